"""Committed structure baselines: one small JSON per item (``golden/structure/<case>[<label>].json``)
holding the Circle model's description (harness/circle/structure.py) and which tico wrote it.
Read with clear errors for a missing or damaged file; written atomically (each item owns its file,
so xdist workers never write the same one)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from harness.golden.tensors import tico_record
from harness.records import rerun

SUBDIR = "structure"


class StructureBaselineError(ValueError):
    """No usable baseline: the message says what is wrong and how to write one."""


def path(golden_dir: Path, case: str, label: str) -> Path:
    return golden_dir / SUBDIR / f"{case}[{label}].json"


def update_command(nodeid: str) -> str:
    """The command that rewrites this item's baseline (its node id as the rerun commands give it: a
    ``-k`` expression cannot hold a variant's ``=`` or ``,``)."""
    return rerun.command(nodeid, extra="--update-golden")


def load(golden_dir: Path, case: str, label: str, nodeid: str) -> dict[str, Any]:
    file = path(golden_dir, case, label)
    if not file.is_file():
        raise StructureBaselineError(
            f"no structure baseline {file}: write it with {update_command(nodeid)}, review it, commit it"
        )
    try:
        doc = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise StructureBaselineError(
            f"structure baseline {file} is unreadable ({exc}); rewrite it with {update_command(nodeid)}"
        ) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("structure"), dict):
        raise StructureBaselineError(
            f"structure baseline {file} has no 'structure' object; rewrite it with {update_command(nodeid)}"
        )
    return doc


def write(golden_dir: Path, case: str, label: str, structure: dict[str, Any]) -> Path:
    file = path(golden_dir, case, label)
    file.parent.mkdir(parents=True, exist_ok=True)
    doc = {"case": case, "label": label, "tico": tico_record(), "structure": structure}
    fd, tmp = tempfile.mkstemp(dir=file.parent, prefix=".", suffix=".tmp")
    with os.fdopen(fd, "w") as handle:
        json.dump(doc, handle, indent=1, sort_keys=True)
        handle.write("\n")
    os.replace(tmp, file)
    return file
