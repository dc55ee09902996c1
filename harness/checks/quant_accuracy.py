"""Quantized (QUANT mode) output vs the Hugging Face reference against per-case thresholds.

Gates shape, finiteness, mean/max |diff|, PEIR and SQNR on the default evaluation sample;
other samples (e.g. padded) are measured on valid positions and gated by the same limits, or by
their own (``samples``: an edge sample's error is its own), unless the case names them in
``ungated_samples`` with a reason (recorded as a note)."""

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from harness.checks.base import Check, CheckResult, Metric
from harness.primitives.metrics import NonFiniteError, accuracy_metrics, error_histogram, scatter_sample, select_valid


@dataclass(frozen=True)
class Settings:
    """Per-case accuracy limits; None means "not gated" and is reported as such."""

    max_mean_abs_diff: float | None = None
    max_abs_diff: float | None = None
    max_peir: float | None = None
    min_sqnr_db: float | None = None
    # evaluation sample -> {limit field: value}: limits of that sample in place of the ones above
    samples: Mapping[str, Mapping[str, Any]] | None = None


def _limits_of(th: Settings, name: str, result: CheckResult) -> Settings | None:
    try:
        return dataclasses.replace(th, samples=None, **dict((th.samples or {}).get(name, {})))
    except TypeError as exc:
        result.fail(f"[{name}] per-sample limits: {exc}")
        return None


def run(pipeline) -> CheckResult:
    result = CheckResult()
    th = pipeline.check_settings(CHECK)
    result.evidence["limits_source"] = pipeline.case.limits_source(pipeline.profile)
    if pipeline.profile not in pipeline.case.profile_limits and pipeline.profile != pipeline.case.profiles[0]:
        result.notes.append(result.evidence["limits_source"])
    for name in sorted(set(pipeline.case.ungated_samples) - set(pipeline.built.inputs.evaluation)):
        result.fail(f"ungated_samples entry {name!r} names no evaluation sample (stale allowlist)")
    for name in sorted(set(th.samples or {}) - set(pipeline.built.inputs.evaluation)):
        result.fail(f"per-sample limits name {name!r}, which is no evaluation sample (stale)")
    for name, sample in pipeline.built.inputs.evaluation.items():
        limits = _limits_of(th, name, result)
        if limits is None:
            continue
        ref = pipeline.output("reference", name)
        quant = pipeline.output("quant", name)
        suffix = "" if name == "default" else f"[{name}]"
        if tuple(ref.shape) != tuple(quant.shape):
            result.fail(f"[{name}] quantized output shape {tuple(quant.shape)} != reference {tuple(ref.shape)}")
            continue
        ref_valid, quant_valid = select_valid(ref, sample.valid_tokens), select_valid(quant, sample.valid_tokens)
        if ref_valid.numel() == 0:
            result.fail(f"[{name}] no valid element to compare (every position is marked invalid)")
            continue
        try:
            metrics = accuracy_metrics(ref_valid, quant_valid)
        except NonFiniteError as exc:
            result.fail(f"[{name}] {exc}")
            continue
        result.evidence[name] = dict(
            metrics,
            scatter=scatter_sample(ref_valid, quant_valid),
            error_histogram=error_histogram(ref_valid, quant_valid),
        )
        for key, value in metrics.items():
            result.metrics[key + suffix] = value
        if name in pipeline.case.ungated_samples:
            result.notes.append(f"[{name}] measured, not gated: {pipeline.case.ungated_samples[name]}")
            continue
        result.gate(f"[{name}] mean |diff|", metrics["mean_abs_diff"], limits.max_mean_abs_diff)
        result.gate(f"[{name}] max |diff|", metrics["max_abs_diff"], limits.max_abs_diff)
        result.gate(f"[{name}] PEIR", metrics["peir"], limits.max_peir)
        result.gate(f"[{name}] SQNR dB", metrics["sqnr_db"], limits.min_sqnr_db, upper=False)
    return result


CHECK = Check(
    name="quant_accuracy",
    run=run,
    description=__doc__.splitlines()[0],
    settings=Settings,
    metrics=(
        Metric("peir", label="PEIR", limit="max_peir", headline=True),
        Metric("mean_abs_diff", label="mean |d|", limit="max_mean_abs_diff", headline=True),
        Metric("max_abs_diff", label="max |d|", limit="max_abs_diff", headline=True),
        Metric("sqnr_db", better="higher", unit="dB", label="SQNR dB", limit="min_sqnr_db", headline=True),
        Metric("cosine", better="higher", label="cosine"),
    ),
    report="""{% set m = rec.get("metrics") or {} %}{% set t = rec.get("settings") or {} %}
<table class="limits"><tr><th>metric</th><th>value</th><th>limit</th></tr>
<tr><td>mean |diff|</td><td>{{ m.get("mean_abs_diff") | num }}</td><td>&le; {{ t.get("max_mean_abs_diff") | num
}}</td></tr>
<tr><td>max |diff|</td><td>{{ m.get("max_abs_diff") | num }}</td><td>&le; {{ t.get("max_abs_diff") | num }}</td></tr>
<tr><td>PEIR</td><td>{{ m.get("peir") | num }}</td><td>&le; {{ t.get("max_peir") | num }}</td></tr>
<tr><td>SQNR dB</td><td>{{ m.get("sqnr_db") | num }}</td><td>&ge; {{ t.get("min_sqnr_db") | num }}</td></tr>
<tr><td>cosine</td><td>{{ m.get("cosine") | num }}</td><td class="muted">not gated</td></tr></table>
{% set ev = (rec.get("evidence") or {}).get("default") or {} %}<div class="charts">{{ ev.get("scatter") | scatter }}
{{ ev.get("error_histogram") | histogram }}</div>""",
)
