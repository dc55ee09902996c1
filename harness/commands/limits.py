"""``python -m harness limits``: the same as ``python -m harness.limits``."""

from __future__ import annotations

HELP = "propose a profile's limits from clean runs (for review)"


def main(argv: list[str]) -> int:
    from harness.limits import main as run

    return run(argv)
