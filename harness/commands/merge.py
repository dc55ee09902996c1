"""``python -m harness merge SHARD.json ... -o results.json``: merge CI matrix shards into one
results.json and report.html (harness/report/shard_merge.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from harness.records.results import atomic_write_text
from harness.report.html import write_report
from harness.report.shard_merge import MergeError, merge

HELP = "merge shard results into one results.json + report"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness merge", description=HELP)
    parser.add_argument("shards", nargs="+", type=Path)
    parser.add_argument("-o", "--output", type=Path, default=Path("reports/results.json"))
    parser.add_argument(
        "--allow-mixed", action="store_true", help="merge shards of different commits, golden sets or testbeds"
    )
    args = parser.parse_args(argv)
    try:
        merged = merge([json.loads(p.read_text()) for p in args.shards], allow_mixed=args.allow_mixed)
    except MergeError as exc:
        parser.exit(2, f"merge refused: {exc}\n")
    atomic_write_text(args.output, json.dumps(merged, indent=2, sort_keys=True))
    report = write_report(merged, args.output.with_name("report.html"))
    print(f"merged {len(args.shards)} shards, {len(merged['results'])} results -> {args.output}, {report}")
    return 1 if merged["run"]["exitstatus"] else 0
