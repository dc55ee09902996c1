"""Qwen3-VL cases: the vision model (seed 2's RoPE, resolved in tico 0.3.0 by fixing grid_thw
in QuantQwen3VLVisionModel's export adapter).

The HF side of rotary parity follows the pinned transformers API: ``rot_pos_emb`` where the
model still has it (older releases), else ``vision_utils.get_vision_position_ids`` plus the
model's rotary module (5.9+).
"""

from __future__ import annotations

import torch

from harness import Built, Case, CaseInputs, ExportCapability, RotaryCapability, RotaryTables, Sample, Thresholds
from harness.capture import first_call_kwarg
from harness.pipeline import unwrap

QWEN3_VL_REQUIRES = ("transformers.models.qwen3_vl.modeling_qwen3_vl",)

# Fixed deployment grid for export and accuracy: temporal > 1 and height != width.
EXPORT_GRID = (2, 4, 6)
# Extra grids for rotary parity only (non-square both ways, temporal 1..3).
ROTARY_GRIDS = ((1, 4, 8), (2, 8, 4), (3, 2, 6))

_TINY_VISION = dict(
    hidden_size=64,
    num_heads=4,
    depth=1,
    temporal_patch_size=2,
    patch_size=16,
    out_hidden_size=64,
    spatial_merge_size=2,
    deepstack_visual_indexes=[0],
    num_position_embeddings=64,
)


def vision_config(profile: str):
    from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLVisionConfig

    if profile != "tiny":
        raise ValueError(f"unknown Qwen3-VL vision profile {profile!r}")
    cfg = Qwen3VLVisionConfig(**_TINY_VISION)
    cfg._attn_implementation = "eager"
    return cfg


def patch_dim(cfg) -> int:
    return cfg.in_channels * cfg.temporal_patch_size * cfg.patch_size * cfg.patch_size


def vision_sample(cfg, grid: tuple[int, int, int]) -> Sample:
    """Batch-one flattened patches for one image/video of ``grid`` = (t, h, w) patches."""
    t, h, w = grid
    pixels = torch.randn(1, t * h * w, patch_dim(cfg))
    return Sample(args=(pixels, torch.tensor([list(grid)])))


def hf_vision_rope(model: torch.nn.Module, grid_thw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Hugging Face's cos/sin for ``grid_thw`` through whichever API this version has."""
    if hasattr(model, "rot_pos_emb"):
        freqs = model.rot_pos_emb(grid_thw)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()
    from transformers.vision_utils import get_vision_position_ids

    positions = get_vision_position_ids(grid_thw, model.spatial_merge_size)
    probe = torch.zeros(1, dtype=model.rotary_pos_emb.inv_freq.dtype)
    return model.rotary_pos_emb(probe, positions)


def pooled_output(output) -> torch.Tensor:
    """The merged visual tokens: HF's pooler_output, or the adapter's first tuple element."""
    if hasattr(output, "pooler_output"):
        return output.pooler_output
    if isinstance(output, (tuple, list)):
        return output[0]
    return output


def build_vision_model(profile: str) -> Built:
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel

    cfg = vision_config(profile)
    module = Qwen3VLVisionModel(cfg)
    # Calibration uses the deployment grid (the option the seed PR's reviewers chose).
    calibration = tuple(vision_sample(cfg, EXPORT_GRID) for _ in range(2))
    default = vision_sample(cfg, EXPORT_GRID)
    probes = {f"grid_{t}x{h}x{w}": vision_sample(cfg, (t, h, w)) for t, h, w in ROTARY_GRIDS}
    return Built(
        module=module,
        inputs=CaseInputs(calibration=calibration, evaluation={"default": default}),
        facts={"rotary_probes": probes},
    )


def _vision_adapter(root: torch.nn.Module, sample: Sample, built: Built) -> torch.nn.Module:
    grid = tuple(int(v) for v in sample.args[1][0])
    return unwrap(root).as_export_module("prefill", grid_thw=grid)


def _vision_rotary(wrapped: torch.nn.Module, reference: torch.nn.Module, built: Built) -> list[RotaryTables]:
    """cos/sin reaching the first vision block for several grids, and the tables baked into
    the export adapter for the deployment grid, each against HF for the same grid_thw."""
    model = unwrap(wrapped)
    tables = []
    probes = dict(built.facts["rotary_probes"])
    probes["export_grid"] = built.inputs.evaluation["default"]
    for label, sample in probes.items():
        grid_thw = sample.args[1]
        reference_tables = hf_vision_rope(reference, grid_thw)
        used = first_call_kwarg(wrapped, model.blocks[0], sample.call, "position_embeddings")
        tables.append(RotaryTables(f"dynamic:{label}", tuple(used), reference_tables))
        if label == "export_grid":
            adapter = _vision_adapter(wrapped, sample, built)
            baked = (adapter.rope_cos_template, adapter.rope_sin_template)
            tables.append(RotaryTables(f"export:{label}", baked, reference_tables))
    return tables


_NO_MASK = "vision attention is block-diagonal over cu_seqlens; the wrapper builds no additive mask"
_FOLDED_SCALE = (
    "QuantQwen3VLVisionAttention folds the 1/sqrt(head_dim) logit scale into the k rows of qkv at "
    "construction, so this observer is declared but never fed nor applied (dead observer)"
)

_IN_PLACE_FOLD = (
    "the Qwen3-VL vision wrappers keep trainable copies of weights beside the float module's originals: "
    "QuantQwen3VLVisionAttention folds 1/sqrt(head_dim) into the k rows of its own qkv copy, and the patch "
    "embedding wrapper builds its own projection (4 extra parameter tensors)"
)

VISION_MODEL = Case(
    name="qwen3_vl_vision_model",
    family="qwen3_vl",
    description="Qwen3VLVisionModel -> QuantQwen3VLVisionModel at fixed grid_thw (seed PR 2)",
    build=build_vision_model,
    seed=123,
    expected_wrapper="QuantQwen3VLVisionModel",
    expected_observer_count=120,
    requires=QWEN3_VL_REQUIRES,
    output=pooled_output,
    # Measured on the pinned stack at grid (2,4,6): mean 0.0014, max 0.020, PEIR 0.056, SQNR 29.5 dB.
    # Circle replay matches torch QUANT exactly on tico 0.3.0.
    thresholds=Thresholds(
        max_mean_abs_diff=0.005,
        max_abs_diff=0.04,
        max_peir=0.09,
        min_sqnr_db=25.0,
        circle_max_steps=1.0,
        circle_mean_steps=0.1,
    ),
    export=ExportCapability(
        adapter=_vision_adapter,
        args=lambda sample: (sample.args[0],),
        unsupported_mode=lambda root, sample, built: unwrap(root).as_export_module("decode", grid_thw=EXPORT_GRID),
        # Patches for a (1, 2, 2) grid fed to the adapter baked for EXPORT_GRID.
        contradicting_args=lambda sample, built: (sample.args[0][:, :4],),
    ),
    rotary=RotaryCapability(tables=_vision_rotary),
    not_applicable={
        "mask_fill": _NO_MASK,
        "mask_quant": _NO_MASK,
    },
    expected_failures={"no_side_effects": _IN_PLACE_FOLD},
    unused_observers={
        "blocks.*.attn.wrapped.obs_scaling": _FOLDED_SCALE,
        "blocks.*.attn.wrapped.obs_mul_logits_scale": _FOLDED_SCALE,
    },
)

CASES = [VISION_MODEL]
