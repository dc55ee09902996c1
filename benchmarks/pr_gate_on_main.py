"""The PR gate as a TICO pull request against tico main meets it: each seeded tico regression of
tests/test_seeded_tico_regressions.py (re-anchored where main's source moved), and the export-adapter edit of
benchmarks/select_changed_edits.py, put on a copy of tico main, run through ``python -m harness pr-gate``'s
steps with selection on; each must be reported worse through its own check.

    WRAPQ_TICO=0.4.0.dev261026 ./scripts/refresh-item-map.sh      # tico main's map, and its whole PR-gate run
    ./scripts/env.sh python benchmarks/pr_gate_on_main.py --main 0.4.0.dev261026 --base-run reports/item-map-other

Per change: the selection over the whole PR gate (its share, from the map nearest BASE: tico main's), whether
it holds every item of the change's own check on its groups (sound), and pr-gate's steps select, head (judged
against ``--base-run``, one whole PR-gate run on tico main, standing in for the base step: every selection is a
subset of it) and compare, narrowed to the change's groups (``-- <groups>``) to bound the time. Seeds on the
nightly profile only are not in the PR gate: listed, not run. Exits 1 when a change is not selected or not
reported worse through its own check.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the tests package: run as a script, only benchmarks/ is on the path

from benchmarks.select_changed_edits import ADAPTERS, PREFILL_CALL_END, SPLIT_AND_JOIN  # noqa: E402
from harness.records import node_ids  # noqa: E402
from harness.run.select_changed import nearest_map  # noqa: E402
from harness.tico_facts import change_selection, changed_functions, item_map, tico_sources  # noqa: E402
from tests.test_seeded_tico_regressions import SEEDED, WRAPPERS, Seeded  # noqa: E402
from tests.tico_tree import edit  # noqa: E402

# Seeds whose anchor tico main rewrote: the same regression on main's lines.
ON_MAIN = {
    "qwen-text-position-ids-ignored": (
        (
            f"{WRAPPERS}/qwen_vl/quant_text_model.py",
            "        if position_ids is None:\n            if export_position_ids is not None:",
            "        if True:\n            if export_position_ids is not None:",
        ),
    ),
}
EXPORT_ADAPTER = Seeded(
    "export-adapter-split",
    "structure",
    ((ADAPTERS, PREFILL_CALL_END, PREFILL_CALL_END + SPLIT_AND_JOIN),),
    ("cases/llama.py::llama_attention_prefill[tiny]",),
    "circle_structure",
    "",
)


def gate(step: str, head: Path, base: Path, report: Path, narrowed: list[str]) -> int:
    command = [sys.executable, "-m", "harness", "pr-gate", f"--step={step}", f"--head={head}", f"--base={base}",
               f"--report-dir={report}", "--", *narrowed]  # fmt: skip
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=3600).returncode


def selection(tree: Path, base: Path, items: list[str]) -> tuple[set[str], list[str]]:
    """The items of the whole PR gate the change selects, from the committed map nearest BASE."""
    changes = changed_functions.changes(base, tree / "tico")
    _, committed, _ = nearest_map(None, REPO, base)
    chosen = change_selection.select(changes, committed, item_map.source_files(base))
    unit_of = (lambda i: i) if chosen.per_item else node_ids.group_of
    return {i for i in items if unit_of(i) in chosen.units or unit_of(i) not in chosen.known}, [
        str(r) for r in chosen.reasons
    ]


def worse_items(report: Path) -> set[str]:
    text = (report / "comparison.md").read_text() if (report / "comparison.md").exists() else ""
    return {line.split("`")[1] for line in text.splitlines() if line.startswith("| **worse** | `")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--main", required=True, help="tico main's build (a version, as WRAPQ_TICO takes)")
    parser.add_argument("--base-run", type=Path, required=True, help="a whole PR-gate run on that build")
    parser.add_argument("--only", nargs="*", help="run these changes only")
    parser.add_argument("--json", type=Path, help="write the rows here too")
    args = parser.parse_args()
    base = tico_sources.resolve(args.main, REPO / ".wrapq-cache" / "tico-sources")
    items = [r["nodeid"] for r in json.loads((args.base_run / "results.json").read_text())["results"] if r["check"]]
    rows, failing = [], 0
    print("| change | check | selected of the PR gate | its items among them | worse (its groups) | reported worse |")
    print("|---|---|---:|---|---:|---|")
    with tempfile.TemporaryDirectory() as work:
        for seeded in [*SEEDED, EXPORT_ADAPTER]:
            if args.only and seeded.name not in args.only:
                continue
            groups = [g for g in seeded.items if not g.startswith("--")]
            if any(g.startswith("--profile") for g in seeded.items):
                print(f"| `{seeded.name}` | {seeded.check} | nightly profile only: not in the PR gate | | | |")
                continue
            tree = Path(work) / seeded.name / "tico-head"
            shutil.copytree(base, tree / "tico")
            for relative, old, new in ON_MAIN.get(seeded.name, seeded.edits):
                edit(tree, relative, old, new)
            report = Path(work) / seeded.name / "gate"
            shutil.copytree(args.base_run, report / "base")
            chosen, reasons = selection(tree, base, items)
            own = {node_ids.item_id(g, seeded.check) for g in groups}
            sound = own <= chosen
            codes = [gate(step, tree, base.parent, report, groups) for step in ("select", "head", "compare")]
            worse = worse_items(report)
            caught = bool(own & worse) and codes[-1] == 1
            failing += not (caught and sound)
            row = {"change": seeded.name, "check": seeded.check, "selected": len(chosen), "of": len(items),
                   "sound": sound, "worse": len(worse), "caught": caught, "codes": codes}  # fmt: skip
            rows.append(row)
            print(f"| `{seeded.name}` | {seeded.check} | {len(chosen)} ({len(chosen) / len(items):.1%}) | "
                  f"{'yes' if sound else 'NO'} | {len(worse)} | {'yes' if caught else 'NO'} |", flush=True)  # fmt: skip
            for marker in (REPO / ".venv-tico").glob("*/.wrapq-source"):  # the head tree's thin venv
                if str(tree) in marker.read_text():
                    shutil.rmtree(marker.parent, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 1 if failing else 0


if __name__ == "__main__":
    raise SystemExit(main())
