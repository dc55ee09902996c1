"""A base run to judge a change against (``--baseline``).

A pull request's question is what it changed, not whether tico is perfect. Given the base run
(its results.json, in a report directory that also holds the base's ``golden-run/``), goldens
compare with the tensors the base run produced, and a failure the base run had in the same way
(the same problem lines, numbers aside, and no tracked metric worse) is reported as
pre-existing, not blamed on the change. Every run writes its own ``golden-run/`` so that it can
serve as a base; a golden there counts only if its manifest carries the base run's id, so files
left by an earlier run in the same directory never answer for this one.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from harness.model.expectations import matchable
from harness.records import node_ids
from harness.records.results import problem_lines

RUN_GOLDEN_DIR = "golden-run"
# A tracked metric counts as worse than the base's when it moved the wrong way by more than this
# fraction of the base value (plus a floor for values near zero): the same code on the same
# machine repeats to the bit; another kernel selection moves values by ~1e-6 relative.
WORSE_REL = 0.01
WORSE_ABS = 1e-9
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
_FAILED = ("failed", "error")


class BaselineError(ValueError):
    """The base run cannot be read."""


@dataclass(frozen=True)
class BaseRun:
    results: Path
    run_id: str | None
    tico: dict[str, Any]
    records: dict[str, dict[str, Any]]

    @property
    def golden_dir(self) -> Path:
        return self.results.parent / RUN_GOLDEN_DIR

    @property
    def label(self) -> str:
        tico = self.tico or {}
        return (
            f"base run {self.results} (tico {tico.get('version', '?')}, sources {str(tico.get('source_sha256'))[:12]})"
        )


def load(spec: str | Path) -> BaseRun:
    """The base run from its results.json or the report directory holding it."""
    path = Path(spec)
    if path.is_dir():
        path = path / "results.json"
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise BaselineError(f"--baseline {spec}: cannot read {path}: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list):
        raise BaselineError(f"--baseline {spec}: {path} is not a wrapq results.json (no 'results' list)")
    run = doc.get("run") or {}
    # a run recorded before today's node ids reads as its items (harness/records/node_ids.py)
    records = {node_ids.current(r["nodeid"]): r for r in doc["results"] if isinstance(r, dict) and r.get("nodeid")}
    return BaseRun(path.resolve(), run.get("run_id"), run.get("tico") or {}, records)


def other_release(recorded: str | None) -> str | None:
    """Why a committed baseline (a golden, a structure record) does not gate this run: it was recorded on
    another tico release than the one under test, whose own base is a run of it (``--baseline``: the pull
    request's base, the nightly's last run). A checkout or a copy of the same release is gated. None: it gates."""
    try:
        running = importlib.metadata.version("tico")
    except importlib.metadata.PackageNotFoundError:
        return None
    if recorded and recorded != running:
        return (
            f"recorded on tico {recorded}, this run is tico {running}: not gated here "
            f"(--baseline=<a run of tico {running}> gates it)"
        )
    return None


@functools.lru_cache(maxsize=2)
def cached_load(path: Path) -> BaseRun:
    """``load`` once per process (every xdist worker reads the base run for its own items)."""
    return load(path)


def signature(line: str) -> str:
    """A problem line as it reads whatever the numbers: install paths, line numbers and values masked."""
    return _NUMBER.sub("#", matchable(line)).strip()


def worse_metrics(tracked: Iterable[tuple[str, str]], head: dict[str, Any], base: dict[str, Any]) -> list[str]:
    """Metrics (name, better) that moved the wrong way from the base run beyond ``WORSE_REL``."""
    worse = []
    for name, better in tracked:
        h, b = head.get(name), base.get(name)
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (h, b)):
            continue
        margin = WORSE_REL * abs(b) + WORSE_ABS
        if (better == "lower" and h > b + margin) or (better == "higher" and h < b - margin):
            worse.append(f"{name} {h:.4g} (base {b:.4g})")
    return worse


def pre_existing(
    base: BaseRun, nodeid: str, problems: list[str], metrics: dict[str, Any], tracked: Iterable[tuple[str, str]]
) -> str | None:
    """Why this failure is not the change's (the base run failed the same way), or None."""
    record = base.records.get(nodeid)
    if record is None or record.get("outcome") not in _FAILED:
        return None
    known = {signature(line) for line in problem_lines(record)}
    if not problems or any(signature(line) not in known for line in problems):
        return None
    if worse_metrics(tracked, metrics, record.get("metrics") or {}):
        return None
    return f"fails the same way in the {base.label}: not this change's"
