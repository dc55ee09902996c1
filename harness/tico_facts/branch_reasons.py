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
        reason = explaining(branch, reasons)
        counts[reason.why.split(":", 1)[0] if reason else "(no reason)"] += 1
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
        "uncovered": [[b.file, b.function, b.condition, b.target] for b in uncovered(summary)],
    }


def load_snapshot(path: Path = SNAPSHOT) -> dict[str, Any]:
    document = json.loads(path.read_text())
    document["uncovered"] = [Branch(*row) for row in document["uncovered"]]
    return document
