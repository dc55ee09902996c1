"""The one command that reruns items, everywhere the harness prints one (golden messages, findings,
comparisons, reports, the dashboard): the README's wrapper script, the tico under review when one
was given, and the case directories given with --wrapq-cases-dir, so a case from outside the
project reruns as it ran.

Node ids are passed as they are (harness/records/node_ids.py: ``file::case::check[profile]``), so the
command selects exactly the items it names; an id recorded in the older form is written in today's."""

from __future__ import annotations

import shlex
from pathlib import Path

from harness.records import node_ids

ROOT = Path(__file__).resolve().parents[2]
_GIVEN_CASES_DIRS: list[Path] = []


def configure(cases_dirs: list[Path]) -> None:
    """The case directories this run was given with --wrapq-cases-dir (set once per process)."""
    _GIVEN_CASES_DIRS[:] = list(cases_dirs)


def _argument(nodeid: str) -> str:
    """The node id as a path argument: a case file outside the project is named by its path in the
    given case directory that holds it."""
    nodeid = node_ids.current(nodeid)
    file, sep, rest = nodeid.partition("::")
    if _GIVEN_CASES_DIRS and not (ROOT / file).is_file():
        found = next((d / file for d in _GIVEN_CASES_DIRS if (d / file).is_file()), None)
        if found is not None:
            file = str(found)
    return shlex.quote(file + sep + rest)


def command(*nodeids: str, tico: str | None = None, extra: str = "") -> str:
    """``./scripts/env.sh pytest ID ...``, runnable as printed."""
    prefix = f"WRAPQ_TICO={shlex.quote(tico)} " if tico else ""
    dirs = "".join(f"--wrapq-cases-dir={shlex.quote(str(d))} " for d in _GIVEN_CASES_DIRS if _outside(nodeids))
    args = " ".join(_argument(n) for n in nodeids)
    return f"{prefix}./scripts/env.sh pytest {dirs}{args}" + (f" {extra}" if extra else "")


def _outside(nodeids: tuple[str, ...]) -> bool:
    return any(not (ROOT / n.partition("::")[0]).is_file() for n in nodeids)
