"""Scheduling of the harness's own tests: the modules whose tests start long harness runs go first,
longest first, so pytest-xdist's workers take the long runs early and end together on short tests
(in collection order, one worker finished a 100-second run alone while the other idled). And the
in-process pipelines share programs and conversions by the caches' keys (tests/stage_sharing.py),
except in tests marked ``fresh_stages``."""

from __future__ import annotations

import pytest

# Modules with a test of 5 s or more, by their longest test, measured with `pytest tests -n auto --durations=0`
# (2026-12-07, 13:38 in all); a module not listed keeps its place after them. Only the order changes, never what runs.
LONG_MODULES = (
    "test_reliability",
    "test_tico_coverage",
    "test_tico_under_review",
    "test_cache_soundness",
    "test_portable_golden",
    "test_seeded_tico_regressions",
    "test_real_weights",
    "test_failure_replay",
    "test_export_check_defects",
    "test_algorithm_findings",
    "test_golden",
    "test_select_changed",
    "test_preloaded_python",
    "test_export_reuse",
    "test_weight_contrast",
    "test_deferred_codegen",
    "test_static_runtime_profile",
    "test_history_store",
    "test_replay_diagnoses",
    "test_qparam_consistency",
    "test_present_v_per_head",
    "test_wrapper_coverage",
    "test_spinquant_handoff",
    "test_contract_check_defects",
    "test_sweep",
    "test_qwen3_vl_text_mask",
    "test_browser",
    "test_tico_branch_reasons",
    "test_recipe_runner",
    "test_algorithm_handoff",
)


def pytest_collection_modifyitems(items):
    rank = {name: index for index, name in enumerate(LONG_MODULES)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(LONG_MODULES)))


def pytest_configure(config):
    from tests import stage_sharing

    config.addinivalue_line(
        "markers", "fresh_stages: trace and convert every pipeline of the test afresh (tests/stage_sharing.py)"
    )
    stage_sharing.install()


@pytest.fixture(autouse=True)
def _fresh_stages_when_marked(request):
    """Tests about the caches, their keys and traces read how a stage runs: they never share one."""
    if request.node.get_closest_marker("fresh_stages") is None:
        yield
        return
    from tests import stage_sharing

    with stage_sharing.routed(shared=False):
        yield
