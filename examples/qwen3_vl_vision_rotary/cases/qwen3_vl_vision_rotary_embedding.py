"""Harness case for the out-of-tree ``QuantQwen3VLVisionRotaryEmbedding`` (wrapq_vision_rotary).

This is how a wrapper author validates a new wrapper before upstreaming it: the unit tests
the TICO pull request wrote by hand for this wrapper become the harness's generic checks --
frequency values and several sequence lengths (``rotary_parity``, ``noquant_parity``),
mode transitions (``lifecycle``), observer count (``observer_use``), quantised output close
(``quant_accuracy``), registry entry (``wrapper_registry``), no learnable parameters
(``no_side_effects``), dtype override (``ptq_overrides``) -- plus export and golden checks.

The HF module is the one a real Qwen3-VL vision tower runs: ``forward(hidden_states,
position_ids) -> (cos, sin)``, with the (h, w) patch positions of a ``grid_thw`` laid out
block-major over the spatial-merge blocks (``transformers.vision_utils.get_vision_position_ids``).
"Sequence length" is the number of patches of the grid.
"""

from __future__ import annotations

import torch

from harness import (
    Built,
    Case,
    CaseInputs,
    Expected,
    RotaryCapability,
    RotaryTables,
    Sample,
    unwrap,
    whole_module_export,
)

# The tiny Qwen3-VL vision config the in-tree qwen3_vl cases use: head_dim 16, so 4
# inverse frequencies per spatial axis; spatial merge 2.
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

# Deployment grid (exported, calibrated on): 64 patches, temporal 2, height != width.
DEPLOY_GRID = (2, 4, 8)
# Other sequence lengths evaluated (4 and 16 patches; 16 is non-square so h/w mix-ups show).
OTHER_GRIDS = {"seq_4": (1, 2, 2), "seq_16": (1, 2, 8)}


def _register_wrapper() -> None:
    """Import the out-of-tree package: its decorator puts the wrapper in tico's registry."""
    import wrapq_vision_rotary  # noqa: F401


def _config(profile: str):
    from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLVisionConfig

    if profile != "tiny":
        raise ValueError(f"unknown profile {profile!r} for qwen3_vl_vision_rotary_embedding")
    return Qwen3VLVisionConfig(**_TINY_VISION)


def _sample(cfg, grid: tuple[int, int, int]) -> Sample:
    """What the vision tower feeds its rotary module for ``grid``: the patch hidden states
    (only their device matters) and the block-major (h, w) position ids."""
    from transformers.vision_utils import get_vision_position_ids

    t, h, w = grid
    hidden = torch.randn(t * h * w, cfg.hidden_size)
    position_ids = get_vision_position_ids(torch.tensor([list(grid)]), cfg.spatial_merge_size)
    return Sample(args=(hidden, position_ids))


def build(profile: str) -> Built:
    _register_wrapper()
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionRotaryEmbedding

    cfg = _config(profile)
    module = Qwen3VLVisionRotaryEmbedding(cfg)
    # Calibrated on the deployment grid only (the option the seed PR's reviewers chose).
    calibration = (_sample(cfg, DEPLOY_GRID),)
    evaluation = {"default": _sample(cfg, DEPLOY_GRID)}
    evaluation.update({name: _sample(cfg, grid) for name, grid in OTHER_GRIDS.items()})
    return Built(module, CaseInputs(calibration=calibration, evaluation=evaluation), facts={"config": cfg})


def ptq_config(profile: str):
    """tico's default PTQConfig, after registering the wrapper (prepare() looks it up)."""
    _register_wrapper()
    from tico.quantization.config.ptq import PTQConfig

    return PTQConfig()


def cos_sin(output) -> torch.Tensor:
    """Both outputs in one tensor (cos | sin on the last dim), so every check sees both."""
    cos, sin = output
    return torch.cat([cos, sin], dim=-1)


def _rotary_tables(wrapped: torch.nn.Module, reference: torch.nn.Module, built: Built) -> list[RotaryTables]:
    """The wrapper's (NO_QUANT) cos/sin next to HF's, for 4, 16 and 64 patches."""
    tables = []
    for name, sample in built.inputs.evaluation.items():
        label = "seq_64" if name == "default" else name
        with torch.no_grad():
            ours = unwrap(wrapped)(*sample.args)
            theirs = reference(*sample.args)
        tables.append(RotaryTables(label, tuple(ours), tuple(theirs)))
    return tables


CASE = Case(
    name="qwen3_vl_vision_rotary_embedding",
    family="qwen3_vl",
    description="Qwen3VLVisionRotaryEmbedding -> out-of-tree QuantQwen3VLVisionRotaryEmbedding (example)",
    build=build,
    ptq_config=ptq_config,
    output=cos_sin,
    seed=0,
    requires=("transformers.models.qwen3_vl.modeling_qwen3_vl", "transformers.vision_utils"),
    expected_wrapper="QuantQwen3VLVisionRotaryEmbedding",
    expected_observer_count=2,
    # Measured on the pinned stack (uint8 cos/sin, calibrated on the 64-patch grid), worst of the
    # 4/16/64-patch samples: mean |diff| 0.00149, max |diff| 0.00389 (half a step of 2/255),
    # PEIR 0.00389 (seq_4; 0.00196 at 64), SQNR 51.8 dB. Rotary parity (NO_QUANT) is exact: 0.0.
    settings={
        "quant_accuracy": {"max_mean_abs_diff": 0.002, "max_abs_diff": 0.005, "max_peir": 0.005, "min_sqnr_db": 45.0},
        "circle_replay": {"max_steps": 0.5, "mean_steps": 0.1},
    },
    rotary=RotaryCapability(tables=_rotary_tables),
    # The module itself is exported, position_ids as an input (no static adapter). Circle
    # replay compares both outputs, cos and sin, each in steps of its own output scale.
    export=whole_module_export(),
    expected_failures={
        "qparam_audit": Expected(
            "QuantQwen3VLVisionRotaryEmbedding fake-quantizes only cos and sin: the int -> float cast of "
            "position_ids, the product with inv_freq and the slice/reshape/cat of the angle table (plus the "
            "inv_freq buffer and the unused hidden-states input) stay float in the exported graph. The seed "
            "PR's reviewers' answer: fix grid_thw so the table folds to a constant inside QuantQwen3VLVisionModel "
            "(a baked export of this wrapper has 0 quantized nodes)",
            problems=(
                r"^node b_wrapped_inv_freq \(b_wrapped_inv_freq, \d+ users\) has no qparam: no stack trace$",
                r"^node args_0 \(args_0, 0 users\) has no qparam: no stack trace$",
                r"^node slice_tensor(_\d+)? \(aten\.slice\.Tensor, \d+ users\) has no qparam: no stack trace$",
                r"^node \S+ \(aten\.(_to_copy\.default|mul\.Tensor|reshape\.default|cat\.default), \d+ users\) has no "
                r"qparam: File .*quant_vision_rotary_embedding\.py\S*, in _angles",
            ),
        ),
    },
)

CASES = [CASE]
