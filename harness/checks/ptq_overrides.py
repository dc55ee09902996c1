"""A per-observer override in the PTQConfig is honoured: forcing one root observer to int16
changes that observer's dtype and qparams, and no other observer's qparams."""

import copy

import torch

from harness.checks.base import Check, CheckResult
from harness.pipeline import unwrap


def _qparams(root) -> dict[str, tuple]:
    from tico.quantization.wrapq.observers.base import ObserverBase

    out = {}
    for path, obs in unwrap(root).named_modules():
        if isinstance(obs, ObserverBase):
            scale, zp = getattr(obs, "_cached_scale", None), getattr(obs, "_cached_zp", None)
            out[path] = (str(obs.dtype), scale.clone() if isinstance(scale, torch.Tensor) else None,
                         zp.clone() if isinstance(zp, torch.Tensor) else None)
    return out


def _same(a: tuple, b: tuple) -> bool:
    return a[0] == b[0] and all(
        (x is None and y is None) or (x is not None and y is not None and x.shape == y.shape and torch.equal(x, y))
        for x, y in zip(a[1:], b[1:])
    )


def run(pipeline) -> CheckResult:
    from tico.quantization import convert, prepare
    from tico.quantization.wrapq.dtypes import INT16

    result = CheckResult()
    baseline = _qparams(pipeline.quantized)
    own = [obs for obs in unwrap(pipeline.quantized)._all_observers() if str(obs.dtype) != str(INT16)]
    if not own:
        result.fail("the root wrapper owns no observer to override")
        return result
    target = own[-1]
    path = next(p for p, m in unwrap(pipeline.quantized).named_modules() if m is target)
    cfg = copy.deepcopy(pipeline.ptq_config)
    overrides = dict(cfg.overrides)
    overrides[target.name] = dict(overrides.get(target.name, {}), dtype=INT16)
    cfg.overrides = overrides
    cfg.normalize_overrides()
    case = pipeline.case
    model = (case.prepare or (lambda m, c: prepare(m, c, inplace=True)))(copy.deepcopy(pipeline.built.module), cfg)
    with torch.no_grad():
        for sample in pipeline.built.inputs.calibration:
            sample.call(model)
    model = (case.convert or (lambda m: convert(m, inplace=True)))(model)
    after = _qparams(model)
    result.evidence.update({"overridden": path, "override": {target.name: "int16"}})
    if str(after[path][0]) != str(INT16):
        result.fail(f"override {target.name} -> int16 ignored: observer {path} is {after[path][0]}")
    elif _same(after[path], baseline[path]):
        result.fail(f"observer {path} became int16 but its qparams did not change")
    changed = [p for p in baseline if p != path and p in after and not _same(baseline[p], after[p])]
    if changed:
        result.fail(f"overriding {target.name} also changed {len(changed)} other observers, e.g. {changed[:3]}")
    result.metrics["other_observers_changed"] = len(changed)
    return result


CHECK = Check(name="ptq_overrides", run=run, description=__doc__.splitlines()[0])
