"""``python -m harness merge``: the same as ``python -m harness.report.merge``."""

from __future__ import annotations

HELP = "merge shard results into one results.json + report"


def main(argv: list[str]) -> int:
    from harness.report.merge import main as run

    return run(argv)
