"""``python -m harness wrappers``: which registered tico wrappers the cases exercise.

    python -m harness wrappers                         # table from the committed snapshot
    python -m harness wrappers --measure [--write]     # measure every tiny case now (no export)
    python -m harness wrappers --measure --case llama_mlp --case nn_linear
    python -m harness wrappers --from reports/results.json   # the map a matrix run recorded

``--write`` (with ``--measure``) rewrites ``wrapper_coverage.json`` and the table in docs/wrapper-coverage.md.
Exit status 1 when the map and ``cases/wrapper_coverage_reasons.toml`` disagree (a registered wrapper
no case exercises without a reason, or a stale reason); the problems are printed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from harness.commands import _coverage_measure as coverage_measure
from harness.tico_facts import wrapper_coverage as wc

HELP = "which registered tico wrappers the cases exercise (standalone / as a child / why none)"


def main(argv: list[str]) -> int:

    parser = argparse.ArgumentParser(prog="python -m harness wrappers", description=HELP)
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--measure", action="store_true", help="measure the tiny cases in this process")
    source.add_argument("--from", dest="results", type=Path, help="read the map from a results.json")
    parser.add_argument("--case", action="append", help="with --measure: only this case (repeatable)")
    parser.add_argument(
        "--write",
        action="store_true",
        help="with --measure over every case: rewrite wrapper_coverage.json and the table in docs/wrapper-coverage.md",
    )
    parser.add_argument("--json", action="store_true", help="print the per-case records as JSON")
    args = parser.parse_args(argv)
    if args.write and (not args.measure or args.case):
        parser.error("--write needs --measure over every case (no --case)")

    seconds = None
    if args.measure:
        start = time.perf_counter()
        per_case = coverage_measure.measure_all(args.case)
        seconds = time.perf_counter() - start
    elif args.results:
        per_case = wc.from_results(json.loads(args.results.read_text()))
        if not per_case:
            print(f"{args.results}: no item carries a wrapper_coverage record (run the tiny matrix)", file=sys.stderr)
            return 2
    else:
        per_case = wc.load_snapshot()["cases"]

    errors = {case: cov["error"] for case, cov in per_case.items() if "error" in cov}
    if args.json:
        print(json.dumps(per_case, indent=1, sort_keys=True))
    registered = wc.tico_wrappers()
    reasons = wc.load_reasons()
    text = wc.table(per_case, reasons, registered)
    if not args.json:
        print(text)
    if seconds is not None:
        stage = sum(float(cov.get("seconds", 0.0)) for cov in per_case.values())
        print(
            f"\nmeasured {len(per_case)} cases in {seconds:.1f} s (build, prepare, calibrate, convert, "
            f"QUANT evaluation; the wrapper_coverage stages, QUANT evaluation included, {stage:.2f} s)",
            file=sys.stderr,
        )
    for case, error in errors.items():
        print(f"{case}: measurement failed: {error}", file=sys.stderr)
    if args.write:
        if errors:
            print("not written: some cases failed to measure", file=sys.stderr)
            return 1
        wc.SNAPSHOT.write_text(json.dumps(wc.snapshot_document(per_case), indent=1, sort_keys=True) + "\n")
        wc.write_readme(wc.table(per_case, reasons, registered))
        print(f"wrote {wc.SNAPSHOT.name} and the table in docs/wrapper-coverage.md", file=sys.stderr)
    partial = bool(args.case)
    found = [] if partial else wc.problems(registered, wc.aggregate(per_case), reasons)
    for line in found:
        print(f"PROBLEM: {line}", file=sys.stderr)
    return 1 if found or errors else 0
