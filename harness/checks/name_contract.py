"""Every wrapper's ``fp_name`` is the path of the float module it wraps, at every depth, and no two
wrappers share one: tico's stages hand results to each other by that name (GPTQ quantizers into
PTQ observers, qparams loaded from a file), so a wrong name silently matches nothing or the wrong
module while the output stays the same. The table of wrappers and names is in the evidence."""

import copy

from harness.checks.base import EVIDENCE_DETAILS, Check, CheckResult, Metric
from harness.primitives.fp_name_audit import audit
from harness.primitives.lifecycle_ops import wrap_noquant


def run(pipeline) -> CheckResult:
    result = CheckResult()
    case, cfg = pipeline.case, pipeline.ptq_config
    # wrapping a private copy of what the case quantizes (an algorithm's output where it has one)
    names = pipeline.case_probe(
        "fp_name_audit", lambda: audit(copy.deepcopy(pipeline.float_module), lambda m: wrap_noquant(case, m, cfg))
    )
    result.metrics.update(
        {"wrappers": names.wrappers, "named_wrappers": names.named, "name_problems": len(names.problems)}
    )
    result.evidence["wrappers"] = names.rows
    result.notes += names.notes
    for problem in names.problems:
        result.fail(problem)
    if names.wrappers == 0:
        result.fail("wrapping produced no quant wrapper at all: nothing carries a name")
    return result


CHECK = Check(
    name="name_contract",
    run=run,
    description=__doc__.splitlines()[0],
    metrics=(
        Metric("name_problems", label="fp_name problems"),
        Metric("wrappers", better=None, label="wrappers"),
        Metric("named_wrappers", better=None, label="named wrappers"),
    ),
    report=EVIDENCE_DETAILS,
)
