"""Run one generic check on a fresh pipeline, as the plugin does, without pytest collection."""

from __future__ import annotations

import json
import re

from safetensors.torch import load_file, save_file

from harness.checks import all_checks
from harness.checks.base import CheckResult
from harness.golden import tensors as golden
from harness.model.case import Case
from harness.pipeline import Pipeline, PipelineCache

CHECKS = {check.name: check for check in all_checks()}
_CLEAN = PipelineCache()


def run_clean_check(case: Case, check_name: str, profile: str = "tiny") -> CheckResult:
    """Like run_check, but shares one pipeline per case across tests (clean tico only:
    never call it while a defect is monkeypatched in)."""
    return CHECKS[check_name].run(_CLEAN.get(case, profile))


def run_check(case: Case, check_name: str, profile: str = "tiny") -> CheckResult:
    pipeline = Pipeline(case, profile)
    check = CHECKS[check_name]
    assert check.applies(case) is None, f"{check_name} does not apply to {case.name}"
    return check.run(pipeline)


def problems_text(result: CheckResult) -> str:
    return "\n".join(result.problems)


def _pinned() -> dict[str, str]:
    """Exact versions from constraints.txt, so tests follow a pin bump instead of hard-coding it."""
    from pathlib import Path

    pins = {}
    for line in (Path(__file__).resolve().parents[1] / "constraints.txt").read_text().splitlines():
        name, sep, version = line.strip().partition("==")
        if sep:
            pins[name.lower()] = version
    return pins


PINNED = _pinned()


def edit_golden(directory, case: str, profile: str, edit) -> None:
    """Change a golden's stored tensors with ``edit(tensors)`` and re-sign its manifest, so the change
    reads as drift (not as a corrupt file)."""
    tensor_path, manifest_path = golden.paths(directory, case, profile)
    tensors = load_file(str(tensor_path))
    edit(tensors)
    save_file(tensors, str(tensor_path))
    manifest = json.loads(manifest_path.read_text())
    for key, t in tensors.items():
        manifest["tensors"][key]["sha256"] = golden.tensor_sha256(t)
        manifest["tensors"][key]["dtype"] = str(t.dtype).removeprefix("torch.")
    manifest_path.write_text(json.dumps(manifest))


def outcome_counts(output: str) -> dict[str, int]:
    """pytest's closing line ("6 passed, 2232 deselected, 2 xfailed in 11.52s") as a count per outcome;
    the deselected count (which only a run without xdist prints) is the selection's, not an outcome."""
    closing = output.splitlines()[-1].rsplit(" in ", 1)[0]
    return {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", closing) if word != "deselected"}


def printed_pytest_args(command: str) -> list[str]:
    """A printed ``./scripts/env.sh pytest ARGS`` as the arguments pytest gets: env.sh names the
    project's config first (tests/test_rerun.py runs such commands through env.sh itself)."""
    import shlex
    from pathlib import Path

    prefix = "./scripts/env.sh pytest "
    assert command.startswith(prefix), command
    config = Path(__file__).resolve().parents[1] / "pyproject.toml"
    return [f"--config-file={config}", *shlex.split(command.removeprefix(prefix))]
