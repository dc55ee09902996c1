"""Propose per-profile limits from measured clean runs, for review (never applied by itself).

    ./scripts/env.sh pytest -n auto --profile e2b_dims --wrapq-report-dir=reports/e2b-native
    ATEN_CPU_CAPABILITY=default ./scripts/env.sh pytest -n auto --profile e2b_dims \\
        --no-circle-cache --no-export-cache --wrapq-report-dir=reports/e2b-scalar
    ./scripts/env.sh python -m harness.limits --profile e2b_dims \\
        reports/e2b-native/results.json reports/e2b-scalar/results.json

Each results.json is one clean run (on tico as pinned) under one kernel selection. For every
case of the profile, each gated metric's worst value over the runs becomes a limit with
``MARGIN`` headroom (SQNR: ``SQNR_MARGIN_DB`` below the worst); Circle step limits never go
below one rounding flip (mean steps below ``MEAN_STEPS_FLOOR``). The output is a module (``LIMITS = {case: (fields, source)}``)
to review and save as ``cases/_limits_<profile>.py``; case files apply it with
``cases._shared_diagnoses.with_profile_limits``. Each source states the measured values,
the runs and the margin. A limit is only as good as the runs it was measured on: measure on clean tico, under
more than one kernel selection, and say so in the source.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

# Headroom over the worst clean value seen across kernel selections: the cross-selection spread
# measured on the tiny goldens is far below it (README "Portable goldens"), while the seeded
# observer defects move these metrics by more than it.
MARGIN = 1.25
SQNR_MARGIN_DB = 1.5
ROUNDING_FLIP_STEPS = 1.0
# A few elements flipping by one step on another CPU must not fail the mean either (the tiny
# profile's Circle limits use the same 0.1).
MEAN_STEPS_FLOOR = 0.1

# threshold field -> (check, metric, direction): "max" limits the worst (largest) value,
# "min" the worst (smallest).
GATED = {
    "max_mean_abs_diff": ("quant_accuracy", "mean_abs_diff", "max"),
    "max_abs_diff": ("quant_accuracy", "max_abs_diff", "max"),
    "max_peir": ("quant_accuracy", "peir", "max"),
    "min_sqnr_db": ("quant_accuracy", "sqnr_db", "min"),
    "circle_max_steps": ("circle_replay", "fake_quantize_max_steps", "max"),
    "circle_mean_steps": ("circle_replay", "fake_quantize_mean_steps", "max"),
    "circle_extra_max_steps": ("circle_replay", "fake_quantize_out*_max_steps", "max"),
    "circle_extra_mean_steps": ("circle_replay", "fake_quantize_out*_mean_steps", "max"),
}


def _round_up(value: float) -> float:
    """Two significant digits, rounded away from the measured value."""
    if value <= 0:
        return 0.0
    exponent = math.floor(math.log10(value)) - 1
    return round(math.ceil(value / 10 ** exponent) * 10 ** exponent, max(0, -exponent))


def _round_down(value: float) -> float:
    return math.floor(value * 10) / 10


def _values(records: list[dict], check: str, metric: str) -> list[float]:
    """The metric on every sample the check gates (suffixes like [padded] included)."""
    found = []
    for record in records:
        if record["check"] != check:
            continue
        for key, value in (record.get("metrics") or {}).items():
            if not isinstance(value, (int, float)) or isinstance(value, bool) or math.isnan(value):
                continue
            base = key.split("[")[0]
            if "*" in metric:
                prefix, suffix = metric.split("*")
                if base.startswith(prefix) and base.endswith(suffix) and "as_exported" not in base:
                    found.append(float(value))
            elif base == metric:
                found.append(float(value))
    return found


def _gated_fields(records: list[dict]) -> set[str] | None:
    """The threshold fields the case gates (not None), from quant_accuracy's evidence."""
    for record in records:
        stated = (record.get("evidence") or {}).get("thresholds") if record["check"] == "quant_accuracy" else None
        if stated:
            return {field for field, value in stated.items() if value is not None}
    return None


def propose(runs: list[list[dict]], profile: str) -> dict[str, dict[str, tuple[float, float]]]:
    """case -> threshold field -> (limit, worst measured value), for the fields the case gates
    (an extra-output Circle limit also where the extra outputs need more than the main one)."""
    by_case: dict[str, list[dict]] = {}
    for records in runs:
        for record in records:
            if record.get("profile") == profile:
                by_case.setdefault(record["case"], []).append(record)
    proposals: dict[str, dict[str, tuple[float, float]]] = {}
    for case, records in sorted(by_case.items()):
        gated = _gated_fields(records)
        fields = {}
        for field, (check, metric, direction) in GATED.items():
            values = _values(records, check, metric)
            if not values:
                continue
            if direction == "min":
                worst = min(values)
                fields[field] = (_round_down(worst - SQNR_MARGIN_DB), worst)
            else:
                worst = max(values)
                limit = _round_up(worst * MARGIN)
                if field in ("circle_max_steps", "circle_extra_max_steps"):
                    limit = max(limit, ROUNDING_FLIP_STEPS)
                if field in ("circle_mean_steps", "circle_extra_mean_steps"):
                    limit = max(limit, MEAN_STEPS_FLOOR)
                fields[field] = (limit, worst)
        if gated is not None:
            for extra, main in (("circle_extra_max_steps", "circle_max_steps"),
                                ("circle_extra_mean_steps", "circle_mean_steps")):
                if extra in fields and extra not in gated and main in fields and fields[extra][0] > fields[main][0]:
                    gated.add(extra)
            fields = {field: value for field, value in fields.items() if field in gated}
        if fields:
            proposals[case] = fields
    return proposals


def render(proposals: dict[str, dict[str, tuple[float, float]]], profile: str, run_names: list[str]) -> str:
    """A reviewable module: each case's gated fields and the source of the numbers."""
    margin = (f"{MARGIN}x the worst (SQNR {SQNR_MARGIN_DB} dB below it; Circle steps never below one flip, "
              f"mean steps never below {MEAN_STEPS_FLOOR})")
    lines = [f'"""Limits for profile {profile!r}, proposed by python -m harness.limits from clean runs '
             f"({', '.join(run_names)}) and reviewed.",
             "",
             "Each entry replaces the gated fields of the case's thresholds on this profile (the other",
             'fields stay as the case states them); its source says what was measured."""',
             "",
             "LIMITS = {"]
    for case, fields in proposals.items():
        measured = ", ".join(f"{GATED[field][1].replace('fake_quantize_', 'circle ')} {worst:.4g}"
                             for field, (_, worst) in fields.items())
        source = (f"measured on clean tico, {profile}, worst over {len(run_names)} kernel selection(s) "
                  f"({', '.join(run_names)}): {measured}; limits {margin}")
        args = ", ".join(f'"{field}": {limit:g}' for field, (limit, _) in fields.items())
        lines.append(f'    "{case}": ({{{args}}},\n        {source!r}),')
    lines.append("}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.limits", description=__doc__.splitlines()[0])
    parser.add_argument("--profile", required=True)
    parser.add_argument("results", nargs="+", type=Path, help="results.json of clean runs of the profile")
    args = parser.parse_args(argv)
    runs = [json.loads(path.read_text())["results"] for path in args.results]
    proposals = propose(runs, args.profile)
    if not proposals:
        print(f"no gated metric of profile {args.profile!r} in {', '.join(map(str, args.results))}")
        return 1
    print(render(proposals, args.profile, [path.parent.name for path in args.results]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
