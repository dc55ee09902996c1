"""Version drift: the nightly run against newer transformers/tico than the pinned gate.

The pinned stack (constraints.txt) is what a pull request is gated on. A drift run installs
newer releases (scripts/drift.sh) and runs the same matrix with ``--drift``: every failing,
erroring or crashing item -- and every strict expectation that now passes -- is labelled
drift with the versions that moved and the error, in results.json, the terminal and the
HTML report. A break caused by a new release is then a finding with its cause attached, not
a crash to dig through, and nothing is skipped to make the run green.
"""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path
from typing import Any

from tabulate import tabulate

from harness.model.expectations import NOW_PASSES
from harness.records.results import same_release
from harness.tico_facts.finding_status import failure_explained_by

WATCHED = ("transformers", "tico", "torch", "huggingface_hub", "tokenizers", "safetensors")
_PIN = re.compile(r"^\s*([A-Za-z0-9_.\-]+)\s*==\s*([^\s;#]+)")
DRIFT_OUTCOMES = {"failed", "error", "crashed"}
_WORKER_BANNER = re.compile(r"^\[gw\d+\] \S+ -- Python")


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(path: Path) -> dict[str, str]:
    """``name==version`` lines of a constraints file, by normalised name."""
    pins = {}
    for line in Path(path).read_text().splitlines():
        match = _PIN.match(line)
        if match:
            pins[_normal(match.group(1))] = match.group(2)
    return pins


def version_moves(pins: dict[str, str]) -> list[dict[str, str | None]]:
    """Watched packages whose installed version differs from the pin."""
    moves = []
    for name in WATCHED:
        pinned = pins.get(_normal(name))
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            installed = None
        if pinned is not None and not _same_release(installed, pinned):
            moves.append({"package": name, "pinned": pinned, "installed": installed})
    return moves


def _same_release(installed: str | None, pinned: str) -> bool:
    """2.13.0+cpu is the pinned 2.13.0 (a local build label, not a different release)."""
    return installed is not None and same_release(installed, pinned)


def headline(message: str) -> str:
    """The line of a failure report that says what went wrong: a failed stage, a check's
    first problem, or the exception line -- not xdist's worker banner or traceback noise."""
    lines = [line.strip() for line in message.splitlines() if line.strip() and not _WORKER_BANNER.match(line.strip())]
    for line in lines:
        if "stage '" in line or line.startswith("- ") or line.startswith("[XPASS") or NOW_PASSES in line:
            return line
    errors = [line for line in lines if line.startswith("E ")]
    if errors:
        return errors[-1].removeprefix("E").strip()
    return lines[-1] if lines else ""


def describe_moves(moves: list[dict[str, Any]]) -> str:
    if not moves:
        return "no watched package differs from its pin"
    return ", ".join(f"{m['package']} {m['pinned']} -> {m['installed']}" for m in moves)


def label_record(record: dict[str, Any], moves: list[dict[str, Any]]) -> None:
    """Mark one result as drift when it went wrong on the moved stack."""
    message = record.get("message", "")
    strict_pass = record.get("outcome") == "failed" and ("[XPASS(strict)]" in message or NOW_PASSES in message)
    if record.get("outcome") in DRIFT_OUTCOMES or strict_pass:
        record["drift"] = {
            "versions": describe_moves(moves),
            "error": headline(record.get("message", ""))[:500],
            "kind": "expected failure now passes" if strict_pass else record["outcome"],
            "explained_by": explained_by(record),
        }


def explained_by(record: dict[str, Any]) -> str:
    """What the findings data says a drifted item is: a known finding, a tico change the case must
    follow, or nothing known (harness/tico_facts/finding_status.py sorts whole runs the same way)."""
    explained = failure_explained_by(record)
    if isinstance(explained, tuple):
        return "finding " + ", ".join(explained)
    return f"tico change {explained} (the case must follow)" if explained else "unexplained"


def render_drift_table(records: dict[str, dict[str, Any]], moves: list[dict[str, Any]]) -> str:
    rows = [
        [r["nodeid"], r["drift"]["kind"], r["drift"].get("explained_by", ""), r["drift"]["error"][:80]]
        for r in sorted(records.values(), key=lambda r: r["nodeid"])
        if r.get("drift")
    ]
    head = f"drift against the pinned stack: {describe_moves(moves)}; {len(rows)} item(s) drifted"
    return (
        head
        if not rows
        else head + "\n" + tabulate(rows, headers=["item", "kind", "explained by", "error"], tablefmt="simple")
    )
