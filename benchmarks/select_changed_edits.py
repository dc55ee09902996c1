"""Is ``--select-changed`` sound on the kinds of change coverage cannot see run? Each edit below is put on a
copy of the pinned tico, the whole PR gate runs on it, and every item whose outcome moved against a clean run
must be among the items the committed map selects for the edit.

    ./scripts/env.sh python benchmarks/select_changed_edits.py --clean reports/item-map [--old-map OLD.json.gz]

``--clean``: a whole PR-gate run on the pinned tico (``./scripts/refresh-item-map.sh`` leaves one in
reports/item-map). ``--old-map``: a map to compare the selection with (e.g. the one before imports and traced
adapters were recorded: ``git show f65c6fd~1:golden/item-map/pinned-tico.json.gz``). Each edit's run takes
about as long as the main job (its tico is a copy: no cache entry answers for it). Prints one table row per
edit; exits 1 on any miss.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the tests package (tico copies): run as a script, only benchmarks/ is on the path

from harness.records import node_ids  # noqa: E402
from harness.run.select_changed import DEFAULT_MAP  # noqa: E402
from harness.tico_facts import change_selection, changed_functions, item_map  # noqa: E402
from tests.tico_tree import copy_tico, edit, installed_tico  # noqa: E402

ADAPTERS = "quantization/wrapq/wrappers/llama/export_adapters.py"
SILU = "quantization/wrapq/wrappers/nn/quant_silu.py"
PRELU = "quantization/wrapq/wrappers/nn/quant_prelu.py"
SILU_REGISTERED = '@try_register("torch.nn.SiLU", "transformers.activations.SiLUActivation")'
ALIAS = """from tico.quantization.wrapq.wrappers.nn.quant_silu import QuantSiLU
from tico.quantization.wrapq.wrappers.registry import try_register

try_register("transformers.activations.GELUTanh")(QuantSiLU)
"""
# the end of LlamaAttentionPrefillExportAdapter.forward's call into the wrapper (once in the file)
PREFILL_CALL_END = """            hidden_states=hidden_states,
            position_embeddings=position_embeddings,
            attention_mask=attention_mask,
            past_key_value=None,
            use_cache=self.return_kv,
            cache_output_mode="delta",
            **kwargs,
        )

        hidden = outputs[0]
"""
SPLIT_AND_JOIN = """        half = hidden.shape[-1] // 2
        hidden = torch.cat([hidden[..., :half], hidden[..., half:]], dim=-1)
"""
SIDE_EFFECT_IMPORT = "import tico.quantization.wrapq.wrappers.nn.quant_gelu_alias  # noqa: F401\n"
# name -> (what it is, edits (file, old, new), new files {path: text})
EDITS = {
    "export-adapter-split": (
        "code only torch.export runs: the Llama prefill adapter splits its hidden output in two and joins it "
        "(values equal, the Circle graph gains operators)",
        [(ADAPTERS, PREFILL_CALL_END, PREFILL_CALL_END + SPLIT_AND_JOIN)],
        {},
    ),
    "registration-decorator": (
        "module-level code: QuantSiLU's registration also claims GELUTanh (no function of quant_silu.py changes)",
        [(SILU, SILU_REGISTERED, SILU_REGISTERED[:-1] + ', "transformers.activations.GELUTanh")')],
        {},
    ),
    "side-effect-import": (
        "an import added for its side effect: quant_prelu.py imports a new module that registers QuantSiLU "
        "for GELUTanh",
        [(PRELU, "import torch\n", "import torch\n\n" + SIDE_EFFECT_IMPORT)],
        {"quantization/wrapq/wrappers/nn/quant_gelu_alias.py": ALIAS},
    ),
}  # fmt: skip


def outcomes(report: Path) -> dict[str, str]:
    document = json.loads((report / "results.json").read_text())
    return {record["nodeid"]: record["outcome"] for record in document["results"] if record.get("check")}


def selected(tree: Path, committed: dict, items: list[str]) -> tuple[set[str], list[str]]:
    pinned = installed_tico()
    changes = changed_functions.changes(pinned, tree / "tico")
    selection = change_selection.select(changes, committed, item_map.source_files(pinned))
    unit_of = (lambda i: i) if selection.per_item else node_ids.group_of
    chosen = {i for i in items if unit_of(i) in selection.units or unit_of(i) not in selection.known}
    return chosen, [str(r) for r in selection.reasons]


def run_matrix(tree: Path, report: Path) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), str(REPO)]), WRAPQ_TICO=str(tree))
    command = [sys.executable, "-m", "pytest", "-q", "-n", "auto", "-p", "no:cacheprovider",
               f"--config-file={REPO / 'pyproject.toml'}", f"--wrapq-report-dir={report}"]  # fmt: skip
    subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=3600)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clean", type=Path, required=True, help="a whole PR-gate run on the pinned tico")
    parser.add_argument("--item-map", type=Path, default=REPO / DEFAULT_MAP)
    parser.add_argument("--old-map", type=Path, help="a map to compare the selection with")
    parser.add_argument("--only", nargs="*", choices=sorted(EDITS), help="run these edits only")
    args = parser.parse_args()
    committed = item_map.load(args.item_map)
    old = item_map.load(args.old_map) if args.old_map else None
    clean = outcomes(args.clean)
    items = sorted(clean)
    print(
        "| change | items whose outcome moved | selected | missed |"
        + (" selected with the old map (missed) |" if old else "")
    )
    print("|---|---:|---:|---:|" + ("---:|" if old else ""))
    missed_anywhere = 0
    with tempfile.TemporaryDirectory() as work:
        for name in args.only or EDITS:
            what, edits, new_files = EDITS[name]
            tree = copy_tico(Path(work), name)
            for relative, old_text, new_text in edits:
                edit(tree, relative, old_text, new_text)
            for relative, text in new_files.items():
                (tree / "tico" / relative).write_text(text)
            run_matrix(tree, Path(work) / f"report-{name}")
            after = outcomes(Path(work) / f"report-{name}")
            moved = {i for i in items if after.get(i) != clean[i]}
            chosen, reasons = selected(tree, committed, items)
            missed = sorted(moved - chosen)
            missed_anywhere += len(missed)
            row = f"| `{name}`: {what} | {len(moved)} | {len(chosen)} of {len(items)} | {len(missed)} |"
            if old is not None:
                old_chosen, _ = selected(tree, old, items)
                row += f" {len(old_chosen)} ({len(moved - old_chosen)}) |"
            print(row, flush=True)
            for reason in reasons:
                print(f"    {reason}", file=sys.stderr)
            for item in missed:
                print(f"  missed: {item}: {clean[item]} -> {after.get(item)}", file=sys.stderr)
    return 1 if missed_anywhere else 0


if __name__ == "__main__":
    raise SystemExit(main())
