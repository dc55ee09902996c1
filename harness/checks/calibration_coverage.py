"""After calibration every observer in the wrapper tree -- found by walking all modules, not
only a wrapper's own list -- was fed data and holds usable qparams (finite, non-zero scale).
An observer that never saw data still reports has_qparams (scale ~1e-8), so min/max must be
finite too. Observers unused by design are listed in the case with a reason."""

import fnmatch

import torch

from harness.checks.base import EVIDENCE_DETAILS, Check, CheckResult
from harness.primitives.lifecycle_ops import unwrap


def _observer_problem(obs) -> str | None:
    if hasattr(obs, "min_val") and hasattr(obs, "max_val"):
        lo, hi = obs.min_val, obs.max_val
        if not (torch.isfinite(lo).all() and torch.isfinite(hi).all()):
            return "never fed: observed min/max are not finite"
    if hasattr(obs, "has_qparams") and not obs.has_qparams:
        return "has no qparams after convert"
    scale = getattr(obs, "_cached_scale", None)
    if isinstance(scale, torch.Tensor) and scale.numel():
        if not torch.isfinite(scale).all():
            return "scale is NaN or infinite"
        if (scale <= 0).any():
            return f"scale is zero or negative (min {float(scale.min()):.3g})"
    return None


def run(pipeline) -> CheckResult:
    from tico.quantization.wrapq.observers.base import ObserverBase
    from tico.quantization.wrapq.observers.identity import IdentityObserver

    result = CheckResult()
    root = unwrap(pipeline.quantized)
    unused = pipeline.case.unused_observers_for(pipeline.profile)
    inventory, allowed, float_by_policy = [], [], []
    for path, module in root.named_modules():
        if not isinstance(module, ObserverBase):
            continue
        inventory.append(path)
        if isinstance(module, IdentityObserver):
            float_by_policy.append(path)  # collects nothing by design: the value stays float
            continue
        problem = _observer_problem(module)
        if problem is None:
            continue
        reason = next((why for pattern, why in unused.items() if fnmatch.fnmatchcase(path, pattern)), None)
        if reason:
            allowed.append({"observer": path, "problem": problem, "allowed_because": reason})
        else:
            result.fail(f"observer {path} ({type(module).__name__}): {problem}")
    if not inventory:
        result.fail("no observer found in the wrapper tree")
    for pattern in unused:
        if not any(fnmatch.fnmatchcase(path, pattern) for path in inventory):
            result.fail(f"unused_observers entry {pattern!r} matches no observer of the wrapper tree (stale allowlist)")
    if float_by_policy:
        result.notes.append(
            f"{len(float_by_policy)} IdentityObserver(s) keep their value float by policy: "
            f"{', '.join(float_by_policy[:4])}{', ...' if len(float_by_policy) > 4 else ''}"
        )
    result.metrics.update(
        {"observers": len(inventory), "unused_allowlisted": len(allowed), "float_by_policy": len(float_by_policy)}
    )
    result.evidence.update({"observers": inventory, "allowlisted": allowed})
    return result


CHECK = Check(name="calibration_coverage", run=run, description=__doc__.splitlines()[0], report=EVIDENCE_DETAILS)
