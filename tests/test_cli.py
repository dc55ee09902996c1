"""``python -m harness``: commands are discovered from harness/commands/, one module each."""

from __future__ import annotations

import sys

import pytest

from harness.__main__ import main
from harness.commands import available, load
from tests import preloaded_python


def test_every_command_module_defines_help_and_main():
    names = available()
    assert {"catalog", "history", "limits", "merge"} <= set(names)
    for name in names:
        module = load(name)
        assert module.HELP.strip(), name


def test_help_lists_commands(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in available():
        assert name in out


def test_unknown_command_is_an_error(capsys):
    assert main(["no-such-command"]) == 2
    assert "unknown command 'no-such-command'" in capsys.readouterr().err


def test_command_arguments_reach_the_tool():
    # argparse exits 2 when a required option is missing: the argv went through to harness.report.limits_proposal.
    with pytest.raises(SystemExit) as raised:
        main(["limits"])
    assert raised.value.code == 2


def test_runs_as_a_module():
    done = preloaded_python.run(
        [sys.executable, "-m", "harness", "--help"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and "commands:" in done.stdout
