"""NO_QUANT wrapper vs the Hugging Face module: wrapping alone must not change the math.

Compared on every evaluation sample (padded ones on valid positions only), so a wrapper that
re-implements a forward path (RoPE gather, mask build) is held to the reference."""

from dataclasses import dataclass

from harness.checks.base import EVIDENCE_DETAILS, Check, CheckResult, Metric
from harness.primitives.tensor_compare import compare_close


@dataclass(frozen=True)
class Settings:
    """NO_QUANT wrapper vs HF reference, torch.testing-style closeness."""

    atol: float = 1e-5
    rtol: float = 1e-5


def run(pipeline) -> CheckResult:
    result = CheckResult()
    th = pipeline.check_settings(CHECK)
    for name, sample in pipeline.built.inputs.evaluation.items():
        metrics, problem = compare_close(
            f"NO_QUANT wrapper vs HF reference [{name}]",
            pipeline.output("reference", name),
            pipeline.output("noquant", name),
            atol=th.atol,
            rtol=th.rtol,
            valid_tokens=sample.valid_tokens,
        )
        result.evidence[name] = metrics
        if "max_abs_diff" in metrics:
            result.metrics[f"max_abs_diff[{name}]"] = metrics["max_abs_diff"]
        if problem:
            result.fail(problem)
    return result


CHECK = Check(
    name="noquant_parity",
    run=run,
    description=__doc__.splitlines()[0],
    settings=Settings,
    report=EVIDENCE_DETAILS,
    metrics=(Metric("max_abs_diff", label="NO_QUANT max |diff|"),),
)
