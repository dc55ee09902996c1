"""CNN-family, activation and tico-facade cases: the registered wrappers no HF module in the
matrix contains (issue #19 item 3).

tico 0.3.0 registers wrappers for torch.nn's Conv2d, ConvTranspose2d, MaxPool2d, PReLU and the
elementwise activations (ReLU, ReLU6, ELU, Sigmoid, Tanh, SiLU), and for its own facades a user
inserts into a model to get Circle semantics (tico.ops.Concat, ResizeBilinear2d,
SamePaddingConv2d, tico.quantization.QuantStub). TICO's smoke has no case for any of them. Each
case here is the float module alone with a seeded input, wrapped by ``prepare`` with the
default PTQConfig, and exported whole, so every check runs on it. Shapes exercise the branches
the wrappers take on configuration: stride, padding, dilation and groups for the convolutions,
SAME padding with a stride for tico's facade.
"""

from __future__ import annotations

import torch
from torch import nn

from harness import Built, Case, CaseInputs, Sample, Sweep, expect, whole_module_export


def _inputs(make, calibration: int = 4) -> CaseInputs:
    return CaseInputs(
        calibration=tuple(Sample(args=(make(),)) for _ in range(calibration)),
        evaluation={"default": Sample(args=(make(),))},
    )


def _images(channels: int, size: int = 8, batch: int = 2):
    return lambda: torch.randn(batch, channels, size, size)


def build_conv2d(profile: str) -> Built:
    return Built(nn.Conv2d(3, 8, kernel_size=3, padding=1, bias=True), _inputs(_images(3)))


def build_conv2d_grouped(profile: str) -> Built:
    """Strided, dilated, grouped: the wrapper's per-group weight path and output-size arithmetic."""
    return Built(
        nn.Conv2d(8, 8, kernel_size=3, stride=2, padding=2, dilation=2, groups=4, bias=False),
        _inputs(_images(8, size=9)),
    )


def build_conv_transpose2d(profile: str) -> Built:
    return Built(nn.ConvTranspose2d(8, 4, kernel_size=4, stride=2, padding=1, bias=True), _inputs(_images(8)))


def build_maxpool2d(profile: str) -> Built:
    return Built(nn.MaxPool2d(kernel_size=2, stride=2), _inputs(_images(4)))


def build_prelu(profile: str) -> Built:
    module = nn.PReLU(num_parameters=4)
    with torch.no_grad():  # per-channel slopes, not the shared 0.25 default
        module.weight.copy_(torch.tensor([0.05, 0.25, 0.5, -0.1]))
    return Built(module, _inputs(_images(4)))


def _activation(cls):
    """Inputs spread over +-10, where the curved activations bend; 8 calibration samples so the
    evaluation sample's extremes fall inside the calibrated range (with 4, the ReLU family's
    largest evaluation value was clipped by 9 steps)."""

    def build(profile: str) -> Built:
        return Built(cls(), _inputs(lambda: 3.0 * torch.randn(4, 32), calibration=8))

    return build


def build_gelu(profile: str, approximate: str = "none") -> Built:
    return Built(nn.GELU(approximate=approximate), _inputs(lambda: 3.0 * torch.randn(4, 32), calibration=8))


# QuantGELU keeps the float module's ``approximate`` and passes it to F.gelu (quant_elementwise.py,
# QuantGELU.forward): the tanh form lowers to a different Circle graph.
GELU_SWEEP = Sweep(
    axes={"approximate": ("none", "tanh")},
    why={"approximate": "QuantGELU.__init__ keeps fp_module.approximate for F.gelu"},
    pr="each",
    nightly="all",
)


def build_concat(profile: str) -> Built:
    """Two inputs of different ranges, so their qparams differ and the wrapper's requantization
    into the output's qparams runs."""
    from tico.ops.concat import Concat

    make = lambda: (torch.randn(2, 4, 8), 4.0 * torch.randn(2, 6, 8))  # noqa: E731
    samples = [make() for _ in range(5)]
    return Built(
        Concat(dim=1),
        CaseInputs(
            calibration=tuple(Sample(args=([a, b],)) for a, b in samples[:4]),
            evaluation={"default": Sample(args=(list(samples[4]),))},
        ),
    )


def build_resize_bilinear(profile: str) -> Built:
    from tico.ops.resize_bilinear import ResizeBilinear2d

    return Built(ResizeBilinear2d((12, 12), half_pixel_centers=True), _inputs(_images(3)))


def build_same_padding_conv2d(
    profile: str, kernel: int = 3, stride: int = 2, dilation: int = 1, depthwise: bool = False
) -> Built:
    from tico.ops.same_padding_conv2d import SamePaddingConv2d

    if depthwise:  # groups == in_channels, a channel multiplier of 2
        module = SamePaddingConv2d(3, 6, kernel_size=kernel, stride=stride, dilation=dilation, groups=3, bias=True)
    else:
        module = SamePaddingConv2d(3, 8, kernel_size=kernel, stride=stride, dilation=dilation, bias=True)
    return Built(module, _inputs(_images(3, size=9)))


# tico.ops.SamePaddingConv2d lowers to circle_custom conv2d.padding (groups == 1) or
# depthwise_conv2d.padding (groups == in_channels; SamePaddingConv2d._conv_forward), and its eager
# path pads as Circle's SAME does, unevenly for even or dilated kernels (_same_padding_1d).
SAME_PADDING_SWEEP = Sweep(
    axes={"kernel": (3, 2, 4), "stride": (2, 1), "dilation": (1, 2), "depthwise": (False, True)},
    why={
        "kernel": "an even kernel pads one more on the after side (_same_padding_1d, ops/same_padding_conv2d.py:190-)",
        "stride": "the SAME output size ceil(in / stride) and its padding (:190-)",
        "dilation": "the effective kernel (kernel - 1) * dilation + 1 sets the padding (:190-)",
        "depthwise": "groups == in_channels lowers to DEPTHWISE_CONV_2D (:120-131) instead of CONV_2D (:109-119)",
    },
    pr="each",
    nightly="pairwise",
    # A 2x2 kernel's heavier output tails are clipped by the output observer (SAME padding itself matches):
    # the kernel=2 variants get their own measured limits (docs/case-measurements.md#tico_same_padding_conv2d)
    overrides={
        "kernel=2": {
            "settings": {"quant_accuracy": {"max_peir": 0.18, "max_mean_abs_diff": 0.0086, "min_sqnr_db": 26.4}}
        }
    },
)


def build_quant_stub(profile: str) -> Built:
    from tico.quantization.quant_stub import QuantStub

    return Built(QuantStub(), _inputs(lambda: torch.randn(4, 16)))


_CNN = dict(family="cnn", profiles=("tiny",), seed=123, export=whole_module_export())

# Limits: the worst over three kernel selections with margin; Circle steps at the one-step floor of rounding
# arithmetic (docs/case-measurements.md#cnn-cases)
_LIMITS = {
    "act_gelu": {"max_peir": 0.0081, "max_mean_abs_diff": 0.018, "min_sqnr_db": 39.2},
    "act_elu": {"max_peir": 0.0074, "max_mean_abs_diff": 0.02, "min_sqnr_db": 39.1},
    "act_relu": {"max_peir": 0.0087, "max_mean_abs_diff": 0.013, "min_sqnr_db": 40.1},
    "act_relu6": {"max_peir": 0.0095, "max_mean_abs_diff": 0.012, "min_sqnr_db": 40.7},
    "act_sigmoid": {"max_peir": 0.012, "max_mean_abs_diff": 0.0034, "min_sqnr_db": 43.1},
    "act_silu": {"max_peir": 0.0098, "max_mean_abs_diff": 0.018, "min_sqnr_db": 39.7},
    "act_tanh": {"max_peir": 0.017, "max_mean_abs_diff": 0.0078, "min_sqnr_db": 37.8},
    "cnn_conv2d": {"max_peir": 0.03, "max_mean_abs_diff": 0.0087, "min_sqnr_db": 31.8},
    "cnn_conv2d_grouped": {"max_peir": 0.097, "max_mean_abs_diff": 0.007, "min_sqnr_db": 29.5},
    "cnn_conv_transpose2d": {"max_peir": 0.0062, "max_mean_abs_diff": 0.0052, "min_sqnr_db": 36.6},
    "cnn_maxpool2d": {"max_peir": 0.0085, "max_mean_abs_diff": 0.011, "min_sqnr_db": 39.6},
    "cnn_prelu": {"max_peir": 0.028, "max_mean_abs_diff": 0.0084, "min_sqnr_db": 36.1},
    "tico_concat": {"max_peir": 0.0034, "max_mean_abs_diff": 0.033, "min_sqnr_db": 38.1},
    "tico_quant_stub": {"max_peir": 0.024, "max_mean_abs_diff": 0.0084, "min_sqnr_db": 36.3},
    "tico_resize_bilinear": {"max_peir": 0.0055, "max_mean_abs_diff": 0.0094, "min_sqnr_db": 35.8},
    "tico_same_padding_conv2d": {"max_peir": 0.055, "max_mean_abs_diff": 0.0068, "min_sqnr_db": 32.9},
}


def _settings(name: str) -> dict:
    return {"quant_accuracy": _LIMITS[name], "circle_replay": {"max_steps": 1.0, "mean_steps": 0.1}}


# Verified in tico 0.3.0 and reproduced (groups=1 and groups=in_channels are not decomposed and
# quantize their bias; docs/cases.md).
GROUPED_CONV_FLOAT_BIAS = expect("grouped-conv-float-bias")


# (name, build, the wrapper prepare must put at the root)
_BUILDS = (
    ("cnn_conv2d", build_conv2d, "QuantConv2d"),
    ("cnn_conv2d_grouped", build_conv2d_grouped, "QuantConv2d"),
    ("cnn_conv_transpose2d", build_conv_transpose2d, "QuantConvTranspose2d"),
    ("cnn_maxpool2d", build_maxpool2d, "QuantMaxPool2d"),
    ("cnn_prelu", build_prelu, "QuantPReLU"),
    ("act_relu", _activation(nn.ReLU), "QuantReLU"),
    ("act_relu6", _activation(nn.ReLU6), "QuantReLU6"),
    ("act_elu", _activation(nn.ELU), "QuantELU"),
    ("act_sigmoid", _activation(nn.Sigmoid), "QuantSigmoid"),
    ("act_tanh", _activation(nn.Tanh), "QuantTanh"),
    ("act_silu", _activation(nn.SiLU), "QuantSiLU"),
    ("act_gelu", build_gelu, "QuantGELU"),
    ("tico_concat", build_concat, "QuantConcat"),
    ("tico_resize_bilinear", build_resize_bilinear, "QuantResizeBilinear2d"),
    ("tico_same_padding_conv2d", build_same_padding_conv2d, "QuantSamePaddingConv2d"),
    ("tico_quant_stub", build_quant_stub, "QuantStubWrapper"),
)
_EXPECTED = {"cnn_conv2d_grouped": {"qparam_audit": GROUPED_CONV_FLOAT_BIAS}}

_SWEEPS = {"tico_same_padding_conv2d": SAME_PADDING_SWEEP, "act_gelu": GELU_SWEEP}

CASES = [
    Case(
        name=name,
        build=build,
        expected_wrapper=wrapper,
        settings=_settings(name),
        expected_failures=_EXPECTED.get(name, {}),
        sweep=_SWEEPS.get(name),
        **_CNN,
    )
    for name, build, wrapper in _BUILDS
]
