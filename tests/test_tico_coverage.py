"""--tico-coverage measures which of tico's lines and branches a run executes, in every xdist worker,
combined by the controller; the tico-coverage command reports it, and diff coverage tells a change's
lines the run reached from those no case reaches."""

from __future__ import annotations

import json
import os
import sys
import zipfile
from pathlib import Path

import pytest

from harness.tico_facts import branch_coverage, converter_areas, tico_diff
from tests import preloaded_python

REPO = Path(__file__).resolve().parents[1]
ATTENTION = "cases/llama.py::llama_attention_prefill[tiny]"


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> Path:
    """nn_linear's quant_accuracy and circle_structure items (the case and its PR sweep variants), and
    llama_attention_prefill's (tico's own export adapter) on two xdist workers, measured."""
    report = tmp_path_factory.mktemp("cov") / "reports"
    done = preloaded_python.run(
        [sys.executable, "-m", "pytest", "-n", "2", "-p", "no:cacheprovider", "--tico-coverage",
         "cases/nn.py::nn_linear", f"{ATTENTION}", "-k", "quant_accuracy or circle_structure",
         f"--wrapq-report-dir={report}"],
        cwd=REPO, env=dict(os.environ), capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:]
    assert "wrapq tico coverage" in done.stdout
    return report


def test_the_run_measures_the_wrapper_it_ran_and_records_the_summary(measured):
    summary = branch_coverage.load(measured)
    linear = summary["files"]["quantization/wrapq/wrappers/nn/quant_linear.py"]
    assert linear["lines_covered"] > 0 and linear["branches_covered"] > 0
    assert "quantization/wrapq/wrappers/nn/quant_linear.py::QuantLinear" in summary["classes"]
    # a wrapper no selected case builds is measured and reported as not run
    conv3d = summary["files"]["quantization/wrapq/wrappers/nn/quant_conv3d.py"]
    assert conv3d["branches"] > 0 and conv3d["branches_covered"] == 0 and conv3d["uncovered_branches"]
    branch = conv3d["uncovered_branches"][0]
    assert isinstance(branch["line"], int) and branch["condition"]  # the condition's own source line
    assert branch["function"].startswith("QuantConv3d")  # the function holding it, by qualified name
    run = json.loads((measured / "results.json").read_text())["run"]
    assert run["tico_coverage"]["scope_totals"] == summary["scope_totals"]
    areas = run["tico_coverage"]["areas"]  # the converter's areas, each its own figure beside the wrappers'
    assert areas == summary["areas"] and areas["wrappers"]["branches"] == summary["scope_totals"]["branches"]
    assert areas["serialize/operators"]["branches_covered"] > 0  # nn_linear's Circle conversion ran visitors
    assert areas["quantization/passes"]["branches_covered"] > 0
    assert areas["quantization/algorithm"]["branches"] > 0 == areas["quantization/algorithm"]["branches_covered"]
    reach = run["tico_coverage"]["reach"]["total"]  # the figure over what a case can reach, beside all
    assert reach["branches"] == summary["scope_totals"]["branches"] and reach["out_of_reach"] > 0
    assert reach["percent_reachable"] > reach["percent_all"]
    assert (measured / "tico-coverage" / "html" / "index.html").is_file()
    assert 'href="tico-coverage/html/index.html"' in (measured / "report.html").read_text()
    # no per-process data file is left behind: the controller combined them
    assert not list((measured / "tico-coverage").glob(".coverage.*"))


def test_the_run_maps_each_item_group_to_the_tico_functions_it_ran(measured):
    from harness.tico_facts import item_map

    found = item_map.load(measured / "tico-coverage" / item_map.MAP_NAME)
    by_group = item_map.functions_by_group(found)
    groups = [g for g in by_group if g.startswith("cases/nn.py::nn_linear[tiny")]
    assert len(groups) >= 2 and set(groups) | {ATTENTION} == set(found["groups"])
    forward = "quantization/wrapq/wrappers/nn/quant_linear.py::QuantLinear.forward"
    assert all(forward in by_group[g] for g in groups)  # every group runs the wrapper it quantizes
    assert not any("quant_conv3d.py" in name for names in by_group.values() for name in names)
    # one-time work lands on each process's first group only: listed apart, so selection can widen it
    assert 1 <= len(found["first_groups"]) <= 2 and set(found["first_groups"]) <= set(found["groups"])
    assert forward not in {found["functions"][i] for i in found["first_only"]}
    summary = branch_coverage.load(measured)
    assert summary["item_map"]["groups"] == len(found["groups"]) and summary["item_map"]["bytes"] < 300_000
    # each process's imports: every group had imported the wrapper it ran, and the registry all wrappers register in
    linear = item_map.groups_importing(found, "quantization/wrapq/wrappers/nn/quant_linear.py")
    assert set(groups) <= linear and item_map.groups_importing(found, "utils/convert.py") == set(found["groups"])
    assert item_map.groups_importing(found, "no/such/module.py") == set()


def test_each_item_reaches_what_it_ran_and_what_computing_the_stages_it_reads_ran(measured):
    """Per item: quant_accuracy reads the quantized model, circle_structure also the Circle model: only the
    second reaches the conversion passes, though the first item of a group computed the shared stages."""
    from harness.records import node_ids
    from harness.tico_facts import item_map

    found = item_map.load(measured / "tico-coverage" / item_map.MAP_NAME)
    reach = item_map.item_reach(found)
    names = found["functions"]
    items = {i for i in reach if node_ids.group_of(i).startswith("cases/nn.py::nn_linear[tiny")}
    assert {node_ids.parse(i).check for i in items} == {"quant_accuracy", "circle_structure"}
    assert len(items) == 2 * (len(found["groups"]) - 1)
    forward = names.index("quantization/wrapq/wrappers/nn/quant_linear.py::QuantLinear.forward")
    convert = names.index("utils/convert.py::convert_exported_module_to_circle")
    for item in items:
        assert forward in reach[item], item
        assert (convert in reach[item]) == (node_ids.parse(item).check == "circle_structure"), item


def test_code_only_torch_export_traces_reaches_every_item_that_reads_the_program(measured):
    """tico's Llama prefill export adapter runs only inside torch.export (dynamo: coverage does not see it) for
    the items that read the program; the measured export stage runs it eagerly too, so circle_structure
    reaches its forward, and quant_accuracy, which reads no program, does not."""
    from harness.records import node_ids
    from harness.tico_facts import item_map

    found = item_map.load(measured / "tico-coverage" / item_map.MAP_NAME)
    reach = item_map.item_reach(found)
    adapter = found["functions"].index(
        "quantization/wrapq/wrappers/llama/export_adapters.py::LlamaAttentionPrefillExportAdapter.forward"
    )
    assert adapter in reach[node_ids.item_id(ATTENTION, "circle_structure")]
    assert adapter not in reach[node_ids.item_id(ATTENTION, "quant_accuracy")]


def test_the_command_reports_totals_classes_and_uncovered_branches(measured):
    done = preloaded_python.run(
        [sys.executable, "-m", "harness", "tico-coverage", str(measured), "--families", "--classes",
         "--uncovered", "3", "--areas"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("tico quantization/wrapq/wrappers: ")
    assert "nn/quant_linear.py::QuantLinear" in done.stdout
    assert any(line.startswith("nn ") for line in done.stdout.splitlines())  # the nn family's row
    assert "reachable wrapper branches: " in done.stdout and "reachable run" in done.stdout
    assert "uncovered branch(es) in quantization/wrapq/wrappers" in done.stdout
    assert "tico converter core (serialize/operators + passes + quantization/passes): " in done.stdout
    rows = {line.split()[0]: line for line in done.stdout.splitlines() if line.strip()}
    assert {"serialize/operators", "passes", "quantization/passes", "utils", "quantization/algorithm"} <= set(rows)
    missing = preloaded_python.run(
        [sys.executable, "-m", "harness", "tico-coverage", str(measured / "nowhere")],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert missing.returncode == 2 and "--tico-coverage" in missing.stdout


def test_a_file_belongs_to_the_innermost_area_named_for_it():
    assert converter_areas.area_of("quantization/passes/fold_quant_ops.py") == "quantization/passes"
    assert converter_areas.area_of("passes/decompose_fake_quantize.py") == "passes"
    assert converter_areas.area_of("quantization/wrapq/wrappers/nn/quant_linear.py") == "wrappers"
    assert converter_areas.area_of("pt2_to_circle.py") is None
    files = {
        "passes/a.py": {"statements": 10, "lines_covered": 5, "branches": 4, "branches_covered": 1},
        "quantization/passes/b.py": {"statements": 6, "lines_covered": 6, "branches": 4, "branches_covered": 4},
        "serialize/operators/c.py": {"statements": 2, "lines_covered": 0, "branches": 2, "branches_covered": 0},
    }
    areas = branch_coverage.area_totals(files)
    assert areas["passes"]["percent_branches"] == 25.0 and areas["quantization/passes"]["percent_branches"] == 100.0
    assert areas["utils"]["files"] == 0 and areas["utils"]["percent_branches"] is None  # measured nothing: no figure
    core = branch_coverage.converter_core(files)
    assert (core["branches_covered"], core["branches"], core["percent_branches"]) == (5, 10, 50.0)


def _tree(root: Path, files: dict[str, str]) -> Path:
    package = root / "tico"
    for name, text in {"__init__.py": "", "quantization/__init__.py": "", **files}.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)
    return package


WRAPPER = "def forward(x, mode):\n    if mode == 'a':\n        return x + 1\n    return x - 1\n"


def test_diff_coverage_separates_lines_the_run_reached_from_those_it_did_not(tmp_path):
    base = _tree(tmp_path / "base", {"quantization/w.py": WRAPPER})
    changed = WRAPPER.replace("x + 1", "x + 2").replace("x - 1", "x - 2")
    head = _tree(tmp_path / "head", {"quantization/w.py": "# a comment moves every line\n" + changed})
    summary = {
        "tico_root": str(head),
        "files": {"quantization/w.py": {"executed_lines": [2, 3, 4], "missing_lines": [5]}},
    }
    result = tico_diff.diff_coverage(summary, base.parent)
    assert (result["touched"], result["ran"]) == (2, 1)
    assert result["unreached"] == [["quantization/w.py", 5, "return x - 2"]]
    assert "touches 2 executable line(s); the harness ran 1; 1 no case reaches" in tico_diff.render(result)


def test_a_behaviour_neutral_change_touches_no_executable_line_and_a_wheel_is_a_base(tmp_path):
    base = _tree(tmp_path / "base", {"quantization/w.py": WRAPPER})
    head = _tree(tmp_path / "head", {"quantization/w.py": "# moved\n\n" + WRAPPER.replace("\n", "  # note\n", 1)})
    wheel = tmp_path / "tico-0.0.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path in base.rglob("*.py"):
            archive.write(path, path.relative_to(base.parent).as_posix())
    summary = {
        "tico_root": str(head),
        "files": {"quantization/w.py": {"executed_lines": [3, 4, 5, 6], "missing_lines": []}},
    }
    result = tico_diff.diff_coverage(summary, wheel)
    # the def line gained a trailing comment: changed text, same statement, which the run executed
    assert result["unreached"] == [] and result["touched"] == result["ran"]
    with pytest.raises(FileNotFoundError, match="holds no tico package"):
        tico_diff.diff_coverage(summary, tmp_path)


def test_shards_merge_into_one_summary_and_a_run_without_measurement_says_so(measured, tmp_path):
    from harness.tico_facts import item_map

    # the summary only (--no-html): the measured run's own combination wrote coverage's pages, tested above
    merged = branch_coverage.merge([measured, measured], tmp_path / "merged", html=False)
    assert merged["scope_totals"] == branch_coverage.load(measured)["scope_totals"]  # the same lines, counted once
    assert not (tmp_path / "merged" / "html").exists()
    # the per-item map survives the merge: the same first groups (one-time work) and the same reach per item
    one, both = (item_map.load(d / item_map.MAP_NAME) for d in (measured / "tico-coverage", tmp_path / "merged"))
    assert both["first_groups"] == one["first_groups"] and both["first_only"] == one["first_only"]
    by_name = lambda m: {i: {m["functions"][f] for f in r} for i, r in item_map.item_reach(m).items()}  # noqa: E731
    assert by_name(both) == by_name(one)
    with pytest.raises(FileNotFoundError, match="made with --tico-coverage"):
        branch_coverage.merge([measured, tmp_path / "plain"], tmp_path / "again")


def test_leaving_out_the_pages_is_an_option_of_a_merge_only(capsys):
    from harness.commands import tico_coverage

    with pytest.raises(SystemExit) as refused:
        tico_coverage.main([str(REPO / "reports"), "--no-html"])
    assert refused.value.code == 2 and "--no-html applies to --merge-into DIR" in capsys.readouterr().err


def test_a_measured_run_never_takes_a_cached_export_or_conversion():
    """A cache hit would skip the tico code the run measures."""
    from types import SimpleNamespace

    from harness.run.options import circle_cache_dir, export_cache_dir

    options = {"wrapq_tico_coverage": True, "wrapq_no_circle_cache": False, "wrapq_no_export_cache": False}
    config = SimpleNamespace(getoption=options.get, rootpath=REPO)
    assert circle_cache_dir(config) is None and export_cache_dir(config) is None
    options["wrapq_tico_coverage"] = False
    options["wrapq_circle_cache"] = options["wrapq_export_cache"] = None
    assert circle_cache_dir(config) is not None and export_cache_dir(config) is not None


def test_diff_coverage_ranks_the_files_with_most_unreached_lines_first(tmp_path):
    base = _tree(tmp_path / "base", {})
    head = _tree(tmp_path / "head", {"quantization/a.py": WRAPPER, "quantization/b.py": "x = 1\n"})
    summary = {"tico_root": str(head), "files": {}}  # neither file was imported by the run
    text = tico_diff.render(tico_diff.diff_coverage(summary, base.parent))
    assert text.splitlines()[:4] == [
        "this change to tico touches 5 executable line(s); the harness ran 0; 5 no case reaches",
        "unreached lines by file (most first):",
        "      4  quantization/a.py",
        "      1  quantization/b.py",
    ]


def test_a_measurement_that_cannot_be_combined_loses_no_result(tmp_path):
    """The run's results are written and say why the coverage summary is missing."""
    (tmp_path / "broken_combine.py").write_text(
        "from harness.tico_facts import branch_coverage\n"
        "def combine(*args, **kwargs):\n"
        "    raise OSError('disk full')\n"
        "branch_coverage.combine = combine\n"
    )
    report = tmp_path / "reports"
    done = preloaded_python.run(
        [sys.executable, "-m", "pytest", "-n", "0", "-p", "no:cacheprovider", "-p", "broken_combine",
         "--tico-coverage", "-k", "nn_layernorm and quant_accuracy", f"--wrapq-report-dir={report}"],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(tmp_path)}, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:]
    assert "the measurement could not be combined: OSError: disk full" in done.stdout
    run = json.loads((report / "results.json").read_text())["run"]
    assert run["tico_coverage"] == {"error": "OSError: disk full"}
    assert "could not be combined" in (report / "report.html").read_text()


def test_the_public_entry_points_are_listed_with_whether_the_run_called_them():
    summary = {
        "functions": {
            "quantization/public_interface.py::prepare": 5,
            "quantization/config/builders.py::build_llm_ptq_config": 0,
            "quantization/config/builders.py::_build_llama_overrides": 0,  # private: not an entry point
        },
        "classes": {
            "quantization/algorithm/gptq/quantizer.py::GPTQQuantizer": {"lines_covered": 12},
            "quantization/algorithm/gptq/quantizer.py::StopForward": {"lines_covered": 1},  # a helper
        },
    }
    assert branch_coverage.entry_points(summary) == [
        ("quantization/public_interface.py::prepare", True),
        ("quantization/config/builders.py::build_llm_ptq_config", False),
        ("quantization/algorithm/gptq/quantizer.py::GPTQQuantizer", True),
    ]


def test_the_measured_run_lists_the_entry_points_it_called(measured):
    called = dict(branch_coverage.entry_points(branch_coverage.load(measured)))
    assert called["quantization/public_interface.py::prepare"] is True  # every case calls tico's prepare
