"""``python -m harness history``: append results to the SQLite history, render the trend dashboard.

    python -m harness history append reports/results.json [--db reports/history.sqlite]
    python -m harness history dashboard [--db ...] [--out reports/dashboard.html] [--window 5] [--margin 0.1]
        [--acknowledged acknowledged.toml] [--policy regression_policy.toml] [--fail-on-regression]
        [--summary-md FILE] [--nights 100]

The store is harness/report/history_store.py, the judging harness/report/regression.py, the dashboard
harness/report/dashboard.py, what an alert says harness/report/alerts.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from harness.records.results import atomic_write_text
from harness.report import alerts
from harness.report import policy as policy_mod
from harness.report.dashboard import dashboard
from harness.report.history_store import CHART_RUNS, HistoryError, append_run

HELP = "append results to the SQLite history; render the dashboard"


def _reviewed(path: Path | None, default_name: str, load):
    """(entries, the file read): the given file (it must exist), else the default one where it
    exists, else none."""
    if path is None:
        default = Path(default_name)
        if not default.is_file():
            return [], None
        path = default
    return load(path), path


def _policies(path: Path | None) -> tuple[list[policy_mod.PolicyEntry], Path | None]:
    return _reviewed(path, policy_mod.DEFAULT_FILE, policy_mod.load_policies)


def _acknowledgements(path: Path | None) -> tuple[list[alerts.Acknowledgement], Path | None]:
    return _reviewed(path, alerts.DEFAULT_FILE, alerts.load_acknowledgements)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness history", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    app = sub.add_parser("append", help="append a results.json to the history database")
    app.add_argument("results", type=Path)
    app.add_argument("--db", type=Path, default=Path("reports/history.sqlite"))
    dash = sub.add_parser(
        "dashboard",
        help="render the trend dashboard",
        epilog="exit status: 0; 1 with --fail-on-regression when an unacknowledged regression is "
        "flagged; 2 on bad input (no database, a bad acknowledgements file)",
    )
    dash.add_argument("--db", type=Path, default=Path("reports/history.sqlite"))
    dash.add_argument("--out", type=Path, default=Path("reports/dashboard.html"))
    dash.add_argument("--window", type=int, default=5, help="previous runs whose median is the baseline")
    dash.add_argument(
        "--margin",
        type=float,
        default=0.1,
        help="relative worsening that counts as a regression, for metrics whose policy sets no margin",
    )
    dash.add_argument(
        "--policy",
        type=Path,
        default=None,
        metavar="FILE",
        help=f"per case/metric/testbed regression policies (.toml or .json; default "
        f"./{policy_mod.DEFAULT_FILE} where it exists)",
    )
    dash.add_argument(
        "--nights",
        type=int,
        default=CHART_RUNS,
        help="runs per testbed shown in the sparklines and charts (judging is unaffected)",
    )
    dash.add_argument(
        "--acknowledged",
        type=Path,
        default=None,
        metavar="FILE",
        help=f"reviewed expected changes (.toml or .json; default ./{alerts.DEFAULT_FILE} where it exists)",
    )
    dash.add_argument(
        "--fail-on-regression",
        action="store_true",
        help="exit 1 when a regression no acknowledgement covers is flagged",
    )
    dash.add_argument(
        "--summary-md",
        type=Path,
        default=None,
        metavar="FILE",
        help="write the regressions, acknowledged changes, improvements and stale acknowledgements "
        "as markdown (a CI job summary, an issue comment)",
    )
    args = parser.parse_args(argv)
    if args.command == "append":
        try:
            run_id = append_run(args.db, json.loads(args.results.read_text()))
        except HistoryError as exc:
            print(f"history: error: {exc}", file=sys.stderr)
            return 2
        print(f"appended run {run_id} to {args.db}")
        return 0
    if not args.db.is_file():
        print(f"history: error: history database not found: {args.db}", file=sys.stderr)
        return 2
    if args.window < 1 or args.margin < 0 or args.nights < 1:
        print(
            f"history: error: --window and --nights must be >= 1 and --margin >= 0 (got {args.window}, "
            f"{args.nights}, {args.margin})",
            file=sys.stderr,
        )
        return 2
    try:
        acks, ack_path = _acknowledgements(args.acknowledged)
        policies, policy_path = _policies(args.policy)
        summary = dashboard(
            args.db,
            args.out,
            args.window,
            args.margin,
            acknowledgements=acks,
            policies=policies,
            chart_runs=args.nights,
        )
    except (alerts.AckError, policy_mod.PolicyError, HistoryError) as exc:
        print(f"history: error: {exc}", file=sys.stderr)
        return 2
    summary["acknowledgements_file"] = ack_path
    summary["policy_file"] = policy_path
    print(
        f"{args.out}: {summary['runs']} runs, {summary['series']} series, {len(summary['regressions'])} regressions, "
        f"{len(summary['acknowledged'])} acknowledged, {len(summary['improvements'])} improvements, "
        f"{len(summary['stale'])} stale acknowledgements"
    )
    if summary["versions_moved"]:
        print(f"  {summary['versions_moved']} (latest run against its baseline window)")
    for label, entries in (
        ("REGRESSION", summary["regression_entries"]),
        ("ACKNOWLEDGED", summary["acknowledged_entries"]),
        ("IMPROVED", summary["improvement_entries"]),
    ):
        for e in entries:
            line = (
                f"  {label} {e['case']}[{e['profile']}] {e['check']} {e['metric']}: {e['latest']:.4g} vs median "
                f"{e['baseline']:.4g} ({e['moved']['text']})"
            )
            if e.get("ack"):
                line += f" -- {e['ack']['reason']}"
            print(line)
            if label == "REGRESSION" and e.get("repro"):
                print(f"    repro: {e['repro']}")
    if len(summary["testbeds"]) > 1:
        for tb in summary["testbeds"]:
            print(f"  testbed {tb['id'] or '-'}: {tb['label']} ({tb['runs']} runs, {tb['series']} series)")
    for p in summary["unused_policies"]:
        print(f"  UNUSED policy entry {p['index']} ({p['reason']}): matches no series")
    for s in summary["stale"]:
        print(f"  STALE acknowledgement {s['index']} ({s['series']}, {s['since']}): {s['why']}")
    if args.summary_md:
        atomic_write_text(args.summary_md, alerts.summary_markdown(summary))
        print(f"summary: {args.summary_md}")
    return 1 if args.fail_on_regression and summary["regressions"] else 0
