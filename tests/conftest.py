"""Scheduling of the harness's own tests: the modules whose tests start long harness runs go first,
longest first, so pytest-xdist's workers take the long runs early and end together on short tests
(in collection order, one worker finished a 100-second run alone while the other idled)."""

from __future__ import annotations

# Modules by their longest test, measured with `pytest tests -n auto --durations=0` (2026-12-07, 13:11 in all);
# a module not listed keeps its place after them. Only the order changes, never what runs.
LONG_MODULES = (
    "test_reliability",
    "test_tico_coverage",
    "test_tico_under_review",
    "test_cache_soundness",
    "test_seeded_tico_regressions",
    "test_portable_golden",
    "test_real_weights",
    "test_export_check_defects",
    "test_failure_replay",
    "test_plugin",
    "test_static_runtime_profile",
    "test_select_changed",
    "test_cases_dir_option",
    "test_sweep",
    "test_scheduling",
    "test_baseline",
)


def pytest_collection_modifyitems(items):
    rank = {name: index for index, name in enumerate(LONG_MODULES)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(LONG_MODULES)))
