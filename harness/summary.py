"""Terminal summary: one row per case x profile, failures first."""

from __future__ import annotations

from typing import Any

from tabulate import tabulate

_MARK = {"xfailed": "xfail", "passed": "ok", "failed": "FAIL", "error": "ERR", "crashed": "CRASH", "skipped": "-", "not_run": "?"}
_BAD = {"failed", "error", "crashed", "not_run"}


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


def render_summary_table(records: dict[str, dict[str, Any]]) -> str:
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    checks: list[str] = []
    for rec in records.values():
        if rec.get("case") is None:
            key = (rec["nodeid"], "")
        else:
            key = (rec["case"], rec["profile"])
        row = rows.setdefault(key, {"checks": {}, "metrics": {}, "bad": False, "seconds": 0.0})
        check = rec.get("check") or "<definition>"
        if check not in checks:
            checks.append(check)
        row["checks"][check] = _MARK.get(rec["outcome"], rec["outcome"])
        row["bad"] |= rec["outcome"] in _BAD
        row["seconds"] += float(rec.get("duration") or 0.0)
        if check in ("quant_accuracy", "circle_replay", "qparam_audit"):
            row["metrics"].update(rec.get("metrics") or {})
    checks.sort(key=lambda c: (c == "<definition>", c))
    table = []
    for (case, profile), row in sorted(rows.items(), key=lambda kv: (not kv[1]["bad"], kv[0])):
        m = row["metrics"]
        table.append(
            [case, profile]
            + [row["checks"].get(c, "") for c in checks]
            + [_fmt(m.get("peir")), _fmt(m.get("mean_abs_diff")), _fmt(m.get("max_abs_diff")), _fmt(m.get("sqnr_db")),
               _fmt(m.get("fake_quantize_max_steps")), _fmt(m.get("missing_qparam")), f"{row['seconds']:.1f}"]
        )
    headers = ["case", "profile"] + checks + ["PEIR", "mean|d|", "max|d|", "SQNR dB", "Circle steps", "no-qparam", "time s"]
    return tabulate(table, headers=headers, tablefmt="simple")
