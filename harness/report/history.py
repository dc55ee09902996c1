"""Nightly history: append runs to SQLite (parameterised SQL only), render a trend dashboard.

    python -m harness.report.history append reports/results.json [--db reports/history.sqlite]
    python -m harness.report.history dashboard [--db ...] [--out reports/dashboard.html] [--window 5] [--margin 0.1]

A metric regresses when its latest value is worse than the median of the previous ``window``
runs by more than ``margin`` (relative, with a small absolute floor). Which metrics are tracked
and which direction is worse come from the checks' declarations that results.json carries
(``Metric(better=...)``); a series is one (case, profile, check, metric).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import math
import sqlite3
import statistics
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup

from harness.report import svg
from harness.results import atomic_write_text

ABS_FLOOR = 1e-9

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    started_at TEXT NOT NULL,
    commit_sha TEXT,
    profiles TEXT NOT NULL,
    versions TEXT NOT NULL,
    exitstatus INTEGER
);
CREATE TABLE IF NOT EXISTS items (
    run_id INTEGER NOT NULL REFERENCES runs(id),
    nodeid TEXT NOT NULL,
    case_name TEXT,
    profile TEXT,
    check_name TEXT,
    outcome TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS metrics (
    run_id INTEGER NOT NULL REFERENCES runs(id),
    case_name TEXT NOT NULL,
    profile TEXT NOT NULL,
    check_name TEXT NOT NULL,
    metric TEXT NOT NULL,
    value REAL NOT NULL,
    better TEXT
);
CREATE INDEX IF NOT EXISTS metrics_key ON metrics(case_name, profile, metric, run_id);
"""


def connect(db: Path) -> sqlite3.Connection:
    db.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(str(db), timeout=30)
    con.executescript(SCHEMA)
    columns = {row[1] for row in con.execute("PRAGMA table_info(metrics)")}
    if "better" not in columns:  # a database written before metrics carried their direction
        con.execute("ALTER TABLE metrics ADD COLUMN better TEXT")
    return con


def tracked(doc: dict[str, Any], rec: dict[str, Any]) -> list[tuple[str, float, str]]:
    """(metric, value, better) for the record's finite metrics its check declares with a
    direction; per-sample variants (``peir[padded]``) stay in results.json only."""
    declared = (((doc.get("run") or {}).get("checks") or {}).get(rec.get("check") or "") or {}).get("metrics") or []
    out = []
    for key, value in (rec.get("metrics") or {}).items():
        if "[" in key or not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            continue
        for metric in declared:
            if metric.get("better") and fnmatch.fnmatchcase(key, metric["name"]):
                out.append((key, float(value), metric["better"]))
                break
    return out


def append_run(db: Path, doc: dict[str, Any]) -> int:
    run = doc.get("run", {})
    with connect(db) as con:
        cur = con.execute(
            "INSERT INTO runs (started_at, commit_sha, profiles, versions, exitstatus) VALUES (?, ?, ?, ?, ?)",
            (run.get("started_at", ""), run.get("commit"), json.dumps(run.get("profiles", [])),
             json.dumps(run.get("versions", {}), sort_keys=True), run.get("exitstatus")),
        )
        run_id = int(cur.lastrowid)
        for rec in doc.get("results", []):
            con.execute(
                "INSERT INTO items (run_id, nodeid, case_name, profile, check_name, outcome) VALUES (?, ?, ?, ?, ?, ?)",
                (run_id, rec["nodeid"], rec.get("case"), rec.get("profile"), rec.get("check"), rec["outcome"]),
            )
            for metric, value, better in tracked(doc, rec):
                con.execute(
                    "INSERT INTO metrics (run_id, case_name, profile, check_name, metric, value, better) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (run_id, rec["case"], rec["profile"], rec["check"], metric, value, better),
                )
    return run_id


def series(con: sqlite3.Connection) -> tuple[dict[tuple[str, str, str, str], list[tuple[int, float]]],
                                            dict[tuple[str, str, str, str], str | None]]:
    """(case, profile, check, metric) -> [(run, value)], and each series' direction (its newest)."""
    out: dict[tuple[str, str, str, str], list[tuple[int, float]]] = {}
    better: dict[tuple[str, str, str, str], str | None] = {}
    rows = con.execute("SELECT case_name, profile, check_name, metric, run_id, value, better FROM metrics ORDER BY run_id")
    for case, profile, check, metric, run_id, value, direction in rows:
        key = (case, profile, check, metric)
        out.setdefault(key, []).append((run_id, value))
        better[key] = direction or better.get(key)
    return out, better


def judge(values: list[float], lower_is_better: bool, window: int, margin: float) -> dict[str, Any]:
    latest = values[-1]
    previous = values[-1 - window : -1]
    if not previous:
        return {"latest": latest, "baseline": None, "regressed": False, "change": None}
    baseline = statistics.median(previous)
    allowed = abs(baseline) * margin + ABS_FLOOR
    worse = latest - baseline if lower_is_better else baseline - latest
    return {"latest": latest, "baseline": baseline, "regressed": worse > allowed, "change": latest - baseline}


def dashboard(db: Path, out: Path, window: int = 5, margin: float = 0.1) -> dict[str, Any]:
    with connect(db) as con:
        runs = con.execute("SELECT id, started_at, commit_sha FROM runs ORDER BY id").fetchall()
        data = series(con)
    data, better = data
    run_ids = [r[0] for r in runs]
    entries = []
    for (case, profile, check, metric), points in sorted(data.items()):
        direction = better.get((case, profile, check, metric))
        if direction not in ("lower", "higher"):
            continue  # rows from before directions were stored: kept, not judged
        by_run = dict(points)
        values = [by_run.get(rid) for rid in run_ids]
        present = [v for v in values if v is not None]
        verdict = judge(present, direction == "lower", window, margin)
        entries.append({"case": case, "profile": profile, "check": check, "metric": metric, "values": values,
                        "lower_is_better": direction == "lower", **verdict,
                        "chart": Markup(svg.trend(values, flagged=verdict["regressed"], label=f"{case} {metric}"))})
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(Path(__file__).parent / "templates")), autoescape=True)
    env.filters["num"] = lambda v: (f"{v:.4g}" if isinstance(v, float) else ("" if v is None else v))
    regressions = [e for e in entries if e["regressed"]]
    html = env.get_template("dashboard.html.j2").render(runs=runs, entries=entries, regressions=regressions,
                                                         window=window, margin=margin)
    atomic_write_text(out, html)
    return {"runs": len(runs), "series": len(entries), "regressions": [(e["case"], e["profile"], e["check"], e["metric"]) for e in regressions]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.report.history", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    app = sub.add_parser("append", help="append a results.json to the history database")
    app.add_argument("results", type=Path)
    app.add_argument("--db", type=Path, default=Path("reports/history.sqlite"))
    dash = sub.add_parser("dashboard", help="render the trend dashboard")
    dash.add_argument("--db", type=Path, default=Path("reports/history.sqlite"))
    dash.add_argument("--out", type=Path, default=Path("reports/dashboard.html"))
    dash.add_argument("--window", type=int, default=5, help="previous runs whose median is the baseline")
    dash.add_argument("--margin", type=float, default=0.1, help="relative worsening that counts as a regression")
    args = parser.parse_args(argv)
    if args.command == "append":
        run_id = append_run(args.db, json.loads(args.results.read_text()))
        print(f"appended run {run_id} to {args.db}")
        return 0
    summary = dashboard(args.db, args.out, args.window, args.margin)
    print(f"{args.out}: {summary['runs']} runs, {summary['series']} series, {len(summary['regressions'])} regressions")
    for case, profile, check, metric in summary["regressions"]:
        print(f"  REGRESSION {case}[{profile}] {check} {metric}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
