"""Every tensor of the Circle model holds the qparams torch's fake-quant applied to it: no value
is fake-quantized in torch with qparams that tico's passes later replace (one tensor, two
qparams), so the torch QUANT output is what the Circle model computes."""

from harness.checks.base import Check, CheckResult, Metric, requires_capability
from harness.circle.consistency import describe, describe_unpinned, unpinned
from harness.circle.requantized import describe_requantized


def run(pipeline) -> CheckResult:
    result = CheckResult()
    audit = pipeline.circle.audit
    result.metrics["applied_fake_quants"] = len(audit.applied)
    result.metrics["overwritten_qparams"] = len(audit.overwritten)
    result.metrics["replaced_nodes"] = len(audit.replaced_nodes)
    if not audit.applied:
        result.fail(
            "no per-tensor fake-quant reached tico's FoldQuantOps: nothing to compare (was the graph "
            "exported in QUANT mode?)"
        )
    elif len(audit.replaced_nodes) == len(audit.applied):
        result.fail("every fake-quant's node was replaced by a later pass: nothing could be compared")
    for record in audit.replaced_nodes:
        result.notes.append(
            f"tensor {record['tensor']} ({record['line']}, {record.get('observer')}): its node was "
            f"replaced by a later conversion pass, so what Circle holds for it is not compared"
        )
    result.evidence["overwritten"] = audit.overwritten
    if audit.attribution_refused:
        result.notes.append(f"observers not identified: {audit.attribution_refused}")
    for record in audit.overwritten:
        result.fail(describe(record))
    # Where each replacement comes from: circle_replay aligns torch to the qparams a pass gave a
    # tensor only when they are a named torch fake-quant's (the value's producer, or the
    # concatenation it feeds); anything else is a propagation defect the alignment would absorb.
    for record in audit.overwritten:
        if unpinned(record):
            result.fail(describe_unpinned(record))
    # The other way round: a value Circle requantizes with qparams a pass gave it, which torch
    # leaves unquantized (circle_replay's aligned copy quantizes it so; a wrong qparam here would
    # otherwise be absorbed there unseen).
    requantized = getattr(audit, "requantized", [])
    result.metrics["requantized_unapplied"] = len(requantized)
    result.evidence["requantized"] = requantized
    for record in requantized:
        result.fail(describe_requantized(record))
    return result


CHECK = Check(
    name="qparam_consistency",
    run=run,
    applies=requires_capability("export"),
    description=__doc__.splitlines()[0],
    metrics=(
        Metric("overwritten_qparams", label="tensors with two qparams"),
        Metric("applied_fake_quants", better=None, label="fake-quants applied"),
    ),
)
