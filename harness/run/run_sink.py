"""The end of a run, on the controller: every item's record is folded into one results.json,
then the HTML report, recorded durations, the history row and the goldens this run staged are
written once, and the terminal summary says what happened (including goldens rewritten and
goldens no case defines). xdist workers only hand their statistics over."""

from __future__ import annotations

import textwrap
from typing import Any

import pytest

from harness.checks import describe_checks
from harness.golden import tensors as golden
from harness.golden.platform_info import platform_record
from harness.golden.tensors import golden_set_id
from harness.records import node_ids, rerun
from harness.records.overhead import current_rss_mb, overhead, peak_rss_mb
from harness.records.overhead import totals as overhead_totals
from harness.records.results import ResultCollector
from harness.report.history_store import append_run
from harness.report.html import write_report
from harness.report.summary import render_summary_table
from harness.run.scheduling import write_durations
from harness.run.session import SessionState
from harness.tico_facts import findings_data
from harness.tico_facts.branch_coverage import converter_core, headline
from harness.tico_facts.branch_reasons import reach_line
from harness.tico_facts.converter_areas import core_line
from harness.tico_facts.drift import describe_moves, label_record, read_pins, render_drift_table, version_moves
from harness.tico_facts.finding_status import render_lines, summarize
from harness.tico_facts.tico_identity import describe, identity


class RunSink:
    """Registered as a plugin in every process; only the controller writes."""

    def __init__(self, state: SessionState):
        config = state.config
        self.state = state
        self.is_worker = state.is_worker
        self.report_dir = state.report_dir
        self.shard_label: str | None = config.getoption("wrapq_shard")
        self.record_durations = bool(config.getoption("wrapq_record_durations"))
        # process name -> overhead totals, peak RSS and RSS after each finished case group
        self.workers: dict[str, dict[str, Any]] = {}
        # case names the workers' case files define (the controller under xdist collects none)
        self.worker_case_names: set[str] = set()
        self.drift_moves: list[dict[str, Any]] | None = None
        if config.getoption("wrapq_drift"):
            self.drift_moves = version_moves(read_pins(config.rootpath / config.getini("wrapq_pins_file")))
        history = config.getoption("wrapq_history")
        self.history_path = (config.rootpath / history) if history else None
        # the whole matrix was collected (no file or directory narrowed it): orphans can be told
        self.full_collection = config.args_source == pytest.Config.ArgsSource.TESTPATHS
        prefixes = []
        for cases_dir in state.cases_dirs:
            try:
                prefixes.append(cases_dir.relative_to(config.rootpath).as_posix() + "/")
            except ValueError:
                # outside the project (--wrapq-cases-dir): pytest names its items from the directory
                # itself, and only case items are collected from it
                prefixes.append("")
        self.collector = ResultCollector(case_nodeid_prefixes=tuple(prefixes))
        self.goldens_rewritten: list[str] = []
        self.orphan_goldens: list[str] = []
        self.findings_summary: dict[str, Any] | None = None

    def process_stats(self) -> dict[str, Any]:
        return {
            "overhead": overhead_totals(),
            "peak_rss_mb": round(peak_rss_mb(), 1),
            "rss_after_group_mb": dict(self.state.rss_after_group),
            "case_names": sorted(self.state.case_names),
        }

    # -- hooks -----------------------------------------------------------------------------
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        self.collector.start()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if not self.is_worker:
            with overhead("result_transport"):
                self.collector.add_report(report)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_collection(self, session: pytest.Session):
        with overhead("collection"):
            yield

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        """A worker starts: it stages goldens under this run's id, like the controller."""
        node.workerinput["wrapq_run_id"] = self.state.run_id

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        """A worker finished: keep its overhead and memory figures for results.json."""
        stats = getattr(node, "workeroutput", {}).get("wrapq_stats")
        if stats:
            self.worker_case_names.update(stats.pop("case_names", []))
            self.workers[node.gateway.id] = stats

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.is_worker:
            session.config.workeroutput["wrapq_stats"] = self.process_stats()
            return
        self._promote_goldens()
        if session.config.option.collectonly or not self.collector.records:
            return  # e.g. `pytest tests`: no case items, so leave the last matrix report alone
        self._write_reports(exitstatus)  # its cost is measured by the benchmark, which re-renders the doc

    def pytest_terminal_summary(self, terminalreporter, exitstatus: int, config: pytest.Config) -> None:
        if self.is_worker or config.option.collectonly or not self.collector.records:
            return

        terminalreporter.section("wrapq summary")
        terminalreporter.write_line(render_summary_table(self.collector.records, describe_checks(self.state.checks)))
        failing: dict[str, list[str]] = {}
        for r in sorted(self.collector.records.values(), key=lambda r: r["nodeid"]):
            if r.get("outcome") in ("failed", "error", "crashed") and r.get("check"):
                failing.setdefault(node_ids.group_of(r["nodeid"]), []).append(r["nodeid"])
        for group in sorted(failing)[:8]:
            terminalreporter.write_line(f"rerun: {rerun.command(*failing[group])}")
        if len(failing) > 8:
            terminalreporter.write_line(f"... {len(failing) - 8} more failing case(s): ./scripts/env.sh pytest --lf")
        self._write_findings(terminalreporter)
        if self.state.tico_coverage_error is not None:
            terminalreporter.section("wrapq tico coverage")
            terminalreporter.write_line(f"the measurement could not be combined: {self.state.tico_coverage_error}")
        if self.state.tico_coverage is not None:
            terminalreporter.section("wrapq tico coverage")
            terminalreporter.write_line(headline(self.state.tico_coverage))
            reach = self.state.tico_coverage.get("reach") or {}
            terminalreporter.write_line(reach_line(reach) if "total" in reach else f"reachable: {reach.get('error')}")
            terminalreporter.write_line(core_line(converter_core(self.state.tico_coverage["files"])))
            terminalreporter.write_line(
                f"per area, file, class and uncovered branch: python -m harness tico-coverage {self.report_dir} "
                "--areas --files"
            )
        if self.drift_moves is not None:
            terminalreporter.section("wrapq drift")
            terminalreporter.write_line(render_drift_table(self.collector.records, self.drift_moves))
        if self.goldens_rewritten:
            terminalreporter.section("wrapq goldens rewritten")
            golden_dir = self.state.pipelines.settings.golden_dir
            terminalreporter.write_line(
                f"{len(self.goldens_rewritten)} golden(s) written to {golden_dir}; review "
                f"`git diff {golden_dir.name}` before committing:"
            )
            for stem in self.goldens_rewritten:
                terminalreporter.write_line(f"  {stem}")
        if self.orphan_goldens:
            terminalreporter.section("wrapq orphan goldens")
            terminalreporter.write_line(
                f"{len(self.orphan_goldens)} golden(s) belong to no case the case files "
                f"define (renamed or removed cases?); delete them or restore their case:"
            )
            for stem in self.orphan_goldens:
                terminalreporter.write_line(f"  {stem}")
        terminalreporter.write_line(
            f"results: {self.report_dir / 'results.json'}  report: {self.report_dir / 'report.html'}"
        )

    def _findings_summary(self) -> dict[str, Any]:
        """The run's findings, computed once for results.json and the terminal
        (harness/tico_facts/finding_status.py)."""
        if self.findings_summary is None:
            self.findings_summary = summarize(self.collector.records.values(), identity().get("requested"))
        return self.findings_summary

    def _baseline_summary(self) -> dict[str, Any] | None:
        base = self.state.base_run
        if base is None:
            return None
        pre = sorted(r["nodeid"] for r in self.collector.records.values() if r.get("baseline") == "pre-existing")
        return {"results": str(base.results), "run_id": base.run_id, "tico": base.tico, "pre_existing": pre}

    def _write_findings(self, terminalreporter) -> None:

        summary = self._findings_summary()
        if findings_data.recorded_here():
            mode = "strictly: the tico findings/tico.toml was recorded on"
        elif self.state.findings_strict:
            mode = "strictly (--strict-findings) on a tico other than the recorded one"
        else:
            mode = "for review: another tico than the recorded one, so a finding that no longer occurs is fixed"
        terminalreporter.section("wrapq findings")
        for line in textwrap.wrap(f"{describe(identity())}; expectations judged {mode}", 118, subsequent_indent="  "):
            terminalreporter.write_line(line)
        for line in render_lines(summary) or ["no finding occurred and no problem is unexplained"]:
            terminalreporter.write_line(line)
        base = self._baseline_summary()
        if base is not None:
            terminalreporter.write_line(
                f"judged against the {self.state.base_run.label}: "
                f"{len(base['pre_existing'])} failure(s) pre-existing there (xfail, not "
                f"this change's); goldens compared with its tensors"
            )

    # -- writing ---------------------------------------------------------------------------
    def _promote_goldens(self) -> None:

        settings = self.state.pipelines.settings
        if settings.update_golden and settings.golden_staging_dir is not None:
            self.goldens_rewritten = golden.promote(settings.golden_staging_dir, settings.golden_dir)
        if self.full_collection:
            names = self.state.case_names | self.worker_case_names
            if names:
                self.orphan_goldens = golden.orphans(settings.golden_dir, names)

    def _write_reports(self, exitstatus: int) -> None:

        workers = dict(self.workers) or {"main": self.process_stats()}
        if self.workers:
            workers["controller"] = self.process_stats()
        for stats in workers.values():
            stats.pop("case_names", None)
        extra = {
            "golden_set": golden_set_id(self.state.pipelines.settings.golden_dir),
            "shard": self.shard_label,
            "processes": workers,
            "checks": describe_checks(self.state.checks),
            "goldens_rewritten": self.goldens_rewritten,
            "orphan_goldens": self.orphan_goldens,
            "platform": platform_record(),  # the testbed the history keys series by
            "tico": identity(),
            "findings_strict": self.state.findings_strict,
            "run_id": self.state.run_id,
            "baseline": self._baseline_summary(),
            **self._findings_summary(),
        }
        if self.state.tico_coverage_error is not None:
            extra["tico_coverage"] = {"error": self.state.tico_coverage_error}
        if self.state.tico_coverage is not None:
            extra["tico_coverage"] = {
                key: self.state.tico_coverage.get(key)
                for key in ("scope", "totals", "scope_totals", "areas", "reach", "wall_seconds")
            }
        if self.state.selection is not None:
            extra["selection"] = self.state.selection
        if self.drift_moves is not None:
            for record in self.collector.records.values():
                label_record(record, self.drift_moves)
            extra["drift"] = {"moves": self.drift_moves, "versions": describe_moves(self.drift_moves)}
        doc = self.collector.write(
            self.report_dir / "results.json", exitstatus=int(exitstatus), profiles=self.state.profiles, extra=extra
        )
        write_report(doc, self.report_dir / "report.html")
        if self.record_durations:
            write_durations(self.state.durations_path, self._group_seconds(), self.state.durations)
        if self.history_path is not None:
            append_run(self.history_path, doc)

    def _group_seconds(self) -> dict[str, float]:
        totals: dict[str, float] = {}
        for record in self.collector.records.values():
            if record.get("case") and record.get("outcome") not in ("not_run", "crashed"):
                group = f"{record['case']}[{record['profile']}]"
                totals[group] = totals.get(group, 0.0) + float(record.get("duration", 0.0))
        return totals


def note_group_done(state: SessionState, case_name: str, profile: str) -> None:
    """A case group's last item on this process ran: drop its pipeline (bounded memory)."""
    state.pipelines.release(case_name, profile)
    # No gc.collect(): reference counting frees the group, so a collection here finds nothing and
    # only costs time (docs/benchmarks.md).
    state.rss_after_group[f"{case_name}[{profile}]"] = round(current_rss_mb(), 1)
