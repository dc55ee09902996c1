"""Qwen3-VL cases: the vision model (seed 2's RoPE, resolved in tico 0.3.0 by fixing grid_thw
in QuantQwen3VLVisionModel's export adapter), its parts and the text MLP.

Profiles: "tiny" (TICO's tiny smoke configs) and "e2b_dims" (TICO's qwen3_vl_4b_dims widths,
one layer/block), for the cases TICO runs at 4B widths.

The HF side of rotary parity follows the pinned transformers API: ``rot_pos_emb`` where the
model still has it (older releases), else ``vision_utils.get_vision_position_ids`` plus the
model's rotary module (5.9+).
"""

from __future__ import annotations

import torch

from cases import _static_runtime as static
from cases._qwen3_vl_common import (
    FOLDED_SCALE,
    PROFILES,
    QWEN3_VL_REQUIRES,
    STATIC_GRID,
    hf_vision_rope,
    text_config,
    vision_config,
    vision_sample,
)
from cases._qwen3_vl_vision_calls import vision_export_probes
from cases._shared_diagnoses import replaced_qparams
from harness import (
    Built,
    CallContractCapability,
    Case,
    CaseInputs,
    ExportCapability,
    RotaryCapability,
    RotaryTables,
    Sample,
    expect,
    first_call_kwarg,
    unwrap,
    whole_module_export,
)

STATIC = static.PROFILE
# Fixed deployment grid for export and accuracy: temporal > 1 and height != width.
EXPORT_GRID = (2, 4, 6)
# Extra grids for rotary parity only (non-square both ways, temporal 1..3).
ROTARY_GRIDS = ((1, 4, 8), (2, 8, 4), (3, 2, 6))


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
    if profile == STATIC:  # TICO's fixed deployment grid, one calibration sample; no extra rotary grids
        calibration = (vision_sample(cfg, STATIC_GRID),)
        return Built(
            module=module,
            inputs=CaseInputs(calibration=calibration, evaluation={"default": vision_sample(cfg, STATIC_GRID)}),
            facts={"rotary_probes": {}},
        )
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
VISION_MODEL = Case(
    name="qwen3_vl_vision_model",
    family="qwen3_vl",
    description="Qwen3VLVisionModel -> QuantQwen3VLVisionModel at fixed grid_thw (seed PR 2)",
    build=build_vision_model,
    profiles=PROFILES,
    seed=123,
    expected_wrapper="QuantQwen3VLVisionModel",
    expected_observer_count=120,
    expected_failures={
        "no_side_effects": expect("qwen3-vl-patch-embed-copy"),
        "qparam_consistency": replaced_qparams(),
    },
    requires=QWEN3_VL_REQUIRES,
    output=pooled_output,
    # Limits: the measured figures at the deployment grid with margin; Circle replay exact
    # (docs/case-measurements.md#qwen3_vl_vision_model)
    settings={
        "quant_accuracy": {"max_mean_abs_diff": 0.005, "max_abs_diff": 0.04, "max_peir": 0.09, "min_sqnr_db": 25.0},
        "circle_replay": {"max_steps": 1.0, "mean_steps": 0.1},
    },
    export=ExportCapability(
        adapter=_vision_adapter,
        args=lambda sample: (sample.args[0],),
        unsupported_mode=lambda root, sample, built: unwrap(root).as_export_module(
            "decode", grid_thw=tuple(int(v) for v in sample.args[1][0])
        ),
        # Patches for a (1, 2, 2) grid fed to the adapter baked for the sample's grid.
        contradicting_args=lambda sample, built: (sample.args[0][:, :4],),
    ),
    rotary=RotaryCapability(tables=_vision_rotary),
    calls=CallContractCapability(probes=vision_export_probes),
    not_applicable={
        "mask_fill": _NO_MASK,
        "mask_quant": _NO_MASK,
    },
    unused_observers={
        "blocks.*.attn.wrapped.obs_scaling": FOLDED_SCALE,
        "blocks.*.attn.wrapped.obs_mul_logits_scale": FOLDED_SCALE,
    },
    deployment_shapes={"vision_grid": STATIC_GRID},
)

# -- vision sub-modules (TICO's qwen3_vl_vision_* smoke cases, with HF RoPE and non-square grids)

_PART_GRID = (1, 4, 8)


def _patch_tokens(grid: tuple[int, int, int]) -> int:
    t, h, w = grid
    return t * h * w


def _cu_seqlens(grid: tuple[int, int, int]) -> torch.Tensor:
    t, h, w = grid
    return torch.tensor([i * h * w for i in range(t + 1)], dtype=torch.int32)


def _vision_part(profile: str, pick, make_sample, calibration: int = 3) -> Built:
    """One part of a tiny vision model, with samples made from that model's own config:
    ``make_sample(model, grid)``, ``grid`` the profile's image grid (_PART_GRID, or TICO's fixed
    deployment grid with one calibration sample at static_runtime)."""
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel

    model = Qwen3VLVisionModel(vision_config(profile))
    module = pick(model)
    grid, calibration = (STATIC_GRID, 1) if profile == STATIC else (_PART_GRID, calibration)
    samples = [make_sample(model, grid) for _ in range(calibration + 1)]
    return Built(module, CaseInputs(calibration=tuple(samples[:-1]), evaluation={"default": samples[-1]}))


def _packed_sample(model, grid: tuple[int, int, int] = _PART_GRID) -> Sample:
    """Packed patches of one ``grid`` item; keywords, since tico's attention and block
    wrappers take ``rotary_pos_emb`` third where HF takes ``position_embeddings``."""
    t, h, w = grid
    hidden = torch.randn(t * h * w, model.config.hidden_size)
    rope = hf_vision_rope(model, torch.tensor([list(grid)]))
    return Sample(args=(hidden, _cu_seqlens(grid)), kwargs={"position_embeddings": rope})


class _FixedGridPart(torch.nn.Module):
    """Static export profile for a packed attention/block part: cu_seqlens and RoPE are
    buffers and the split sizes Python ints, as the full vision model's adapter does."""

    def __init__(self, part: torch.nn.Module, sample: Sample):
        super().__init__()
        self.part = part
        self.register_buffer("cu_seqlens", sample.args[1].clone())
        cos, sin = sample.kwargs["position_embeddings"]
        self.register_buffer("cos", cos.clone())
        self.register_buffer("sin", sin.clone())
        bounds = sample.args[1].tolist()
        self.split_sizes = tuple(int(b - a) for a, b in zip(bounds, bounds[1:]))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.part(
            hidden, self.cu_seqlens, position_embeddings=(self.cos, self.sin), attention_split_sizes=self.split_sizes
        )


def _fixed_grid_export() -> ExportCapability:
    return ExportCapability(
        adapter=lambda root, sample, built: _FixedGridPart(root, sample),
        args=lambda s: (s.args[0],),
        refuses_calib=False,
    )


def build_vision_mlp(profile: str) -> Built:
    # 16 patch rows on tiny (TICO's count), the grid's patch tokens at static_runtime
    return _vision_part(
        profile,
        lambda m: m.blocks[0].mlp,
        lambda m, grid: Sample(
            args=(torch.randn(_patch_tokens(grid) if profile == STATIC else 16, m.config.hidden_size),)
        ),
    )


def build_vision_attention(profile: str) -> Built:
    return _vision_part(profile, lambda m: m.blocks[0].attn, _packed_sample)


def build_vision_block(profile: str) -> Built:
    return _vision_part(profile, lambda m: m.blocks[0], _packed_sample)


def build_patch_embed(profile: str) -> Built:
    return _vision_part(
        profile,
        lambda m: m.patch_embed,
        lambda m, grid: Sample(args=(vision_sample(m.config, grid if profile == STATIC else (1, 2, 4)).args[0],)),
    )


def build_patch_merger(profile: str) -> Built:
    # two merged tokens on tiny, the grid's patch tokens at static_runtime
    return _vision_part(
        profile,
        lambda m: m.merger,
        lambda m, grid: Sample(
            args=(
                torch.randn(
                    _patch_tokens(grid) if profile == STATIC else 2 * m.config.spatial_merge_size**2,
                    m.config.hidden_size,
                ),
            )
        ),
    )


_PART = dict(family="qwen3_vl", seed=123, requires=QWEN3_VL_REQUIRES, profiles=PROFILES)

VISION_PARTS = [
    Case(
        name="qwen3_vl_vision_mlp",
        build=build_vision_mlp,
        expected_wrapper="QuantQwen3VLVisionMLP",
        settings={
            "quant_accuracy": {"max_mean_abs_diff": 0.05, "max_peir": 0.1},
            "circle_replay": {"max_steps": 1.0, "mean_steps": 0.1},
        },
        export=whole_module_export(),
        deployment_shapes={"vision_patch_seq_len": static.QWEN3_VL_PATCH_TOKENS},
        **_PART,
    ),
    Case(
        name="qwen3_vl_vision_attention",
        build=build_vision_attention,
        expected_wrapper="QuantQwen3VLVisionAttention",
        settings={
            "quant_accuracy": {"max_mean_abs_diff": 0.05, "max_peir": 0.1},
            "circle_replay": {"max_steps": 1.0, "mean_steps": 0.1},
        },
        unused_observers={"obs_scaling": FOLDED_SCALE, "obs_mul_logits_scale": FOLDED_SCALE},
        export=_fixed_grid_export(),
        expected_failures={"qparam_consistency": replaced_qparams()},
        deployment_shapes={"vision_grid": STATIC_GRID},
        **_PART,
    ),
    Case(
        name="qwen3_vl_vision_block",
        build=build_vision_block,
        expected_wrapper="QuantQwen3VLVisionBlock",
        settings={
            "quant_accuracy": {"max_mean_abs_diff": 0.05, "max_peir": 0.1},
            "circle_replay": {"max_steps": 1.0, "mean_steps": 0.1},
        },
        unused_observers={"attn.wrapped.obs_scaling": FOLDED_SCALE, "attn.wrapped.obs_mul_logits_scale": FOLDED_SCALE},
        export=_fixed_grid_export(),
        expected_failures={"qparam_consistency": replaced_qparams()},
        deployment_shapes={"vision_grid": STATIC_GRID},
        **_PART,
    ),
    Case(
        name="qwen3_vl_vision_patch_embed",
        build=build_patch_embed,
        expected_wrapper="QuantQwen3VLVisionPatchEmbed",
        settings={
            "quant_accuracy": {"max_mean_abs_diff": 0.05, "max_peir": 0.1},
            "circle_replay": {"max_steps": 1.0, "mean_steps": 0.1},
        },
        export=whole_module_export(),
        deployment_shapes={"vision_grid": STATIC_GRID},
        **_PART,
    ),
    Case(
        name="qwen3_vl_vision_patch_merger",
        build=build_patch_merger,
        expected_wrapper="QuantQwen3VLVisionPatchMerger",
        settings={
            "quant_accuracy": {"max_mean_abs_diff": 0.05, "max_peir": 0.1},
            "circle_replay": {"max_steps": 1.0, "mean_steps": 0.1},
        },
        export=whole_module_export(),
        deployment_shapes={"vision_patch_seq_len": static.QWEN3_VL_PATCH_TOKENS},
        **_PART,
    ),
]

# -- text MLP (TICO's tiny text config) ------------------------------------------------------------


def build_text_mlp(profile: str) -> Built:
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextMLP

    cfg = text_config(profile)
    module = Qwen3VLTextMLP(cfg)
    # static_runtime: one 2048-token window, batch one, one calibration sample (TICO's static smoke)
    shape, count = ((1, static.QWEN3_VL["max_seq"]), 1) if profile == STATIC else ((2, 8), 3)
    sample = lambda: Sample(args=(torch.randn(*shape, cfg.hidden_size),))  # noqa: E731
    return Built(
        module, CaseInputs(calibration=tuple(sample() for _ in range(count)), evaluation={"default": sample()})
    )


TEXT_PARTS = [
    Case(
        name="qwen3_vl_text_mlp",
        build=build_text_mlp,
        expected_wrapper="QuantQwen3VLTextMLP",
        settings={
            "quant_accuracy": {"max_mean_abs_diff": 0.05, "max_peir": 0.1},
            "circle_replay": {"max_steps": 1.0, "mean_steps": 0.1},
        },
        export=whole_module_export(),
        deployment_shapes={"prefill_seq_len": static.QWEN3_VL["max_seq"]},
        **_PART,
    ),
]

CASES = [VISION_MODEL, *VISION_PARTS, *TEXT_PARTS]
