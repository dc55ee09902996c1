"""``--tico-coverage``: every process of the run measures which of tico's lines and branches it
executes (harness/tico_facts/branch_coverage.py); the controller combines the measurements once the
workers are done, before the run's results are written, so results.json and the report carry the
summary and ``<report dir>/tico-coverage/`` holds coverage's pages for tico."""

from __future__ import annotations

import time

import pytest

from harness.primitives.stage_engine import observe_stages
from harness.records import node_ids
from harness.run.session import SessionState
from harness.tico_facts import branch_coverage, branch_reasons, item_map, stage_contexts

DIR_NAME = "tico-coverage"


class TicoCoverageRun:
    def __init__(self, state: SessionState):
        self.state = state
        self.data_dir = state.report_dir / DIR_NAME
        self.started = time.perf_counter()
        self.first_group: str | None = None
        if not state.is_worker:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            branch_coverage.clear(self.data_dir)
        try:
            self.measurement = branch_coverage.Measurement(self.data_dir)
        except RuntimeError as exc:  # no tico to measure
            raise pytest.UsageError(f"--tico-coverage: {exc}") from None
        self.measurement.start()
        self.stages = stage_contexts.StageContexts(self.measurement.coverage.switch_context)
        observe_stages(self.stages)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        """Label what runs from here on with the item (issue 48's item map); what a stage computes is
        labelled with the stage instead (``stage_contexts``), since every later item of the group that
        asks for the stage reads what it built."""
        group = node_ids.group_of(item.nodeid)
        if self.first_group is None:
            # one-time work (a lazily filled registry, a first import) is measured under this group only
            self.first_group = group
            item_map.record_first_group(self.data_dir, group)
        stage_contexts.forget_memoized()
        self.stages.item_starts(item.nodeid)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        """On a worker this runs inside xdist's own sessionfinish wrapper, before the worker reports
        itself finished; on the controller, after every worker has."""
        observe_stages(None)
        self.measurement.save()
        self.stages.write(self.data_dir)
        if self.state.is_worker or session.config.option.collectonly:
            return
        try:
            summary = branch_coverage.combine(self.data_dir, time.perf_counter() - self.started)
        except Exception as exc:  # noqa: BLE001 - the run's results are written whatever the measurement did
            self.state.tico_coverage_error = f"{type(exc).__name__}: {exc}"
            return
        try:
            summary["reach"] = branch_reasons.reach(summary, branch_reasons.load_reasons())
        except ValueError as exc:  # the reasons file: the figure over all branches stands without it
            summary["reach"] = {"error": str(exc)}
        self.state.tico_coverage = summary
