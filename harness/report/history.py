"""Nightly history: append runs to SQLite (parameterised SQL only), render a trend dashboard.

    python -m harness.report.history append reports/results.json [--db reports/history.sqlite]
    python -m harness.report.history dashboard [--db ...] [--out reports/dashboard.html] [--window 5] [--margin 0.1]
        [--acknowledged acknowledged.toml] [--fail-on-regression] [--summary-md FILE]

A metric regresses when its latest value is worse than the median of the previous ``window``
runs by more than ``margin`` (relative, with a small absolute floor). Which metrics are tracked
and which direction is worse come from the checks' declarations that results.json carries
(``Metric(better=...)``); a series is one (case, profile, check, metric). What an alert says --
acknowledged expected changes, stale acknowledgements, and what moved (versions, commit) where a
change started -- is harness/report/alerts.py.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import math
import shlex
import sqlite3
import statistics
import sys
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup

from harness.report import alerts, svg
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
        return {"latest": latest, "baseline": None, "regressed": False, "improved": False, "change": None}
    baseline = statistics.median(previous)
    allowed = abs(baseline) * margin + ABS_FLOOR
    worse = latest - baseline if lower_is_better else baseline - latest
    return {"latest": latest, "baseline": baseline, "regressed": worse > allowed, "improved": -worse > allowed,
            "change": latest - baseline}


def change_start(points: list[tuple[int, float]], lower_is_better: bool, window: int, margin: float,
                 regressed: bool) -> int:
    """Index in ``points`` of the first run of the latest stretch beyond the margin (the same
    way as the latest value): where the series left its baseline. The window's median lies
    inside the band, so the stretch starts after the window's first value."""
    values = [v for _, v in points]
    baseline = statistics.median(values[-1 - window : -1])
    allowed = abs(baseline) * margin + ABS_FLOOR

    def beyond(value: float) -> bool:
        worse = value - baseline if lower_is_better else baseline - value
        return worse > allowed if regressed else -worse > allowed

    start = len(points) - 1
    while start - 1 >= max(1, len(points) - 1 - window) and beyond(values[start - 1]):
        start -= 1
    return start


def _nodeids_by_run(con: sqlite3.Connection) -> dict[tuple[str, str, str, int], str]:
    rows = con.execute("SELECT case_name, profile, check_name, run_id, nodeid FROM items")
    return {(case, profile, check, run_id): nodeid for case, profile, check, run_id, nodeid in rows}


def dashboard(db: Path, out: Path, window: int = 5, margin: float = 0.1,
              acknowledgements: list[alerts.Acknowledgement] | None = None) -> dict[str, Any]:
    """Render the dashboard; returns what it flagged. ``regressions`` are the unacknowledged
    ones (case, profile, check, metric); acknowledged changes, improvements and stale
    acknowledgements are listed apart, each flagged change with what moved where it started."""
    with connect(db) as con:
        rows = con.execute("SELECT id, started_at, commit_sha, versions FROM runs ORDER BY id").fetchall()
        data, better = series(con)
        nodeids = _nodeids_by_run(con)
    runs = [{"id": rid, "started_at": started, "commit": commit, "versions": json.loads(versions or "{}")}
            for rid, started, commit, versions in rows]
    by_id = {run["id"]: run for run in runs}
    run_ids = [run["id"] for run in runs]
    entries = []
    for (case, profile, check, metric), points in sorted(data.items()):
        direction = better.get((case, profile, check, metric))
        if direction not in ("lower", "higher"):
            continue  # rows from before directions were stored: kept, not judged
        by_run = dict(points)
        values = [by_run.get(rid) for rid in run_ids]
        present = [(rid, by_run[rid]) for rid in run_ids if rid in by_run]
        lower = direction == "lower"
        verdict = judge([v for _, v in present], lower, window, margin)
        status = "new" if verdict["baseline"] is None else "ok"
        moved = None
        if verdict["regressed"] or verdict["improved"]:
            status = "regressed" if verdict["regressed"] else "improved"
            start = change_start(present, lower, window, margin, verdict["regressed"])
            moved = alerts.what_moved(by_id[present[start - 1][0]], by_id[present[start][0]])
        nodeid = nodeids.get((case, profile, check, present[-1][0]))
        entries.append({"case": case, "profile": profile, "check": check, "metric": metric, "values": values,
                        "lower_is_better": lower, **verdict, "status": status, "moved": moved, "ack": None,
                        "latest_run": present[-1][0], "nodeid": nodeid,
                        "repro": f"./scripts/env.sh pytest {shlex.quote(nodeid)}" if nodeid else None})
    stale = alerts.apply(acknowledgements or [], entries, runs)
    for entry in entries:
        entry["chart"] = Markup(svg.trend(entry["values"], flagged=entry["status"] == "regressed",
                                          label=f"{entry['case']} {entry['metric']}"))
    latest = runs[-1] if runs else None
    versions_moved = alerts.describe_version_moves(alerts.version_moves(runs[-1 - window : -1], latest)) if latest else ""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(Path(__file__).parent / "templates")), autoescape=True)
    env.filters["num"] = lambda v: (f"{v:.4g}" if isinstance(v, float) else ("" if v is None else v))
    by_status = {s: [e for e in entries if e["status"] == s] for s in ("regressed", "acknowledged", "improved")}
    html = env.get_template("dashboard.html.j2").render(
        runs=rows, entries=entries, regressions=by_status["regressed"], acknowledged=by_status["acknowledged"],
        improvements=by_status["improved"], stale=stale, versions_moved=versions_moved, window=window, margin=margin)
    atomic_write_text(out, html)

    def key(e: dict[str, Any]) -> tuple[str, str, str, str]:
        return (e["case"], e["profile"], e["check"], e["metric"])

    def plain(e: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in e.items() if k not in ("chart", "values")}

    return {"runs": len(runs), "series": len(entries), "window": window, "margin": margin,
            "latest": {k: latest[k] for k in ("id", "started_at", "commit")} if latest else None,
            "versions_moved": versions_moved,
            "regressions": [key(e) for e in by_status["regressed"]],
            "acknowledged": [key(e) for e in by_status["acknowledged"]],
            "improvements": [key(e) for e in by_status["improved"]],
            "regression_entries": [plain(e) for e in by_status["regressed"]],
            "acknowledged_entries": [plain(e) for e in by_status["acknowledged"]],
            "improvement_entries": [plain(e) for e in by_status["improved"]],
            "stale": stale, "acknowledgements_count": len(acknowledgements or [])}


def _acknowledgements(path: Path | None) -> tuple[list[alerts.Acknowledgement], Path | None]:
    """The given file (it must exist), else the default one where it exists, else none."""
    if path is None:
        default = Path(alerts.DEFAULT_FILE)
        if not default.is_file():
            return [], None
        path = default
    return alerts.load_acknowledgements(path), path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.report.history", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    app = sub.add_parser("append", help="append a results.json to the history database")
    app.add_argument("results", type=Path)
    app.add_argument("--db", type=Path, default=Path("reports/history.sqlite"))
    dash = sub.add_parser("dashboard", help="render the trend dashboard",
                          epilog="exit status: 0; 1 with --fail-on-regression when an unacknowledged regression is "
                                 "flagged; 2 on bad input (no database, a bad acknowledgements file)")
    dash.add_argument("--db", type=Path, default=Path("reports/history.sqlite"))
    dash.add_argument("--out", type=Path, default=Path("reports/dashboard.html"))
    dash.add_argument("--window", type=int, default=5, help="previous runs whose median is the baseline")
    dash.add_argument("--margin", type=float, default=0.1, help="relative worsening that counts as a regression")
    dash.add_argument("--acknowledged", type=Path, default=None, metavar="FILE",
                      help=f"reviewed expected changes (.toml or .json; default ./{alerts.DEFAULT_FILE} where it exists)")
    dash.add_argument("--fail-on-regression", action="store_true",
                      help="exit 1 when a regression no acknowledgement covers is flagged")
    dash.add_argument("--summary-md", type=Path, default=None, metavar="FILE",
                      help="write the regressions, acknowledged changes, improvements and stale acknowledgements "
                           "as markdown (a CI job summary, an issue comment)")
    args = parser.parse_args(argv)
    if args.command == "append":
        run_id = append_run(args.db, json.loads(args.results.read_text()))
        print(f"appended run {run_id} to {args.db}")
        return 0
    if not args.db.is_file():
        print(f"history: error: history database not found: {args.db}", file=sys.stderr)
        return 2
    if args.window < 1 or args.margin < 0:
        print(f"history: error: --window must be >= 1 and --margin >= 0 (got {args.window}, {args.margin})", file=sys.stderr)
        return 2
    try:
        acks, ack_path = _acknowledgements(args.acknowledged)
    except alerts.AckError as exc:
        print(f"history: error: {exc}", file=sys.stderr)
        return 2
    summary = dashboard(args.db, args.out, args.window, args.margin, acknowledgements=acks)
    summary["acknowledgements_file"] = ack_path
    print(f"{args.out}: {summary['runs']} runs, {summary['series']} series, {len(summary['regressions'])} regressions, "
          f"{len(summary['acknowledged'])} acknowledged, {len(summary['improvements'])} improvements, "
          f"{len(summary['stale'])} stale acknowledgements")
    if summary["versions_moved"]:
        print(f"  {summary['versions_moved']} (latest run against its baseline window)")
    for label, entries in (("REGRESSION", summary["regression_entries"]), ("ACKNOWLEDGED", summary["acknowledged_entries"]),
                           ("IMPROVED", summary["improvement_entries"])):
        for e in entries:
            line = (f"  {label} {e['case']}[{e['profile']}] {e['check']} {e['metric']}: {e['latest']:.4g} vs median "
                    f"{e['baseline']:.4g} ({e['moved']['text']})")
            if e.get("ack"):
                line += f" -- {e['ack']['reason']}"
            print(line)
            if label == "REGRESSION" and e.get("repro"):
                print(f"    repro: {e['repro']}")
    for s in summary["stale"]:
        print(f"  STALE acknowledgement {s['index']} ({s['series']}, {s['since']}): {s['why']}")
    if args.summary_md:
        atomic_write_text(args.summary_md, alerts.summary_markdown(summary))
        print(f"summary: {args.summary_md}")
    return 1 if args.fail_on_regression and summary["regressions"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
