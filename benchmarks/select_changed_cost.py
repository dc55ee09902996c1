"""What ``--select-changed`` would run for tico's own changes: the share of the PR gate's items selected.

    ./scripts/env.sh python benchmarks/select_changed_cost.py [--item-map PATH] [--from 0.2.0]

tico's history here is its builds on the package index: each consecutive pair from ``--from`` on is one
change, and each Python file a pair changes is one file-sized change, the size most tico pull requests
are (the issue counted median ten hunks). Each change's functions are mapped by name onto the map
(harness/tico_facts/change_selection.py) and counted in the PR gate's items (``pytest --co``; groups
the map never measured count as selected, and a change that reaches no item runs the import smoke).
Prints a row per change, a table per kind of change (how many, the median and the largest share), and
the share each seeded tico regression of the tests selects.
Only selection is measured here, nothing runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from harness.records import node_ids
from harness.run.select_changed import DEFAULT_MAP, SMOKE_CASE
from harness.tico_facts import change_selection, changed_functions, item_map, tico_sources

REPO = Path(__file__).resolve().parents[1]
WRAPPERS = "quantization/wrapq/wrappers/"
CIRCLE_SIDE = ("passes/", "serialize/", "interpreter/", "utils/convert.py", "utils/signature.py", "pt2_to_circle")
EXAMPLES = ("examples/", "recipes/", "evaluation/")


def collected_items() -> list[str]:
    """The node ids of the PR gate's items."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    return [line for line in done.stdout.splitlines() if "::" in line]


def builds(first: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", "tico", "--pre"], capture_output=True, text=True, timeout=120
    )
    line = next(x for x in done.stdout.splitlines() if x.startswith("Available versions:"))
    from packaging.version import Version

    versions = sorted((v.strip() for v in line.split(":", 1)[1].split(",")), key=Version)
    return [v for v in versions if Version(v) >= Version(first)]


def kind_of(files: set[str]) -> str:
    if all(any(f.startswith(mark) or f"/{mark}" in f for mark in EXAMPLES) for f in files):
        return "examples, recipes, evaluation only"
    families = {f[len(WRAPPERS) :].split("/")[0] for f in files if f.startswith(WRAPPERS)}
    if len(families) == 1 and all(f.startswith(WRAPPERS) for f in files):
        return "one wrapper family"
    if all(f.startswith(WRAPPERS) for f in files):
        return "several wrapper families"
    if all(any(mark in f for mark in CIRCLE_SIDE) for f in files):
        return "Circle side (passes, serialize, interpreter)"
    if all("observers/" in f for f in files):
        return "observers"
    return "shared code (config, base classes, registry, utils)"


def share(changes: list, committed: dict, items: list[str], base: Path) -> tuple[int, list[str]]:
    """How many of ``items`` the run selects for ``changes`` against the tico at ``base``, and why."""
    selection = change_selection.select(changes, committed, item_map.source_files(base))
    unit_of = (lambda nodeid: nodeid) if selection.per_item else node_ids.group_of
    selected = [i for i in items if unit_of(i) in selection.units or unit_of(i) not in selection.known]
    if not selected:  # the import smoke runs (harness/run/select_changed.py)
        groups = {node_ids.group_of(i) for i in items if f"::{SMOKE_CASE}::" in i}
        smoke = min(groups, key=lambda g: (len(g), g))
        selected = [i for i in items if node_ids.group_of(i) == smoke]
    return len(selected), [str(r) for r in selection.reasons]


def seeded_rows(committed: dict, items: list[str]) -> list[tuple[str, int]]:
    """Each seeded tico regression (tests/test_seeded_tico_regressions.py) on a copy of the pinned tico:
    how many items it selects."""
    import tempfile

    sys.path.insert(0, str(REPO))  # the tests package: run as a script, only benchmarks/ is on the path
    from tests.test_seeded_tico_regressions import SEEDED
    from tests.tico_tree import copy_tico, edit, installed_tico

    rows = []
    with tempfile.TemporaryDirectory() as work:
        for seeded in SEEDED:
            tree = copy_tico(Path(work), seeded.name)
            for relative, old, new in seeded.edits:
                edit(tree, relative, old, new)
            pinned = installed_tico()
            count, _ = share(changed_functions.changes(pinned, tree / "tico"), committed, items, pinned)
            rows.append((seeded.name, count))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--item-map", type=Path, default=REPO / DEFAULT_MAP)
    parser.add_argument("--from", dest="first", default="0.2.0")
    parser.add_argument("--json", type=Path, help="write every row here too")
    args = parser.parse_args()
    committed = item_map.load(args.item_map)
    items = collected_items()
    total = len(items)
    cache = REPO / ".wrapq-cache" / "tico-sources"
    versions = builds(args.first)
    groups = {node_ids.group_of(i) for i in items}
    print(f"PR gate: {total} items in {len(groups)} groups; map {args.item_map.name} "
          f"(tico {committed.get('tico', {}).get('version')}); builds {versions[0]} .. {versions[-1]}")  # fmt: skip
    rows: list[dict] = []
    for base, head in zip(versions, versions[1:]):
        base_root = tico_sources.resolve(base, cache)
        changes = changed_functions.changes(base_root, tico_sources.resolve(head, cache))
        by_file: dict[str, list] = {}
        for change in changes:
            by_file.setdefault(change.file, []).append(change)
        count, _ = share(changes, committed, items, base_root)
        rows.append({"change": f"{base} -> {head}", "kind": "a build pair (many commits)", "items": count})
        for file, file_changes in sorted(by_file.items()):
            count, reasons = share(file_changes, committed, items, base_root)
            change = f"{base} -> {head}: {file}"
            rows.append({"change": change, "kind": kind_of({file}), "items": count, "why": reasons})
    for row in rows:
        print(f"{100 * row['items'] / total:6.1f}%  {row['items']:5d}  {row['kind']:<45} {row['change']}")
    print("\n| kind of change | changes | median share of the PR gate's items | largest |")
    print("|---|---:|---:|---:|")
    for kind in sorted({row["kind"] for row in rows}):
        shares = [100 * row["items"] / total for row in rows if row["kind"] == kind]
        print(f"| {kind} | {len(shares)} | {statistics.median(shares):.1f}% | {max(shares):.1f}% |")
    files = [100 * row["items"] / total for row in rows if row["kind"] != "a build pair (many commits)"]
    print(f"| every file-sized change | {len(files)} | {statistics.median(files):.1f}% | {max(files):.1f}% |")
    print("\n| seeded regression | selected |\n|---|---:|")
    for name, count in seeded_rows(committed, items):
        print(f"| `{name}` | {100 * count / total:.1f}% |")
    if args.json:
        args.json.write_text(json.dumps({"total": total, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
