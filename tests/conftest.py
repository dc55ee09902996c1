"""Scheduling of the harness's own tests: the modules whose tests start harness runs in subprocesses go
first, longest first, so pytest-xdist's workers take the long runs early and end together on short tests
(in collection order, one worker finished a 100-second run alone while the other idled)."""

from __future__ import annotations

# Per-module totals measured with `pytest tests -n auto --durations=0` (2026-12-07), longest first; a module
# not listed keeps its place after them. Only the order changes, never what runs.
LONG_MODULES = (
    "test_seeded_tico_regressions",
    "test_reliability",
    "test_cache_soundness",
    "test_tico_under_review",
    "test_tico_coverage",
    "test_portable_golden",
    "test_real_weights",
    "test_cases_dir_option",
    "test_sweep",
    "test_select_changed",
    "test_scheduling",
    "test_baseline",
)


def pytest_collection_modifyitems(items):
    rank = {name: index for index, name in enumerate(LONG_MODULES)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(LONG_MODULES)))
