"""``python -m harness limits``: propose a profile's limits from clean runs, for review
(harness/report/limits_proposal.py), or a new case's ready-to-paste settings block."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from harness.checks import all_checks, describe_checks
from harness.report.limits_proposal import propose, settings_block, table, write

HELP = "propose a profile's limits from clean runs (for review)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness limits", description=HELP)
    parser.add_argument("--profile", default=None, help="the profile the runs measured (required for --write)")
    parser.add_argument(
        "--case",
        action="append",
        default=None,
        metavar="NAME",
        help="print a ready-to-paste settings={...} block with every limit the checks declare for "
        "this case, gated or not (a new case that sets none); repeatable",
    )
    parser.add_argument(
        "--write",
        nargs="?",
        const=True,
        default=None,
        metavar="PATH",
        help="merge the proposal into the profile's limits data (default cases/limits/<profile>.json) "
        "instead of printing it; review the diff before committing",
    )
    parser.add_argument("results", nargs="+", type=Path, help="results.json of clean runs of the profile")
    args = parser.parse_args(argv)
    docs = [json.loads(path.read_text()) for path in args.results]
    checks = {name: meta for doc in docs for name, meta in ((doc.get("run") or {}).get("checks") or {}).items()}
    if not checks:
        checks = describe_checks(all_checks())
    if args.case:
        return _print_case_blocks(
            docs, checks, args.case, args.profile or "tiny", [p.parent.name for p in args.results]
        )
    if args.profile is None:
        parser.error("--profile is required (or --case NAME for a new case's settings block)")
    proposals = propose([doc["results"] for doc in docs], args.profile, checks)
    if not proposals:
        print(f"no gated metric of profile {args.profile!r} in {', '.join(map(str, args.results))}")
        return 1
    proposed = table(proposals, args.profile, [path.parent.name for path in args.results])
    if args.write is None:
        print(json.dumps(proposed, indent=1))
        return 0
    path = Path("cases/limits") / f"{args.profile}.json" if args.write is True else Path(args.write)
    written = write(path, proposed)
    print(f"wrote limits of {len(written)} case(s) to {path}: {', '.join(written)}; review `git diff {path}`")
    return 0


def _print_case_blocks(docs: list[dict], checks: dict, cases: list[str], profile: str, run_names: list[str]) -> int:
    proposals = propose([doc["results"] for doc in docs], profile, checks, every_limit=True)
    missing = [case for case in cases if case not in proposals]
    for case in cases:
        if case in proposals:
            print(settings_block(case, proposals[case], run_names))
        counts = {
            r["metrics"]["observers"]
            for doc in docs
            for r in doc["results"]
            if r.get("case") == case
            and r.get("profile") == profile
            and r.get("check") == "observer_use"
            and isinstance((r.get("metrics") or {}).get("observers"), int)
        }
        if len(counts) == 1:
            print(f"expected_observer_count={counts.pop()},  # observers fed and applied in the measured run")
    if missing:
        print(
            f"no gated metric measured for {', '.join(missing)} at profile {profile!r} in these runs", file=sys.stderr
        )
        return 1
    return 0
