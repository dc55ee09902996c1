"""The Circle model is built as before: its operators per wrapper, tensor kinds (dtype, qparams),
float-producing ops and interface equal the committed structure baseline (with ``--baseline``: the
base run's), each difference named ("BROADCAST_TO 2 -> 4 in QuantLlamaAttention"). A change fails
unless the case declares that its structure may move (then each difference is a note). Portable:
nothing in the description depends on float bits."""

from __future__ import annotations

from dataclasses import dataclass

from harness.checks.base import Check, CheckResult, Metric, requires_capability
from harness.circle.structure import describe, differences
from harness.golden import baseline, structure_store
from harness.records import node_ids


@dataclass(frozen=True)
class Settings:
    """``may_move``: why this case's graph structure is allowed to change (empty: it is not)."""

    may_move: str = ""


def _base_structure(pipeline, result: CheckResult) -> tuple[dict | None, str, str | None]:
    """The structure to compare with, what it is, and (for the committed file) the tico version it was recorded
    on: the base run's record, else the committed file."""
    settings = pipeline.settings
    if settings.base_results is not None:
        base = baseline.cached_load(settings.base_results)
        # a collected pipeline's group holds its file ("cases/nn.py::nn_linear[tiny]"), one built
        # directly its case only ("nn_linear[tiny]")
        own = node_ids.item_id(pipeline.group, CHECK.name)
        for nodeid, record in base.records.items():
            structure = (record.get("evidence") or {}).get("structure")
            if (nodeid == own or nodeid.endswith(f"::{own}")) and isinstance(structure, dict):
                return structure, f"the {base.label}", None
        result.notes.append("the base run recorded no structure for this item: compared with the committed baseline")
    try:
        doc = structure_store.load(
            settings.golden_dir, pipeline.case.name, pipeline.label, node_ids.item_id(pipeline.group, CHECK.name)
        )
    except structure_store.StructureBaselineError as exc:
        result.fail(str(exc))
        return None, "", None
    recorded = doc.get("tico", {}).get("version")
    return doc["structure"], f"the committed baseline (tico {recorded or '?'})", recorded


def _rewrite(pipeline, result: CheckResult, current: dict) -> None:
    settings = pipeline.settings
    case, label = pipeline.case.name, pipeline.label
    try:
        before = structure_store.load(settings.golden_dir, case, label, node_ids.item_id(pipeline.group, CHECK.name))[
            "structure"
        ]
        changes = differences(before, current)
        kind = "changed" if changes else "unchanged"
    except structure_store.StructureBaselineError:
        changes, kind = [], "new"
    file = structure_store.write(settings.golden_dir, case, label, current)
    message = f"structure baseline {file} rewritten ({kind}{': ' + '; '.join(changes[:5]) if changes else ''})"
    if settings.update_golden == "fail" and kind != "unchanged":
        result.fail(message + " (--update-golden=fail: a rewrite never passes)")
    else:
        result.notes.append(message)


def run(pipeline) -> CheckResult:
    result = CheckResult()
    current = describe(pipeline.circle.binary)
    result.evidence["structure"] = current
    result.metrics["operators"] = current["operators"]
    result.metrics["float_ops"] = sum(sum(c.values()) for c in current["float_ops"].values())
    if pipeline.settings.update_golden:
        _rewrite(pipeline, result, current)
        return result
    base, against, recorded = _base_structure(pipeline, result)
    if base is None:
        return result
    changes = differences(base, current)
    result.metrics["structure_changes"] = len(changes)
    result.evidence["compared_with"] = against
    may_move = pipeline.check_settings(CHECK).may_move or (recorded and baseline.other_release(recorded))
    for change in changes:
        if may_move:
            result.notes.append(f"structure moved (allowed: {may_move}): {change}")
        else:
            result.fail(f"Circle structure changed against {against}: {change}")
    return result


def applies_to_profile(case, profile: str) -> str | None:
    kept = case.golden_profiles if case.structure_profiles is None else case.structure_profiles
    if profile in kept:
        return None
    return f"not applicable: {case.name!r} keeps structure baselines for profile(s) {', '.join(kept) or 'none'}"


CHECK = Check(
    name="circle_structure",
    run=run,
    applies=requires_capability("export"),
    applies_to_profile=applies_to_profile,
    description=__doc__.splitlines()[0],
    settings=Settings,
    metrics=(
        Metric("structure_changes", label="structure changes"),
        Metric("operators", better=None, label="Circle operators"),
        Metric("float_ops", better=None, label="float-producing ops"),
    ),
    report="""{% set s = (rec.get("evidence") or {}).get("structure") %}{% if s %}<details><summary>{{
    s.operators }} operators in {{ s.ops | length }} wrapper scope(s)</summary><pre>{{ s | tojson_pretty }}</pre>
</details>{% endif %}""",
)
