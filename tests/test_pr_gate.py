"""The PR gate as a TICO pull request meets it: the shipped workflow's own run steps (examples/ci/tico-pr-gate.yml),
run in the layout it checks out (the harness, ``tico`` and ``tico-base`` side by side under the workspace) on a
real change to a copy of tico, report the change's items worse; and ``pr-gate`` refuses bad options before
anything runs, with the fix in one line."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import yaml

from harness.commands import pr_gate
from tests.tico_tree import copy_tico, edit

REPO = Path(__file__).resolve().parents[1]
WORKFLOW = REPO / "examples" / "ci" / "tico-pr-gate.yml"
PRELU = "quantization/wrapq/wrappers/nn/quant_prelu.py"


def _run_steps() -> list[dict]:
    steps = [s for job in yaml.safe_load(WORKFLOW.read_text())["jobs"].values() for s in job["steps"]]
    return [s for s in steps if "run" in s]


def _thin_venvs_of(workspace: Path) -> list[Path]:
    """The per-tico venvs scripts/env.sh built for trees under ``workspace``."""
    return [
        marker.parent
        for marker in (REPO / ".venv-tico").glob("*/.wrapq-source")
        if str(workspace) in marker.read_text()
    ]


def test_the_workflow_steps_report_a_real_change_worse_in_its_layout(tmp_path):
    """A wrapper change (QuantPReLU returns its output without the output fake-quant), run step by step as the
    workflow runs it: the steps before the comparison pass, the comparison exits 1 and names cnn_prelu's items
    worse in the job summary, and the selection ran only what the change reaches."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "wrapq").symlink_to(REPO)
    copy_tico(workspace, "tico-base")
    head = copy_tico(workspace, "tico")
    edit(head, PRELU, "        return self._fq(output, self.obs_act_out)\n", "        return output\n")
    summary = workspace / "summary.md"
    env = {k: v for k, v in os.environ.items() if k not in ("WRAPQ_TICO", "PYTHONPATH")}
    env |= {"GITHUB_WORKSPACE": str(workspace), "GITHUB_STEP_SUMMARY": str(summary)}
    codes = {}
    try:
        for step in _run_steps():
            done = subprocess.run(
                ["bash", "-e", "-o", "pipefail", "-c", step["run"]],
                cwd=workspace / step.get("working-directory", "."),
                env=env,
                capture_output=True,
                text=True,
                timeout=900,
            )
            codes[step["name"]] = done.returncode
            assert done.returncode in (0, 1), f"{step['name']}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
    finally:
        for venv in _thin_venvs_of(workspace):
            shutil.rmtree(venv, ignore_errors=True)
    assert list(codes.values()) == [0, 0, 0, 1], codes
    selected = (workspace / "gate" / "select" / "selected-items.txt").read_text().split()
    assert selected and all(i.startswith("cases/cnn.py::cnn_prelu::") for i in selected), selected
    text = summary.read_text()
    assert "WORSE:" in text and "selected 17 of" in text, text[:3000]
    for check in ("observer_use", "calibration_coverage", "qparam_audit", "circle_structure"):
        assert f"| **worse** | `cases/cnn.py::cnn_prelu::{check}[tiny]` |" in text, text[:3000]


def test_bad_options_are_refused_before_anything_runs_with_the_fix(tmp_path, capsys):
    report = tmp_path / "gate"
    code = pr_gate.main(["--head", str(tmp_path / "nowhere"), "--base=0.3.0", f"--report-dir={report}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and not report.exists()
    assert len(err.splitlines()) == 1 and "--head" in err and "give a tico checkout" in err, err
    code = pr_gate.main(["--head", str(tmp_path), "--base=0.3.0", f"--report-dir={report}"])
    assert code == 2 and "no tico/__init__.py there" in capsys.readouterr().err and not report.exists()
    # a path option takes 'OPT DIR' and 'OPT=DIR' alike; a later step without the earlier one's output says so
    tree = tmp_path / "tree"
    (tree / "tico").mkdir(parents=True)
    (tree / "tico" / "__init__.py").write_text("")
    for form in (["--report-dir", str(report)], [f"--report-dir={report}"]):
        code = pr_gate.main(["--step=base", f"--head={tree}", "--base", str(tree), *form])
        err = capsys.readouterr().err.strip()
        assert code == 2 and "run the select step first (--step select)" in err, err
