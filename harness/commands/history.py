"""``python -m harness history``: the same as ``python -m harness.report.history``."""

from __future__ import annotations

HELP = "append results to the SQLite history; render the dashboard"


def main(argv: list[str]) -> int:
    from harness.report.history import main as run

    return run(argv)
