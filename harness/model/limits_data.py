"""A case directory's measured limits, merged into the cases its files declare.

The limits of a profile are data, ``<case dir>/limits/<profile>.json``
(``{"cases": {case: {"settings": {check: {field: limit}}, "source": ...}}}``), written by
``python -m harness limits --write`` and reviewed like code. A case file never applies them:
every loader of case files (collection, the commands) passes its cases through ``complete``, so
a case is declared in one place, its ``Case(...)``, and its numbers live in the data.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from harness.model.case import Case, ProfileLimits

Table = dict[str, tuple[dict[str, dict[str, Any]], str]]


def table_path(cases_dir: Path, profile: str) -> Path:
    return cases_dir / "limits" / f"{profile}.json"


def read(cases_dir: Path, profile: str) -> Table:
    """case -> (check -> settings fields, where the numbers come from); empty when the directory
    keeps no limits for the profile. A table that exists but cannot be read is an error."""
    path = table_path(cases_dir, profile)
    if not path.is_file():
        return {}
    try:
        doc = json.loads(path.read_text())
        return {case: (entry["settings"], entry["source"]) for case, entry in doc["cases"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"limits table {path} cannot be read: {type(exc).__name__}: {exc}") from None


def complete(cases: list[Case], case_file: Path) -> list[Case]:
    """``cases`` (declared in ``case_file``) with each profile's measured limits from the data
    beside it: the table's settings and source fill that profile's ``ProfileLimits``, keeping what
    the case declared for the profile (its allowlist, its diagnosed failures)."""
    cases_dir = case_file.resolve().parent
    tables: dict[str, Table] = {}
    completed = []
    for case in cases:
        limits = dict(case.profile_limits)
        for profile in case.profiles:
            if profile not in tables:
                tables[profile] = read(cases_dir, profile)
            entry = tables[profile].get(case.name)
            if entry is None:
                continue
            settings, source = entry
            declared = limits.get(profile, ProfileLimits())
            limits[profile] = dataclasses.replace(declared, settings=settings, source=source)
        completed.append(case if limits == case.profile_limits else dataclasses.replace(case, profile_limits=limits))
    return completed
