"""Is ``--select-changed`` sound on tico's real changes? Whole-matrix runs of consecutive tico builds,
compared item by item with what the selection would have run.

    ./scripts/env.sh python benchmarks/select_changed_soundness.py 0.3.0=reports/v030 \\
        0.4.0.dev261018=reports/v261018 0.4.0.dev261019=reports/v261019 ...

Each argument is a tico version and the report directory of the whole matrix run on it
(``WRAPQ_TICO=<version> ./scripts/env.sh pytest -n auto --wrapq-report-dir=<dir>``). For each
consecutive pair, the change is the second build against the first; the items it can explain are
those whose outcome moved between the two runs. A moved item the selection would not run is a miss.
Prints per pair: changes, items selected, items moved, missed (listed). Exits 1 on any miss.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from harness.records import node_ids
from harness.run.select_changed import DEFAULT_MAP
from harness.tico_facts import change_selection, changed_functions, item_map, tico_sources

REPO = Path(__file__).resolve().parents[1]


def outcomes(report: Path) -> dict[str, str]:
    document = json.loads((report / "results.json").read_text())
    return {record["nodeid"]: record["outcome"] for record in document["results"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="VERSION=REPORT_DIR, oldest first")
    parser.add_argument("--item-map", type=Path, default=REPO / DEFAULT_MAP)
    args = parser.parse_args()
    committed = item_map.load(args.item_map)
    cache = REPO / ".wrapq-cache" / "tico-sources"
    runs = [(spec.split("=", 1)[0], Path(spec.split("=", 1)[1])) for spec in args.runs]
    missed_anywhere = 0
    print("| change | changes | items selected | items whose outcome moved | missed |")
    print("|---|---:|---:|---:|---:|")
    for (base, base_dir), (head, head_dir) in zip(runs, runs[1:]):
        base_root = tico_sources.resolve(base, cache)
        changes = changed_functions.changes(base_root, tico_sources.resolve(head, cache))
        selection = change_selection.select(changes, committed, item_map.source_files(base_root))
        unit_of = (lambda nodeid: nodeid) if selection.per_item else node_ids.group_of
        before, after = outcomes(base_dir), outcomes(head_dir)
        items = sorted(after)
        selected = {i for i in items if unit_of(i) in selection.units or unit_of(i) not in selection.known}
        moved = {i for i in items if before.get(i) != after[i]}
        missed = sorted(moved - selected)
        missed_anywhere += len(missed)
        print(f"| {base} -> {head} | {len(changes)} | {len(selected)} of {len(items)} | {len(moved)} | {len(missed)} |")
        for item in missed:
            print(f"  missed: {item}: {before.get(item)} -> {after[item]}", file=sys.stderr)
    return 1 if missed_anywhere else 0


if __name__ == "__main__":
    sys.exit(main())
