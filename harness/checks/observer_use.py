"""Every observer of the wrapper tree collects at least once in CALIB mode on the case's
calibration inputs, and every calibrated observer is applied (its fake-quant runs) in QUANT
mode on the evaluation input. The inventory is reported; unused-by-design observers need a
reason in the case, and a declared observer count is enforced."""

import copy
import fnmatch

import torch

from harness.checks.base import Check, CheckResult
from harness.pipeline import unwrap


def _instrument(root, method: str) -> dict[str, int]:
    """Count calls of ``method`` per observer path by shadowing it on each (private) instance."""
    from tico.quantization.wrapq.observers.base import ObserverBase

    counts: dict[str, int] = {}
    for path, obs in root.named_modules():
        if isinstance(obs, ObserverBase):
            counts[path] = 0
            original = getattr(obs, method)

            def counting(*args, _orig=original, _path=path, **kwargs):
                counts[_path] += 1
                return _orig(*args, **kwargs)

            setattr(obs, method, counting)
    return counts


def run(pipeline) -> CheckResult:
    result = CheckResult()
    case = pipeline.case
    root = copy.deepcopy(pipeline.wrapped)
    # Instrument first: some wrappers feed weight observers inside enable_calibration().
    collected = _instrument(unwrap(root), "collect")
    root.enable_calibration()
    with torch.no_grad():
        for sample in pipeline.built.inputs.calibration:
            sample.call(root)
    root.freeze_qparams()
    applied = _instrument(unwrap(root), "fake_quant")
    with torch.no_grad():
        pipeline.built.inputs.evaluation["default"].call(root)

    def reason(path: str) -> str | None:
        return next((why for pattern, why in case.unused_observers.items() if fnmatch.fnmatchcase(path, pattern)), None)

    never_fed = [p for p, n in collected.items() if n == 0]
    never_applied = [p for p, n in applied.items() if n == 0 and collected.get(p, 0) > 0]
    for path in never_fed:
        if not reason(path):
            result.fail(f"observer {path} never collected in CALIB mode on {len(pipeline.built.inputs.calibration)} calibration samples")
    for path in never_applied:
        if not reason(path):
            result.fail(f"observer {path} was calibrated but its fake-quant never ran in QUANT mode")
    result.metrics.update({"observers": len(collected), "never_fed": len(never_fed), "never_applied": len(never_applied)})
    result.evidence.update({"inventory": sorted(collected), "never_fed": never_fed, "never_applied": never_applied,
                            "collect_calls": collected, "fake_quant_calls": applied})
    expected = case.expected_observer_count
    if expected is not None and expected != len(collected):
        result.fail(f"wrapper tree holds {len(collected)} observers, the case expects {expected}")
    return result


CHECK = Check(name="observer_use", run=run, description=__doc__.splitlines()[0])
