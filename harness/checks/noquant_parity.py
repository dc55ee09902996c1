"""NO_QUANT wrapper vs the Hugging Face module: wrapping alone must not change the math.

Compared on every evaluation sample (padded ones on valid positions only), so a wrapper that
re-implements a forward path (RoPE gather, mask build) is held to the reference."""

from harness.checks.base import Check, CheckResult
from harness.compare import compare_close


def run(pipeline) -> CheckResult:
    result = CheckResult()
    th = pipeline.thresholds
    for name, sample in pipeline.built.inputs.evaluation.items():
        metrics, problem = compare_close(
            f"NO_QUANT wrapper vs HF reference [{name}]",
            pipeline.output("reference", name),
            pipeline.output("noquant", name),
            atol=th.noquant_atol,
            rtol=th.noquant_rtol,
            valid_tokens=sample.valid_tokens,
        )
        result.evidence[name] = metrics
        if "max_abs_diff" in metrics:
            result.metrics[f"max_abs_diff[{name}]"] = metrics["max_abs_diff"]
        if problem:
            result.fail(problem)
    return result


CHECK = Check(name="noquant_parity", run=run, description=__doc__.splitlines()[0])
