"""Every branch of tico's wrappers the nightly matrix never takes has a reviewed reason
(cases/tico_branch_reasons.toml), checked against the nightly run's snapshot (tico_branch_coverage.json);
branches are named by function and source text, so moving tico's code changes no verdict."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.tico_facts import branch_coverage, branch_reasons, tico_identity
from harness.tico_facts.branch_reasons import Branch, Reason
from tests import preloaded_python

REPO = Path(__file__).resolve().parents[1]


def test_every_untaken_branch_of_the_nightly_snapshot_has_a_reason_and_no_reason_is_stale():
    snapshot = branch_reasons.load_snapshot()
    found = branch_reasons.problems(snapshot["uncovered"], branch_reasons.load_reasons())
    assert found == [], "\n".join(found)


def test_the_snapshot_was_measured_on_the_installed_tico():
    """A snapshot of another tico's branches would explain (or flag) code this tico does not have."""
    snapshot = branch_reasons.load_snapshot()
    installed = tico_identity.source_fingerprint(tico_identity.package_dir())
    assert snapshot["tico_source_sha256"] == installed, (
        "tico changed since tico_branch_coverage.json was measured: rerun the nightly matrix with "
        "--tico-coverage and `python -m harness tico-coverage REPORT --write-snapshot`"
    )
    assert "nightly" in snapshot["pytest_args"] and snapshot["uncovered"]


def test_every_reason_states_its_kind_on_one_line():
    kinds = ("defensive:", "unexercised:", "unreachable:", "environment:", "traced:")
    for reason in branch_reasons.load_reasons():
        assert reason.why.startswith(kinds) and "\n" not in reason.why, reason


BRANCHES = [
    Branch("nn/quant_linear.py", "QuantLinear.forward", "if self.bias is None:", "return y"),
    Branch("nn/quant_linear.py", "QuantLinear.__init__", "if qcfg is None:", "raise ValueError(...)"),
    Branch("fairseq/quant_mha.py", "QuantFairseqMHA.forward", "if key_padding_mask is not None:", "exit"),
]
REASONS = [
    Reason("nn/quant_linear.py::QuantLinear.__init__", "defensive: no config", condition="qcfg is None"),
    Reason("nn/*::QuantLinear.forward", "unexercised: a bias-free linear"),
    Reason("fairseq/*", "environment: fairseq is not installed"),
]


def test_an_untaken_branch_without_a_reason_and_a_stale_reason_are_both_problems():
    assert branch_reasons.problems(BRANCHES, REASONS) == []
    assert branch_reasons.kinds(BRANCHES, REASONS) == {"defensive": 1, "unexercised": 1, "environment": 1}
    new = Branch("nn/quant_layernorm.py", "QuantLayerNorm.forward", "if b is not None:", "x = x + b")
    found = branch_reasons.problems([*BRANCHES, new], REASONS)
    assert found == [f"untaken with no reason in tico_branch_reasons.toml: {new.label()}"]
    # a case now takes the bias-free path: its reason explains nothing and is reported stale
    found = branch_reasons.problems(BRANCHES[1:], REASONS)
    assert len(found) == 1 and found[0].startswith("stale reason") and "a bias-free linear" in found[0]
    # a condition fragment narrows an entry: the same function's other branch is not explained by it
    other = Branch("nn/quant_linear.py", "QuantLinear.__init__", "if bias:", "self.bias = ...")
    assert any("no reason" in line for line in branch_reasons.problems([*BRANCHES, other], REASONS))


def test_a_target_fragment_tells_apart_the_two_ways_out_of_one_condition():
    """The same guard leads to a raise no caller reaches and, elsewhere, into code that runs only traced."""
    guard = "if self.layer_idx is None:"
    to_raise = Branch("llama/quant_attention.py", "A._finalize", guard, "raise RuntimeError(")
    to_reset = Branch("llama/quant_attention.py", "A._finalize", guard, "cache.layers[i] = type(")
    reasons = [
        Reason("llama/*::A._finalize", "unreachable: always built with its layer_idx", guard, "raise"),
        Reason("llama/*::A._finalize", "traced: the reset runs only while compiling", guard),
    ]
    assert branch_reasons.explaining(to_raise, reasons).why.startswith("unreachable")
    assert branch_reasons.explaining(to_reset, reasons).why.startswith("traced")
    assert branch_reasons.problems([to_reset], reasons) == [
        "stale reason (explains no untaken branch): llama/*::A._finalize [if self.layer_idx is None:] [raise]: "
        "unreachable: always built with its layer_idx"
    ]


def test_a_malformed_reasons_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "reasons.toml"
    bad.write_text('[[reason]]\nwhere = "nn/*"\n')
    with pytest.raises(ValueError, match="needs 'where' and 'why'"):
        branch_reasons.load_reasons(bad)
    bad.write_text("[[reason]\n")
    with pytest.raises(ValueError, match="cannot read the branch reasons"):
        branch_reasons.load_reasons(bad)


WRAPPER = textwrap.dedent(
    """\
    class QuantThing:
        def forward(self, x, mode):
            if mode == "a":
                return x + 1
            if mode == "b":
                return x - 1
            return x
    """
)


def _untaken(tmp_path: Path, source: str) -> list[Branch]:
    """The untaken branches coverage.py measures when a tico-like tree's wrapper runs mode 'a' only."""
    root = tmp_path / "tico"
    wrapper = root / branch_coverage.SCOPE / "thing.py"
    wrapper.parent.mkdir(parents=True, exist_ok=True)
    wrapper.write_text(source)
    script = tmp_path / "run.py"
    script.write_text(f"import runpy\nns = runpy.run_path({str(wrapper)!r})\nns['QuantThing']().forward(1, 'a')\n")
    data = tmp_path / ".coverage"
    subprocess.run(
        [sys.executable, "-m", "coverage", "run", "--branch", f"--data-file={data}", f"--source={root}", str(script)],
        check=True, cwd=REPO,
    )  # fmt: skip
    report = tmp_path / "coverage.json"
    subprocess.run(
        [sys.executable, "-m", "coverage", "json", f"--data-file={data}", "-o", str(report)], check=True, cwd=REPO
    )  # outside the working directory coverage names files by absolute path, as summarize expects
    summary = branch_coverage.summarize(json.loads(report.read_text()), root.resolve())
    return branch_reasons.uncovered(summary)


def test_moving_the_code_keeps_every_branch_name(tmp_path):
    """Lines added above and inside the function move every line number; the names stay the same."""
    before = _untaken(tmp_path / "before", WRAPPER)
    moved = "# a licence header\n\n\n" + WRAPPER.replace("    def forward", "    # why\n\n    def forward")
    after = _untaken(tmp_path / "after", moved)
    assert before and before == after
    assert Branch("thing.py", "QuantThing.forward", 'if mode == "b":', "return x - 1") in before


def test_the_command_checks_reasons_and_exits_1_on_a_problem(tmp_path):
    """A run whose untaken branches the reasons do not describe: every reason is stale, so the check fails."""
    summary = {
        "scope": branch_coverage.SCOPE,
        "files": {},
        "classes": {},
        "functions": {},
        "totals": branch_coverage.totals({}),
        "scope_totals": branch_coverage.totals({}),
    }
    (tmp_path / branch_coverage.SUMMARY_NAME).write_text(json.dumps(summary))
    done = preloaded_python.run(
        [sys.executable, "-m", "harness", "tico-coverage", str(tmp_path), "--check-reasons"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "PROBLEM: stale reason (explains no untaken branch): fairseq/" in done.stdout


TRACED = textwrap.dedent(
    """\
    import sys
    import torch

    class M(torch.nn.Module):
        def forward(self, x):
            if torch.compiler.is_compiling():
                y = x + 1
            else:
                y = x - 1
            return y * 2

    torch.export.export(M(), (torch.randn(2),), strict=sys.argv[1] == "strict")
    """
)


@pytest.mark.parametrize("mode", ["strict", "non_strict"])
def test_code_traced_by_strict_export_is_not_recorded(tmp_path, mode):
    """Why the reason kind 'traced' exists: strict torch.export (the harness's) traces forward symbolically
    with dynamo, so coverage records none of its lines; non-strict export runs it as Python."""
    script = tmp_path / "traced.py"
    script.write_text(TRACED)
    data = tmp_path / ".coverage"
    subprocess.run(
        [sys.executable, "-m", "coverage", "run", "--branch", f"--data-file={data}", str(script), mode],
        check=True, cwd=REPO, capture_output=True,
    )  # fmt: skip
    report = tmp_path / "coverage.json"
    subprocess.run(
        [sys.executable, "-m", "coverage", "json", f"--data-file={data}", "-o", str(report)],
        check=True, cwd=REPO, capture_output=True,
    )  # fmt: skip
    (entry,) = json.loads(report.read_text())["files"].values()
    forward = entry["functions"]["M.forward"]
    assert bool(forward["executed_lines"]) is (mode == "non_strict"), forward


def test_a_summary_from_before_branch_names_is_refused_with_what_to_do(tmp_path):
    old = {"files": {"quantization/wrapq/wrappers/x.py": {"uncovered_branches": [[3, 4, "if a:"]]}}}
    (tmp_path / branch_coverage.SUMMARY_NAME).write_text(json.dumps(old))
    with pytest.raises(FileNotFoundError, match="predates branch names by function: rerun, or re-summarise"):
        branch_coverage.load(tmp_path)


def test_the_reachable_figure_leaves_out_only_the_branches_no_case_can_reach():
    def untaken(condition):
        return {"function": "QuantThing.forward", "condition": condition, "target": "exit", "line": 1, "to": -1}

    files = {
        f"{branch_coverage.SCOPE}/fam/a.py": {
            "branches": 10, "branches_covered": 6,
            "uncovered_branches": [untaken("if torch.cuda.is_available():"), untaken("if x is None:")],
        },
        f"{branch_coverage.SCOPE}/other/b.py": {"branches": 4, "branches_covered": 4, "uncovered_branches": []},
    }  # fmt: skip
    reasons = [
        Reason("fam/a.py", "environment: no GPU on the test machines", condition="cuda"),
        Reason("fam/a.py", "defensive: a None input is refused", condition="None"),
    ]
    figures = branch_reasons.reach({"files": files}, reasons)
    assert figures["families"]["fam"] == {
        "branches": 10, "covered": 6, "out_of_reach": 1, "reachable": 9, "percent_all": 60.0, "percent_reachable": 66.7,
    }  # fmt: skip
    assert figures["total"]["reachable"] == 13 and figures["total"]["percent_reachable"] == 76.9
    assert branch_reasons.reach_line(figures).startswith("reachable wrapper branches: 76.9% (10/13); all: 71.4%")


def _snapshot(sha: str, rows: list[list[str]], fairseq_total: int, fairseq_covered: int) -> dict:
    return {
        "tico_source_sha256": sha,
        "branches_covered": 10 + fairseq_covered,
        "families": {"fairseq": {"branches": fairseq_total, "covered": fairseq_covered}, "llama": {"branches": 12}},
        "uncovered": rows,
    }


def test_a_family_only_its_own_run_executes_keeps_the_committed_entries_on_the_same_tico():
    """fairseq's wrappers run only in the fairseq profile's venv: a nightly snapshot that took none of
    them keeps the committed entries (and their covered count); another tico, or a run that did take
    some, is measured as it stands."""
    from harness.tico_facts.branch_reasons import carry_own_runs

    llama = ["llama/quant_model.py", "f", "if x:", "y"]
    fairseq = [["fairseq/quant_mha.py", "g", f"if c{i}:", "t"] for i in range(4)]
    committed = {
        **_snapshot("abc", [llama, fairseq[0]], 4, 3),
        "fairseq_run": {"pytest_args": ["--profile", "fairseq"]},
    }

    document = _snapshot("abc", [llama, *fairseq], 4, 0)
    assert carry_own_runs(document, committed) == ["fairseq"]
    assert document["uncovered"] == [llama, fairseq[0]]
    assert document["branches_covered"] == 13 and document["families"]["fairseq"]["covered"] == 3
    assert document["fairseq_run"] == committed["fairseq_run"]

    other_tico = _snapshot("def", [llama, *fairseq], 4, 0)
    assert carry_own_runs(other_tico, committed) == [] and len(other_tico["uncovered"]) == 5
    took_some = _snapshot("abc", [llama, *fairseq[:3]], 4, 1)
    assert carry_own_runs(took_some, committed) == [] and "fairseq_run" not in took_some


def test_a_run_that_executed_none_of_an_own_run_family_does_not_judge_its_reasons():
    from harness.tico_facts.branch_reasons import SCOPE, own_run_families_not_run

    def files(fairseq_covered: int) -> dict:
        branch = {"function": "f", "condition": "if x:", "target": "y"}
        return {
            "files": {
                f"{SCOPE}/fairseq/quant_mha.py": {
                    "branches": 2,
                    "branches_covered": fairseq_covered,
                    "uncovered_branches": [branch] * (2 - fairseq_covered),
                },
                f"{SCOPE}/llama/quant_model.py": {"branches": 2, "branches_covered": 1, "uncovered_branches": [branch]},
            }
        }

    assert own_run_families_not_run(files(0)) == ["fairseq"]
    assert own_run_families_not_run(files(1)) == []
