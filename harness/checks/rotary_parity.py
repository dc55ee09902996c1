"""The wrapper's RoPE cos/sin tables vs Hugging Face's rotary module for the same positions.

Compared directly, because a uniform position shift cancels inside attention and float
output parity cannot see it. Cases supply tables for non-square grids (and temporal > 1
where the model has time) so height/width mix-ups show."""

from dataclasses import dataclass

from harness.checks.base import EVIDENCE_DETAILS, Check, CheckResult, Metric, requires_capability
from harness.primitives.tensor_compare import compare_close


@dataclass(frozen=True)
class Settings:
    """Wrapper cos/sin vs HF's rotary module, absolute tolerance (rtol 0)."""

    atol: float = 1e-6


def run(pipeline) -> CheckResult:
    result = CheckResult()
    atol = pipeline.check_settings(CHECK).atol
    tables = pipeline.case_probe(
        "rotary_tables", lambda: pipeline.case.rotary.tables(pipeline.wrapped, pipeline.built.module, pipeline.built)
    )
    if not tables:
        result.fail("case rotary capability returned no tables to compare")
    for table in tables:
        for part, wrapper_t, ref_t in zip(("cos", "sin"), table.wrapper, table.reference):
            metrics, problem = compare_close(
                f"rotary {part} [{table.label}]",
                ref_t,
                wrapper_t,
                atol=atol,
                rtol=0.0,
                valid_tokens=table.valid_tokens,
            )
            result.evidence[f"{table.label}.{part}"] = metrics
            if "max_abs_diff" in metrics:
                result.metrics[f"max_abs_diff[{table.label},{part}]"] = metrics["max_abs_diff"]
            if problem:
                result.fail(problem)
    return result


CHECK = Check(
    name="rotary_parity",
    run=run,
    applies=requires_capability("rotary"),
    description=__doc__.splitlines()[0],
    settings=Settings,
    report=EVIDENCE_DETAILS,
    metrics=(Metric("max_abs_diff", label="cos/sin max |diff|"),),
)
