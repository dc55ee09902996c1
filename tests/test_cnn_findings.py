"""The grouped-Conv2d finding, reproduced (cases/cnn.py GROUPED_CONV_FLOAT_BIAS): with
1 < groups < in_channels tico's conversion leaves one float32 bias per group in the uint8 Circle
model; the smallest change that removes it -- groups=1 (not decomposed) or depthwise
(groups=in_channels, not decomposed either) -- gives a quantized bias and no float tensor."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from harness import Built, Case, CaseInputs, Sample, whole_module_export
from harness.pipeline import Pipeline


def _float_tensors_in_circle(groups: int) -> list[tuple[str, tuple]]:
    from tico.circle.runtime.executor import CircleReferenceRuntime

    def build(profile: str) -> Built:
        make = lambda: torch.randn(2, 8, 9, 9)  # noqa: E731
        return Built(
            nn.Conv2d(8, 8, 3, stride=2, padding=2, dilation=2, groups=groups, bias=True),
            CaseInputs(
                calibration=tuple(Sample(args=(make(),)) for _ in range(4)),
                evaluation={"default": Sample(args=(make(),))},
            ),
        )

    case = Case(
        name=f"conv_groups_{groups}",
        build=build,
        seed=123,
        family="cnn",
        profiles=("tiny",),
        export=whole_module_export(),
    )
    program = CircleReferenceRuntime(Pipeline(case, "tiny").circle.binary).program
    tensors = (program.tensor(i) for i in range(len(program.tensors)))
    return [(t.name.split("::")[-1], tuple(t.shape)) for t in tensors if str(t.dtype) == "float32"]


def test_a_grouped_conv_keeps_one_float_bias_per_group():
    floats = _float_tensors_in_circle(groups=4)
    assert len(floats) == 4 and all(shape == (2,) for _, shape in floats), floats
    assert all(name.startswith("_prop_tensor_constant") for name, _ in floats), floats


@pytest.mark.parametrize("groups", [1, 8])
def test_an_undecomposed_conv_quantizes_its_bias(groups):
    assert _float_tensors_in_circle(groups) == []
