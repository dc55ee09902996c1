"""The decomposed-Conv3d findings the Conv3d sweep diagnosed (cases/nn.py CONV3D_SWEEP), each reproduced with
the smallest change that removes it: padding in time leaves float zeros in a CONCATENATION with the uint8 input,
which tico's runtime refuses (padding only in height and width leaves none); without a bias, the time steps'
accumulators take the output's qparams (with a bias they keep their own)."""

from __future__ import annotations

import pytest

from cases.nn import build_conv3d
from harness import Case, whole_module_export
from harness.pipeline import Pipeline
from tests.helpers import run_check


def _case(**geometry) -> Case:
    return Case(
        name=("conv3d_" + "_".join(f"{k}_{v}" for k, v in geometry.items())).lower(),
        build=lambda profile: build_conv3d(profile, **geometry),
        seed=123,
        family="nn",
        profiles=("tiny",),
        export=whole_module_export(),
    )


def _concatenation_input_dtypes(case: Case) -> list[list[str]]:
    """Per CONCATENATION of the case's Circle model, the dtypes of its inputs."""
    from tico.circle.runtime.program import CircleProgram

    program = CircleProgram.from_bytes(Pipeline(case, "tiny").circle.binary)
    return [
        sorted({str(program.tensor(i).dtype) for i in op.inputs if i >= 0})
        for op in program.operators
        if op.name == "CONCATENATION"
    ]


def test_padding_in_time_concatenates_float_zeros_with_the_uint8_input():
    assert ["float32", "uint8"] in _concatenation_input_dtypes(_case(padding="tuple"))  # (1, 0, 2): time padded by 1
    # kernel (2, 4, 4): 'same' pads time by (0, 1), the trailing extra of an even kernel
    assert ["float32", "uint8"] in _concatenation_input_dtypes(_case(padding="same", stride="one"))


def test_without_padding_in_time_no_concatenation_mixes_dtypes():
    for geometry in ({"padding": "valid", "stride": "one", "dilation": 2}, {"padding": "zero"}):
        assert all("float32" not in dtypes for dtypes in _concatenation_input_dtypes(_case(**geometry))), geometry


@pytest.mark.parametrize("bias", [False, True])
def test_accumulators_take_the_output_qparams_only_without_a_bias(bias):
    """Two output frames (4 frames, kernel 2 dilated by 2, no padding): without a bias each frame's accumulator
    feeds the concatenation directly and PropagateQParamBackward replaces its qparams."""
    result = run_check(_case(padding="valid", stride="one", dilation=2, bias=bias), "qparam_consistency")
    replaced = [p for p in result.problems if "accumulator_t" in p and "PropagateQParamBackward" in p]
    assert bool(replaced) is (not bias), result.problems
