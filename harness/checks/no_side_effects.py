"""Wrapping leaves the float module alone -- its parameters, buffers and forward output are
what they were before -- and adds no trainable parameters of its own (new or copied)."""

import copy

import torch

from harness.checks.base import Check, CheckResult
from harness.pipeline import wrap_noquant


def run(pipeline) -> CheckResult:
    result = CheckResult()
    fp = copy.deepcopy(pipeline.built.module)
    # Keyed by the tensor objects themselves: custom wrapping may re-parent children, but the
    # float module's own tensors must keep their values.
    named = dict(fp.named_parameters(remove_duplicate=True))
    named.update(dict(fp.named_buffers()))
    originals = {name: (t, t.detach().clone()) for name, t in named.items()}
    sample = pipeline.built.inputs.evaluation["default"]
    # The float module is called the way the case calls its HF reference.
    call = pipeline.case.reference_call or (lambda module, s: s.call(module))
    with torch.no_grad():
        out_before = pipeline.case.output(call(fp, sample)).clone()
    fp_param_ids = {id(p) for p in fp.parameters()}
    wrapped = wrap_noquant(pipeline.case, fp, pipeline.ptq_config)
    diffs = {name: float((now.detach().float() - was.float()).abs().max())
             for name, (now, was) in originals.items() if now.shape != was.shape or not torch.equal(now, was)}
    result.metrics["float_tensors_changed"] = len(diffs)
    if diffs:
        result.evidence["changed"] = diffs
        result.fail(f"wrapping modified {len(diffs)} tensors of the float module in place, e.g. "
                    + ", ".join(f"{k} (max |diff| {d:.3g})" for k, d in list(diffs.items())[:3]))
    if pipeline.case.wrap is None:
        with torch.no_grad():
            out_after = pipeline.case.output(call(fp, sample))
        if not torch.equal(out_before, out_after):
            result.fail(f"the float module's own output changed after wrapping (max |diff| "
                        f"{float((out_before - out_after).abs().max()):.3g})")
    else:
        result.notes.append("output not re-run: the case wraps children in place, so the root now runs the wrappers")
    extra = [n for n, p in wrapped.named_parameters() if id(p) not in fp_param_ids and p.requires_grad]
    result.metrics["trainable_parameters_added"] = len(extra)
    if extra:
        result.fail(f"the wrapper holds {len(extra)} trainable parameters that are not the float module's: {extra[:5]}")
    return result


CHECK = Check(name="no_side_effects", run=run, description=__doc__.splitlines()[0])
