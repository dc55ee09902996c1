"""``python -m harness findings [results.json]``: tico's findings, and what a run saw of them.

Without a results file (or with ``--registry``), lists every finding of ``findings/tico.toml``:
id, title, the checks it has patterns for, and the cases that declare it. With one (default
``reports/results.json`` when it exists), each finding's status in that run -- open, fixed or new --
with where it was seen and the command that reproduces it, then the problems no finding explains,
each shape of them with a suggested record to complete once diagnosed.
``--id ID`` prints one finding whole (cause, symbols, patterns).
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path

from harness.model import sweep
from harness.model.case_loading import add_configured_import_roots, load_cases
from harness.tico_facts.finding_status import render_lines, summarize
from harness.tico_facts.finding_suggestion import suggestions
from harness.tico_facts.findings_data import FindingsError, registry
from harness.tico_facts.tico_identity import describe

HELP = "tico's findings (findings/tico.toml) and their status in a run: open, fixed or new"


def declared_expectations():
    """(case file, 'case[profile,variant]:check', check, Expected) for every collected case, every
    profile and every sweep variant the nightly runs."""

    add_configured_import_roots()
    for path, case in load_cases():
        for profile in case.profiles:
            for variant in sweep.iter_selected(case, profile, "nightly"):
                label = variant.variant.label if variant.variant else ""
                for check, expectation in variant.expected_failures_for(profile).items():
                    yield path, f"{variant.name}[{profile},{label}]:{check}", check, expectation


def _declared_by() -> dict[str, list[str]]:
    """finding id -> 'case[profile,variant]:check' wherever a case declares it."""
    out: dict[str, set[str]] = {}
    for _, where, _, expectation in declared_expectations():
        for fid in expectation.findings:
            out.setdefault(fid, set()).add(where)
    return {fid: sorted(where) for fid, where in out.items()}


def _print_registry() -> None:

    reg = registry()
    declared = _declared_by()
    print(
        f"{len(reg.findings)} findings recorded on tico {reg.recorded_version} (sources {reg.recorded_sources[:12]}):"
    )
    for finding in reg.findings.values():
        cases = sorted({where.split(":")[0] for where in declared.get(finding.id, [])})
        since = f" (since tico {finding.since})" if finding.since else ""
        print(f"  {finding.id}: {finding.title}{since}")
        print(
            f"      checks: {', '.join(finding.checks)}; declared by {len(cases)} case(s)"
            + (f": {', '.join(cases[:4])}{', ...' if len(cases) > 4 else ''}" if cases else "")
        )
    if reg.api_changes:
        print(f"\n{len(reg.api_changes)} tico API changes a case must follow (failures they explain stay red):")
        for change in reg.api_changes.values():
            print(f"  {change.id} (since tico {change.since}): {change.title}")


def _print_one(fid: str) -> int:

    change = registry().api_changes.get(fid)
    if change is not None:
        print(f"{change.id}: {change.title} (tico API change since {change.since})\n")
        print(textwrap.fill("The case must follow: " + change.follow, 100))
        print(f"\nsymbols: {', '.join(change.symbols)}")
        for pattern in change.patterns:
            print(f"pattern: {pattern}")
        return 0
    try:
        finding = registry().get(fid)
    except FindingsError as exc:
        print(f"findings: {exc}", file=sys.stderr)
        return 2
    print(f"{finding.id}: {finding.title}\n")
    print(textwrap.fill(finding.cause, 100))
    print(f"\nsymbols: {', '.join(finding.symbols)}")
    for check, patterns in finding.patterns.items():
        for pattern in patterns:
            print(f"pattern [{check}]: {pattern}")
    print("\ndeclared by:")
    for where in _declared_by().get(fid, []):
        print(f"  {where}")
    return 0


def _print_run(doc: dict) -> int:

    run = doc.get("run") or {}
    # Judged again from the item records: the findings data may have grown since the run.
    summary = summarize(doc.get("results", []), (run.get("tico") or {}).get("requested"))
    print(f"{describe(run.get('tico') or {})}")
    lines = render_lines(summary, width=10_000)
    print("\n".join(lines) if lines else "no finding occurred and no problem is unexplained")
    for item in summary["findings"]:
        if item.get("reproduce"):
            print(f"  {item['id']}: {item['reproduce']}")
        if item["status"] == "fixed":
            for where in item["fixed"]:
                print(f"  {item['id']} fixed on {where}: remove it from that case's expected_failures")
    for change in summary["api_changes"]:
        print(f"  {change['id']} (since tico {change['since']}): {change['follow']}")
        for where in change["items"]:
            print(f"    {where}")
    drafts = suggestions(summary["new_problems"])
    if drafts:
        print(f"\nsuggested findings/tico.toml records, one per shape of new problem ({len(drafts)}):\n")
        print("\n\n".join(drafts))
    return 0


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m harness findings", description=__doc__.splitlines()[0])
    p.add_argument("results", nargs="?", type=Path, help="a results.json (default: reports/results.json if present)")
    p.add_argument("--registry", action="store_true", help="list the recorded findings, ignoring any run")
    p.add_argument("--id", help="print one finding whole")
    args = p.parse_args(argv)
    if args.id:
        return _print_one(args.id)
    path = args.results or Path("reports/results.json")
    if args.registry or (args.results is None and not path.exists()):
        _print_registry()
        return 0
    if path.is_dir():
        path = path / "results.json"
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        print(f"findings: cannot read {path}: {exc}", file=sys.stderr)
        return 2
    return _print_run(doc)
