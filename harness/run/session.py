"""Per-process state of one pytest session: the checks in force, the profiles asked for, the
case directories and the pipeline memo. Every process (controller and xdist workers) has one,
in ``config.stash[STATE]``."""

from __future__ import annotations

import uuid

import pytest

from harness.checks.base import Check
from harness.golden.baseline import BaselineError, BaseRun, cached_load
from harness.model.case import Case
from harness.pipeline import PipelineCache
from harness.run.options import DEFAULT_PROFILE, given_cases_dirs, report_dir, run_settings
from harness.run.scheduling import ShardSpecError, load_durations, parse_shard
from harness.tico_facts import findings_data

_RUN_ID = pytest.StashKey[str]()


def run_id(config: pytest.Config) -> str:
    """One id for the whole run: the controller's, handed to xdist workers in their workerinput."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput and workerinput.get("wrapq_run_id"):
        return workerinput["wrapq_run_id"]
    return config.stash.setdefault(_RUN_ID, uuid.uuid4().hex[:12])


class SessionState:
    def __init__(self, config: pytest.Config, checks: list[Check]):
        self.config = config
        self.checks = checks
        configured = [(config.rootpath / d).resolve() for d in config.getini("wrapq_cases_dir")]
        given = given_cases_dirs(config)
        self.given_cases_dirs = given
        self.cases_dirs = configured + [d for d in given if d not in configured]
        self.profiles: list[str] = config.getoption("wrapq_profiles") or [DEFAULT_PROFILE]
        self.sweep_mode: str = config.getoption("wrapq_sweep")
        self.is_worker = hasattr(config, "workerinput")
        self.report_dir = report_dir(config)
        self.run_id = run_id(config)
        settings = run_settings(config, self.run_id, given)
        self.pipelines = PipelineCache(artifact_dir=self.report_dir / "artifacts", settings=settings)
        shard = config.getoption("wrapq_shard")
        try:
            self.shard: tuple[int, int] | None = parse_shard(shard) if shard else None
        except ShardSpecError as exc:
            raise pytest.UsageError(str(exc)) from None
        self.durations_path = config.rootpath / config.getini("wrapq_durations_file")
        self.durations = load_durations(self.durations_path)
        # case names the case files define (collected in this process), for orphan goldens
        self.case_names: set[str] = set()
        self.rss_after_group: dict[str, float] = {}
        # (case node id, stage) -> the item whose report carries that stage failure's traceback
        self.stage_tracebacks_shown: dict[tuple[str, str], str] = {}
        # --tico-coverage: the combined summary, set on the controller before results are written
        self.tico_coverage: dict | None = None
        self.tico_coverage_error: str | None = None
        # --select-changed: what the run selected and why (harness/run/select_changed.py)
        self.selection: dict | None = None
        self._findings_strict: bool | None = None
        self.base_run: BaseRun | None = None
        if settings.base_results is not None:
            try:
                self.base_run = cached_load(settings.base_results)
            except BaselineError as exc:
                raise pytest.UsageError(str(exc)) from None

    @property
    def findings_strict(self) -> bool:
        """Expectations are strict on the tico the findings were recorded for, or with --strict-findings;
        on any other tico a finding that no longer occurs is reported fixed (harness/tico_facts/findings_data.py)."""
        if self._findings_strict is None:
            self._findings_strict = (
                bool(self.config.getoption("wrapq_strict_findings")) or findings_data.recorded_here()
            )
        return self._findings_strict

    def wants(self, case: Case, profile: str) -> bool:
        return "all" in self.profiles or profile in self.profiles


STATE = pytest.StashKey[SessionState]()


def state_of(config: pytest.Config) -> SessionState:
    return config.stash[STATE]


__all__ = ["STATE", "SessionState", "run_id", "state_of"]
