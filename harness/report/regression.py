"""Judging a metric series: a metric regresses when its latest value is worse than the median of
the previous ``window`` runs on the same testbed by more than its policy allows: ``max(margin *
|baseline| + abs_floor, noise_k * noise)``, the noise being the series' own spread over the window
where measurable (harness/report/policy.py says where margin, noise_k and abs_floor come from)."""

from __future__ import annotations

import json
import math
import sqlite3
import statistics
from typing import Any

from harness.report.history_store import ABS_FLOOR, MAD_TO_SIGMA, MIN_NOISE_RUNS, NOISE_FLOOR_REL, NOISE_RUNS

# -- judging ------------------------------------------------------------------------------------
SeriesKey = tuple[str | None, str, str, str, str]  # (testbed, case, profile, check, metric)


def series(
    con: sqlite3.Connection,
) -> tuple[
    dict[SeriesKey, list[tuple[int, float]]], dict[SeriesKey, str | None], dict[SeriesKey, dict[str, Any] | None]
]:
    """(testbed, case, profile, check, metric) -> [(run, value)], each series' direction and its
    declared regression policy (both from its newest row that has one). A series never spans
    two testbeds."""
    out: dict[SeriesKey, list[tuple[int, float]]] = {}
    better: dict[SeriesKey, str | None] = {}
    policy: dict[SeriesKey, dict[str, Any] | None] = {}
    rows = con.execute(
        "SELECT r.testbed, m.case_name, m.profile, m.check_name, m.metric, m.run_id, m.value, m.better, "
        "m.policy FROM metrics m JOIN runs r ON r.id = m.run_id ORDER BY m.run_id"
    )
    for testbed, case, profile, check, metric, run_id, value, direction, declared in rows:
        key = (testbed, case, profile, check, metric)
        out.setdefault(key, []).append((run_id, value))
        better[key] = direction or better.get(key)
        policy[key] = json.loads(declared) if declared else policy.get(key)
    return out, better, policy


def noise_of(previous: list[float], baseline: float, abs_floor: float = ABS_FLOOR) -> float | None:
    """The series' own night-to-night spread before the latest run: the median absolute change
    between consecutive runs over the last NOISE_RUNS values, scaled to a standard deviation
    (x 1.4826 / sqrt 2; a step change is one outlier the median ignores). None where it is not
    measurable: fewer than MIN_NOISE_RUNS values, or a spread under NOISE_FLOOR_REL of the
    baseline (plus ``abs_floor``) -- a deterministic series, judged by its margin alone."""
    recent = previous[-NOISE_RUNS:]
    if len(recent) < MIN_NOISE_RUNS:
        return None
    spread = MAD_TO_SIGMA / math.sqrt(2) * statistics.median(abs(b - a) for a, b in zip(recent, recent[1:]))
    return spread if spread > NOISE_FLOOR_REL * abs(baseline) + abs_floor else None


def judge(
    values: list[float],
    lower_is_better: bool,
    window: int,
    margin: float,
    noise_k: float | None = None,
    abs_floor: float = ABS_FLOOR,
) -> dict[str, Any]:
    """The latest value against the median of the previous ``window``: regressed / improved when
    it moved the wrong / right way by more than ``max(margin * |baseline| + abs_floor,
    noise_k * noise)``. ``worse`` > 0 is a move the wrong way; ``relative`` and ``z`` (in units of
    the noise, where measurable) are signed the same way."""
    latest = values[-1]
    previous = values[-1 - window : -1]
    if not previous:
        return {
            "latest": latest,
            "baseline": None,
            "regressed": False,
            "improved": False,
            "change": None,
            "allowed": None,
            "noise": None,
            "worse": None,
            "relative": None,
            "z": None,
            "sigmas": None,
        }
    baseline = statistics.median(previous)
    noise = noise_of(values[:-1], baseline, abs_floor)
    allowed = abs(baseline) * margin + abs_floor
    if noise is not None and noise_k:
        allowed = max(allowed, noise_k * noise)
    worse = latest - baseline if lower_is_better else baseline - latest
    return {
        "latest": latest,
        "baseline": baseline,
        "regressed": worse > allowed,
        "improved": -worse > allowed,
        "change": latest - baseline,
        "allowed": allowed,
        "noise": noise,
        "worse": worse,
        "relative": worse / abs(baseline) if baseline else None,
        "z": worse / noise if noise else None,
        "sigmas": (latest - baseline) / noise if noise else None,
    }


def change_start(
    points: list[tuple[int, float]],
    lower_is_better: bool,
    window: int,
    margin: float,
    regressed: bool,
    allowed: float | None = None,
) -> int:
    """Index in ``points`` of the first run of the latest stretch beyond the margin (the same
    way as the latest value): where the series left its baseline. The window's median lies
    inside the band, so the stretch starts after the window's first value."""
    values = [v for _, v in points]
    baseline = statistics.median(values[-1 - window : -1])
    if allowed is None:
        allowed = abs(baseline) * margin + ABS_FLOOR

    def beyond(value: float) -> bool:
        worse = value - baseline if lower_is_better else baseline - value
        return worse > allowed if regressed else -worse > allowed

    start = len(points) - 1
    while start - 1 >= max(1, len(points) - 1 - window) and beyond(values[start - 1]):
        start -= 1
    return start
