"""The export adapter's contract: refused outside NO_QUANT/QUANT (here: CALIB) with a clear
error, an unsupported export mode raises, inputs contradicting the fixed profile are
rejected, and the traced program has no data-dependent guards left."""

import copy
import re

import torch

from harness.checks.base import Check, CheckResult, requires_capability
from harness.model.expectations import Expected
from harness.primitives.lifecycle_ops import enable_calibration

CALIB_MODE_PROBLEM = "export adapter was built in CALIB mode; it must be refused outside NO_QUANT/QUANT"


def calib_mode_adapter(reason: str) -> Expected:
    """The precise expectation for an adapter factory that accepts CALIB mode (and nothing else)."""
    return Expected(reason, problems=("^" + re.escape(CALIB_MODE_PROBLEM) + "$",))


def _raises(fn) -> str | None:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - any clear refusal counts
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return None


def run(pipeline) -> CheckResult:
    result = CheckResult()
    export = pipeline.case.export
    name = pipeline.export_sample_name
    sample, built = pipeline.sample(name), pipeline.built

    if export.refuses_calib:
        calib = copy.deepcopy(pipeline.wrapped)
        enable_calibration(calib)
        refusal = _raises(lambda: export.adapter(calib, sample, built))
        result.evidence["calib_mode"] = refusal
        if refusal is None:
            result.fail(CALIB_MODE_PROBLEM)
    else:
        result.notes.append("CALIB refusal not probed: the case exports the module itself, without an adapter factory")

    if export.unsupported_mode is None:
        result.notes.append("unsupported export mode not probed: the case gives no unsupported_mode probe")
    else:
        refusal = _raises(lambda: export.unsupported_mode(copy.deepcopy(pipeline.quantized), sample, built))
        result.evidence["unsupported_mode"] = refusal
        if refusal is None:
            result.fail("asking for an unsupported export mode did not raise")

    if export.contradicting_args is None:
        result.notes.append("contradicting inputs not probed: the case gives no contradicting_args probe")
    else:
        adapter = pipeline.export_adapter("quant", name)
        bad_args = export.contradicting_args(sample, built)
        refusal = _raises(lambda: adapter(*bad_args))
        result.evidence["contradicting_inputs"] = refusal
        if refusal is None:
            shapes = [tuple(a.shape) for a in bad_args if isinstance(a, torch.Tensor)]
            result.fail(f"the export adapter accepted inputs {shapes} that contradict its fixed profile")

    record = pipeline.export_record
    result.evidence["export_cache"] = record.status
    guards = record.value_guards
    result.metrics["value_guards"] = len(guards)
    if guards:
        result.fail(f"the exported program still depends on input values: {guards[:5]}")
    symbolic = record.symbolic_shapes
    if symbolic:
        result.fail(f"the exported program has symbolic shapes {symbolic[:5]}: the adapter is not fully static")
    return result


CHECK = Check(
    name="export_contract", run=run, applies=requires_capability("export"), description=__doc__.splitlines()[0]
)
