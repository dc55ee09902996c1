"""The pytest plugin, driven end to end with pytester in a scratch project (subprocess runs,
so case modules never collide with the repo's own ``cases`` package)."""

from __future__ import annotations

import json
import textwrap

import pytest

from harness import Case
from harness.checks import all_checks
from harness.records import node_ids
from tests import preloaded_python
from tests.helpers import PINNED

N_CHECKS = len(all_checks())
# Checks that need no capability: what a plain nn.Linear case (no export/rotary/mask) runs.
_PLAIN = Case(name="plain", family="nn", build=lambda profile: None)
LINEAR_APPLICABLE = sum(1 for check in all_checks() if check.applies(_PLAIN) is None)
# ... and on toy_linear's second profile, "wide": a check may declare itself for some profiles only
# (attribution runs on a case's first profile).
_TWO_PROFILES = Case(
    name="plain", family="nn", build=lambda profile: None, profiles=("tiny", "wide"), golden_profiles=("tiny", "wide")
)
WIDE_APPLICABLE = sum(
    1
    for check in all_checks()
    if check.applies(_TWO_PROFILES) is None and check.applies_to_profile(_TWO_PROFILES, "wide") is None
)

TOY_CASES = """
import torch
from harness import Built, Case, CaseInputs, Sample


def build_linear(profile):
    module = torch.nn.Linear(8, 4)
    sample = lambda: Sample(args=(torch.randn(2, 8),))
    return Built(module=module, inputs=CaseInputs(calibration=(sample(), sample()), evaluation={"default": sample()}))


CASES = [
    Case(name="toy_linear", family="nn", build=build_linear, profiles=("tiny", "wide"),
         golden_profiles=("tiny", "wide"), settings={"quant_accuracy": {"max_peir": 0.3}}),
    Case(name="toy_future", family="nn", build=build_linear, min_versions={"transformers": "99.0"}),
    Case(name="toy_missing", family="nn", build=build_linear, requires=("no_such_module_xyz",)),
]
"""


INI = """
[pytest]
testpaths = cases
wrapq_cases_dir = cases
addopts = -p no:cacheprovider
"""


@pytest.fixture(scope="module")
def toy_goldens(tmp_path_factory):
    """Goldens for the toy cases, written once through the real --update-golden path."""
    import sys

    root = tmp_path_factory.mktemp("toy_goldens")
    (root / "pytest.ini").write_text(INI)
    (root / "cases").mkdir()
    (root / "cases" / "__init__.py").write_text("")
    (root / "cases" / "toy.py").write_text(textwrap.dedent(TOY_CASES))
    done = preloaded_python.run(
        [sys.executable, "-m", "pytest", "-q", "-k", "golden", "--update-golden", "--profile", "all"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:]
    return root / "golden"


@pytest.fixture
def project(pytester, toy_goldens):
    pytester.makeini(INI)
    cases = pytester.mkpydir("cases")
    (cases / "toy.py").write_text(textwrap.dedent(TOY_CASES))
    (pytester.path / "golden").mkdir()
    for f in toy_goldens.glob("toy_linear.*"):
        (pytester.path / "golden" / f.name).write_bytes(f.read_bytes())
    return pytester


def _results(pytester) -> dict:
    return json.loads((pytester.path / "reports" / "results.json").read_text())


def test_collection_ids_are_readable(project):
    result = preloaded_python.runpytest(project, "--collect-only", "-q")
    lines = [line for line in result.outlines if "::" in line]
    assert "cases/toy.py::toy_linear::quant_accuracy[tiny]" in lines
    assert "cases/toy.py::toy_linear::rotary_parity[tiny]" in lines
    # Only the default profile is collected unless asked.
    assert not any("[wide]" in line for line in lines)
    result = preloaded_python.runpytest(project, "--collect-only", "-q", "--profile", "wide")
    assert any(line == "cases/toy.py::toy_linear::noquant_parity[wide]" for line in result.outlines)


def test_skip_reasons_and_results_json(project):
    result = preloaded_python.runpytest(project, "-rs")
    result.assert_outcomes(passed=LINEAR_APPLICABLE, skipped=3 * N_CHECKS - LINEAR_APPLICABLE)
    out = result.stdout.str()
    assert "not applicable: case 'toy_linear' declares no export capability" in out
    assert "case unavailable: requires transformers>=99.0, found" in out
    assert "case unavailable: requires module no_such_module_xyz, which is not importable" in out
    doc = _results(project)
    by_id = {r["nodeid"]: r for r in doc["results"]}
    acc = by_id["cases/toy.py::toy_linear::quant_accuracy[tiny]"]
    assert acc["outcome"] == "passed"
    assert acc["case"] == "toy_linear" and acc["profile"] == "tiny" and acc["check"] == "quant_accuracy"
    assert 0 < acc["metrics"]["peir"] < 0.3
    assert {"reference", "wrap", "prepare", "calibrate", "convert"} <= set(acc["stage_timings"])
    skipped = by_id["cases/toy.py::toy_missing::noquant_parity[tiny]"]
    assert skipped["outcome"] == "skipped" and "no_such_module_xyz" in skipped["message"]
    assert doc["run"]["versions"]["tico"] == PINNED["tico"]
    assert doc["run"]["counts"] == {"passed": LINEAR_APPLICABLE, "skipped": 3 * N_CHECKS - LINEAR_APPLICABLE}


def test_second_case_directory_and_golden_kept_for_tiny_only(pytester):
    """An out-of-tree case directory is collected next to cases/, and a real-width profile
    without goldens reports its golden item as not applicable (with why), not as missing."""
    pytester.makeini(
        INI.replace("wrapq_cases_dir = cases", "wrapq_cases_dir =\n    cases\n    extra/cases").replace(
            "testpaths = cases", "testpaths = cases extra/cases"
        )
    )
    pytester.mkpydir("cases")
    (pytester.path / "extra" / "cases").mkdir(parents=True)
    nightly = textwrap.dedent(TOY_CASES).split("CASES = [")[0] + textwrap.dedent("""
        CASES = [Case(name="toy_nightly", family="nn", build=build_linear, profiles=("tiny", "wide"),
                      settings={"quant_accuracy": {"max_peir": 0.3}})]
    """)
    (pytester.path / "extra" / "cases" / "nightly.py").write_text(nightly)
    result = preloaded_python.runpytest(pytester, "--profile", "wide", "-k", "golden or quant_accuracy", "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    assert "keeps goldens for profile(s) tiny only; the wide profile is gated by its thresholds" in result.stdout.str()
    outcomes = {r["nodeid"]: r["outcome"] for r in _results(pytester)["results"]}
    assert outcomes == {
        "extra/cases/nightly.py::toy_nightly::golden[wide]": "skipped",
        "extra/cases/nightly.py::toy_nightly::quant_accuracy[wide]": "passed",
    }


def test_golden_profiles_must_be_listed_profiles():
    from harness import CaseDefinitionError

    with pytest.raises(CaseDefinitionError, match="golden_profiles"):
        Case(name="bad", family="nn", build=lambda p: None, profiles=("wide",))


def test_xdist_results_are_merged_on_the_controller(project):
    result = preloaded_python.runpytest(project, "-n", "2", "-v", "--profile", "tiny", "--profile", "wide")
    # toy_linear runs in both profiles; the two unavailable cases list only "tiny".
    result.assert_outcomes(
        passed=LINEAR_APPLICABLE + WIDE_APPLICABLE,
        skipped=(N_CHECKS - LINEAR_APPLICABLE) + (N_CHECKS - WIDE_APPLICABLE) + 2 * N_CHECKS,
    )
    assert "scheduling tests via CrashSafeLoadScopeScheduling" in result.stdout.str()
    # loadscope: every check of one (case, profile) ran on one worker, sharing its pipeline.
    workers: dict[str, set[str]] = {}
    for line in result.outlines:
        if line.startswith("[gw") and "::" in line:
            group = node_ids.group_of(line.split()[-1])
            workers.setdefault(group, set()).add(line.split()[0])
    assert len(workers) == 4 and all(len(w) == 1 for w in workers.values()), workers
    # Each worker reports its own overhead and memory to the controller (the benchmark reads them).
    processes = _results(project)["run"]["processes"]
    assert {"gw0", "gw1", "controller"} <= set(processes)
    for name in ("gw0", "gw1"):
        assert processes[name]["peak_rss_mb"] > 50 and processes[name]["overhead"]["collection"] > 0
    ran = {g for name in ("gw0", "gw1") for g in processes[name]["rss_after_group_mb"]}
    assert ran == {"toy_linear[tiny]", "toy_linear[wide]", "toy_future[tiny]", "toy_missing[tiny]"}
    doc = _results(project)
    assert len(doc["results"]) == 4 * N_CHECKS
    outcomes = {r["nodeid"]: r["outcome"] for r in doc["results"]}
    assert outcomes["cases/toy.py::toy_linear::quant_accuracy[wide]"] == "passed"
    assert all(r.get("family") == "nn" for r in doc["results"])
    report = (project.path / "reports" / "report.html").read_text()
    assert "toy_linear" in report and '<table id="overview">' in report


def test_history_flag_appends_each_run(project):
    for _ in range(2):
        preloaded_python.runpytest(project, "-k", "toy_linear and tiny and quant_accuracy", "--history")
    import sqlite3

    con = sqlite3.connect(project.path / "reports" / "history.sqlite")
    assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 2
    assert con.execute("SELECT count(*) FROM metrics WHERE metric = 'peir'").fetchone()[0] == 2


def test_failing_check_reports_clear_message(project):
    (project.path / "cases" / "strict.py").write_text(
        textwrap.dedent(TOY_CASES).replace('"max_peir": 0.3', '"max_peir": 1e-9').replace('"toy_', '"strict_')
    )
    result = preloaded_python.runpytest(project, "-k", "strict_linear and tiny and quant_accuracy")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "quant_accuracy failed for strict_linear[tiny]:" in out
    assert "[default] PEIR 0.1" in out and "exceeds threshold 1e-09" in out
    rec = _results(project)["results"][0]
    assert rec["outcome"] == "failed" and "exceeds threshold" in rec["problems"][0]


def test_malformed_case_fails_alone_with_case_and_field(project):
    (project.path / "cases" / "broken.py").write_text(
        textwrap.dedent(
            """
            from harness import Case
            CASES = [Case(name="bad_case", family="nn", build=lambda p: None,
                          settings={"quant_accuracy": {"max_peir": "0.1"}, "circle_replay": {"max_stepz": 1}})]
            """
        )
    )
    result = preloaded_python.runpytest(project, "-k", "broken or (toy_linear and tiny and quant_accuracy)")
    # One definition item per bad setting; the case's checks are not run on settings that do not exist.
    result.assert_outcomes(passed=1, failed=2)
    out = result.stdout.str()
    assert (
        "malformed case definition in broken.py: case 'bad_case': field \"settings['quant_accuracy'].max_peir\": "
        "must be a number or None, got str '0.1'"
    ) in out
    assert (
        "case 'bad_case': field \"settings['circle_replay']\": circle_replay has no setting 'max_stepz' "
        "(settings: max_steps, mean_steps, "
    ) in out


def test_duplicate_case_names_fail_both_copies(project):
    (project.path / "cases" / "copy.py").write_text(textwrap.dedent(TOY_CASES))
    result = preloaded_python.runpytest(project, "-k", "toy_linear and tiny and noquant_parity")
    result.assert_outcomes(failed=2)
    out = result.stdout.str()
    assert "case 'toy_linear': field 'name': duplicate case name, also defined in toy.py" in out
    assert "case 'toy_linear': field 'name': duplicate case name, also defined in copy.py" in out


def test_crashing_wrapper_names_the_stage(project):
    (project.path / "cases" / "crash.py").write_text(
        textwrap.dedent(
            """
            import torch
            from harness import Case
            def build(profile):
                raise RuntimeError("reference builder exploded")
            CASES = [Case(name="crashy", family="nn", build=build)]
            """
        )
    )
    result = preloaded_python.runpytest(project, "-k", "crashy or (toy_linear and tiny)")
    crashy_applicable = LINEAR_APPLICABLE
    result.assert_outcomes(
        passed=LINEAR_APPLICABLE, failed=crashy_applicable, skipped=2 * (N_CHECKS - LINEAR_APPLICABLE)
    )
    assert "crashy[tiny]: stage 'reference' failed: RuntimeError: reference builder exploded" in result.stdout.str()
    by_case = [r for r in _results(project)["results"] if r["case"] == "crashy" and r["outcome"] == "failed"]
    assert {r["stage_error"]["stage"] for r in by_case} == {"reference"}


def test_update_golden_writes_at_the_end_and_says_what_it_rewrote(project):
    """Goldens are promoted once, when the run ends, and the summary lists them; with
    --update-golden=fail an item whose golden changed fails, so CI cannot green itself."""
    golden_dir = project.path / "golden"
    (golden_dir / "toy_linear.tiny.json").unlink()
    (golden_dir / "toy_linear.tiny.safetensors").unlink()
    (golden_dir / "renamed_case.tiny.json").write_text("{}")  # its case is gone
    result = preloaded_python.runpytest(
        project, "-k", "toy_linear and golden", "--update-golden=fail", "--profile", "all"
    )
    result.assert_outcomes(failed=1, passed=1)  # tiny is new: fails; wide is identical: passes
    out = result.stdout.str()
    assert "rewritten at the end of the run (new: " in out and "--update-golden=fail: a rewrite never passes" in out
    assert "wrapq goldens rewritten" in out and "toy_linear.tiny" in out and "toy_linear.wide" in out
    doc = _results(project)
    assert sorted(doc["run"]["goldens_rewritten"]) == ["toy_linear.tiny", "toy_linear.wide"]
    assert (golden_dir / "toy_linear.tiny.json").exists() and not (golden_dir / ".staged").exists()
    # -k narrows the items, not the case files: orphans are still told (every case file was collected)
    assert doc["run"]["orphan_goldens"] == ["renamed_case.tiny"]
    assert "wrapq orphan goldens" in out and "renamed_case.tiny" in out
    again = preloaded_python.runpytest(project, "-k", "toy_linear and golden", "--update-golden", "--profile", "all")
    again.assert_outcomes(passed=2)
    assert "(unchanged: identical tensors)" in _results(project)["results"][0]["notes"][0]
