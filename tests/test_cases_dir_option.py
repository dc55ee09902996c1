"""A wrapper author's case outside the project: --wrapq-cases-dir collects and runs it without
editing any project file, its goldens live beside it, every command the run prints reruns it, and a
selection that points outside every case directory is a usage error that says so."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from harness.checks import builtin_checks
from tests import preloaded_python
from tests.helpers import printed_pytest_args

REPO = Path(__file__).resolve().parents[1]


def _pytest(*args: str) -> subprocess.CompletedProcess:
    return preloaded_python.run(
        [sys.executable, "-m", "pytest", "-p", "no:xdist", "-q", *args],
        cwd=REPO,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_a_case_directory_outside_the_project_runs_green_in_two_runs(tmp_path):
    cases = tmp_path / "my_cases"
    cases.mkdir()
    (cases / "outside_case.py").write_text((REPO / "tests" / "data" / "outside_case.py").read_text())
    project_goldens = sorted(p.name for p in (REPO / "golden").iterdir())

    first = _pytest(f"--wrapq-cases-dir={cases}", f"--wrapq-report-dir={tmp_path / 'r1'}")
    assert (tmp_path / "r1" / "results.json").is_file(), first.stdout[-2000:] + first.stderr[-2000:]
    records = json.loads((tmp_path / "r1" / "results.json").read_text())["results"]
    assert {r["case"] for r in records} == {"outside_linear"}  # only the given directory ran
    assert [r["check"] for r in records if r["outcome"] == "failed"] == ["golden"], first.stdout[-3000:]
    command = next(line for line in first.stdout.splitlines() if "create it with: " in line).split("create it with: ")[
        1
    ]
    item = f"{cases}/outside_case.py::outside_linear::golden[tiny]"
    assert command == f"./scripts/env.sh pytest --wrapq-cases-dir={cases} '{item}' --update-golden"
    _pytest(*printed_pytest_args(command), f"--wrapq-report-dir={tmp_path / 'r2'}")
    assert (cases / "golden" / "outside_linear.tiny.safetensors").is_file()
    assert sorted(p.name for p in (REPO / "golden").iterdir()) == project_goldens

    second = _pytest(f"--wrapq-cases-dir={cases}", f"--wrapq-report-dir={tmp_path / 'r3'}")
    assert second.returncode == 0, second.stdout[-3000:]
    assert "failed" not in second.stdout.splitlines()[-1] and "passed" in second.stdout.splitlines()[-1]


def test_a_selection_outside_every_case_directory_says_so(tmp_path):
    (tmp_path / "lost_case.py").write_text((REPO / "tests" / "data" / "outside_case.py").read_text())
    done = _pytest("-c", "pyproject.toml", str(tmp_path / "lost_case.py"))
    assert done.returncode == 4 and "lies outside every case directory" in done.stderr
    assert "--wrapq-cases-dir=DIR" in done.stderr
    done = _pytest("-k", "no_case_has_this_name")
    assert done.returncode == 4 and "matches no item of the case directories" in done.stderr


def test_limits_for_a_new_case_paste_into_it_and_gate_its_accuracy(tmp_path):
    cases = tmp_path / "my_cases"
    cases.mkdir()
    source = (REPO / "tests" / "data" / "outside_case.py").read_text()
    # a new case states no limits: its accuracy is measured, not gated
    bare = re.sub(r"\n\s*settings=\{.*\},", "", source)
    assert bare != source
    (cases / "outside_case.py").write_text(bare)
    _pytest(
        f"--wrapq-cases-dir={cases}", "-k", "quant_accuracy or observer_use", f"--wrapq-report-dir={tmp_path / 'r'}"
    )
    done = preloaded_python.run(
        [sys.executable, "-m", "harness", "limits", "--case", "outside_linear", str(tmp_path / "r" / "results.json")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    block = "\n".join(line for line in done.stdout.splitlines() if not line.startswith("#"))
    assert '"quant_accuracy": {"max_peir":' in block and "expected_observer_count=" in block
    pasted = bare.replace('expected_wrapper="QuantLinear",', 'expected_wrapper="QuantLinear",\n' + block)
    (cases / "outside_case.py").write_text(pasted)
    _pytest(f"--wrapq-cases-dir={cases}", "-k", "quant_accuracy", f"--wrapq-report-dir={tmp_path / 'g'}")
    (record,) = json.loads((tmp_path / "g" / "results.json").read_text())["results"]
    assert record["outcome"] == "passed" and record["settings"]["max_peir"] is not None  # gated now


def test_new_case_scaffolds_a_module_tico_does_not_wrap_and_it_runs_at_once(tmp_path):
    before = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True).stdout
    out = tmp_path / "phi3_cases"
    done = preloaded_python.run(
        [sys.executable, "-m", "harness", "new-case", "Phi3MLP", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert (out / "phi3_mlp_case.py").is_file() and (out / "wrapq_phi3_mlp" / "quant_phi3_mlp.py").is_file()
    run = _pytest(f"--wrapq-cases-dir={out}", f"--wrapq-report-dir={tmp_path / 'r'}")
    records = json.loads((tmp_path / "r" / "results.json").read_text())["results"]
    checks = len(builtin_checks())  # one item per check
    assert {r["case"] for r in records} == {"phi3_mlp"} and len(records) == checks, run.stdout[-3000:]
    assert not [r for r in records if r["outcome"] in ("error", "crashed")], run.stdout[-3000:]
    wrapper = next(r for r in records if r["check"] == "wrapper_registry")
    assert wrapper["outcome"] == "passed"  # prepare() used the skeleton the scaffold registered
    after = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True).stdout
    assert after == before  # nothing in the repository was edited
