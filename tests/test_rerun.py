"""Every rerun command the harness prints selects the item it names, in the project and from a case
directory given with --wrapq-cases-dir."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from harness.records import rerun

REPO = Path(__file__).resolve().parents[1]


def _collected(command: str) -> list[str]:
    """The items the command collects, run as printed (through scripts/env.sh, from the project)."""
    assert command.startswith("./scripts/env.sh pytest "), command
    done = subprocess.run(
        ["bash", "-c", f"{command} --collect-only -q -p no:xdist"],
        cwd=REPO,
        env={k: v for k, v in os.environ.items() if k != "WRAPQ_TICO"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return [line for line in done.stdout.splitlines() if "::" in line]


def test_a_check_rerun_selects_exactly_that_item():
    command = rerun.command("cases/nn.py::nn_linear::golden[tiny]", extra="--update-golden")
    assert command == "./scripts/env.sh pytest 'cases/nn.py::nn_linear::golden[tiny]' --update-golden"
    assert _collected(command.removesuffix(" --update-golden")) == ["cases/nn.py::nn_linear::golden[tiny]"]
    # an id a run recorded in the older form reruns as today's
    assert rerun.command("cases/nn.py::nn_linear[tiny]::golden") == command.removesuffix(" --update-golden")
    several = rerun.command("cases/nn.py::nn_linear::golden[tiny]", "cases/nn.py::nn_linear::lifecycle[tiny,bias=True]")
    assert _collected(several) == [
        "cases/nn.py::nn_linear::golden[tiny]",
        "cases/nn.py::nn_linear::lifecycle[tiny,bias=True]",
    ]


def test_a_group_argument_runs_that_groups_items_only():
    """``file::case[profile]`` as pytest reads ``test_f[a]``: the case at that profile or variant."""
    group = _collected(rerun.command("cases/nn.py::nn_linear[tiny]", tico="0.4.0").removeprefix("WRAPQ_TICO=0.4.0 "))
    assert group and all(i.startswith("cases/nn.py::nn_linear::") and i.endswith("[tiny]") for i in group)
    assert len(group) == len({i.split("::")[2].split("[")[0] for i in group})  # each check once
    # another argument still names what it names
    both = _collected(
        "./scripts/env.sh pytest 'cases/nn.py::nn_linear[tiny]' 'cases/nn.py::nn_linear::golden[tiny,bias=True]'"
    )
    assert set(both) == {*group, "cases/nn.py::nn_linear::golden[tiny,bias=True]"}


def test_a_case_from_outside_the_project_reruns_from_its_directory(tmp_path):
    (tmp_path / "outside_case.py").write_text((REPO / "tests" / "data" / "outside_case.py").read_text())
    rerun.configure([tmp_path])
    try:
        command = rerun.command("outside_case.py::outside_linear::golden[tiny]")
    finally:
        rerun.configure([])
    item = f"{tmp_path}/outside_case.py::outside_linear::golden[tiny]"
    assert command == f"./scripts/env.sh pytest --wrapq-cases-dir={tmp_path} '{item}'"
    assert [line.split("::", 1)[1] for line in _collected(command)] == ["outside_linear::golden[tiny]"]
