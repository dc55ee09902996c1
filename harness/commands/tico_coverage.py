"""``python -m harness tico-coverage [REPORT_DIR ...] [--merge-into DIR [--no-html]] [--areas] [--files] [--classes]
[--uncovered N] [--base TICO] [--check-reasons] [--write-snapshot]``: which of tico's lines and branches a
``--tico-coverage`` run (or its shards, merged) executed; with ``--base`` the lines a change to tico touches
that no case reaches; with ``--check-reasons`` whether every untaken wrapper branch has a reviewed reason."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tabulate import tabulate

from harness.tico_facts import branch_coverage, branch_reasons, converter_areas, tico_diff

HELP = "tico's lines and branches a --tico-coverage run executed; --base TICO: diff coverage of a change"


def _rows(entries: dict, prefix: str) -> list[list]:
    rows = []
    for name, entry in sorted(entries.items()):
        if not name.startswith(prefix):
            continue
        branches = entry["branches"]
        percent = f"{100.0 * entry['branches_covered'] / branches:.0f}%" if branches else "-"
        rows.append([name[len(prefix) :], f"{entry['lines_covered']}/{entry['statements']}", percent, branches])
    return rows


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness tico-coverage", description=HELP)
    parser.add_argument(
        "where", nargs="*", type=Path, default=[Path("reports")], help="report dir of the run (or of each shard)"
    )
    parser.add_argument(
        "--merge-into", type=Path, default=None, metavar="DIR", help="combine the shards' measurements into DIR"
    )
    parser.add_argument(
        "--no-html",
        action="store_true",
        help="with --merge-into: the summary only, without coverage's HTML pages (most of a merge's time)",
    )
    parser.add_argument(
        "--areas", action="store_true", help="per area of tico: the wrappers, the converter's parts, the algorithms"
    )
    parser.add_argument("--files", action="store_true", help="per file of the wrappers")
    parser.add_argument("--families", action="store_true", help="per wrapper family (subdirectory)")
    parser.add_argument("--classes", action="store_true", help="per wrapper class")
    parser.add_argument("--uncovered", type=int, default=0, metavar="N", help="list N uncovered branches")
    parser.add_argument(
        "--entry-points", action="store_true", help="tico's public entry points (interface, builders, quantizers)"
    )
    parser.add_argument("--base", type=Path, default=None, help="the base tico (package dir, checkout or .whl)")
    parser.add_argument("--limit", type=int, default=40, help="unreached changed lines to list (default 40)")
    parser.add_argument(
        "--check-reasons",
        action="store_true",
        help=f"exit 1 when an untaken wrapper branch has no reason in cases/{branch_reasons.REASONS.name} "
        "or a reason explains none",
    )
    parser.add_argument(
        "--write-snapshot",
        action="store_true",
        help=f"record the run's untaken wrapper branches in {branch_reasons.SNAPSHOT.name} (the nightly selection)",
    )
    args = parser.parse_args(argv)
    if len(args.where) > 1 and args.merge_into is None:
        parser.error("several report directories (shards) need --merge-into DIR")
    if args.no_html and args.merge_into is None:
        parser.error("--no-html applies to --merge-into DIR (a run writes its pages as it combines)")
    if args.write_snapshot and args.merge_into is not None:
        parser.error("--write-snapshot reads one run's results.json: merge the shards first")
    try:
        if args.merge_into is not None:
            summary = branch_coverage.merge(args.where, args.merge_into, html=not args.no_html)
        else:
            summary = branch_coverage.load(args.where[0])
    except FileNotFoundError as exc:
        print(exc)
        return 2
    prefix = summary["scope"] + "/"
    print(branch_coverage.headline(summary))
    try:
        reach = branch_reasons.reach(summary, branch_reasons.load_reasons())
    except ValueError as exc:
        reach = None
        print(f"reachable: {exc}")
    if reach is not None:
        print(branch_reasons.reach_line(reach))
    whole = summary["totals"]
    print(f"all of tico: {whole['percent_lines']}% of lines, {whole['percent_branches']}% of branches")
    print(converter_areas.core_line(branch_coverage.converter_core(summary["files"])))
    if summary.get("wall_seconds"):
        print(f"cost: the measured run took {summary['wall_seconds']:.0f} s (benchmarks/tico_coverage_cost.py: ratio)")
    headers = ["", "lines", "branches run", "branches"]
    if args.families:
        families: dict[str, dict[str, int]] = {}
        for name, entry in summary["files"].items():
            if name.startswith(prefix):
                family = branch_reasons.family_of(name[len(prefix) :])
                totals = families.setdefault(
                    family, dict.fromkeys(("lines_covered", "statements", "branches_covered", "branches"), 0)
                )
                for key in totals:
                    totals[key] += entry[key]
        rows = _rows(families, "")
        if reach is not None:
            for row in rows:
                figures = reach["families"].get(row[0], {})
                share = figures.get("percent_reachable")
                row += [figures.get("reachable", "-"), "-" if share is None else f"{share:.0f}%"]
        extra = ["reachable", "reachable run"] if reach is not None else []
        print(tabulate(rows, headers=["family", *headers[1:], *extra]))
    if args.areas:
        print(tabulate(_rows(summary["areas"], ""), headers=["area", *headers[1:]]))
    if args.files:
        print(tabulate(_rows(summary["files"], prefix), headers=["file", *headers[1:]]))
    if args.classes:
        print(tabulate(_rows(summary["classes"], prefix), headers=["class", *headers[1:]]))
    if args.entry_points:
        found = branch_coverage.entry_points(summary)
        print(tabulate([[name, "yes" if ran else "no"] for name, ran in found], headers=["entry point", "called"]))
        print(f"{sum(ran for _, ran in found)} of {len(found)} entry points called")
    if args.uncovered:
        shown = 0
        for name, entry in sorted(summary["files"].items()):
            for branch in entry["uncovered_branches"] if name.startswith(prefix) else []:
                if shown < args.uncovered:
                    target = "exit" if branch["to"] < 0 else branch["to"]
                    print(f"{name[len(prefix) :]}:{branch['line']} -> {target}  {branch['condition'][:80]}")
                shown += 1
        print(f"{shown} uncovered branch(es) in {summary['scope']}")
    if args.base is not None:
        try:
            result = tico_diff.diff_coverage(summary, args.base)
        except FileNotFoundError as exc:
            print(exc)
            return 2
        print(tico_diff.render(result, args.limit))
    if args.write_snapshot:
        results = args.where[0] / "results.json"
        if not results.is_file():
            print(f"--write-snapshot: no {results} (the run's record says which tico and selection it measured)")
            return 2
        run = json.loads(results.read_text())["run"]
        document = branch_reasons.snapshot_document(summary, run)
        if branch_reasons.SNAPSHOT.is_file():
            committed = json.loads(branch_reasons.SNAPSHOT.read_text())
            for family in branch_reasons.carry_own_runs(document, committed):
                print(f"kept the committed {family}/ entries: only its own run executes them (same tico)")
        branch_reasons.SNAPSHOT.write_text(json.dumps(document, indent=1) + "\n")
        print(f"wrote {branch_reasons.SNAPSHOT.name}: {len(document['uncovered'])} untaken branch(es)")
    if args.check_reasons:
        untaken, reasons = branch_reasons.uncovered(summary), branch_reasons.load_reasons()
        not_run = branch_reasons.own_run_families_not_run(summary)
        if not_run:
            print(f"not judged: {', '.join(f'{f}/' for f in not_run)} (this run executed none of it; its own run does)")
            untaken = [b for b in untaken if branch_reasons.family_of(b.file) not in not_run]
            reasons = [r for r in reasons if branch_reasons.family_of(r.where.split("::")[0]) not in not_run]
        found = branch_reasons.problems(untaken, reasons)
        for line in found:
            print(f"PROBLEM: {line}")
        by_kind = ", ".join(f"{kind} {n}" for kind, n in branch_reasons.kinds(untaken, reasons).items())
        print(f"untaken wrapper branches by reason: {by_kind or 'none'}; {len(found)} problem(s)")
        return 1 if found else 0
    return 0
