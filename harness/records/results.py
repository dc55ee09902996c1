"""Per-item result records: built on workers, carried by pytest reports, merged and written
once by the controller as reports/results.json (the single source for every report view)."""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from harness.records import node_ids

SCHEMA_VERSION = 1


def jsonable(value: Any) -> Any:
    """Plain JSON types only (execnet and json both need them); non-finite floats as strings."""
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    try:
        import torch

        if isinstance(value, torch.Tensor):
            return jsonable(value.detach().cpu().tolist()) if value.numel() <= 64 else f"<tensor {tuple(value.shape)}>"
    except ImportError:  # pragma: no cover
        pass
    return str(value)


def package_versions() -> dict[str, str | None]:
    """Installed distribution versions (tico's own __version__ is stale in 0.3.0)."""
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for dist in ("torch", "transformers", "tico", "pytest", "pytest-xdist"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    return versions


def git_commit(cwd: Path) -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Temp file in the same directory, then rename: readers see the old file or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


class ResultCollector:
    """Folds setup/call/teardown reports of harness items into one record per node id."""

    def __init__(self, case_nodeid_prefixes: tuple[str, ...]):
        self.prefixes = case_nodeid_prefixes
        self.records: dict[str, dict[str, Any]] = {}
        self.started = time.time()

    def start(self) -> None:
        self.started = time.time()

    def add_report(self, report: Any) -> None:
        nodeid = report.nodeid
        if not nodeid.startswith(self.prefixes):
            return
        record = self.records.setdefault(nodeid, self._skeleton(nodeid))
        value = getattr(report, "wrapq_record", None)
        if isinstance(value, dict):
            record.update(value)
        when, outcome = report.when, report.outcome
        record["duration"] = record.get("duration", 0.0) + float(getattr(report, "duration", 0.0) or 0.0)
        if outcome == "skipped" and hasattr(report, "wasxfail"):
            record["outcome"] = "xfailed"
            record["message"] = f"expected failure: {report.wasxfail}"
        elif outcome == "skipped":
            record["outcome"] = "skipped"
            longrepr = report.longrepr
            reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
            record["message"] = reason.removeprefix("Skipped: ")
        elif outcome == "failed":
            if when not in ("setup", "call", "teardown"):
                record["outcome"] = "crashed"
            else:
                record["outcome"] = "failed" if when == "call" else "error"
            text = getattr(report, "longreprtext", "") or str(report.longrepr)
            record["message"] = (record.get("message", "") + "\n" + text).strip() if record.get("message") else text
        elif when == "call" and record["outcome"] == "pending":
            record["outcome"] = "passed"

    def _skeleton(self, nodeid: str) -> dict[str, Any]:
        parts = node_ids.parse(nodeid)
        return {
            "nodeid": nodeid,
            "case": parts.case if parts else None,
            "profile": parts.label if parts else None,
            "check": parts.check if parts else None,
            "outcome": "pending",
            "message": "",
            "metrics": {},
        }

    def write(
        self, path: Path, *, exitstatus: int, profiles: list[str], extra: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        for record in self.records.values():
            if record["outcome"] == "pending":  # e.g. interrupted before the call phase
                record["outcome"] = "not_run"
        counts: dict[str, int] = {}
        for record in self.records.values():
            counts[record["outcome"]] = counts.get(record["outcome"], 0) + 1
        document = {
            "schema": SCHEMA_VERSION,
            "run": {
                "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started)),
                "duration_s": round(time.time() - self.started, 3),
                "exitstatus": exitstatus,
                "commit": git_commit(Path.cwd()),
                "argv": sys.argv[1:],
                "profiles": profiles,
                "versions": package_versions(),
                "counts": counts,
                **(extra or {}),
            },
            "results": [jsonable(self.records[k]) for k in sorted(self.records)],
        }
        atomic_write_text(path, json.dumps(document, indent=2, sort_keys=True))
        return document


def same_release(a: str, b: str) -> bool:
    """2.13.0+cpu is release 2.13.0 (a local build label, not another release)."""
    try:
        return Version(a).public == Version(b).public
    except InvalidVersion:
        return a == b


def stage_line(stage: str, error_type: str, text: str) -> str:
    """A failed stage as one problem line: "stage 'torch_export' failed: Type: first line"."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    return f"stage '{stage}' failed: {error_type}: {first}"


def problem_lines(record: dict[str, Any]) -> list[str]:
    """What a recorded item failed with: its problems, then its failed stage as one line."""
    lines = list(record.get("problems") or [])
    stage = record.get("stage_error")
    if stage:
        lines.append(stage_line(str(stage.get("stage")), str(stage.get("type")), stage.get("message") or ""))
    return lines
