"""Nightly history: append runs to SQLite (parameterised SQL only), render a trend dashboard.

    python -m harness.report.history append reports/results.json [--db reports/history.sqlite]
    python -m harness.report.history dashboard [--db ...] [--out reports/dashboard.html] [--window 5] [--margin 0.1]

A metric regresses when its latest value is worse than the median of the previous ``window``
runs by more than ``margin`` (relative, with a small absolute floor); direction is per metric.
"""

from __future__ import annotations

import argparse
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

# metric -> True when lower is better
TRACKED = {
    "peir": True,
    "mean_abs_diff": True,
    "max_abs_diff": True,
    "sqnr_db": False,
    "fake_quantize_max_steps": True,
    "fake_quantize_mean_steps": True,
    "missing_qparam": True,
    "drifted": True,
}
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
    value REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS metrics_key ON metrics(case_name, profile, metric, run_id);
"""


def connect(db: Path) -> sqlite3.Connection:
    db.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(str(db), timeout=30)
    con.executescript(SCHEMA)
    return con


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
            for metric, value in (rec.get("metrics") or {}).items():
                if metric in TRACKED and isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                    con.execute(
                        "INSERT INTO metrics (run_id, case_name, profile, check_name, metric, value) VALUES (?, ?, ?, ?, ?, ?)",
                        (run_id, rec["case"], rec["profile"], rec["check"], metric, float(value)),
                    )
    return run_id


def series(con: sqlite3.Connection) -> dict[tuple[str, str, str], list[tuple[int, float]]]:
    out: dict[tuple[str, str, str], list[tuple[int, float]]] = {}
    rows = con.execute("SELECT case_name, profile, metric, run_id, value FROM metrics ORDER BY run_id")
    for case, profile, metric, run_id, value in rows:
        out.setdefault((case, profile, metric), []).append((run_id, value))
    return out


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
    run_ids = [r[0] for r in runs]
    entries = []
    for (case, profile, metric), points in sorted(data.items()):
        by_run = dict(points)
        values = [by_run.get(rid) for rid in run_ids]
        present = [v for v in values if v is not None]
        verdict = judge(present, TRACKED[metric], window, margin)
        entries.append({"case": case, "profile": profile, "metric": metric, "values": values,
                        "lower_is_better": TRACKED[metric], **verdict,
                        "chart": Markup(svg.trend(values, flagged=verdict["regressed"], label=f"{case} {metric}"))})
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(Path(__file__).parent / "templates")), autoescape=True)
    env.filters["num"] = lambda v: (f"{v:.4g}" if isinstance(v, float) else ("" if v is None else v))
    regressions = [e for e in entries if e["regressed"]]
    html = env.get_template("dashboard.html.j2").render(runs=runs, entries=entries, regressions=regressions,
                                                         window=window, margin=margin)
    atomic_write_text(out, html)
    return {"runs": len(runs), "series": len(entries), "regressions": [(e["case"], e["profile"], e["metric"]) for e in regressions]}


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
    for case, profile, metric in summary["regressions"]:
        print(f"  REGRESSION {case}[{profile}] {metric}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
