"""The one command that reruns an item, everywhere the harness prints one (golden messages, findings,
comparisons, reports, the dashboard): the README's wrapper script, the tico under review when one
was given, and the case directories given with --wrapq-cases-dir, so a case from outside the
project reruns as it ran.

pytest cannot select a check item by its full node id (``file::case[profile]::check``: it reads
the bracket of a middle part as a parametrization), so a check is selected with ``-k``."""

from __future__ import annotations

import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_GIVEN_CASES_DIRS: list[Path] = []


def configure(cases_dirs: list[Path]) -> None:
    """The case directories this run was given with --wrapq-cases-dir (set once per process)."""
    _GIVEN_CASES_DIRS[:] = list(cases_dirs)


def command(nodeid: str, *, tico: str | None = None, extra: str = "") -> str:
    prefix = f"WRAPQ_TICO={shlex.quote(tico)} " if tico else ""
    parts = nodeid.split("::")
    # the last part is a check when the part before it is a case group ("case[profile]")
    check = parts[-1] if len(parts) >= 2 and "[" not in parts[-1] and "[" in parts[-2] else ""
    head = parts[:-1] if check else parts
    file = head[0] if head[0].endswith(".py") else ""
    group = head[-1] if "[" in head[-1] else ""
    if _GIVEN_CASES_DIRS and not (ROOT / file).is_file():
        # a case from a directory outside the project: that directory, selected by name
        dirs = " ".join(f"--wrapq-cases-dir={shlex.quote(str(d))}" for d in _GIVEN_CASES_DIRS)
        names = " and ".join(name for name in (group.split("[")[0], check) if name)
        args = f"{dirs} -k {shlex.quote(names)}"
    else:
        args = shlex.quote("::".join(head)) + (f" -k {shlex.quote(check)}" if check else "")
    return f"{prefix}./scripts/env.sh pytest {args}" + (f" {extra}" if extra else "")
