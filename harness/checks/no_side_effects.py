"""Wrapping leaves the float module alone -- its parameters, buffers and forward output are
what they were before -- and adds no trainable parameters of its own (new or copied)."""

import copy

import torch

from harness.checks.base import Check, CheckResult


def run(pipeline) -> CheckResult:
    from tico.quantization.wrapq.wrap_helper import PTQWrapHelper

    result = CheckResult()
    fp = copy.deepcopy(pipeline.built.module)
    before = {k: v.detach().clone() for k, v in fp.state_dict().items()}
    sample = pipeline.built.inputs.evaluation["default"]
    with torch.no_grad():
        out_before = pipeline.case.output(sample.call(fp)).clone()
    fp_param_ids = {id(p) for p in fp.parameters()}
    cfg = pipeline.ptq_config
    wrapped = PTQWrapHelper(strict_wrap=bool(getattr(cfg, "strict_wrap", True))).wrap_supported(fp, cfg)
    after = fp.state_dict()
    changed = [k for k, v in before.items() if k not in after or not torch.equal(v, after[k])]
    result.metrics["float_tensors_changed"] = len(changed)
    if changed:
        diffs = {k: float((before[k].float() - after[k].float()).abs().max()) for k in changed if k in after}
        result.evidence["changed"] = diffs
        result.fail(f"wrapping modified {len(changed)} tensors of the float module in place, e.g. "
                    + ", ".join(f"{k} (max |diff| {d:.3g})" for k, d in list(diffs.items())[:3]))
    with torch.no_grad():
        out_after = pipeline.case.output(sample.call(fp))
    if not torch.equal(out_before, out_after):
        result.fail(f"the float module's own output changed after wrapping (max |diff| "
                    f"{float((out_before - out_after).abs().max()):.3g})")
    extra = [n for n, p in wrapped.named_parameters() if id(p) not in fp_param_ids and p.requires_grad]
    result.metrics["trainable_parameters_added"] = len(extra)
    if extra:
        result.fail(f"the wrapper holds {len(extra)} trainable parameters that are not the float module's: {extra[:5]}")
    return result


CHECK = Check(name="no_side_effects", run=run, description=__doc__.splitlines()[0])
