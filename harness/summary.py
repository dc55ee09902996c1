"""Terminal summary: one row per case x profile, failures first; the metric columns are the
headline metrics the checks declare (harness/headline.py)."""

from __future__ import annotations

from typing import Any, Mapping

from tabulate import tabulate

from harness.headline import headline_columns, headline_values

_MARK = {"xfailed": "xfail", "passed": "ok", "failed": "FAIL", "error": "ERR", "crashed": "CRASH", "skipped": "-", "not_run": "?"}
_BAD = {"failed", "error", "crashed", "not_run"}


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


def render_summary_table(records: dict[str, dict[str, Any]], checks: Mapping[str, Mapping[str, Any]]) -> str:
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    names: list[str] = []
    for rec in records.values():
        if rec.get("case") is None:
            key = (rec["nodeid"], "")
        else:
            key = (rec["case"], rec["profile"])
        row = rows.setdefault(key, {"marks": {}, "records": {}, "bad": False, "seconds": 0.0})
        check = rec.get("check") or "<definition>"
        if check not in names:
            names.append(check)
        row["marks"][check] = _MARK.get(rec["outcome"], rec["outcome"])
        row["records"][check] = rec
        row["bad"] |= rec["outcome"] in _BAD
        row["seconds"] += float(rec.get("duration") or 0.0)
    names.sort(key=lambda c: (c == "<definition>", c))
    columns = headline_columns(checks)
    table = []
    for (case, profile), row in sorted(rows.items(), key=lambda kv: (not kv[1]["bad"], kv[0])):
        table.append([case, profile] + [row["marks"].get(c, "") for c in names]
                     + [_fmt(v) for v in headline_values(row["records"], columns)] + [f"{row['seconds']:.1f}"])
    headers = ["case", "profile"] + names + [label for _, _, label in columns] + ["time s"]
    return tabulate(table, headers=headers, tablefmt="simple")
