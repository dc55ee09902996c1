"""Loading case files outside pytest (commands, scripts, tests) as the plugin loads them: the case
directories pyproject configures, their import roots, and each module's cases with the limits data
beside the file."""

from __future__ import annotations

import importlib
import sys
import tomllib
from pathlib import Path
from types import ModuleType

from harness.model import limits_data
from harness.model.case import Case

ROOT = Path(__file__).resolve().parents[2]


def configured_case_dirs() -> list[Path]:
    """The case directories pytest collects (``wrapq_cases_dir`` in pyproject.toml)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    dirs = config["tool"]["pytest"]["ini_options"].get("wrapq_cases_dir", "cases")
    return [ROOT / d for d in dirs.split()]


def add_configured_import_roots() -> None:
    """Put the import roots pytest gets from pyproject (``pythonpath``, the out-of-tree example's
    package too) on sys.path, for scripts that load cases outside pytest."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for entry in reversed(config["tool"]["pytest"]["ini_options"].get("pythonpath", [])):
        if str(ROOT / entry) not in sys.path:
            sys.path.insert(0, str(ROOT / entry))


def cases_of(module: ModuleType) -> list[Case]:
    """A case module's cases as the harness runs them: with the limits data beside the file."""
    return limits_data.complete(list(getattr(module, "CASES", [])), Path(module.__file__))


def load_cases(case_dirs: list[Path] | None = None) -> list[tuple[str, Case]]:
    """(case file relative to the repo root, case) for every collected case."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    found = []
    for cases_dir in case_dirs or configured_case_dirs():
        for path in sorted(cases_dir.glob("[!_]*.py")):
            module_name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            module = importlib.import_module(module_name)
            found += [(path.relative_to(ROOT).as_posix(), case) for case in cases_of(module)]
    return found
