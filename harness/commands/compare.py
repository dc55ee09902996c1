"""``python -m harness compare BASE.json HEAD.json``: what a pull request changed, item by item.

Verdict changes first (passed -> failed, new failures, fixed, new and removed items,
xfail <-> fail), then moves of the metrics the checks declare with a direction beyond a relative
margin, each with the command that reruns the item; printed, and written as markdown (a PR
comment) and self-contained HTML on request. Runs on different pinned stacks are refused.

Exit status: 0 nothing got worse, 1 something got worse (``--fail-on`` chooses what counts),
2 bad input (a missing or corrupt file, different stacks, bad options).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.records.results import atomic_write_text
from harness.report import comparison_report, run_compare

HELP = "compare two results.json (PR head vs base): verdict changes, then metric moves; exit 1 if worse"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m harness compare",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="exit status: 0 nothing got worse, 1 worse (see --fail-on), 2 bad input",
    )
    p.add_argument("base", type=Path, help="the base run's results.json (or its report directory)")
    p.add_argument("head", type=Path, help="the head run's results.json (or its report directory)")
    p.add_argument(
        "--margin",
        type=float,
        default=0.1,
        help="relative move of a declared metric that is reported (default 0.1 = 10%%)",
    )
    p.add_argument(
        "--abs-floor",
        type=float,
        default=1e-9,
        help="absolute move always tolerated, for metrics whose base is 0 (default 1e-9)",
    )
    p.add_argument(
        "--fail-on",
        choices=("any", "verdict", "metric", "none"),
        default="any",
        help="what makes the exit status 1: a regressed verdict or a worse metric (any, the default), "
        "only verdicts, only metrics, or nothing (report only)",
    )
    p.add_argument(
        "--allow-version-mismatch",
        action="store_true",
        help="compare runs whose recorded versions (torch, transformers, tico, ...) differ",
    )
    p.add_argument("--markdown", type=Path, metavar="FILE", help="also write the comparison as markdown")
    p.add_argument("--html", type=Path, metavar="FILE", help="also write it as one self-contained HTML file")
    return p


def main(argv: list[str]) -> int:

    try:
        args = parser().parse_args(argv)
    except SystemExit as exc:  # argparse's usage errors are bad input too
        return int(exc.code or 0)
    try:
        base = run_compare.load_results(args.base, "base")
        head = run_compare.load_results(args.head, "head")
        cmp = run_compare.compare(
            base, head, margin=args.margin, abs_floor=args.abs_floor, allow_version_mismatch=args.allow_version_mismatch
        )
    except run_compare.CompareError as exc:
        print(f"compare: error: {exc}", file=sys.stderr)
        return 2
    print(comparison_report.render_text(cmp))
    try:
        if args.markdown:
            atomic_write_text(args.markdown, comparison_report.render_markdown(cmp))
            print(f"markdown: {args.markdown}")
        if args.html:
            atomic_write_text(args.html, comparison_report.render_html(cmp))
            print(f"html: {args.html}")
    except OSError as exc:
        print(f"compare: error: cannot write {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2
    return 1 if cmp.got_worse(args.fail_on) else 0
