"""``python -m harness catalog``: the same as ``python -m harness.catalog``."""

from __future__ import annotations

HELP = "print or write the case x check catalog (docs/catalog.md)"


def main(argv: list[str]) -> int:
    from harness.catalog import main as run

    return run(argv)
