"""The export adapter (eager, QUANT) vs its torch.export program: tracing must not change the
computation, of any output the adapter returns (a decode step's new K/V as well as its logits).
The program is exported once per case and reused by the Circle and audit checks; on a rerun whose
adapter executes exactly as before, its recorded output and facts are reused
(harness/export/export_reuse.py)."""

from dataclasses import dataclass

from harness.checks.base import Check, CheckResult, Metric, requires_capability
from harness.primitives.tensor_compare import compare_close, compare_each


@dataclass(frozen=True)
class Settings:
    """Eager export adapter vs its torch.export program: exact unless a case states a tolerance."""

    atol: float = 0.0


def run(pipeline) -> CheckResult:
    result = CheckResult()
    name = pipeline.export_sample_name
    atol = pipeline.check_settings(CHECK).atol
    metrics, problem = compare_close(
        f"torch.export program vs eager export adapter [{name}]",
        pipeline.export_output("quant", name),
        pipeline.exported_program_output(),
        atol=atol,
        rtol=0.0,
    )
    result.evidence[name] = metrics
    if "max_abs_diff" in metrics:
        result.metrics["max_abs_diff"] = metrics["max_abs_diff"]
    if problem:
        result.fail(problem)
    _compare_every_output(pipeline, result, name, atol)
    record = pipeline.export_record
    result.metrics["graph_nodes"] = record.graph_nodes
    result.evidence["export_cache"] = record.status
    result.notes += record.notes
    return result


def _compare_every_output(pipeline, result: CheckResult, name: str, atol: float) -> None:
    """Each tensor the adapter returns against the program's, in torch.export's flattened order."""
    eager = pipeline.export_output_leaves("quant", name)
    traced = pipeline.exported_program_output_leaves()
    if len(eager) != len(traced):
        result.fail(f"the torch.export program returns {len(traced)} tensors, the eager export adapter {len(eager)}")
        return
    worst, problems = compare_each(
        lambda index: f"torch.export program vs eager export adapter [{name}], output {index} of {len(eager)}",
        eager,
        traced,
        atol=atol,
        rtol=0.0,
    )
    for problem in problems:
        result.fail(problem)
    result.metrics["outputs"] = len(eager)
    result.metrics["max_abs_diff_every_output"] = worst


CHECK = Check(
    name="torch_export",
    run=run,
    applies=requires_capability("export"),
    description=__doc__.splitlines()[0],
    settings=Settings,
    metrics=(
        Metric("max_abs_diff", label="export max |diff|"),
        Metric("max_abs_diff_every_output", label="export max |diff|, every output"),
        Metric("graph_nodes", better=None, label="graph nodes"),
    ),
)
