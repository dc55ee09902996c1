"""The exported Circle model replayed in tico's reference runtime vs the torch QUANT output,
in absolute terms and in quantization steps of the Circle output tensor.

FAKE_QUANTIZE mode is always run and gated; NATIVE mode (integer kernels) is run too and gated
like FAKE_QUANTIZE where the runtime executes the graph. The runtime's by-design refusal
("backend-defined integer arithmetic") is recorded as not applicable with its words; any other
NATIVE exception fails."""

import re
from dataclasses import dataclass

import torch

from harness import compat
from harness.checks.base import Check, CheckResult, Metric, requires_capability
from harness.circle.alignment import aligned_to_circle
from harness.circle.requantized import describe_requantized
from harness.diagnosis.deployed_attribution import deployed_attribution
from harness.primitives.metrics import as_float, nonfinite_summary

# The Circle runtime computes the same graph with its own float kernels (numpy), torch with
# others: at any fake-quant an element near a rounding boundary can land on the adjacent level,
# on any CPU. One step anywhere is that arithmetic, not a defect, so no max-steps limit is
# below it (the case that showed it: docs/diagnosis.md).
ROUNDING_FLIP_STEPS = 1.0
# Steps are a float ratio: 2.0000001 steps is two steps.
STEP_SLACK = 1e-4
# Both outputs are float32 values on the output grid; at magnitude M each is exact only to
# half an ulp (M * eps / 2), so their difference carries up to M * eps of float error -- in
# steps, M / step * eps, which grows with the grid: an INT16 output near 32767 steps carries
# up to 0.004 step, enough to read one flip as more than one (docs/diagnosis.md). The max-steps
# slack is the larger of STEP_SLACK and FLOAT32_SLACK_ULPS times that bound.
FLOAT32_SLACK_ULPS = 2.0
# A few elements flipping by one step on another CPU must not fail a mean-steps limit either:
# no proposed mean limit is below this (python -m harness limits).
MEAN_STEPS_FLOOR = 0.1
# tico's CircleReferenceRuntime refuses NATIVE execution of ops whose integer arithmetic is
# backend-defined (FULLY_CONNECTED, RMS_NORM, CONV_2D, ... on tico 0.3.0): not applicable by its
# design. Any other exception in NATIVE replay is a failure.
NATIVE_BY_DESIGN = re.compile(
    r"on integer quantized tensors has backend-defined integer arithmetic and is not "
    r"executed in NATIVE mode"
)


@dataclass(frozen=True)
class Settings:
    """Circle replay vs torch QUANT, in quantization steps of each Circle output tensor.
    ``extra_*`` gate every further output the export adapter returns (e.g. the K/V a layer hands
    back for the cache), each in its own scale; None: the output-0 limits apply. NATIVE is held
    to ``native_max_steps``, else to ``max_steps``. A case that states nothing is held to the
    arithmetic floor (one rounding flip, mean 0.1 step): a replay is never ungated."""

    max_steps: float | None = ROUNDING_FLIP_STEPS
    mean_steps: float | None = MEAN_STEPS_FLOOR
    native_max_steps: float | None = None
    extra_max_steps: float | None = None
    extra_mean_steps: float | None = None


def _aligned_torch_outputs(pipeline, result: CheckResult) -> list | None:
    """The output of a private copy of the torch model that computes as the Circle model does:
    the qparams tico's passes replaced (see qparam_consistency), the values Circle requantizes,
    Circle's rounding and kernel arithmetic, its quantized inputs and integer biases -- the
    smallest change that makes torch quantize what Circle quantizes. Built for every case, also
    when no qparam was replaced (the arithmetic alone moves elements across rounding
    boundaries). None when the model cannot be attributed (said in a note)."""
    audit = pipeline.circle.audit
    requantized = getattr(audit, "requantized", [])
    name = pipeline.export_sample_name
    twin, why = aligned_to_circle(
        pipeline.export_adapter("quant", name),
        audit.applied,
        audit.overwritten,
        requantized,
        getattr(audit, "redundant", []),
        inputs=pipeline.circle.input_quantization,
        biases=getattr(audit, "quantized_biases", []),
    )
    if twin is None:
        result.notes.append(
            "torch could not be aligned to the Circle model's qparams, so the gap is gated as "
            "exported: " + "; ".join(why)
        )
        return None
    try:
        with torch.no_grad():
            leaves, _ = compat.tree_flatten(twin(*pipeline.case.export.args(pipeline.sample(name))))
    except RuntimeError as exc:
        result.notes.append(
            f"torch could not be aligned to the values Circle requantizes ({exc}), so the gap is gated as exported"
        )
        return None
    for record in requantized:
        result.notes.append("aligned copy requantizes as Circle does: " + describe_requantized(record))
    biases = getattr(audit, "quantized_biases", [])
    if biases:
        result.notes.append(
            f"aligned copy adds {len(biases)} bias(es) as Circle holds them: tico's QuantizeBias wrote "
            f"them as integers in steps of input scale x weight scale, which the runtime dequantizes "
            f"({', '.join(record['parameter'] for record in biases[:3])}{', ...' if len(biases) > 3 else ''})"
        )
    return [leaf.detach() for leaf in leaves if isinstance(leaf, torch.Tensor)]


def _steps(
    result: CheckResult,
    pipeline,
    mode: str,
    label: str,
    torch_outs: list,
    max_steps,
    mean_steps,
    extra_limits: tuple | None = None,
    tag_prefix: str = "",
    gated: bool = True,
) -> None:
    """Every Circle output against the torch output it corresponds to, each in steps of its own
    serialized output scale. Output 0 keeps the plain metric names; further outputs (e.g. the
    K/V a decoder layer also returns) are suffixed with their index."""
    circle_outs = pipeline.circle_outputs(mode)
    all_scales = pipeline.circle.output_scales
    for index, (torch_out, circle_out) in enumerate(zip(torch_outs, circle_outs)):
        tag = tag_prefix + ("" if index == 0 else f"_out{index}")
        where = f"Circle {label}" + ("" if len(torch_outs) == 1 else f" output {index}")
        problem = nonfinite_summary(circle_out)
        if problem:
            result.fail(f"{where} has {problem}")
            continue
        diff = (as_float(circle_out) - as_float(torch_out)).abs()
        metrics = {f"{mode}{tag}_max_abs_diff": float(diff.max()), f"{mode}{tag}_mean_abs_diff": float(diff.mean())}
        scales = all_scales[index] if index < len(all_scales) else ()
        if len(scales) == 1 and scales[0] > 0:
            step = scales[0]
            metrics.update(
                {
                    f"{mode}{tag}_max_steps": float(diff.max()) / step,
                    f"{mode}{tag}_mean_steps": float(diff.mean()) / step,
                    f"output{tag}_scale": step,
                }
            )
            limit_max, limit_mean = max_steps, mean_steps
            if index > 0 and extra_limits is not None:
                limit_max = extra_limits[0] if extra_limits[0] is not None else max_steps
                limit_mean = extra_limits[1] if extra_limits[1] is not None else mean_steps
            if limit_max is not None:
                limit_max = max(limit_max, ROUNDING_FLIP_STEPS) + _float_slack_steps(circle_out, torch_out, step)
            if gated:
                result.gate(f"{where} max |diff| in steps", metrics[f"{mode}{tag}_max_steps"], limit_max)
                if limit_mean is not None or mode == "fake_quantize":
                    result.gate(
                        f"{where} mean |diff| in steps",
                        metrics[f"{mode}{tag}_mean_steps"],
                        None if limit_mean is None else limit_mean + STEP_SLACK,
                    )
        elif gated:
            result.fail(
                f"{where}: output tensor has no per-tensor scale ({len(scales)} scales), cannot express in steps"
            )
        result.metrics.update(metrics)
    result.metrics["circle_outputs"] = len(circle_outs)


def _float_slack_steps(circle_out, torch_out, step: float) -> float:
    """How far from a whole number of steps float32 arithmetic alone can put a difference of
    these two outputs (see FLOAT32_SLACK_ULPS), at least STEP_SLACK."""
    magnitude = max((float(as_float(t).abs().max()) for t in (circle_out, torch_out) if t.numel()), default=0.0)
    return max(STEP_SLACK, FLOAT32_SLACK_ULPS * torch.finfo(torch.float32).eps * magnitude / step)


def _worst_steps(metrics: dict, first: str, further_prefix: str) -> float:
    """The largest max-steps over every output (output 0 is ``first``, the others start with
    ``further_prefix`` and end with ``_max_steps``)."""
    values = [
        v for k, v in metrics.items() if k == first or (k.startswith(further_prefix) and k.endswith("_max_steps"))
    ]
    return max(values, default=0.0)


def _replay(
    result: CheckResult,
    pipeline,
    mode: str,
    label: str,
    aligned: list | None,
    max_steps,
    mean_steps,
    extra_limits: tuple | None = None,
) -> None:
    """Gate the Circle output against torch aligned to Circle's qparams when tico replaced some
    (the gap to torch as exported is then recorded as ``*_as_exported_*`` metrics, its cause
    named by qparam_consistency), else against torch as exported."""
    exported = pipeline.export_output_leaves("quant", pipeline.export_sample_name)
    if aligned is None:
        _steps(result, pipeline, mode, label, exported, max_steps, mean_steps, extra_limits)
        return
    probe = CheckResult()
    _steps(probe, pipeline, mode, label, exported, max_steps, mean_steps, extra_limits, gated=False)
    _steps(probe, pipeline, mode, label, aligned, max_steps, mean_steps, extra_limits, "_aligned", gated=False)
    as_exported = _worst_steps(probe.metrics, f"{mode}_max_steps", f"{mode}_out")
    as_aligned = _worst_steps(probe.metrics, f"{mode}_aligned_max_steps", f"{mode}_aligned_out")
    if as_aligned > as_exported:
        # Aligning made it worse: the replaced qparams do not explain this gap; gate as exported.
        result.notes.append(
            f"{label}: torch aligned to the Circle model's qparams differs by up to "
            f"{as_aligned:.3g} steps, torch as exported by {as_exported:.3g}: the replaced "
            f"qparams do not explain the gap, so it is gated as exported"
        )
        _steps(result, pipeline, mode, label, exported, max_steps, mean_steps, extra_limits)
        return
    _steps(result, pipeline, mode, label, exported, max_steps, mean_steps, extra_limits, "_as_exported", gated=False)
    _steps(result, pipeline, mode, label, aligned, max_steps, mean_steps, extra_limits)
    if mode == "fake_quantize":
        result.metrics["aligned_tensors"] = len(pipeline.circle.audit.overwritten)
        result.metrics["requantized_tensors"] = len(getattr(pipeline.circle.audit, "requantized", []))
        result.notes.append(
            f"gated against torch computing as the Circle model does (its qparams at "
            f"{len(pipeline.circle.audit.overwritten)} overwritten tensor(s), which qparam_consistency names; its "
            f"rounding, kernels, inputs and biases); against torch as exported: max "
            f"{result.metrics.get('fake_quantize_as_exported_max_steps', float('nan')):.3g} steps"
        )


def run(pipeline) -> CheckResult:
    result = CheckResult()
    th = pipeline.check_settings(CHECK)
    artifact = pipeline.circle
    result.evidence["circle_file"] = getattr(artifact, "path", None)
    result.evidence["circle_bytes"] = len(artifact.binary)
    result.evidence["circle_cache"] = artifact.cache_status
    result.evidence["export_cache"] = pipeline.export_record.status
    result.evidence["limits_source"] = pipeline.case.limits_source(pipeline.profile)
    result.notes += artifact.notes
    aligned = _aligned_torch_outputs(pipeline, result)
    _replay(
        result,
        pipeline,
        "fake_quantize",
        "FAKE_QUANTIZE",
        aligned,
        th.max_steps,
        th.mean_steps,
        (th.extra_max_steps, th.extra_mean_steps),
    )
    try:
        pipeline.circle_outputs("native")
    except Exception as exc:  # noqa: BLE001 - sorted below: by-design refusal vs failure
        text = getattr(exc, "error_text", str(exc)).strip()
        cause = f"{getattr(exc, 'error_type', type(exc).__name__)}: {text.splitlines()[0] if text else ''}"
        result.metrics["native_supported"] = False
        result.evidence["native"] = cause
        if NATIVE_BY_DESIGN.search(cause):
            result.notes.append(
                f"NATIVE replay not applicable: tico's reference runtime does not execute this "
                f"graph in NATIVE mode by design: {cause}"
            )
        else:
            result.fail(f"NATIVE replay failed: {cause}")
    else:
        result.metrics["native_supported"] = True
        # Without a NATIVE limit of its own, NATIVE is held to the FAKE_QUANTIZE limits.
        native_max = th.native_max_steps if th.native_max_steps is not None else th.max_steps
        _replay(result, pipeline, "native", "NATIVE", aligned, native_max, th.mean_steps)
    if result.problems:
        _say_where_the_gap_runs(result, pipeline)
    return result


def _say_where_the_gap_runs(result: CheckResult, pipeline) -> None:
    """On a failing (or expected-failing) replay only: the sites whose removal in torch alone
    closes the gap to the Circle model (harness/diagnosis/deployed_attribution.py). Evidence, never a
    problem line: the verdict is the replay's."""

    try:
        deployed = deployed_attribution(pipeline)
    except Exception as exc:  # noqa: BLE001 - a diagnosis that cannot run costs the diagnosis only
        result.notes.append(f"where the gap runs: not computed ({type(exc).__name__}: {exc})")
        return
    result.evidence["deployed_sites"] = [[s.path, s.max_steps_off, s.mean_steps_off] for s in deployed.sites[:10]]
    if deployed.closing:
        result.notes.append(
            f"where the gap runs: switching off alone in torch any of {', '.join(deployed.closing)} "
            f"closes the FAKE_QUANTIZE gap as exported ({deployed.max_steps:.3g} steps) to <= 1 step"
        )
    else:
        best = deployed.sites[0] if deployed.sites else None
        result.notes.append(
            "where the gap runs: no single fake-quant switched off in torch closes it"
            + (f" (best: {best.path}, {best.max_steps_off:.3g} steps left of {deployed.max_steps:.3g})" if best else "")
        )


CHECK = Check(
    name="circle_replay",
    run=run,
    applies=requires_capability("export"),
    description=__doc__.splitlines()[0],
    settings=Settings,
    metrics=(
        Metric(
            "fake_quantize_max_steps",
            unit="steps",
            label="Circle steps",
            limit="max_steps",
            headline=True,
            floor=ROUNDING_FLIP_STEPS,
            counts=True,
        ),
        Metric(
            "fake_quantize_mean_steps",
            unit="steps",
            label="Circle mean steps",
            limit="mean_steps",
            floor=MEAN_STEPS_FLOOR,
        ),
        Metric(
            "fake_quantize_out*_max_steps",
            unit="steps",
            label="Circle extra-output steps",
            limit="extra_max_steps",
            floor=ROUNDING_FLIP_STEPS,
            limit_fallback="max_steps",
            counts=True,
        ),
        Metric(
            "fake_quantize_out*_mean_steps",
            unit="steps",
            label="Circle extra-output mean steps",
            limit="extra_mean_steps",
            floor=MEAN_STEPS_FLOOR,
            limit_fallback="mean_steps",
        ),
        Metric("fake_quantize_max_abs_diff", label="Circle max |diff|"),
        Metric("fake_quantize_as_exported_max_steps", better=None, unit="steps", label="Circle steps as exported"),
        Metric("native_max_steps", unit="steps", label="NATIVE steps", limit="native_max_steps", counts=True),
    ),
    report="""{% set m = rec.get("metrics") or {} %}{% set t = rec.get("settings") or {} %}
{% if m %}<table class="limits"><tr><th>Circle vs torch</th><th>value</th><th>limit</th></tr>
<tr><td>max / mean steps</td><td>{{ m.get("fake_quantize_max_steps") | num }} / {{
m.get("fake_quantize_mean_steps") | num }}</td>
<td>&le; {{ t.get("max_steps") | num }} / {{ t.get("mean_steps") | num }}</td></tr>
{% if m.get("fake_quantize_as_exported_max_steps") is not none %}<tr><td>max steps as exported</td>
<td>{{ m.get("fake_quantize_as_exported_max_steps") | num }}</td><td class="muted">not gated (see
qparam_consistency)</td></tr>{% endif %}
</table>{% endif %}""",
)
