"""What a PTQ algorithm run before wrapq computed is what the wrappers and the Circle model use.

For every tensor in the case's algorithm record (harness/model/algorithm.py), by fp_name: the wrapper
holding that module carries the algorithm's weight (SmoothQuant: the norm weights divided and
the linear weights multiplied by the smoothing scales, recomputed here from the calibration
statistics; GPTQ: its output weights), up to a uniform factor the wrapper folds itself (the
Llama attention scale in k_proj), reported. Where the algorithm quantized the weight (GPTQ),
the weight observer applies the algorithm's per-channel scale (times that factor) and zero
point in QUANT and its fake-quant reproduces the algorithm's integer codes. Where the case
exports, the Circle model holds a constant with exactly those codes and qparams. A wrapper that
recomputes weight qparams from min/max, or weights the algorithm left unsmoothed, fail here
even when the output stays close enough to pass quant_accuracy. For GPTQ the key table the handoff
recorded (harness/primitives/gptq_match.py) must show the quantizers found where tico's PTQ stage
looks and every key matched by a wrapper's fp_name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from harness.checks.base import EVIDENCE_DETAILS, Check, CheckResult, Metric, requires_capability
from harness.primitives import gptq_match

# Weights reach the wrapper tree by copy (bitwise); a fold or the harness's own smoothing
# arithmetic may differ by float32 rounding: a few ulp of the largest element.
WEIGHT_REL_EQUAL = 1e-6
# The scale a folded wrapper applies is the algorithm's times the fold factor, in float32.
SCALE_REL_EQUAL = 1e-6


@dataclass(frozen=True)
class Settings:
    # 0: every integer code of every handed-over weight must be the algorithm's
    max_code_mismatches: int = 0


def _wrapper_modules(root: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """fp_name -> the innermost quant module of that name that owns the float module's weight."""
    from tico.quantization.wrapq.wrappers.quant_module_base import QuantModuleBase

    found: dict[str, torch.nn.Module] = {}
    for module in root.modules():
        name = getattr(module, "fp_name", None)
        if (
            isinstance(module, QuantModuleBase)
            and name
            and isinstance(getattr(getattr(module, "module", None), "weight", None), torch.Tensor)
        ):
            found[name] = module
    return found


def _fold_factors(weight: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """Per output channel, the factor between the wrapper's weight and the algorithm's (1 where
    the wrapper folded nothing): a wrapper may fold a constant into some rows (an attention scale
    into k_proj, or into the K rows of a fused qkv)."""
    w, e = weight.double().reshape(weight.shape[0], -1), expected.double().reshape(weight.shape[0], -1)
    denominator = (e * e).sum(dim=1)
    return torch.where(
        denominator > 0, (w * e).sum(dim=1) / denominator.clamp(min=1e-300), torch.ones_like(denominator)
    )


def _broadcast(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    values = values.reshape(-1)
    if values.numel() == 1:
        return values.reshape((1,) * like.dim())
    return values.reshape((-1,) + (1,) * (like.dim() - 1))


def _codes(weight: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, qmin: int, qmax: int) -> torch.Tensor:
    return (torch.round(weight / _broadcast(scale, weight)) + _broadcast(zero_point, weight)).clamp(qmin, qmax)


def _kernel_codes(
    weight: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, qmin: int, qmax: int
) -> torch.Tensor:
    """The codes torch's fake-quant kernel gives ``weight`` under these qparams (per output channel, or
    per tensor): the kernel multiplies by the reciprocal scale, so near-ties round as QUANT mode rounds
    them, which ``_codes``' division does not always reproduce on millions of elements."""
    if scale.numel() == 1:
        fake = torch.fake_quantize_per_tensor_affine(
            weight, scale.reshape(()).float(), zero_point.reshape(()).to(torch.int32), qmin, qmax
        )
    else:
        fake = torch.fake_quantize_per_channel_affine(
            weight, scale.reshape(-1).float(), zero_point.reshape(-1).to(torch.int32), 0, qmin, qmax
        )
    return _codes(fake, scale, zero_point, qmin, qmax)


def _circle_constants(binary: bytes, shape: tuple[int, ...]) -> list[Any]:
    from tico.circle.runtime.program import CircleProgram

    program = CircleProgram.from_bytes(binary)
    return [t for t in program.tensors if t.is_constant and t.is_quantized_integer and tuple(t.shape) == shape]


def _circle_match(
    constants: list[Any], codes: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor
) -> tuple[bool, str]:
    """Is there a Circle constant with these codes and qparams? Else describe the nearest one."""
    best: tuple[int, str] | None = None
    want_scale = scale.reshape(-1).double()
    want_zp = zero_point.reshape(-1).to(torch.int64)
    for tensor in constants:
        data = torch.as_tensor(tensor.constant.astype("int64"))
        q = tensor.quantization
        c_scale = torch.tensor(list(q.scale), dtype=torch.float64)
        c_zp = torch.tensor(list(q.zero_point), dtype=torch.int64)
        if c_scale.numel() != want_scale.numel() and not (c_scale.numel() == 1 or want_scale.numel() == 1):
            continue
        scale_rel = float(((c_scale - want_scale).abs() / want_scale.abs()).max())
        zp_ok = bool((c_zp == want_zp).all()) if c_zp.numel() else bool((want_zp == 0).all())
        mismatched = int((data != codes.to(torch.int64)).sum())
        if mismatched == 0 and scale_rel <= SCALE_REL_EQUAL and zp_ok:
            return True, f"{tensor.name!r}"
        text = (
            f"nearest {tensor.name!r}: {mismatched} of {data.numel()} codes differ, scale rel diff "
            f"{scale_rel:.3g}, zero points {'equal' if zp_ok else 'differ'}"
        )
        if best is None or mismatched < best[0]:
            best = (mismatched, text)
    return False, best[1] if best else f"no quantized constant of shape {tuple(codes.shape)}"


def run(pipeline) -> CheckResult:
    settings = pipeline.check_settings(CHECK)
    result = CheckResult()
    quantized = pipeline.quantized
    record = pipeline.algorithm_record
    wrappers = _wrapper_modules(quantized)
    circle_binary = None
    if pipeline.case.export is None:
        result.notes.append("the case exports nothing: the Circle model is not checked")
    elif "circle_replay" in pipeline.case.expected_failures:
        result.notes.append(
            "the case's Circle export is an expected failure (circle_replay): the Circle model is not checked"
        )
    else:
        circle_binary = pipeline.circle.binary
    compared = code_mismatches = circle_checked = 0
    rows = []
    for name, expected in sorted(record.weights.items()):
        row: dict[str, Any] = {"fp_name": name}
        rows.append(row)
        module = wrappers.get(name)
        if module is None:
            result.fail(
                f"{name}: no wrapper in the quantized tree has fp_name {name!r} and a weight: the algorithm's "
                f"tensor reaches no wrapper"
            )
            continue
        weight = module.module.weight.detach()
        if tuple(weight.shape) != tuple(expected.shape):
            if weight.numel() != expected.numel() or weight.shape[0] != expected.shape[0]:
                result.fail(
                    f"{name}: wrapper weight shape {tuple(weight.shape)} != algorithm's {tuple(expected.shape)}"
                )
                continue
            # a wrapper may linearise a convolution (same output channels, inputs flattened)
            result.notes.append(
                f"{name}: the wrapper holds the algorithm's weight reshaped "
                f"{tuple(expected.shape)} -> {tuple(weight.shape)}"
            )
            expected = expected.reshape(weight.shape)
        factors = _fold_factors(weight, expected)
        moved = (factors - 1.0).abs() > WEIGHT_REL_EQUAL
        # A fold is one constant on some output channels of a matrix (an attention scale in
        # k_proj, or in the K rows of a fused qkv); any other rescaling is a different weight.
        folded = (
            bool(moved.any())
            and weight.dim() >= 2
            and bool(((factors[moved] - factors[moved][0]).abs() <= WEIGHT_REL_EQUAL * factors[moved][0].abs()).all())
        )
        shape = (-1,) + (1,) * (weight.dim() - 1)
        target = (expected.double() * factors.reshape(shape)).to(expected.dtype) if folded else expected
        rel = float((weight - target).abs().max() / target.abs().max().clamp(min=1e-30))
        distinct = sorted({round(float(f), 6) for f in factors})
        row.update({"weight_max_rel_diff": rel, "fold_factors": distinct})
        compared += 1
        if folded:
            rows_folded = int(moved.sum())
            result.notes.append(
                f"{name}: the wrapper holds the algorithm's weight with {rows_folded} of "
                f"{factors.numel()} output channels folded by {', '.join(f'{f:g}' for f in distinct if f != 1.0)}"
            )
        if rel > WEIGHT_REL_EQUAL:
            result.fail(
                f"{name}: the wrapper's weight is not the algorithm's: max |diff| {rel:.3g} of max |weight| "
                f"(allowed {WEIGHT_REL_EQUAL:g})"
            )
            continue
        observer = module.get_observer("weight")
        if observer is None:
            row["observer"] = "none"
            continue
        scale, zero_point = observer._cached_scale.detach(), observer._cached_zp.detach()
        qmin, qmax = observer.dtype.qmin, observer.dtype.qmax
        grid = record.grids.get(name)
        if grid is not None:
            want_scale = (grid.scale.double() * factors).to(grid.scale.dtype) if folded else grid.scale
            scale_rel = (
                float(((_broadcast(scale, want_scale) - want_scale).abs() / want_scale).max())
                if scale.numel() in (1, want_scale.numel())
                else float("inf")
            )
            zp_equal = zero_point.numel() in (1, grid.zero_point.numel()) and bool(
                (zero_point.reshape(-1).to(torch.int64) == grid.zero_point.to(torch.int64)).all()
            )
            row.update({"scale_max_rel_diff": scale_rel, "zero_points_equal": zp_equal})
            if scale_rel > SCALE_REL_EQUAL or not zp_equal:
                result.fail(
                    f"{name}: the weight observer does not apply the algorithm's qparams: scale max rel diff "
                    f"{scale_rel:.3g}, zero points {'equal' if zp_equal else 'differ'}"
                )
            want_codes = grid.codes(expected).reshape(weight.shape)
            want_scale_c, want_zp_c = want_scale, grid.zero_point
        else:
            want_codes = _kernel_codes(target, scale, zero_point, qmin, qmax)
            want_scale_c, want_zp_c = scale, zero_point
        with torch.no_grad():
            fake = observer.fake_quant(weight)
        got_codes = _codes(fake, scale, zero_point, qmin, qmax)
        mismatched = int((got_codes != want_codes).sum())
        code_mismatches += mismatched
        row["code_mismatches"] = mismatched
        if mismatched > settings.max_code_mismatches:
            result.fail(
                f"{name}: QUANT fake-quant gives {mismatched} of {want_codes.numel()} integer codes other than "
                f"the algorithm's"
            )
        if circle_binary is not None:
            ok, where = _circle_match(
                _circle_constants(circle_binary, tuple(weight.shape)), want_codes, want_scale_c, want_zp_c
            )
            row["circle"] = where
            circle_checked += 1
            if not ok:
                result.fail(
                    f"{name}: the Circle model holds no constant with the algorithm's codes and qparams ({where})"
                )
    keys = _key_table(result, record)
    if compared == 0:
        result.fail("the algorithm record names no tensor the wrapper tree holds: nothing was compared")
    result.metrics.update(
        {"handed_over": compared, "code_mismatches": code_mismatches, "circle_checked": circle_checked, **keys}
    )
    facts = {k: v for k, v in record.facts.items() if k != "gptq_match"}
    result.evidence.update({"tensors": rows, "algorithm": pipeline.case.algorithm.name, "facts": facts})
    return result


def _key_table(result: CheckResult, record) -> dict[str, int]:
    """The GPTQ key table the handoff recorded (quantizer keys against the wrappers' fp_names): its
    problems fail the check, the table goes in the evidence."""
    for unresolved in record.facts.get("gptq_keys_naming_no_module", []):
        result.fail(f"GPTQ keyed a quantizer by a name no module of the float model has ({unresolved})")
    table = record.facts.get("gptq_match")
    if table is None:
        return {}
    result.evidence["gptq_keys"] = table
    for problem in gptq_match.problems(table, sorted(record.grids)):
        result.fail(problem)
    return {"gptq_keys_matched": table["matched"], "gptq_keys_unused": len(table["unused"])}


CHECK = Check(
    name="algorithm_handoff",
    run=run,
    applies=requires_capability("algorithm"),
    description=__doc__.splitlines()[0],
    settings=Settings,
    metrics=(
        Metric("handed_over", better=None, label="tensors handed over"),
        Metric("code_mismatches", better="lower", limit="max_code_mismatches", label="codes not the algorithm's"),
        Metric("circle_checked", better=None, label="weights found in Circle"),
        Metric("gptq_keys_matched", better=None, label="GPTQ keys matched"),
        Metric("gptq_keys_unused", label="GPTQ keys unused"),
    ),
    report=EVIDENCE_DETAILS,
)
