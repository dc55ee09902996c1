"""Every observer of the wrapper tree is fed statistics at least once during calibration
(enable_calibration, the case's calibration inputs, freeze_qparams), and every calibrated observer is applied
(its fake-quant runs) in QUANT
mode on the evaluation input. The inventory is reported; unused-by-design observers need a
reason in the case, and a declared observer count is enforced."""

import copy
import fnmatch
from contextlib import contextmanager
from typing import Iterator

import torch

from harness.checks.base import Check, CheckResult
from harness.primitives.lifecycle_ops import enable_calibration, freeze_qparams, unwrap, wrap_noquant


@contextmanager
def _counting(root, method: str) -> Iterator[dict[int, int]]:
    """Count calls of ``method`` per observer object, patched on the defining classes so that
    observers a wrapper (re)creates during calibration are counted too; restored on exit."""
    from tico.quantization.wrapq.observers.base import ObserverBase

    counts: dict[int, int] = {}
    owners = set()
    for module in root.modules():
        if isinstance(module, ObserverBase):
            owners.add(next(c for c in type(module).__mro__ if method in c.__dict__))
    originals = {owner: owner.__dict__[method] for owner in owners}

    def patched(original):
        def counting(self, *args, **kwargs):
            counts[id(self)] = counts.get(id(self), 0) + 1
            return original(self, *args, **kwargs)

        return counting

    try:
        for owner, original in originals.items():
            setattr(owner, method, patched(original))
        yield counts
    finally:
        for owner, original in originals.items():
            setattr(owner, method, original)


def _by_path(root, counts: dict[int, int]) -> dict[str, int]:
    """Feed / use counts per observer path; an IdentityObserver keeps its value float by policy and
    collects nothing by design, so it is not counted as an observer that should be fed."""
    from tico.quantization.wrapq.observers.base import ObserverBase
    from tico.quantization.wrapq.observers.identity import IdentityObserver

    return {
        path: counts.get(id(m), 0)
        for path, m in root.named_modules()
        if isinstance(m, ObserverBase) and not isinstance(m, IdentityObserver)
    }


def run(pipeline) -> CheckResult:
    result = CheckResult()
    case = pipeline.case
    # A fresh tree of what the case quantizes (an algorithm may change the float modules' kinds): the
    # shared NO_QUANT one may already have run forwards (lazy wrappers).
    root = wrap_noquant(case, copy.deepcopy(pipeline.float_module), pipeline.ptq_config)
    # Count from before enable_calibration (some wrappers feed weight observers there) to
    # after freeze_qparams; _update_stats is where every feeding path ends.
    with _counting(root, "_update_stats") as fed:
        enable_calibration(root)
        with torch.no_grad():
            for sample in pipeline.built.inputs.calibration:
                try:
                    sample.call(root)
                except Exception as exc:  # noqa: BLE001 - a wrapper that cannot run is what this reports
                    first = (str(exc).strip().splitlines() or [""])[0]
                    result.fail(f"a calibration forward raised {type(exc).__name__}: {first}")
                    return result
        freeze_qparams(root)
    collected = _by_path(unwrap(root), fed)
    with _counting(root, "fake_quant") as used, torch.no_grad():
        pipeline.built.inputs.evaluation["default"].call(root)
    applied = _by_path(unwrap(root), used)

    allowlist = case.unused_observers_for(pipeline.profile)

    def reason(path: str) -> str | None:
        return next((why for pattern, why in allowlist.items() if fnmatch.fnmatchcase(path, pattern)), None)

    never_fed = [p for p, n in collected.items() if n == 0]
    never_applied = [p for p, n in applied.items() if n == 0 and collected.get(p, 0) > 0]
    for path in never_fed:
        if not reason(path):
            result.fail(
                f"observer {path} was never fed statistics during calibration "
                f"({len(pipeline.built.inputs.calibration)} calibration samples)"
            )
    for path in never_applied:
        if not reason(path):
            result.fail(f"observer {path} was calibrated but its fake-quant never ran in QUANT mode")
    if not collected:
        result.fail("no observer found in the wrapper tree: nothing was calibrated or applied")
    excused = set(never_fed) | set(never_applied)
    for pattern in allowlist:
        covered = [p for p in collected if fnmatch.fnmatchcase(p, pattern)]
        if not covered:
            result.fail(f"unused_observers entry {pattern!r} matches no observer (stale allowlist)")
        elif not excused.intersection(covered):
            result.fail(
                f"unused_observers entry {pattern!r}: every observer it covers ({', '.join(covered[:4])}"
                f"{', ...' if len(covered) > 4 else ''}) is fed and applied now (stale allowlist)"
            )
    result.metrics.update(
        {"observers": len(collected), "never_fed": len(never_fed), "never_applied": len(never_applied)}
    )
    result.evidence.update(
        {
            "inventory": sorted(collected),
            "never_fed": never_fed,
            "never_applied": never_applied,
            "collect_calls": collected,
            "fake_quant_calls": applied,
        }
    )
    expected = case.expected_observer_count
    if expected is not None and expected != len(collected):
        result.fail(f"wrapper tree holds {len(collected)} observers, the case expects {expected}")
    return result


CHECK = Check(name="observer_use", run=run, description=__doc__.splitlines()[0])
