"""torch.nn cases: the leaf wrappers (Linear, Conv3d, LayerNorm, tied Embedding + Linear).

Same modules and input shapes as TICO's nn smoke cases; the whole module is the export
adapter, so every export check runs on them too."""

from __future__ import annotations

import torch
from torch import nn

from cases._shared_diagnoses import CIRCLE_CHECKS, replaced_qparams
from harness import Built, Case, CaseInputs, Sample, Sweep, expect, expect_on, whole_module_export


def _inputs(make, calibration: int, evaluation=None) -> CaseInputs:
    return CaseInputs(
        calibration=tuple(Sample(args=(make(),)) for _ in range(calibration)),
        evaluation={"default": Sample(args=((evaluation or make)(),))},
    )


def build_linear(profile: str, bias: bool = False) -> Built:
    module = nn.Linear(16, 8, bias=bias)
    return Built(module, _inputs(lambda: torch.randn(4, 16), 4, lambda: torch.randn(2, 16)))


def linear_policy(profile: str, policy: str = "uint8"):
    """The dtype policies a user passes to tico's PTQConfig (config/ptq.py:238-240): the default
    (uint8 activations, per-channel uint8 weights), int16 for every role, a per-tensor weight
    override, and an int16 override of one observer (the output)."""
    from tico.quantization.config.ptq import PTQConfig
    from tico.quantization.config.specs import affine
    from tico.quantization.wrapq.dtypes import INT16, UINT8
    from tico.quantization.wrapq.qscheme import QScheme

    if policy == "uint8":
        return PTQConfig()
    if policy == "int16":
        return PTQConfig(activation=affine(INT16), weight=affine(INT16))
    if policy == "per_tensor_weight":
        return PTQConfig(overrides={"weight": affine(UINT8, qscheme=QScheme.PER_TENSOR_ASYMM)})
    if policy == "act_out_int16":
        return PTQConfig(overrides={"act_out": affine(INT16)})
    raise ValueError(f"unknown dtype policy {policy!r}")


# QuantLinear (nn/quant_linear.py) takes its observers' dtype and qscheme from the PTQConfig with
# the precedence of QuantModuleBase._make_obs: an explicit override, then the wrapper's default
# (per-channel weight, QuantLinear.__init__), then the role's spec; the bias is added in float
# (F.linear in QuantLinear.forward) and tico's QuantizeBias pass quantizes it at conversion.
LINEAR_SWEEP = Sweep(
    axes={"policy": ("uint8", "int16", "per_tensor_weight", "act_out_int16"), "bias": (False, True)},
    why={
        "policy": "_make_obs precedence (quant_module_base.py:197-209): override > wrapper default > role spec",
        "bias": "a bias reaches Circle through QuantizeBias (passes/quantize_bias.py:95-97)",
    },
    pr="each",
    nightly="all",
    overrides={
        "policy=per_tensor_weight,bias=True": {
            "expected_failures": {check: expect("quantize-bias-per-tensor-assert") for check in CIRCLE_CHECKS}
        },
        "policy=act_out_int16": {
            "expected_failures": expect_on(("circle_replay", "qparam_consistency"), "int16-output-after-uint8")
        },
    },
)


# The padding forms nn.Conv3d takes, by sweep value (a sweep value must be a plain name).
CONV3D_PADDINGS = {"zero": 0, "int": 1, "tuple": (1, 0, 2), "single": (1,), "same": "same", "valid": "valid"}


def build_conv3d(
    profile: str, padding: str = "zero", stride: str = "patch", dilation: int = 1, groups: int = 1, bias: bool = True
) -> Built:
    """Conv3d(3 -> 8) over (1, 3, 2, 8, 8), 4 frames when dilated (the dilated kernel spans 3);
    ``stride='patch'`` strides by the kernel, 'one' by 1 (SAME padding needs it); ``groups=3`` is
    depthwise with 3 filters per channel (9 outputs)."""
    module = nn.Conv3d(
        3,
        9 if groups == 3 else 8,
        kernel_size=(2, 4, 4),
        stride=(2, 4, 4) if stride == "patch" else 1,
        padding=CONV3D_PADDINGS[padding],
        dilation=dilation,
        groups=groups,
        bias=bias,
    )
    frames = 2 if dilation == 1 else 4
    # 8 calibration samples off the baseline: with 3, a padded slice's or a depthwise output's evaluation
    # range exceeds the calibrated one and clipping, not the wrapper, dominates the error
    baseline = (padding, stride, dilation, groups, bias) == ("zero", "patch", 1, 1, True)
    return Built(module, _inputs(lambda: torch.randn(1, 3, frames, 8, 8), 3 if baseline else 8))


# Padding in time: the zeros tico concatenates stay float (findings/tico.toml); the slices then read an
# unquantized tensor, so the slice requantization the baseline shows is gone.
_TEMPORAL_PADDING = {
    "expected_failures": {
        "qparam_audit": expect(
            "conv3d-decomposed-float-bias", "conv3d-temporal-padding-float-zeros", check="qparam_audit"
        ),
        "circle_replay": expect("conv3d-temporal-padding-float-zeros", check="circle_replay"),
        "circle_call": expect("conv3d-temporal-padding-float-zeros", check="circle_call"),
        "qparam_consistency": None,
    }
}


# QuantConv3dDecomposed (nn/quant_conv3d_decomposed.py) turns the padding into explicit per-side pads
# (_parse_padding: a 3-tuple -- nn.Conv3d turns an int into one --, a 1-tuple, which it keeps as given,
# 'same' with the trailing extra of an even or dilated kernel, 'valid'), pads time by concatenation and
# height/width evenly or with an explicit pad (_apply_temporal_padding, _apply_conv2d_quantized), checks
# groups against the channels, and adds the bias only when there is one. 'same' needs stride 1 (torch
# refuses it strided), so the variants are explicit selectors: each axis value once on the PR gate, pairs
# with SAME padding nightly.
CONV3D_SWEEP = Sweep(
    axes={
        "padding": tuple(CONV3D_PADDINGS),
        "stride": ("patch", "one"),
        "dilation": (1, 2),
        "groups": (1, 3),
        "bias": (True, False),
    },
    why={
        "padding": "_parse_padding's 3-tuple (an int becomes one), 1-tuple, 'same' and 'valid' forms, and their pads",
        "stride": "the temporal and spatial output sizes and the per-time-step slicing of forward",
        "dilation": "the effective kernel of 'same' padding (_same_padding_pair) and the dilated slices",
        "groups": "the channel check and grouped conv2d per time step",
        "bias": "the bias add after the time-step accumulation (forward), absent without a bias",
    },
    pr=(
        "padding=int",
        "padding=tuple",
        "padding=single",
        "padding=valid",
        "padding=same,stride=one",
        "stride=one,dilation=2",
        "groups=3",
        "bias=False",
    ),
    nightly=(
        "padding=same,stride=one,dilation=2",
        "padding=same,stride=one,groups=3,bias=False",
        "padding=tuple,stride=one,dilation=2,groups=3",
    ),
    overrides={
        **{f"padding={form}": _TEMPORAL_PADDING for form in ("int", "tuple", "single", "same")},
        "bias=False": {"expected_failures": {"qparam_audit": None}},
        # one accumulator observer per output time step: with time padding and dilation the last, half-padded
        # step's calibrated range is narrow and clips one evaluation value (docs/case-measurements.md#nn_conv3d-sweep)
        "padding=same,dilation=2": {"settings": {"quant_accuracy": {"max_peir": 0.13}}},
        "padding=tuple,dilation=2": {"settings": {"quant_accuracy": {"max_peir": 0.077}}},
        "padding=same,bias=False": {
            "expected_failures": {
                "qparam_audit": expect("conv3d-temporal-padding-float-zeros", check="qparam_audit"),
                "qparam_consistency": expect("conv3d-accumulators-concatenated"),
            }
        },
    },
)


def build_conv3d_patch(profile: str) -> Built:
    """Kernel and stride equal to the patch volume: the Qwen3-VL patch-embed special path."""
    module = nn.Conv3d(3, 16, kernel_size=(2, 8, 8), stride=(2, 8, 8), padding=0, bias=True)
    return Built(module, _inputs(lambda: torch.randn(2, 3, 2, 8, 8), 3))


def build_layernorm(profile: str, affine: str = "weight_and_bias") -> Built:
    """``affine`` (a sweep axis): nn.LayerNorm's own forms, weight and bias, weight only (bias=False), none."""
    forms = {
        "weight_and_bias": {"elementwise_affine": True},
        "weight_only": {"elementwise_affine": True, "bias": False},
        "none": {"elementwise_affine": False},
    }
    module = nn.LayerNorm((32,), eps=1e-5, **forms[affine])
    if affine == "weight_only":  # a weight of ones would hide a skipped multiply (the baseline keeps its golden)
        with torch.no_grad():
            module.weight.uniform_(0.5, 1.5)
    return Built(module, _inputs(lambda: torch.randn(4, 32), 3))


LAYERNORM_SWEEP = Sweep(
    axes={"affine": ("weight_and_bias", "weight_only", "none")},
    why={
        "affine": "QuantLayerNorm's observers follow the module: no affine observers without elementwise_affine, "
        "no bias observer with bias=False (quant_layernorm.py __init__, forward, _all_observers)"
    },
    pr=(),
    overrides={
        "affine=weight_only": {
            "unused_observers": {
                "obs_affine_add": "QuantLayerNorm makes obs_affine_add whenever elementwise_affine, bias or not "
                "(quant_layernorm.py __init__), and lists it in _all_observers; with bias=False forward adds no "
                "bias, so it is never fed and no exported op reads it"
            }
        }
    },
)


class TiedEmbeddingLM(nn.Module):
    """Embedding and LM head sharing one weight, as small language models do."""

    def __init__(self, vocab_size: int = 16, hidden_size: int = 8) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, hidden_size)
        self.lm_head = nn.Linear(hidden_size, vocab_size, bias=False)
        self.lm_head.weight = self.embed.weight

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.embed(token_ids))


def build_tied(profile: str) -> Built:
    tokens = lambda shape: torch.randint(0, 16, shape, dtype=torch.long)
    return Built(TiedEmbeddingLM(), _inputs(lambda: tokens((2, 5)), 3, lambda: tokens((1, 4))))


def _per_child(step):
    """Apply a tico step to embed and lm_head separately, so the tie survives wrapping."""

    def apply(module, *cfg):
        module.embed = step(module.embed, *cfg)
        module.lm_head = step(module.lm_head, *cfg)
        return module

    return apply


def _wrap_child(child, cfg):
    from tico.quantization.wrapq.wrappers.ptq_wrapper import PTQWrapper

    return PTQWrapper(child, qcfg=cfg)


def _prepare_child(child, cfg):
    from tico.quantization import prepare

    return prepare(child, cfg)


def _convert_child(child):
    from tico.quantization import convert

    return convert(child)


_LEAF = dict(family="nn", profiles=("tiny",))

CASES = [
    # Limits: measured on the pinned stack, with margin (docs/profiles.md has the numbers).
    Case(
        name="nn_linear",
        build=build_linear,
        seed=123,
        expected_wrapper="QuantLinear",
        ptq_config=linear_policy,
        settings={
            "quant_accuracy": {"max_mean_abs_diff": 0.06, "max_peir": 0.08},
            "circle_replay": {"max_steps": 1.0, "mean_steps": 0.1},
        },
        export=whole_module_export(),
        sweep=LINEAR_SWEEP,
        **_LEAF,
    ),
    # Circle differs only by the per-slice qparams tico replaces (qparam_consistency): circle_replay is the
    # one-flip floor (docs/case-measurements.md#nn_conv3d)
    Case(
        name="nn_conv3d",
        build=build_conv3d,
        seed=123,
        expected_wrapper="QuantConv3dDecomposed",
        settings={
            "quant_accuracy": {"max_mean_abs_diff": 0.05, "max_peir": 0.05},
            "circle_replay": {"max_steps": 1.0, "mean_steps": 0.1},
        },
        export=whole_module_export(),
        expected_failures={
            "qparam_audit": expect("conv3d-decomposed-float-bias"),
            "qparam_consistency": replaced_qparams(rotate_half=False, conv3d_slices=True),
        },
        sweep=CONV3D_SWEEP,
        **_LEAF,
    ),
    Case(
        name="nn_conv3d_special_case",
        build=build_conv3d_patch,
        seed=123,
        expected_wrapper="QuantConv3dDecomposed",
        settings={
            "quant_accuracy": {"max_mean_abs_diff": 0.05, "max_peir": 0.05},
            "circle_replay": {"max_steps": 1.0, "mean_steps": 0.1},
        },
        export=whole_module_export(),
        **_LEAF,
    ),
    Case(
        name="nn_layernorm",
        build=build_layernorm,
        seed=123,
        sweep=LAYERNORM_SWEEP,
        expected_wrapper="QuantLayerNorm",
        settings={
            "quant_accuracy": {"max_mean_abs_diff": 0.12, "max_peir": 0.12},
            "circle_replay": {"max_steps": 1.0, "mean_steps": 0.1},
        },
        export=whole_module_export(),
        **_LEAF,
    ),
    Case(
        name="nn_tied_embedding",
        build=build_tied,
        seed=123,
        settings={
            "quant_accuracy": {"max_mean_abs_diff": 0.1, "max_peir": 0.05},
            "circle_replay": {"max_steps": 1.0, "mean_steps": 0.1},
        },
        wrap=_per_child(_wrap_child),
        prepare=_per_child(_prepare_child),
        convert=_per_child(_convert_child),
        export=whole_module_export(),
        not_applicable={
            "wrapper_registry": "the root is a test composite; embed and lm_head are wrapped one by one to keep "
            "the tie",
            "ptq_overrides": "the root is a test composite that owns no observer of its own",
            "override_scope": "the case wraps embed and lm_head one by one with the root's config (to keep the "
            "tie), so no child path addresses an override",
        },
        expected_failures={"qparam_consistency": replaced_qparams(rotate_half=False, embedding=True)},
        **_LEAF,
    ),
]
