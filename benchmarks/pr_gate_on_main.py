"""The PR gate as a TICO pull request against tico main meets it: each seeded tico regression of
tests/test_seeded_tico_regressions.py (re-anchored where main's source moved), and the export-adapter edit of
benchmarks/select_changed_edits.py, put on a copy of tico main, run through ``python -m harness pr-gate``'s
steps with selection on; each must be reported worse through its own check.

    WRAPQ_TICO=0.4.0.dev261026 ./scripts/refresh-item-map.sh      # tico main's map, and its whole PR-gate run
    ./scripts/env.sh python benchmarks/pr_gate_on_main.py --main 0.4.0.dev261026 --base-run reports/item-map-other

The base step is shared: ``--base-run`` is one whole PR-gate run on tico main (every selection is a subset of
it), in place of running each selection's items on the base again. select, head (judged against that run)
and compare are pr-gate's own steps. Seeds on the nightly profile only are not in the PR gate: listed, not run.
Prints one row per change; exits 1 when one is not reported worse through its check.
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
from harness.tico_facts import tico_sources  # noqa: E402
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


def gate(step: str, head: Path, base: Path, report: Path) -> int:
    command = [sys.executable, "-m", "harness", "pr-gate", f"--step={step}", f"--head={head}", f"--base={base}",
               f"--report-dir={report}"]  # fmt: skip
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=3600).returncode


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
    total = len(json.loads((args.base_run / "results.json").read_text())["results"])
    rows, failing = [], 0
    print("| change | check | selected (of the PR gate) | worse | its check reported worse |")
    print("|---|---|---:|---:|---|")
    with tempfile.TemporaryDirectory() as work:
        for seeded in [*SEEDED, EXPORT_ADAPTER]:
            if args.only and seeded.name not in args.only:
                continue
            groups = [g for g in seeded.items if not g.startswith("--")]
            if any(g.startswith("--profile") for g in seeded.items):
                print(f"| `{seeded.name}` | {seeded.check} | nightly profile only: not in the PR gate | | |")
                continue
            tree = Path(work) / seeded.name / "tico-head"
            shutil.copytree(base, tree / "tico")
            for relative, old, new in ON_MAIN.get(seeded.name, seeded.edits):
                edit(tree, relative, old, new)
            report = Path(work) / seeded.name / "gate"
            shutil.copytree(args.base_run, report / "base")
            codes = [gate(step, tree, base.parent, report) for step in ("select", "head", "compare")]
            selected = len((report / "select" / "selected-items.txt").read_text().split())
            worse = worse_items(report)
            own = {node_ids.item_id(g, seeded.check) for g in groups}
            caught = bool(own & worse) and codes[-1] == 1
            failing += not caught
            row = {"change": seeded.name, "check": seeded.check, "selected": selected, "of": total,
                   "worse": len(worse), "caught": caught, "codes": codes}  # fmt: skip
            rows.append(row)
            print(f"| `{seeded.name}` | {seeded.check} | {selected} ({selected / total:.1%}) | {len(worse)} | "
                  f"{'yes' if caught else 'NO'} |", flush=True)  # fmt: skip
            for marker in (REPO / ".venv-tico").glob("*/.wrapq-source"):  # the head tree's thin venv
                if str(tree) in marker.read_text():
                    shutil.rmtree(marker.parent, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 1 if failing else 0


if __name__ == "__main__":
    raise SystemExit(main())
