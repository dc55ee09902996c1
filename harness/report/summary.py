"""Terminal summary: one row per case x profile, failures first, with the count of each verdict and
the checks that failed; then, for a run of a few cases, the headline metrics the checks declare
(harness/report/headline.py) that it measured, in tables of at most ``WIDTH`` columns (metric columns
wrap into more tables)."""

from __future__ import annotations

from typing import Any, Mapping

from tabulate import tabulate

from harness.report.headline import headline_columns, headline_values

WIDTH = 120
# Above this many case rows the headline metrics stay in results.json and the report: a matrix run's
# terminal output is read for its verdicts.
METRIC_ROWS = 24
_BAD = {"failed", "error", "crashed", "not_run"}
_COUNTED = (("passed", "ok"), ("xfailed", "xfail"), ("skipped", "n/a"))


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _width(text: str) -> int:
    return max((len(line) for line in text.splitlines()), default=0)


def _groups(records: dict[str, dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for rec in records.values():
        key = (rec["nodeid"], "") if rec.get("case") is None else (rec["case"], rec["profile"])
        row = rows.setdefault(key, {"records": {}, "bad": [], "seconds": 0.0, "counts": {}, "ungated": 0})
        row["ungated"] += len(rec.get("ungated") or [])
        check = rec.get("check") or "<definition>"
        row["records"][check] = rec
        row["counts"][rec["outcome"]] = row["counts"].get(rec["outcome"], 0) + 1
        if rec["outcome"] in _BAD:
            row["bad"].append(check)
        row["seconds"] += float(rec.get("duration") or 0.0)
    return rows


def render_summary_table(
    records: dict[str, dict[str, Any]], checks: Mapping[str, Mapping[str, Any]], width: int = WIDTH
) -> str:
    rows = _groups(records)
    ordered = sorted(rows.items(), key=lambda kv: (not kv[1]["bad"], kv[0]))
    verdicts = []
    for (case, profile), row in ordered:
        counts = row["counts"]
        verdicts.append(
            [_clip(case, 44), _clip(profile, 24)]
            + [counts.get(o, 0) or "" for o, _ in _COUNTED]
            + [row["ungated"] or "", f"{row['seconds']:.1f}", _clip(", ".join(sorted(row["bad"])) or "", 30)]
        )
    parts = [
        tabulate(
            verdicts,
            headers=["case", "profile"] + [label for _, label in _COUNTED] + ["ungated", "time s", "FAILED"],
            tablefmt="simple",
        )
    ]
    if len(ordered) > METRIC_ROWS:
        parts.append(f"headline metrics of the {len(ordered)} case rows: results.json and report.html")
        return "\n\n".join(parts)
    # Headline metrics this run measured, as many columns per table as fit the width.
    columns = [
        c
        for c in headline_columns(checks)
        if any(headline_values(row["records"], [c])[0] is not None for _, row in ordered)
    ]
    values = {key: headline_values(row["records"], columns) for key, row in ordered}
    start = 0
    while start < len(columns):
        end = start + 1
        while end <= len(columns):
            table = _metric_table(ordered, columns, values, start, end)
            if _width(table) > width and end > start + 1:
                end -= 1
                break
            end += 1
        end = min(end, len(columns))
        parts.append(_metric_table(ordered, columns, values, start, end))
        start = end
    return "\n\n".join(parts)


def _metric_table(ordered, columns, values, start: int, end: int) -> str:
    rows = []
    for key, _ in ordered:
        cells = [_fmt(v) for v in values[key][start:end]]
        if any(cells):
            rows.append([_clip(key[0], 44), _clip(key[1], 24)] + cells)
    headers = ["case", "profile"] + [label for _, _, label in columns[start:end]]
    return tabulate(rows, headers=headers, tablefmt="simple", maxheadercolwidths=[None, None] + [12] * (end - start))
