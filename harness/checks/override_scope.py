"""A PTQConfig override aimed at one observer lands on exactly that observer, in every addressing form
the config accepts (nested mapping, dot-path key, module dot-path key, ``set_override`` with a string
or a tuple; QuantSpec or kwargs leaf), by name, by layer index and by a nested path in a multimodal
model: never on none, on every layer or on a sibling. The form-by-target table is in the evidence."""

from harness.checks.base import EVIDENCE_DETAILS, Check, CheckResult, Metric
from harness.primitives.lifecycle_ops import wrap_noquant
from harness.primitives.override_addressing import probe


def run(pipeline) -> CheckResult:
    result = CheckResult()
    case, cfg = pipeline.case, pipeline.ptq_config
    if not callable(getattr(cfg, "set_override", None)):
        result.fail(f"the case's config is a {type(cfg).__name__}, not a PTQConfig: its overrides cannot be addressed")
        return result
    report = probe(pipeline.float_module, cfg, lambda module, c: wrap_noquant(case, module, c))
    result.metrics.update(
        {"override_forms": len(report.rows), "override_targets": len(report.targets), "misplaced_overrides": 0}
    )
    result.evidence["overrides"] = report.rows
    if not report.targets:
        result.fail("the wrapper tree has no observer to aim an override at")
    for problem in report.problems:
        result.fail(problem)
    result.metrics["misplaced_overrides"] = len(report.problems)
    return result


CHECK = Check(
    name="override_scope",
    run=run,
    description=__doc__.splitlines()[0],
    metrics=(
        Metric("misplaced_overrides", label="overrides off target"),
        Metric("override_targets", better=None, label="targets"),
        Metric("override_forms", better=None, label="target x form"),
    ),
    report=EVIDENCE_DETAILS,
)
