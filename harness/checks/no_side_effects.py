"""Wrapping leaves the float module alone -- its parameters, buffers and forward output are
what they were before -- and the wrapper tree holds no duplicate of a tensor it also keeps.

Derived from tico's design rather than from "no new parameters": folding the attention scale
into a projection (Llama k_proj, Qwen3-VL qkv and k_norm) or linearising a Conv3d patch
embedding needs new tensors by design, so new parameters are reported (count and names), not
failed. What must never happen: the float module changed in place, its output changed, or the
wrapper keeping two tensors with the same contents (a copy beside the original: memory paid
twice, and two tensors that can drift apart)."""

import copy

import torch

from harness.checks.base import Check, CheckResult
from harness.primitives.lifecycle_ops import wrap_noquant

# Tensors smaller than this, or constant ones (e.g. an all-ones norm weight), can coincide by
# value without being copies of each other.
MIN_COPY_ELEMENTS = 64


def _content_key(t: torch.Tensor) -> tuple | None:
    if not t.is_floating_point() or t.numel() < MIN_COPY_ELEMENTS:
        return None
    flat = t.detach().reshape(-1)
    if bool((flat == flat[0]).all()):
        return None
    return (t.dtype, t.numel(), float(flat.double().sum()), float(flat.double().abs().sum()))


def _duplicates(root: torch.nn.Module) -> list[tuple[str, str]]:
    """(copy, original) name pairs of distinct tensors in the tree with equal contents."""
    seen: dict[tuple, list[tuple[str, torch.Tensor]]] = {}
    storages: set[int] = set()
    pairs = []
    tensors = list(root.named_parameters(remove_duplicate=True)) + list(root.named_buffers(remove_duplicate=True))
    for name, tensor in tensors:
        ptr = tensor.untyped_storage().data_ptr()
        if ptr in storages:
            continue  # shared storage (a view or a tie) costs nothing
        storages.add(ptr)
        key = _content_key(tensor)
        if key is None:
            continue
        for other_name, other in seen.get(key, []):
            if torch.equal(other.detach().reshape(-1), tensor.detach().reshape(-1)):
                pairs.append((name, other_name))
                break
        seen.setdefault(key, []).append((name, tensor))
    return pairs


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
    diffs = {
        name: float((now.detach().float() - was.float()).abs().max())
        for name, (now, was) in originals.items()
        if now.shape != was.shape or not torch.equal(now, was)
    }
    result.metrics["float_tensors_changed"] = len(diffs)
    if diffs:
        result.evidence["changed"] = diffs
        result.fail(
            f"wrapping modified {len(diffs)} tensors of the float module in place, e.g. "
            + ", ".join(f"{k} (max |diff| {d:.3g})" for k, d in list(diffs.items())[:3])
        )
    if pipeline.case.wrap is None:
        with torch.no_grad():
            out_after = pipeline.case.output(call(fp, sample))
        if not torch.equal(out_before, out_after):
            result.fail(
                f"the float module's own output changed after wrapping (max |diff| "
                f"{float((out_before - out_after).abs().max()):.3g})"
            )
    else:
        result.notes.append("output not re-run: the case wraps children in place, so the root now runs the wrappers")
    new = [n for n, p in wrapped.named_parameters() if id(p) not in fp_param_ids]
    result.metrics["parameters_added"] = len(new)
    result.metrics["trainable_parameters_added"] = sum(
        1 for n, p in wrapped.named_parameters() if id(p) not in fp_param_ids and p.requires_grad
    )
    result.evidence["parameters_added"] = new
    if new:
        result.notes.append(
            f"the wrapper creates {len(new)} parameters of its own (e.g. folded or reshaped weights): {new[:5]}"
        )
    duplicates = _duplicates(wrapped)
    result.metrics["duplicate_tensors"] = len(duplicates)
    result.evidence["duplicates"] = [{"copy": c, "original": o} for c, o in duplicates]
    for copy_name, original in duplicates:
        result.fail(
            f"the wrapper tree holds {copy_name}, a copy of {original} with the same contents (memory held twice)"
        )
    return result


CHECK = Check(name="no_side_effects", run=run, description=__doc__.splitlines()[0])
