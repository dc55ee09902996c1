"""--select-changed BASE runs the items a change to tico can reach: each rule on a real collection and a
map whose answer is known, BASE in each form WRAPQ_TICO takes, and every misuse a usage error."""

from __future__ import annotations

import json
import os
import shutil
import sys
import zipfile
from pathlib import Path

import pytest

from harness.checks import builtin_checks
from harness.records import node_ids
from harness.tico_facts import tico_sources
from tests import preloaded_python
from tests.tico_tree import copy_tico, edit, installed_tico, run_harness

REPO = Path(__file__).resolve().parents[1]
LINEAR = "quantization/wrapq/wrappers/nn/quant_linear.py"
LAYERNORM = "quantization/wrapq/wrappers/nn/quant_layernorm.py"
LINEAR_GROUPS = [
    "cases/nn.py::nn_linear[tiny]",
    "cases/nn.py::nn_linear[tiny,bias=True]",
    "cases/nn.py::nn_linear[tiny,policy=int16]",
]
LAYERNORM_GROUP = "cases/nn.py::nn_layernorm[tiny]"
LLAMA_ATTENTION = "quantization/wrapq/wrappers/llama/quant_attention.py"
BOOL_MASK_GROUP = "cases/llama.py::llama_attention_prefill[tiny,mask=bool]"
# the collection: two cases' groups, the linear case's other variants never measured by this map
SELECTION = ["cases/nn.py", "-k", "nn_linear or nn_layernorm"]
PER_GROUP = len(builtin_checks())  # items of one (case, profile) group: one per check


def _map(path: Path) -> Path:
    functions = [
        f"{LINEAR}::QuantLinear.forward",  # 0
        f"{LAYERNORM}::QuantLayerNorm.forward",  # 1
        "quantization/wrapq/utils/introspection.py::",  # 2: a module body, one-time work
    ]
    groups = {group: [0] for group in LINEAR_GROUPS} | {LAYERNORM_GROUP: [1, 2]}
    document = {"functions": functions, "groups": groups, "outside_items": [], "first_only": [2]}
    path.write_text(json.dumps({"tico": {"version": "test"}, **document}))
    return path


def _collect(tmp_path: Path, head: Path | None, *options: str) -> tuple[int, set[str], str, dict]:
    """Collect only, with ``head`` (a tree holding tico/) first on the path; the selected groups. A -k in
    ``options`` takes the place of the selection's."""
    report = tmp_path / f"report-{len(list(tmp_path.glob('report-*')))}"
    path = [str(head)] if head else []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*path, str(REPO)]))
    done = preloaded_python.run(
        [sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", f"--wrapq-report-dir={report}",
         *SELECTION, *options],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    collected = [line for line in done.stdout.splitlines() if line.startswith("cases/")]
    groups = {node_ids.group_of(line) for line in collected}
    record = json.loads((report / "selection.json").read_text()) if (report / "selection.json").exists() else {}
    if record:  # the node ids another tico runs with ``pytest @selected-items.txt``
        assert (report / "selected-items.txt").read_text().splitlines() == collected
    return done.returncode, groups, done.stdout + done.stderr, record


def _pinned_tree(tmp_path: Path) -> Path:
    """BASE as a plain tree: the pinned tico's sources."""
    return copy_tico(tmp_path, "base")


def test_a_changed_function_selects_the_groups_that_ran_it_and_every_unmapped_group(tmp_path):
    head = copy_tico(tmp_path, "head")
    edit(head, LINEAR, "        out = F.linear(x_q, w, b)\n", "        out = F.linear(x_q, w, b) * 1.0\n")
    rc, groups, output, record = _collect(
        tmp_path, head, "--select-changed", str(_pinned_tree(tmp_path)), "--item-map", str(_map(tmp_path / "m.json"))
    )
    assert rc == 0, output[-3000:]
    unmapped = {f"cases/nn.py::nn_linear[tiny,policy={p}]" for p in ("act_out_int16", "per_tensor_weight")}
    assert groups == set(LINEAR_GROUPS) | unmapped
    assert f"{LINEAR}::QuantLinear.forward -> {3 * PER_GROUP} items" in output
    assert f"{2 * PER_GROUP} items the map never measured run whatever changed (in 2 group(s))" in output
    assert record["selected_items"] == 5 * PER_GROUP and record["collected_items"] == 6 * PER_GROUP
    assert record["changes"] == [f"{LINEAR}: QuantLinear.forward"]


def test_no_change_runs_the_import_smoke_and_one_time_work_selects_every_mapped_group(tmp_path):
    base, item_map = _pinned_tree(tmp_path), _map(tmp_path / "m.json")
    only_mapped = ["-k", "nn_linear and not policy or nn_layernorm"]
    selecting = ["--select-changed", str(base), "--item-map", str(item_map), *only_mapped]
    rc, groups, output, record = _collect(tmp_path, None, *selecting)
    assert rc == 0, output[-3000:]
    assert groups == {"cases/nn.py::nn_linear[tiny]"} and record["smoke_group"] == "cases/nn.py::nn_linear[tiny]"
    assert "nothing the map runs changed: the import smoke runs (group cases/nn.py::nn_linear[tiny])" in output
    head = copy_tico(tmp_path, "head")
    edit(head, "quantization/wrapq/utils/introspection.py", "import torch\n", "import torch  # noqa\nimport math\n")
    rc, groups, output, record = _collect(tmp_path, head, *selecting)
    assert rc == 0 and record["everything"], output[-3000:]
    assert groups == {LAYERNORM_GROUP, "cases/nn.py::nn_linear[tiny]", "cases/nn.py::nn_linear[tiny,bias=True]"}


def test_a_non_python_file_selects_everything_and_a_wheel_is_a_base(tmp_path):
    base = _pinned_tree(tmp_path)
    wheel = tmp_path / "tico-0.3.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path in (base / "tico").rglob("*"):
            archive.write(path, path.relative_to(base).as_posix())
    head = copy_tico(tmp_path, "head")
    (head / "tico" / "serialize" / "schema.json").write_text("{}")
    rc, groups, output, record = _collect(
        tmp_path, head, "--select-changed", str(wheel), "--item-map", str(_map(tmp_path / "m.json"))
    )
    assert rc == 0 and record["everything"], output[-3000:]
    assert f"serialize/schema.json: a non-Python file -> {4 * PER_GROUP} items" in output
    assert len(groups) == 6 and record["map"]["files_differing_from_base"] is None


@pytest.mark.parametrize(
    "options, said",
    [
        (["--select-changed", "/no/such/tico"], "is neither a directory holding tico, a .whl file nor a version"),
        (["--select-changed", str(REPO / "docs")], "holds no tico package"),
        (["--item-map", "x.json"], "give --select-changed too"),
        (["--select-changed", str(installed_tico().parent), "--item-map", "/no/map.json"], "cannot read the item map"),
    ],
)
def test_a_wrong_or_missing_base_or_map_is_a_usage_error(tmp_path, options, said):
    rc, groups, output, _ = _collect(tmp_path, None, *options)
    assert rc == 4 and said in output and not groups, output[-2000:]


def test_a_wheel_and_a_directory_resolve_to_the_package_and_junk_is_refused(tmp_path):
    tree = tmp_path / "tree"
    shutil.copytree(installed_tico(), tree / "tico", ignore=shutil.ignore_patterns("__pycache__"))
    assert tico_sources.resolve(str(tree), tmp_path / "cache") == (tree / "tico").resolve()
    assert tico_sources.resolve(str(tree / "tico"), tmp_path / "cache") == (tree / "tico").resolve()
    junk = tmp_path / "junk.whl"
    junk.write_text("not a zip")
    with pytest.raises(tico_sources.BaseSourceError, match="no readable wheel"):
        tico_sources.resolve(str(junk), tmp_path / "cache")
    empty = tmp_path / "empty-0.1-py3-none-any.whl"
    with zipfile.ZipFile(empty, "w") as archive:
        archive.writestr("other/__init__.py", "")
    with pytest.raises(tico_sources.BaseSourceError, match="holds no tico package"):
        tico_sources.resolve(str(empty), tmp_path / "cache")


def test_every_seeded_regression_selects_every_item_it_turns_red(tmp_path):
    """Soundness on the seeded tico regressions (tests/test_seeded_tico_regressions.py), applied to a copy
    of the pinned tico and selected from the committed map: every item the seed turns red (its check and
    the checks named red with it, on its groups) is selected, or is one the map never measured (another
    profile), which runs whatever changed."""
    from harness.run.select_changed import DEFAULT_MAP
    from harness.tico_facts import change_selection, changed_functions, item_map
    from tests.test_seeded_tico_regressions import SEEDED

    committed = item_map.load(REPO / DEFAULT_MAP)
    units, per_item = change_selection.units_of(committed)
    base_files = item_map.source_files(installed_tico())  # the map's tico: changes narrow to their blocks
    narrowed = 0
    for seeded in SEEDED:
        tree = copy_tico(tmp_path, seeded.name)
        for relative, old, new in seeded.edits:
            edit(tree, relative, old, new)
        changes = changed_functions.changes(installed_tico(), tree / "tico")
        assert changes, seeded.name
        selection = change_selection.select(changes, committed, base_files)
        narrowed += any("inside the blocks" in str(r) for r in selection.reasons)
        red_groups = {group for group in seeded.items if not group.startswith("--")}
        checks = {seeded.check, *seeded.also_red}
        red = {node_ids.item_id(g, c) for g in red_groups for c in checks} if per_item else red_groups
        missed = {unit for unit in red if unit in units and unit not in selection.units}
        assert not missed, (seeded.name, sorted(missed), [str(r) for r in selection.reasons])
        if not red & set(units):  # seeded on the nightly profile only: the PR gate has none of it
            assert all("[tiny_nightly" in group for group in red_groups), (seeded.name, sorted(red))
    assert narrowed, "no seed was narrowed to lines: the soundness above says nothing of the line rule"


def test_a_run_says_how_far_the_map_s_tico_is_from_base_and_the_map_round_trips(tmp_path):
    from harness.run.select_changed import describe
    from harness.tico_facts import item_map

    pinned = installed_tico()
    built = {"functions": ["a.py::f", "a.py::g", "b.py::h"], "groups": {"x[tiny]": [0, 1, 2], "y[tiny]": [2]}}
    built |= {"outside_items": [], "first_only": [0, 1], "first_groups": ["x[tiny]"]}
    size = item_map.write(built, tmp_path / "m.json", {"version": "0.3.0", "files": item_map.source_files(pinned)})
    loaded = item_map.load(tmp_path / "m.json")
    assert size == (tmp_path / "m.json").stat().st_size and loaded["groups"] == built["groups"]
    assert json.loads((tmp_path / "m.json").read_text())["first_only"] == "0-1"
    packed = item_map.write(built, tmp_path / "m.json.gz", {"version": "0.3.0"})  # the committed form
    assert packed < size and item_map.load(tmp_path / "m.json.gz")["groups"] == built["groups"]
    assert item_map.files_differing(loaded, pinned) == 0
    other = copy_tico(tmp_path, "other")
    edit(other, LINEAR, "        out = F.linear(x_q, w, b)\n", "        out = F.linear(x_q, w, b) * 1.0\n")
    (other / "tico" / "brand_new.py").write_text("")
    assert item_map.files_differing(loaded, other / "tico") == 2
    record = {
        "base": "0.4.0.dev261018",
        "map": {"path": "m.json", "tico_version": "0.3.0", "files_differing_from_base": 2},
        "changes": ["x"],
        "selected_items": 3,
        "collected_items": 9,
        "everything": False,
        "reasons": [{"reason": "a.py::f -> 1 group(s)", "items": 3}],
        "unmapped_groups": [],
        "unmapped_items": 0,
        "smoke_group": None,
        "notes": [],
    }
    said = "\n".join(describe(record))
    assert "the map's tico differs from BASE in 2 Python file(s)" in said and "a.py::f -> 3 items" in said


def test_a_change_in_a_branch_few_items_take_selects_them_and_every_item_it_turns_red(tmp_path):
    """The line rule end to end on a real branch: the padding-mask branch of QuantLlamaAttention's mask
    builder, which only llama_attention_prefill's ``mask=bool`` variant takes, stops adding the causal
    mask. By lines the change selects that variant's items; by function, every item of every case whose
    attention builds a mask. Run on that variant and the plain one, every item it turns red is selected."""
    from harness.run.select_changed import DEFAULT_MAP
    from harness.tico_facts import change_selection, changed_functions, item_map

    tree = copy_tico(tmp_path, "causal_dropped")
    mask = "            mask = torch.clamp(causal_mask + additive, min=fill_val)\n"
    edit(tree, LLAMA_ATTENTION, mask, mask.replace("causal_mask + additive", "additive"))
    committed = item_map.load(REPO / DEFAULT_MAP)
    changes = changed_functions.changes(installed_tico(), tree / "tico")
    by_lines = change_selection.select(changes, committed, item_map.source_files(installed_tico()))
    by_function = change_selection.select(changes, committed)
    assert by_lines.units and len(by_lines.units) * 10 < len(by_function.units), [str(r) for r in by_lines.reasons]
    assert {node_ids.group_of(unit) for unit in by_lines.units} == {BOOL_MASK_GROUP}
    code, results, output = run_harness(tree, tmp_path, BOOL_MASK_GROUP, BOOL_MASK_GROUP.replace(",mask=bool", ""))
    red = {r["nodeid"] for r in results["results"] if r["outcome"] in ("failed", "error")}
    assert code == 1 and red, output[-3000:]
    assert red <= by_lines.units, sorted(red - by_lines.units)


def test_without_a_map_given_the_committed_map_nearest_base_is_read_and_the_others_named(tmp_path):
    """The pinned tico's map and tico main's (the nightly's) side by side: a BASE that is tico main reads main's
    map, the pinned tico reads the pinned map (also on a tie), and the selection names the map it passed over."""
    from harness.run.select_changed import DEFAULT_MAP, describe, nearest_map
    from harness.tico_facts import item_map

    pinned = installed_tico()
    main = copy_tico(tmp_path, "main") / "tico"
    edit(main.parent, "quantization/wrapq/utils/introspection.py", "import torch\n", "import torch  # main\n")
    built = {"functions": ["a.py::f"], "groups": {"x[tiny]": [0]}, "outside_items": [], "first_only": []}
    root = tmp_path / "project"
    (root / DEFAULT_MAP).parent.mkdir(parents=True)
    item_map.write(built, root / DEFAULT_MAP, {"version": "0.3.0", "files": item_map.source_files(pinned)})
    main_map = root / DEFAULT_MAP.replace("pinned-tico", "tico-0.4.0.dev1")
    item_map.write(built, main_map, {"version": "0.4.0.dev1", "files": item_map.source_files(main)})
    chosen, _, others = nearest_map(None, root, main)
    assert chosen == main_map and [o["files_differing_from_base"] for o in others] == [1]
    assert nearest_map(None, root, pinned)[0] == root / DEFAULT_MAP
    record = {"base": "main", "changes": [], "selected_items": 0, "collected_items": 0, "everything": False,
              "reasons": [], "unmapped_items": 0, "smoke_group": None, "notes": []}  # fmt: skip
    record["map"] = {"path": "m", "tico_version": "0.4.0.dev1", "files_differing_from_base": 0, "others": others}
    passed_over = "  not chosen: map golden/item-map/pinned-tico.json.gz (tico 0.3.0), 1 Python file(s) from BASE"
    assert passed_over in describe(record)
