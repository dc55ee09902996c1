"""Every rerun command the harness prints selects the item it names, in the project and from a case
directory given with --wrapq-cases-dir."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from harness.records import rerun
from tests import preloaded_python

REPO = Path(__file__).resolve().parents[1]


def _collected(command: str) -> list[str]:
    args = shlex.split(command.removeprefix("./scripts/env.sh pytest "))
    done = preloaded_python.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:xdist", *args],
        cwd=REPO,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=300,
    )
    return [line for line in done.stdout.splitlines() if "::" in line]


def test_a_check_rerun_selects_exactly_that_item():
    command = rerun.command("cases/nn.py::nn_linear[tiny]::golden", extra="--update-golden")
    assert command == "./scripts/env.sh pytest 'cases/nn.py::nn_linear[tiny]' -k golden --update-golden"
    assert _collected(command.removesuffix(" --update-golden")) == ["cases/nn.py::nn_linear[tiny]::golden"]
    assert rerun.command("cases/nn.py::nn_linear[tiny]", tico="0.4.0") == (
        "WRAPQ_TICO=0.4.0 ./scripts/env.sh pytest 'cases/nn.py::nn_linear[tiny]'"
    )


def test_a_case_from_outside_the_project_reruns_from_its_directory(tmp_path):
    (tmp_path / "outside_case.py").write_text((REPO / "tests" / "data" / "outside_case.py").read_text())
    rerun.configure([tmp_path])
    try:
        command = rerun.command("outside_case.py::outside_linear[tiny]::golden")
    finally:
        rerun.configure([])
    assert command == f"./scripts/env.sh pytest --wrapq-cases-dir={tmp_path} -k 'outside_linear and golden'"
    assert [line.split("::", 1)[1] for line in _collected(command)] == ["outside_linear[tiny]::golden"]
