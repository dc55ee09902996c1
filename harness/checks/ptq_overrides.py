"""A per-observer override in the PTQConfig is honoured: forcing one observer (the root's own,
else a child wrapper's) to int16 (uint8 when it already is int16) changes that observer's
dtype and qparams, and no other observer's qparams."""

import copy

import torch

from harness.checks.base import Check, CheckResult
from harness.primitives.lifecycle_ops import unwrap


def _qparams(root) -> dict[str, tuple]:
    from tico.quantization.wrapq.observers.base import ObserverBase

    out = {}
    for path, obs in unwrap(root).named_modules():
        if isinstance(obs, ObserverBase):
            scale, zp = getattr(obs, "_cached_scale", None), getattr(obs, "_cached_zp", None)
            out[path] = (
                str(obs.dtype),
                scale.clone() if isinstance(scale, torch.Tensor) else None,
                zp.clone() if isinstance(zp, torch.Tensor) else None,
            )
    return out


def _same(a: tuple, b: tuple) -> bool:
    return a[0] == b[0] and all(
        (x is None and y is None) or (x is not None and y is not None and x.shape == y.shape and torch.equal(x, y))
        for x, y in zip(a[1:], b[1:])
    )


def _override_target(root) -> tuple[str, list[str], object] | None:
    """(observer path, config scope, observer) to override: a root-owned observer when the
    root has one, else the first observer of the first child wrapper."""
    from tico.quantization.wrapq.observers.base import ObserverBase

    own = list(root._all_observers())
    if own:
        obs = own[-1]
        return next(p for p, m in root.named_modules() if m is obs), [], obs
    for path, module in root.named_modules():
        if isinstance(module, ObserverBase):
            scope = [part for part in path.split(".")[:-1] if part != "wrapped"]
            return path, scope, module
    return None


def run(pipeline) -> CheckResult:
    from tico.quantization.wrapq.dtypes import INT16, UINT8

    result = CheckResult()
    baseline = _qparams(pipeline.quantized)
    found = _override_target(unwrap(pipeline.quantized))
    if found is None:
        result.fail("the wrapper tree has no observer to override")
        return result
    path, scope, target = found
    new_dtype = UINT8 if str(target.dtype) == str(INT16) else INT16
    cfg = copy.deepcopy(pipeline.ptq_config)
    overrides = copy.deepcopy(dict(cfg.overrides))
    node = overrides
    for part in scope:
        node = node.setdefault(part, {})
    # Only the dtype changes: an existing override's qscheme was resolved for the old dtype (an int16
    # override carries PER_TENSOR_SYMM, which tico refuses for uint8), so tico resolves it anew.
    kept = {k: v for k, v in node.get(target.name, {}).items() if k != "qscheme"}
    node[target.name] = dict(kept, dtype=new_dtype)
    cfg.overrides = overrides
    cfg.normalize_overrides()
    # the case's whole flow (its algorithm and handoff included) with the overridden config
    model = pipeline.ptq_flow(cfg)
    after = _qparams(model)
    label = ".".join(scope + [target.name])
    result.evidence.update({"overridden": path, "override": {label: str(new_dtype)}})
    if str(after[path][0]) != str(new_dtype):
        result.fail(f"override {label} -> {new_dtype} ignored: observer {path} is {after[path][0]}")
    elif _same(after[path], baseline[path]):
        result.fail(f"observer {path} became {new_dtype} but its qparams did not change")
    changed = [p for p in baseline if p != path and p in after and not _same(baseline[p], after[p])]
    if changed:
        result.fail(f"overriding {label} also changed {len(changed)} other observers, e.g. {changed[:3]}")
    result.metrics["other_observers_changed"] = len(changed)
    return result


CHECK = Check(name="ptq_overrides", run=run, description=__doc__.splitlines()[0])
