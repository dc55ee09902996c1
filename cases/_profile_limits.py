"""Apply a profile's reviewed limits table (``cases/limits/<profile>.json``, written by
``python -m harness limits --write``) to the cases of one case file."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Mapping

from harness import Expected, ProfileLimits

LIMITS_DIR = Path(__file__).resolve().parent / "limits"


def limits_table(profile: str) -> dict[str, tuple[dict[str, dict[str, float]], str]]:
    """case -> (check -> settings fields, where the numbers come from), from the profile's data file."""
    path = LIMITS_DIR / f"{profile}.json"
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"limits table {path} cannot be read: {exc}") from None
    return {case: (entry["settings"], entry["source"]) for case, entry in doc["cases"].items()}


def with_profile_limits(
    cases: list,
    profile: str,
    unused_observers: Mapping[str, Mapping[str, str]] | None = None,
    expected_failures: Mapping[str, Mapping[str, Expected | None]] | None = None,
) -> list:
    """``cases`` with ``profile_limits[profile]`` set from the profile's table: the table's
    settings (check -> fields) replace those fields of each case's settings on that profile, the
    source is kept. ``unused_observers``
    (case -> allowlist) replaces a case's allowlist on that profile; ``expected_failures`` (case ->
    check -> Expected) replaces those checks' diagnosed failures on that profile, the case's others kept; None
    for a check drops the case's diagnosis on that profile (its cause is absent there, so the check must pass)."""
    table = limits_table(profile)
    unused_observers = unused_observers or {}
    expected_failures = expected_failures or {}
    names = {case.name for case in cases}
    unknown = sorted((set(unused_observers) | set(expected_failures)) - names)
    if unknown:
        raise ValueError(f"unused_observers / expected_failures for unknown case(s): {unknown}")
    updated = []
    for case in cases:
        own = profile in case.profiles and (case.name in unused_observers or case.name in expected_failures)
        if profile in case.profiles and case.name in table:
            settings, source = table[case.name]
        elif own:
            # no measured limits yet, but the profile's own allowlist / diagnoses still apply
            settings, source = (
                {},
                (
                    f"no limits stated for profile {profile!r}: the case's settings for "
                    f"{case.profiles[0]!r} apply unchanged"
                ),
            )
        else:
            updated.append(case)
            continue
        expected = None
        if case.name in expected_failures:
            merged = {**case.expected_failures, **expected_failures[case.name]}
            expected = {check: diagnosis for check, diagnosis in merged.items() if diagnosis is not None}
        limits = ProfileLimits(
            settings, source=source, unused_observers=unused_observers.get(case.name), expected_failures=expected
        )
        updated.append(dataclasses.replace(case, profile_limits={**case.profile_limits, profile: limits}))
    return updated
