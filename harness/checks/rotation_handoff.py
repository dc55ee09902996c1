"""Rotation -> wrapq handoff: the float model a rotation algorithm (SpinQuant) produced computes what
the original did, wrapq PTQ uses what the algorithm computed, and the quantized accuracy is
compared with wrapq PTQ of the original alone.

For a case whose float module is an algorithm's output (``Case.rotation_handoff``):

* **float equivalence** (gated): on every evaluation sample, the algorithm's float model (output
  mapped by ``to_original``) vs the original float model, max |diff| / max |original| over valid
  tokens <= ``max_float_rel``. A rotation is an identity in exact arithmetic; what is left is
  float32 rounding, so the limit comes from measured noise. An algorithm step left out (e.g. the
  lm-head side of a rotation) moves the output by its own magnitude.
* **computed tensors used** (gated): every parameter of the algorithm's model that the original
  does not hold unchanged (rotated projections, the rotation modules) must be held, with the same
  contents (up to a scalar a wrapper folds in, e.g. the attention scale in k_proj), by a module of
  the QUANT wrapper tree, and the wrapper around it must run a forward on the default sample. A wrapper that
  drops or bypasses an algorithm module fails here by name, even
  where the float model it wraps would hide it.
* **accuracy vs wrapq alone**: the same PTQConfig, calibration samples and public prepare /
  calibrate / convert flow on the original; SQNR of each quantized model vs the original float
  output on the default sample, and the gain (``sqnr_gain_db``, gated by ``min_sqnr_gain_db``).
  Where the case names ``claimed_sites``, the same pair with only those fake-quant sites on
  (``claimed_sqnr_gain_db``, gated by ``min_claimed_sqnr_gain_db``): the part of the model where
  the algorithm claims a lower error, apart from sites it does not touch. Limits are None by
  default: a gain is gated only where a case measured that the claim holds.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch

from harness.checks.base import EVIDENCE_DETAILS, Check, CheckResult, Metric, requires_capability
from harness.primitives.metrics import select_valid, sqnr_db


@dataclass(frozen=True)
class Settings:
    # float32 rounding of an exact identity stays far below it (numbers in docs/cases.md, "Float
    # equivalence"); a rotation left out moves the output by its own magnitude (> 0.1)
    max_float_rel: float = 1e-5
    min_sqnr_gain_db: float | None = None
    min_claimed_sqnr_gain_db: float | None = None


def _original_output(pipeline, original: torch.nn.Module, sample) -> torch.Tensor:
    case = pipeline.case
    with torch.no_grad():
        out = case.reference_call(original, sample) if case.reference_call else sample.call(original)
    return case.output(out).detach()


def _mapped(pipeline, output: torch.Tensor) -> torch.Tensor:
    handoff = pipeline.case.rotation_handoff
    if handoff.to_original is None:
        return output
    with torch.no_grad():
        return handoff.to_original(output, pipeline.built).detach()


def _computed(algorithm_model: torch.nn.Module, original: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Parameters of the algorithm's model that the original lacks or holds with other contents."""
    before = dict(original.named_parameters(remove_duplicate=False))
    out = {}
    for name, tensor in algorithm_model.named_parameters(remove_duplicate=False):
        old = before.get(name)
        if old is None or old.shape != tensor.shape or not torch.equal(old, tensor):
            out[name] = tensor.detach()
    return out


def _same_up_to_scale(held: torch.Tensor, tensor: torch.Tensor) -> float | None:
    """1.0 when ``held`` equals ``tensor``; c when it is c * ``tensor`` for a scalar c (a wrapper
    folding a scale into the weight, e.g. Llama's attention scale into k_proj); else None."""
    if held.shape != tensor.shape or held.dtype != tensor.dtype or not held.is_floating_point():
        return None
    held = held.detach()
    if torch.equal(held, tensor):
        return 1.0
    norm = float((tensor.double() ** 2).sum())
    if norm == 0.0:
        return None
    factor = float((held.double() * tensor.double()).sum()) / norm
    scaled = tensor.double() * factor
    if factor != 0.0 and torch.allclose(held.double(), scaled, rtol=1e-6, atol=1e-7 * float(scaled.abs().max())):
        return factor
    return None


def _holders(tree: torch.nn.Module, tensor: torch.Tensor) -> list[tuple[str, float]]:
    """(module path, factor) for every module of ``tree`` with a direct parameter or buffer that
    holds ``tensor``'s contents, up to a scalar factor."""
    found = []
    for path, module in tree.named_modules():
        for _, held in list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False)):
            factor = _same_up_to_scale(held, tensor)
            if factor is not None:
                found.append((path, factor))
                break
    return found


def _runner(tree: torch.nn.Module, path: str) -> tuple[str, torch.nn.Module]:
    """The wrapper that runs ``path``'s tensor: the innermost wrapq module (PTQWrapper or quant
    module) at or above it; a wrapper reads its float module's weight without calling it."""
    from tico.quantization.wrapq.wrappers.ptq_wrapper import PTQWrapper
    from tico.quantization.wrapq.wrappers.quant_module_base import QuantModuleBase

    modules = dict(tree.named_modules())
    parts = path.split(".") if path else []
    for cut in range(len(parts), -1, -1):
        prefix = ".".join(parts[:cut])
        if isinstance(modules[prefix], (PTQWrapper, QuantModuleBase)):
            return prefix, modules[prefix]
    return path, modules[path]


def _check_computed_used(pipeline, original: torch.nn.Module, result: CheckResult) -> None:
    computed = _computed(pipeline.built.module, original)
    result.metrics["computed_tensors"] = len(computed)
    if not computed:
        result.fail(
            f"the {pipeline.case.rotation_handoff.algorithm} model holds no parameter that differs from the "
            f"original's: the algorithm changed nothing"
        )
        return
    tree = copy.deepcopy(pipeline.quantized)
    holders = {name: _holders(tree, tensor) for name, tensor in computed.items()}
    runners = {name: [_runner(tree, path) for path, _ in found] for name, found in holders.items()}
    ran: set[int] = set()
    hooks = [
        module.register_forward_hook(lambda m, a, o: ran.add(id(m)))
        for found in runners.values()
        for _, module in found
    ]
    try:
        with torch.no_grad():
            pipeline.sample("default").call(tree)
    finally:
        for hook in hooks:
            hook.remove()
    used = 0
    for name, found in runners.items():
        if not found:
            result.fail(
                f"{name}: the algorithm computed it, and no module of the QUANT wrapper tree holds a tensor "
                f"with its contents (the wrapper dropped or replaced it)"
            )
        elif not any(id(module) in ran for _, module in found):
            result.fail(
                f"{name}: held under {', '.join(path or '<root>' for path, _ in found)} in the QUANT wrapper "
                f"tree, which ran no forward on the default sample (the wrapper bypasses it)"
            )
        else:
            used += 1
    result.metrics["computed_tensors_used"] = used
    result.evidence["computed"] = {
        name: [f"{path}" + ("" if factor == 1.0 else f" (x{factor:.6g}: folded)") for path, factor in found]
        for name, found in holders.items()
    }


def _wrapq_alone(pipeline, original: torch.nn.Module) -> torch.nn.Module:
    """The public PTQ flow on a copy of the original, as the pipeline runs it on the case module."""
    from tico.quantization import convert, prepare

    case = pipeline.case
    do_prepare = case.prepare or (lambda module, c: prepare(module, c, inplace=True))
    do_convert = case.convert or (lambda module: convert(module, inplace=True))
    prepared = do_prepare(copy.deepcopy(original), copy.deepcopy(pipeline.ptq_config))
    with torch.no_grad():
        for sample in pipeline.built.inputs.calibration:
            sample.call(prepared)
    return do_convert(prepared).eval()


def _sqnr_with_sites(pipeline, tree: torch.nn.Module, keep, sample, reference: torch.Tensor) -> tuple[float, int]:
    """SQNR vs ``reference`` with only the fake-quant sites ``keep(path)`` selects switched on."""
    from tico.quantization.wrapq.control import FakeQuantState

    tree = copy.deepcopy(tree)
    with FakeQuantState(tree) as state:
        state.set_all(False)
        count = state.set_where(lambda site: keep(site.path), True)
        with torch.no_grad():
            out = pipeline.case.output(sample.call(tree)).detach()
    return sqnr_db(select_valid(reference, sample.valid_tokens), select_valid(out, sample.valid_tokens)), count


def run(pipeline) -> CheckResult:
    result = CheckResult()
    th = pipeline.check_settings(CHECK)
    handoff = pipeline.case.rotation_handoff
    original = handoff.original(pipeline.built).eval()

    worst = 0.0
    for name, sample in pipeline.built.inputs.evaluation.items():
        want = _original_output(pipeline, original, sample)
        got = _mapped(pipeline, pipeline.output("reference", name))
        if got.shape != want.shape:
            result.fail(f"[{name}] {handoff.algorithm} float output {tuple(got.shape)} vs original {tuple(want.shape)}")
            continue
        want_v, got_v = select_valid(want, sample.valid_tokens), select_valid(got, sample.valid_tokens)
        if want_v.numel() == 0:
            result.fail(f"[{name}] no valid element to compare")
            continue
        rel = float((got_v - want_v).abs().max()) / max(float(want_v.abs().max()), 1e-30)
        result.metrics[f"float_rel[{name}]"] = rel
        worst = max(worst, rel)
        if not rel <= th.max_float_rel:
            result.fail(
                f"[{name}] {handoff.algorithm} float model vs the original float model: max |diff| / max "
                f"|original| {rel:.3g} > {th.max_float_rel:g} (the algorithm's transform is not an identity "
                f"in float)"
            )
    result.metrics["float_rel"] = worst

    _check_computed_used(pipeline, original, result)

    sample = pipeline.sample("default")
    reference = _original_output(pipeline, original, sample)
    alone = _wrapq_alone(pipeline, original)
    with torch.no_grad():
        alone_out = pipeline.case.output(sample.call(alone)).detach()
    ref_v = select_valid(reference, sample.valid_tokens)
    with_alg = sqnr_db(ref_v, select_valid(_mapped(pipeline, pipeline.output("quant", "default")), sample.valid_tokens))
    without = sqnr_db(ref_v, select_valid(alone_out, sample.valid_tokens))
    result.metrics.update(
        {"sqnr_db_with_algorithm": with_alg, "sqnr_db_wrapq_alone": without, "sqnr_gain_db": with_alg - without}
    )
    result.gate(
        f"SQNR gain of {handoff.algorithm} + wrapq over wrapq alone (dB)",
        with_alg - without,
        th.min_sqnr_gain_db,
        upper=False,
    )
    if handoff.claimed_sites is not None:
        if handoff.to_original is not None:
            result.fail("claimed_sites needs outputs in one basis: to_original must be None")
            return result
        claimed_with, n_with = _sqnr_with_sites(pipeline, pipeline.quantized, handoff.claimed_sites, sample, reference)
        claimed_without, n_without = _sqnr_with_sites(pipeline, alone, handoff.claimed_sites, sample, reference)
        if n_with == 0 or n_without == 0:
            result.fail(
                f"claimed_sites selects {n_with} site(s) of the {handoff.algorithm} model and {n_without} of "
                f"wrapq alone: nothing to compare"
            )
        else:
            gain = claimed_with - claimed_without
            result.metrics.update(
                {
                    "claimed_sqnr_db": claimed_with,
                    "claimed_sqnr_db_wrapq_alone": claimed_without,
                    "claimed_sqnr_gain_db": gain,
                    "claimed_sites": n_with,
                }
            )
            result.gate(
                f"SQNR gain on the claimed sites only ({n_with} sites, dB)",
                gain,
                th.min_claimed_sqnr_gain_db,
                upper=False,
            )
    result.notes.append(
        f"{handoff.algorithm} + wrapq SQNR {with_alg:.4g} dB vs wrapq alone {without:.4g} dB"
        + ("" if math.isfinite(with_alg - without) else " (an exact output)")
    )
    return result


CHECK = Check(
    name="rotation_handoff",
    run=run,
    description=__doc__.splitlines()[0],
    applies=requires_capability("rotation_handoff"),
    settings=Settings,
    report=EVIDENCE_DETAILS,
    metrics=(
        Metric("float_rel", label="alg. float rel", limit="max_float_rel"),
        Metric(
            "sqnr_gain_db", better="higher", unit="dB", label="alg. SQNR gain", limit="min_sqnr_gain_db", headline=True
        ),
        Metric(
            "claimed_sqnr_gain_db",
            better="higher",
            unit="dB",
            label="claimed-site gain",
            limit="min_claimed_sqnr_gain_db",
        ),
        Metric("sqnr_db_with_algorithm", better="higher", unit="dB", label="alg. + wrapq SQNR"),
        Metric("sqnr_db_wrapq_alone", better=None, unit="dB", label="wrapq-alone SQNR"),
        Metric("computed_tensors", better=None, label="computed tensors"),
    ),
)
