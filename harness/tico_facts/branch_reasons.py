"""Why each branch of tico's wrappers the nightly matrix never takes stays untaken.

A branch is named by what survives a refactor: its file under the wrappers directory, the function
that holds it, the source text of its condition line and of the line it jumps to (never line
numbers). The reviewed reasons (``cases/tico_branch_reasons.toml``) match branches by file glob,
function glob and, optionally, a fragment of the condition; the snapshot (``tico_branch_coverage.json``)
is the nightly run's list of untaken branches. The two must agree: every untaken branch has a
reason, and every reason still explains a branch.
"""

from __future__ import annotations

import fnmatch
import json
import tomllib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.model.case_loading import ROOT
from harness.tico_facts.branch_coverage import SCOPE

REASONS = ROOT / "cases" / "tico_branch_reasons.toml"
SNAPSHOT = ROOT / "tico_branch_coverage.json"
# Reason kinds that put a branch out of any case's reach; every other untaken branch counts as reachable
# (a defensive guard included: bad input is how a case takes it).
OUT_OF_REACH = ("environment", "unreachable", "traced")


@dataclass(frozen=True)
class Branch:
    """One untaken branch, by what stays true when tico's code moves."""

    file: str  # under quantization/wrapq/wrappers/
    function: str  # qualified name; "" at module level
    condition: str  # the branching line's source, stripped
    target: str  # the source of the line it would jump to, or "exit"

    def label(self) -> str:
        where = f"{self.file}::{self.function}" if self.function else self.file
        return f"{where}: {self.condition} -> {self.target}"


@dataclass(frozen=True)
class Reason:
    where: str  # "file glob" or "file glob::function glob"
    why: str
    condition: str = ""  # a fragment of the condition line; empty: any
    target: str = ""  # a fragment of the line the branch jumps to; empty: any

    def explains(self, branch: Branch) -> bool:
        file_glob, _, function_glob = self.where.partition("::")
        return (
            fnmatch.fnmatchcase(branch.file, file_glob)
            and fnmatch.fnmatchcase(branch.function, function_glob or "*")
            and self.condition in branch.condition
            and self.target in branch.target
        )


def uncovered(summary: dict[str, Any]) -> list[Branch]:
    """The untaken branches of the wrappers in a --tico-coverage summary."""
    prefix = SCOPE + "/"
    found = []
    for name, entry in sorted(summary["files"].items()):
        if name.startswith(prefix):
            for branch in entry["uncovered_branches"]:
                found.append(Branch(name[len(prefix) :], branch["function"], branch["condition"], branch["target"]))
    return found


def load_reasons(path: Path = REASONS) -> list[Reason]:
    """The reviewed reasons, in file order (the first that matches explains a branch)."""
    try:
        document = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"{path}: cannot read the branch reasons: {exc}") from exc
    reasons = []
    for i, entry in enumerate(document.get("reason", [])):
        unknown = set(entry) - {"where", "why", "condition", "target"}
        if unknown or not entry.get("where") or not entry.get("why"):
            raise ValueError(
                f"{path}: reason #{i + 1} needs 'where' and 'why' (and at most 'condition', 'target'): {entry}"
            )
        reasons.append(Reason(entry["where"], entry["why"], entry.get("condition", ""), entry.get("target", "")))
    return reasons


def explaining(branch: Branch, reasons: list[Reason]) -> Reason | None:
    """The first reason that explains ``branch``, or None."""
    return next((r for r in reasons if r.explains(branch)), None)


def problems(branches: list[Branch], reasons: list[Reason]) -> list[str]:
    """What the untaken branches and the reasons disagree on (empty: they agree)."""
    used: Counter[Reason] = Counter()
    found = []
    for branch in branches:
        reason = explaining(branch, reasons)
        if reason is None:
            found.append(f"untaken with no reason in {REASONS.name}: {branch.label()}")
        else:
            used[reason] += 1
    for reason in reasons:
        if not used[reason]:
            scope = reason.where + "".join(f" [{part}]" for part in (reason.condition, reason.target) if part)
            found.append(f"stale reason (explains no untaken branch): {scope}: {reason.why}")
    return found


def kinds(branches: list[Branch], reasons: list[Reason]) -> dict[str, int]:
    """How many untaken branches each kind of reason explains (the word before the reason's colon)."""
    counts: Counter[str] = Counter()
    for branch in branches:
        counts[kind_of(explaining(branch, reasons))] += 1
    return dict(counts.most_common())


def snapshot_document(summary: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """The snapshot of a measured run (``run``: its results.json record): which tico, which selection,
    and its untaken branches."""
    scope = summary["scope_totals"]
    tico = run.get("tico") or {}
    return {
        # where the run wrote its report is this machine's business, not the snapshot's
        "pytest_args": [arg for arg in run.get("argv") or [] if not arg.startswith("--wrapq-report-dir")],
        "profiles": run.get("profiles"),
        "tico_version": tico.get("version"),
        "tico_source_sha256": tico.get("source_sha256"),
        "branches": scope["branches"],
        "branches_covered": scope["branches_covered"],
        # per family: every branch and the taken ones, so the reachable figure reads from the snapshot alone
        "families": {
            family: {"branches": row["branches"], "covered": row["covered"]}
            for family, row in reach(summary, []).get("families", {}).items()
        },
        "uncovered": [[b.file, b.function, b.condition, b.target] for b in uncovered(summary)],
    }


def load_snapshot(path: Path = SNAPSHOT) -> dict[str, Any]:
    document = json.loads(path.read_text())
    document["uncovered"] = [Branch(*row) for row in document["uncovered"]]
    return document


def kind_of(reason: Reason | None) -> str:
    return reason.why.split(":", 1)[0] if reason else "(no reason)"


def family_of(file: str) -> str:
    """A wrapper file's family: its directory under the wrappers ("llama", "gemma4"), or "(top level)"."""
    return file.split("/")[0] if "/" in file else "(top level)"


def _percent(part: int, whole: int) -> float | None:
    return round(100.0 * part / whole, 1) if whole else None


def reach(summary: dict[str, Any], reasons: list[Reason]) -> dict[str, Any]:
    """The wrapper branches a case can reach (all of them but those an OUT_OF_REACH reason explains) and
    the share of those the run took, per family and in total, beside the share of all branches."""
    prefix = SCOPE + "/"
    families: dict[str, dict[str, int]] = {}
    for name, entry in summary["files"].items():
        if name.startswith(prefix):
            row = families.setdefault(family_of(name[len(prefix) :]), {"branches": 0, "covered": 0, "out_of_reach": 0})
            row["branches"] += entry["branches"]
            row["covered"] += entry["branches_covered"]
    for branch in uncovered(summary):
        if kind_of(explaining(branch, reasons)) in OUT_OF_REACH:
            families[family_of(branch.file)]["out_of_reach"] += 1
    total = {key: sum(row[key] for row in families.values()) for key in ("branches", "covered", "out_of_reach")}
    for row in [*families.values(), total]:
        row["reachable"] = row["branches"] - row["out_of_reach"]
        row["percent_all"] = _percent(row["covered"], row["branches"])
        row["percent_reachable"] = _percent(row["covered"], row["reachable"])
    return {"out_of_reach_kinds": list(OUT_OF_REACH), "total": total, "families": dict(sorted(families.items()))}


def reach_line(figures: dict[str, Any]) -> str:
    total = figures["total"]
    return (
        f"reachable wrapper branches: {total['percent_reachable']}% ({total['covered']}/{total['reachable']}); "
        f"all: {total['percent_all']}% ({total['covered']}/{total['branches']}), {total['out_of_reach']} out of "
        f"any case's reach ({', '.join(figures['out_of_reach_kinds'])})"
    )


# families only their own run can execute (their package lives in a venv of its own), by the key the
# snapshot records that run under
OWN_RUN_FAMILIES = {"fairseq": "fairseq_run"}


def own_run_families_not_run(summary: dict[str, Any]) -> list[str]:
    """The ``OWN_RUN_FAMILIES`` a --tico-coverage run took no branch of: its untaken branches there say
    nothing about their reasons (the family's own run measures them)."""
    families = reach(summary, []).get("families", {})
    return [f for f in OWN_RUN_FAMILIES if f in families and families[f]["covered"] == 0]


def carry_own_runs(document: dict[str, Any], committed: dict[str, Any]) -> list[str]:
    """Keep, in a new snapshot ``document``, the committed entries of each family only its own run executes
    (``OWN_RUN_FAMILIES``), when the new run took none of that family's branches and measured the same tico.
    Returns the families carried; a family the new run did take is measured, and nothing is carried."""
    carried = []
    if committed.get("tico_source_sha256") != document.get("tico_source_sha256"):
        return carried
    for family, key in OWN_RUN_FAMILIES.items():
        if key not in committed:
            continue
        new_rows = [row for row in document["uncovered"] if family_of(row[0]) == family]
        family_total = (document.get("families") or {}).get(family, {})
        if family_total.get("covered", 0) or len(new_rows) != family_total.get("branches", -1):
            continue
        old_rows = [list(row) for row in committed["uncovered"] if family_of(list(row)[0]) == family]
        document["uncovered"] = [row for row in document["uncovered"] if family_of(row[0]) != family] + old_rows
        covered = len(new_rows) - len(old_rows)
        document["branches_covered"] += covered
        document["families"][family]["covered"] = covered
        document[key] = committed[key]
        carried.append(family)
    return carried
