"""Propose per-profile limits from measured clean runs, for review (never applied by itself).

    ./scripts/env.sh pytest -n auto --profile e2b_dims --wrapq-report-dir=reports/e2b-native
    ATEN_CPU_CAPABILITY=default ./scripts/env.sh pytest -n auto --profile e2b_dims \\
        --no-circle-cache --no-export-cache --wrapq-report-dir=reports/e2b-scalar
    ./scripts/env.sh python -m harness limits --profile e2b_dims \\
        reports/e2b-native/results.json reports/e2b-scalar/results.json

Each results.json is one clean run (on tico as pinned) under one kernel selection. What is
gated comes from the checks' declarations: every metric a check declares with ``limit`` (the
settings field gating it). For every case of the profile, each gated metric's worst value over
the runs becomes a limit with ``MARGIN`` headroom (a "higher is better" metric in dB:
``SQNR_MARGIN_DB`` below the worst), never below the metric's declared ``floor`` (e.g. one
rounding flip of the Circle runtime); a counted metric (whole Circle steps) is proposed as the
count it measured, at least its floor. Only fields the case gates (not None in the settings the
run recorded) are proposed, plus a ``limit_fallback`` metric whose own limit would exceed its
fallback's. The output is the profile's limits data (``{"cases": {case: {"settings": {check: {field:
limit}}, "source": ...}}}``); ``--write`` merges it into ``cases/limits/<profile>.json``, which every
loader of the case files merges into the cases (``harness/model/limits_data.py``). Each source states
the measured values, the runs and the margin. A limit is only as good as the runs it was measured on: measure on clean
tico, under more than one kernel selection, and say so in the source.
"""

from __future__ import annotations

import fnmatch
import json
import math
from pathlib import Path
from typing import Any

# Headroom over the worst clean value seen across kernel selections: the cross-selection spread
# measured on the tiny goldens is far below it (docs/goldens.md "Portable goldens"), while the seeded
# observer defects move these metrics by more than it.
MARGIN = 1.25
SQNR_MARGIN_DB = 1.5

Field = tuple[str, str]  # (check, settings field)


def _round_up(value: float) -> float:
    """Two significant digits, rounded away from the measured value."""
    if value <= 0:
        return 0.0
    exponent = math.floor(math.log10(value)) - 1
    return round(math.ceil(value / 10**exponent) * 10**exponent, max(0, -exponent))


def _round_down(value: float) -> float:
    return math.floor(value * 10) / 10


def gated_metrics(checks: dict[str, dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(check, metric declaration) for every metric a check declares a limit for."""
    return [
        (name, metric)
        for name, meta in sorted(checks.items())
        for metric in meta.get("metrics") or []
        if metric.get("limit")
    ]


def _values(records: list[dict], check: str, pattern: str) -> list[float]:
    """The metric on every sample the check gates (suffixes like [padded] included)."""
    found = []
    for record in records:
        if record["check"] != check:
            continue
        for key, value in (record.get("metrics") or {}).items():
            if not isinstance(value, (int, float)) or isinstance(value, bool) or math.isnan(value):
                continue
            if fnmatch.fnmatchcase(key.split("[")[0], pattern):
                found.append(float(value))
    return found


def _stated(records: list[dict], check: str) -> dict[str, Any] | None:
    """The settings the run recorded for the check (what the case gates), if any record has them."""
    for record in records:
        if record["check"] == check and isinstance(record.get("settings"), dict):
            return record["settings"]
    return None


# A counted metric (whole levels, e.g. Circle max steps) reads within this of a whole number
# when float error alone moves it (an INT16 flip reads 1.000118 steps); further off, it is
# not a count and gets the usual headroom.
COUNT_TOLERANCE = 0.01


def _limit(metric: dict[str, Any], values: list[float]) -> tuple[float, float]:
    if metric.get("counts") and abs(max(values) - round(max(values))) <= COUNT_TOLERANCE:
        worst = max(values)
        return max(float(round(worst)), float(metric.get("floor") or 0.0)), worst
    if metric.get("better") == "higher":
        worst = min(values)
        limit = _round_down(worst - SQNR_MARGIN_DB) if metric.get("unit") == "dB" else _round_down(worst / MARGIN)
        return limit, worst
    worst = max(values)
    limit = _round_up(worst * MARGIN)
    if metric.get("floor") is not None:
        limit = max(limit, float(metric["floor"]))
    return limit, worst


def propose(
    runs: list[list[dict]], profile: str, checks: dict[str, dict[str, Any]], every_limit: bool = False
) -> dict[str, dict[Field, tuple[float, float, str]]]:
    """case -> (check, field) -> (limit, worst measured value, metric), for the fields the case gates;
    ``every_limit``: for every limit a check declares, gated or not (a new case that sets none)."""
    by_case: dict[str, list[dict]] = {}
    for records in runs:
        for record in records:
            if record.get("profile") == profile:
                by_case.setdefault(record["case"], []).append(record)
    proposals: dict[str, dict[Field, tuple[float, float, str]]] = {}
    for case, records in sorted(by_case.items()):
        fields: dict[Field, tuple[float, float, str]] = {}
        for check, metric in gated_metrics(checks):
            values = _values(records, check, metric["name"])
            if not values:
                continue
            stated = _stated(records, check)
            limit, worst = _limit(metric, values)
            own = metric["limit"]
            if every_limit:
                if metric.get("limit_fallback") is None or (check, own) not in fields:
                    fields[(check, own)] = (limit, worst, metric["name"])
                continue
            if stated is None or stated.get(own) is not None:
                fields[(check, own)] = (limit, worst, metric["name"])
                continue
            fallback = metric.get("limit_fallback")
            if fallback and stated.get(fallback) is not None:
                fallback_metric = next(
                    (m for c, m in gated_metrics(checks) if c == check and m["limit"] == fallback), None
                )
                fallback_values = _values(records, check, fallback_metric["name"]) if fallback_metric else []
                fallback_limit = _limit(fallback_metric, fallback_values)[0] if fallback_values else stated[fallback]
                if limit > fallback_limit:
                    fields[(check, own)] = (limit, worst, metric["name"])
        if fields:
            proposals[case] = fields
    return proposals


def table(
    proposals: dict[str, dict[Field, tuple[float, float, str]]], profile: str, run_names: list[str]
) -> dict[str, Any]:
    """The limits data of a profile (``cases/limits/<profile>.json``): each case's gated fields and
    the source of the numbers."""
    margin = (
        f"{MARGIN}x the worst (dB metrics {SQNR_MARGIN_DB} dB below it; Circle max steps: the whole steps "
        f"counted; never below a metric's floor: one flip for Circle steps, 0.1 for mean steps)"
    )
    cases: dict[str, Any] = {}
    for case, fields in proposals.items():
        measured = ", ".join(f"{metric} {worst:.4g}" for (_, _), (_, worst, metric) in fields.items())
        by_check: dict[str, dict[str, float]] = {}
        for (check, field), (limit, _, _) in fields.items():
            by_check.setdefault(check, {})[field] = limit
        cases[case] = {
            "settings": by_check,
            "source": (
                f"measured on clean tico, {profile}, worst over {len(run_names)} kernel selection(s) "
                f"({', '.join(run_names)}): {measured}; limits {margin}"
            ),
        }
    return {
        "profile": profile,
        "about": (
            f"Limits for profile {profile!r}, proposed by python -m harness limits from clean runs "
            f"({', '.join(run_names)}) and reviewed. Each entry replaces those settings fields of the "
            f"case on this profile (the other fields stay as the case states them); its source says "
            f"what was measured."
        ),
        "cases": cases,
    }


def render(proposals: dict[str, dict[Field, tuple[float, float, str]]], profile: str, run_names: list[str]) -> str:
    return json.dumps(table(proposals, profile, run_names), indent=1) + "\n"


def settings_block(case: str, fields: dict[Field, tuple[float, float, str]], run_names: list[str]) -> str:
    """A ready-to-paste ``settings={...}`` for one case: every limit its checks declare, measured."""
    by_check: dict[str, dict[str, float]] = {}
    for (check, field), (limit, _, _) in fields.items():
        by_check.setdefault(check, {})[field] = limit
    measured = ", ".join(f"{metric} {worst:.4g}" for (_, _), (_, worst, metric) in fields.items())
    lines = [
        f"# {case}: measured on {', '.join(run_names)}: {measured}",
        f"# limits {MARGIN}x the worst (dB metrics {SQNR_MARGIN_DB} dB below it; Circle steps: the count, at "
        f"least one flip); review, then paste into the Case",
        "settings={",
    ]
    for check, values in by_check.items():
        body = ", ".join(f'"{field}": {value:g}' for field, value in values.items())
        lines.append(f'    "{check}": {{{body}}},')
    lines.append("},")
    return "\n".join(lines)


def write(path: Path, proposed: dict[str, Any]) -> list[str]:
    """Merge ``proposed`` into the data file at ``path``: the proposed cases' entries are replaced,
    every other case's reviewed entry is kept. Returns the cases written."""
    try:
        current = json.loads(path.read_text())
    except FileNotFoundError:
        current = {"profile": proposed["profile"], "about": proposed["about"], "cases": {}}
    current["cases"] = dict(sorted({**current.get("cases", {}), **proposed["cases"]}.items()))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(current, indent=1) + "\n")
    return sorted(proposed["cases"])
