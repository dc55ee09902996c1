"""The tests' in-process pipelines share a program or a conversion only with the same execution and the
same code (tests/stage_sharing.py): what is shared equals what a fresh trace and conversion give, and a
wrapper or a pass patched in memory is traced or converted again, giving what sharing-off gives."""

from __future__ import annotations

import pytest

from cases.nn import CASES as NN_CASES
from harness.pipeline import Pipeline, StageError
from tests import stage_sharing
from tests.pass_defects import serialize_zero_points_off_by_one

LINEAR = next(c for c in NN_CASES if c.name == "nn_linear")


@pytest.fixture
def shared():
    """Sharing on (whatever WRAPQ_TESTS_FRESH_STAGES says), counted from nothing kept."""
    with stage_sharing.routed(shared=True):
        stage_sharing.clear()
        yield stage_sharing.served
        stage_sharing.clear()


def test_a_second_pipeline_of_a_case_is_served_an_equal_private_copy(shared):
    first, second = Pipeline(LINEAR, "tiny"), Pipeline(LINEAR, "tiny")
    one, two = first.circle, second.circle
    assert shared == {"export miss": 1, "export hit": 1, "convert miss": 1, "convert hit": 1}
    assert (two.binary, two.audit) == (one.binary, one.audit)
    assert second.exported_program is not first.exported_program
    assert str(second.exported_program.graph) == str(first.exported_program.graph)
    two.audit.applied.clear()  # a private copy: nothing the second pipeline does reaches the first's
    assert one.audit.applied and Pipeline(LINEAR, "tiny").circle.audit == one.audit
    with stage_sharing.routed(shared=False):
        cold = Pipeline(LINEAR, "tiny").circle
    assert (cold.binary, cold.audit) == (one.binary, one.audit)


def test_a_patched_serializer_is_converted_again_as_without_sharing(shared, monkeypatch):
    clean = Pipeline(LINEAR, "tiny").circle
    serialize_zero_points_off_by_one(monkeypatch)
    patched = Pipeline(LINEAR, "tiny").circle
    # the export does not run the serializer: its program is shared; the conversion is not
    assert shared == {"export miss": 1, "export hit": 1, "convert miss": 2}
    with stage_sharing.routed(shared=False):
        cold = Pipeline(LINEAR, "tiny").circle
    assert patched.binary == cold.binary != clean.binary


def test_a_patched_wrapper_forward_is_traced_again(shared, monkeypatch):
    from tico.quantization.wrapq.wrappers.nn.quant_linear import QuantLinear

    clean = Pipeline(LINEAR, "tiny").exported_program
    original = QuantLinear.forward

    def doubled_input(self, x):
        return original(self, x * 2)

    monkeypatch.setattr(QuantLinear, "forward", doubled_input)
    patched = Pipeline(LINEAR, "tiny").exported_program
    assert shared == {"export miss": 2}
    assert "mul" in str(patched.graph) and "mul" not in str(clean.graph)


def test_a_failed_conversion_is_never_kept(shared, monkeypatch):
    from tico.quantization.passes.fold_quant_ops import FoldQuantOps

    original = FoldQuantOps.call
    monkeypatch.setattr(FoldQuantOps, "call", lambda self, ep: (_ for _ in ()).throw(RuntimeError("injected")))
    for _ in range(2):
        with pytest.raises(StageError, match="injected"):
            _ = Pipeline(LINEAR, "tiny").circle
    monkeypatch.setattr(FoldQuantOps, "call", original)
    assert Pipeline(LINEAR, "tiny").circle.binary
    assert shared == {"export miss": 1, "export hit": 2, "convert miss": 3}
