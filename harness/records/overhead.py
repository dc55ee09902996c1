"""The harness's own cost, kept apart from the work it validates.

Wrapper work (building, calibrating, exporting, converting, replaying, comparing) is what a
run is for; collection, result transport, golden file I/O, the mutation guard's snapshots
and report rendering are what this harness adds on top. Each process sums the latter per
kind; xdist workers send theirs to the controller, which stores the total in results.json
so the benchmark can report it as a share of the run.
"""

from __future__ import annotations

import resource
import time
from contextlib import contextmanager
from typing import Iterator

_totals: dict[str, float] = {}


@contextmanager
def overhead(kind: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        _totals[kind] = _totals.get(kind, 0.0) + time.perf_counter() - start


def totals() -> dict[str, float]:
    return dict(_totals)


def peak_rss_mb() -> float:
    """This process's peak resident set size (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def current_rss_mb() -> float:
    """Resident set size now (to see a finished case group's memory given back)."""
    try:
        with open("/proc/self/statm") as handle:
            pages = int(handle.read().split()[1])
        return pages * resource.getpagesize() / 2**20
    except (OSError, ValueError, IndexError):
        return float("nan")
