"""Which tico this run judges: version, where it was imported from, how it was installed, and a
fingerprint of its sources that does not depend on the install path.

The fingerprint decides whether the findings data (``findings/tico.toml``) was recorded on *this*
tico: only then is an expected failure that no longer occurs an error (strict). Any other tico -- a
checkout under review, a nightly, the pinned wheel with one comment added -- is judged in review
mode (``harness/tico_facts/findings_data.py``). Nothing here imports tico: importing it registers torch ops, and
the controller must stay able to run before workers import it.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import subprocess
from pathlib import Path
from typing import Any

# WRAPQ_TICO as scripts/env.sh received it (a path, a wheel file or a version), and the sha256 of a
# wheel file it installed; both are set by env.sh only when the variable was given.
REQUESTED_ENV = "WRAPQ_TICO"
WHEEL_SHA_ENV = "WRAPQ_TICO_WHEEL_SHA256"


def package_dir() -> Path | None:
    """The directory ``import tico`` would load, without importing it."""
    spec = importlib.util.find_spec("tico")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]).resolve()


def source_fingerprint(root: Path) -> str:
    """sha256 over every ``*.py`` file under ``root``: its path relative to ``root`` and its bytes.
    Relative paths make the same sources give the same fingerprint wherever they are installed."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        digest.update(path.relative_to(root).as_posix().encode() + b"\x00")
        digest.update(path.read_bytes() + b"\x00")
    return digest.hexdigest()


def _git(directory: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(directory), *args], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def _install_kind() -> tuple[str, str | None]:
    """('wheel from the index' | 'editable' | 'local wheel' | 'path', url) from PEP 610's direct_url.json."""
    try:
        dist = importlib.metadata.distribution("tico")
    except importlib.metadata.PackageNotFoundError:
        return "path", None
    text = dist.read_text("direct_url.json")
    if not text:
        return "index", None
    info = json.loads(text)
    if info.get("dir_info", {}).get("editable"):
        return "editable", info.get("url")
    if "archive_info" in info:
        return "local wheel", info.get("url")
    return "directory", info.get("url")


@functools.lru_cache(maxsize=1)
def identity() -> dict[str, Any]:
    """What results.json, the report header, manifests and history record as the tico of a run."""
    root = package_dir()
    if root is None:
        return {"version": None, "location": None, "source_sha256": None}
    try:
        version = importlib.metadata.version("tico")
    except importlib.metadata.PackageNotFoundError:
        version = None
    kind, url = _install_kind()
    dist_dir = None
    try:
        dist_dir = Path(importlib.metadata.distribution("tico").locate_file("")).resolve()
    except importlib.metadata.PackageNotFoundError:
        pass
    if dist_dir is not None and dist_dir != root.parent and kind != "editable":
        kind = "path"  # a tree put first on PYTHONPATH, in front of the installed distribution
    record: dict[str, Any] = {
        "version": version,
        "location": str(root),
        "install": kind,
        "source_sha256": source_fingerprint(root),
    }
    if url:
        record["url"] = url
    requested = os.environ.get(REQUESTED_ENV)
    if requested:
        record["requested"] = requested
    if os.environ.get(WHEEL_SHA_ENV):
        record["wheel_sha256"] = os.environ[WHEEL_SHA_ENV]
    # A checkout: tico's own files are tracked by the repository around them (a venv inside some
    # other repository is not a checkout of tico).
    tracked = (_git(root, "ls-files", "--", "__init__.py") or "").strip()
    commit = _git(root, "rev-parse", "HEAD") if tracked else None
    if commit:
        status = _git(root, "status", "--porcelain", "--", ".") or ""
        record["git_commit"] = commit.strip()
        record["git_dirty"] = bool(status.strip())
    return record


def describe(record: dict[str, Any]) -> str:
    """One line for the terminal and the report header."""
    if not record or not record.get("location"):
        return "tico: not installed"
    parts = [f"tico {record.get('version')}", f"({record.get('install')})", record["location"]]
    if record.get("git_commit"):
        parts.append(f"git {record['git_commit'][:12]}{' dirty' if record.get('git_dirty') else ''}")
    if record.get("wheel_sha256"):
        parts.append(f"wheel sha256 {record['wheel_sha256'][:12]}")
    parts.append(f"sources {str(record.get('source_sha256'))[:12]}")
    return " ".join(parts)
