"""Dynamic forward vs the static export adapter, in NO_QUANT and QUANT mode.

The adapter bakes position tables and masks into buffers; the dynamic path computes them per
call. Any difference means the exported model is not the model that was calibrated and
evaluated. Checked on every sample the case's export capability names (padded ones too)."""

from dataclasses import dataclass

from harness.checks.base import EVIDENCE_DETAILS, Check, CheckResult, Metric, requires_capability
from harness.primitives.tensor_compare import compare_close


@dataclass(frozen=True)
class Settings:
    """Dynamic forward vs static export adapter, same mode."""

    atol: float = 1e-5
    rtol: float = 0.0


_MODE_LABEL = {"noquant": "NO_QUANT", "quant": "QUANT"}


def run(pipeline) -> CheckResult:
    result = CheckResult()
    th = pipeline.check_settings(CHECK)
    export = pipeline.case.export
    modes = ("noquant", "quant")
    if export.quant_only:
        modes = ("quant",)
        result.notes.append(f"NO_QUANT not compared: {export.quant_only}")
    for name in export.samples:
        valid = pipeline.sample(name).valid_tokens
        for mode in modes:
            metrics, problem = compare_close(
                f"{_MODE_LABEL[mode]} dynamic forward vs export adapter [{name}]",
                pipeline.output(mode, name),
                pipeline.export_output(mode, name),
                atol=th.atol,
                rtol=th.rtol,
                valid_tokens=valid,
            )
            result.evidence[f"{mode}[{name}]"] = metrics
            if "max_abs_diff" in metrics:
                result.metrics[f"max_abs_diff[{mode},{name}]"] = metrics["max_abs_diff"]
            if problem:
                result.fail(problem)
    return result


CHECK = Check(
    name="dynamic_vs_export",
    run=run,
    applies=requires_capability("export"),
    description=__doc__.splitlines()[0],
    settings=Settings,
    report=EVIDENCE_DETAILS,
    metrics=(Metric("max_abs_diff", label="dynamic vs export max |diff|"),),
)
