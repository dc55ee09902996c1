"""Quantized (QUANT mode) output vs the Hugging Face reference against per-case thresholds.

Gates shape, finiteness, mean/max |diff|, PEIR and SQNR on the default evaluation sample;
other samples (e.g. padded) are measured on valid positions and gated by the same limits,
unless the case names them in ``ungated_samples`` with a reason (recorded as a note)."""

import dataclasses

from harness.checks.base import Check, CheckResult
from harness.metrics import NonFiniteError, accuracy_metrics, error_histogram, scatter_sample, select_valid


def run(pipeline) -> CheckResult:
    result = CheckResult()
    th = pipeline.thresholds
    result.evidence["thresholds"] = dataclasses.asdict(th)
    result.evidence["limits_source"] = pipeline.case.limits_source(pipeline.profile)
    if pipeline.profile not in pipeline.case.profile_limits and pipeline.profile != pipeline.case.profiles[0]:
        result.notes.append(result.evidence["limits_source"])
    for name in sorted(set(pipeline.case.ungated_samples) - set(pipeline.built.inputs.evaluation)):
        result.fail(f"ungated_samples entry {name!r} names no evaluation sample (stale allowlist)")
    for name, sample in pipeline.built.inputs.evaluation.items():
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
            metrics, scatter=scatter_sample(ref_valid, quant_valid), error_histogram=error_histogram(ref_valid, quant_valid)
        )
        for key, value in metrics.items():
            result.metrics[key + suffix] = value
        if name in pipeline.case.ungated_samples:
            result.notes.append(f"[{name}] measured, not gated: {pipeline.case.ungated_samples[name]}")
            continue
        result.gate(f"[{name}] mean |diff|", metrics["mean_abs_diff"], th.max_mean_abs_diff)
        result.gate(f"[{name}] max |diff|", metrics["max_abs_diff"], th.max_abs_diff)
        result.gate(f"[{name}] PEIR", metrics["peir"], th.max_peir)
        result.gate(f"[{name}] SQNR dB", metrics["sqnr_db"], th.min_sqnr_db, upper=False)
    return result


CHECK = Check(name="quant_accuracy", run=run, description=__doc__.splitlines()[0])
