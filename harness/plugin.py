"""pytest plugin: collects case x profile x check items from the cases directory.

Node ids read ``cases/gemma4.py::gemma4_vision_encoder[tiny]::rotary_parity`` so -k, --lf,
junit and xdist work unchanged. Under xdist the plugin picks ``--dist loadscope``, whose
scope is everything before the last ``::`` -- one case and profile -- so a case's items share
one worker and its pipeline. Results ride on each report (``report.wrapq_record``) to the
controller, which alone writes ``reports/results.json``.
"""

from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from harness.case import Case, CaseDefinitionError
from harness.checks import all_checks
from harness.checks.base import Check, CheckResult
from harness.pipeline import PipelineCache, RunSettings, StageError
from harness.results import ResultCollector, jsonable
from harness.overhead import current_rss_mb, overhead, peak_rss_mb
from harness.overhead import totals as overhead_totals
from harness.expectations import judge
from harness.drift import describe_moves, label_record, read_pins, render_drift_table, version_moves
from harness.scheduling import ShardSpecError, assign_shards, load_durations, longest_first, parse_shard, write_durations

DEFAULT_PROFILE = "tiny"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("wrapq", "wrapq validation harness")
    group.addoption(
        "--profile",
        action="append",
        dest="wrapq_profiles",
        default=None,
        help=f"size profile to run (repeatable; default: {DEFAULT_PROFILE}). 'all' runs every profile a case lists.",
    )
    group.addoption(
        "--wrapq-report-dir",
        dest="wrapq_report_dir",
        default=None,
        help="where results.json is written (default: <rootdir>/reports)",
    )
    group.addoption(
        "--torch-threads",
        dest="wrapq_torch_threads",
        type=int,
        default=1,
        help="torch intra-op threads per process (default 1: xdist workers must not oversubscribe cores, "
        "and a fixed count keeps numerics identical between -n 1 and -n auto)",
    )
    group.addoption(
        "--history",
        dest="wrapq_history",
        nargs="?",
        const="reports/history.sqlite",
        default=None,
        help="append this run to a SQLite history database (default path reports/history.sqlite)",
    )
    group.addoption(
        "--stage-timeout",
        dest="wrapq_stage_timeout",
        type=float,
        default=900.0,
        help="seconds one pipeline stage may run before that case fails as hung (0 disables; default 900)",
    )
    group.addoption(
        "--update-golden",
        dest="wrapq_update_golden",
        action="store_true",
        help="rewrite golden tensors for the selected cases instead of comparing (the only way goldens change)",
    )
    group.addoption(
        "--golden-dir",
        dest="wrapq_golden_dir",
        default=None,
        help="where golden tensors live (default: <rootdir>/golden)",
    )
    group.addoption(
        "--circle-cache",
        dest="wrapq_circle_cache",
        default=None,
        help="directory of the content-addressed Circle conversion cache (default: <rootdir>/.wrapq-cache/circle)",
    )
    group.addoption(
        "--no-circle-cache",
        dest="wrapq_no_circle_cache",
        action="store_true",
        help="convert every exported program, reading and writing no cache (a cold run)",
    )
    group.addoption(
        "--export-cache",
        dest="wrapq_export_cache",
        default=None,
        help="directory of the torch.export reuse cache, keyed by each export adapter's execution "
        "(default: <rootdir>/.wrapq-cache/export)",
    )
    group.addoption(
        "--no-export-cache",
        dest="wrapq_no_export_cache",
        action="store_true",
        help="trace every export adapter with torch.export, reading and writing no reuse cache",
    )
    group.addoption(
        "--shard",
        dest="wrapq_shard",
        default=None,
        metavar="i/n",
        help="run only shard i of n (1-based): case groups split by recorded durations, the same split on every "
        "machine; merge shard results with `python -m harness.report.merge`",
    )
    group.addoption(
        "--record-durations",
        dest="wrapq_record_durations",
        action="store_true",
        help="write this run's per-case durations into the durations file (longest-first order and shard balance)",
    )
    group.addoption(
        "--drift",
        dest="wrapq_drift",
        action="store_true",
        help="nightly drift mode: label every failure as drift with the package versions that differ from the pins "
        "(run it in the environment scripts/drift.sh builds)",
    )
    parser.addini("wrapq_pins_file", "the pinned gate's constraints (drift mode compares against it)", default="constraints.txt")
    parser.addini("wrapq_durations_file", "recorded per-case durations (relative to rootdir)", default="case_durations.json")
    parser.addini(
        "wrapq_cases_dir",
        "directories (relative to rootdir, one per line) holding case modules; out-of-tree wrapper "
        "packages add their own case directory here",
        type="linelist",
        default=["cases"],
    )


def _user_chose_dist(config: pytest.Config) -> bool:
    args = config.invocation_params.args
    return any(a in ("--dist", "-d") or a.startswith("--dist=") for a in map(str, args))


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    # Group each case's checks on one worker unless the user chose a distribution mode.
    # xdist's own tryfirst hook may already have turned "-n N" into --dist load, or may run next
    # (it leaves a mode other than "no" alone), so both values mean "not chosen".
    if getattr(config.option, "numprocesses", None) and not _user_chose_dist(config) \
            and getattr(config.option, "dist", "no") in ("no", "load"):
        config.option.dist = "loadscope"
        # Keep our longest-first collection order (xdist would re-sort scopes by item count).
        config.option.loadscopereorder = False


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """loadscope, except that an item whose worker died is not handed out again."""
    if config.getvalue("dist") != "loadscope":
        return None
    from harness.xdist_scheduler import CrashSafeLoadScopeScheduling

    return CrashSafeLoadScopeScheduling(config, log)


def pytest_configure(config: pytest.Config) -> None:
    _refuse_lost_project_config(config)
    import torch

    torch.set_num_threads(max(1, config.getoption("wrapq_torch_threads")))
    cases_dirs = [(config.rootpath / d).resolve() for d in config.getini("wrapq_cases_dir")]
    profiles = config.getoption("wrapq_profiles") or [DEFAULT_PROFILE]
    state = _State(cases_dirs=cases_dirs, profiles=profiles, config=config)
    config.stash[_STATE] = state
    for check in all_checks():
        register_marker(config, check.name, f"the {check.name} check of every case")
    for capability in CAPABILITY_MARKERS:
        register_marker(config, capability, f"every check of cases that declare a {capability} capability")
    config.pluginmanager.register(state, "wrapq-state")


def _refuse_lost_project_config(config: pytest.Config) -> None:
    """pytest picks its rootdir from arguments that name existing paths, so ``--wrapq-report-dir
    /tmp/r`` with /tmp/r present moves the rootdir there, drops the project's config and collects
    the wrong files. Run from a wrapq project without its config is refused with the fix."""
    project = config.invocation_params.dir / "pyproject.toml"
    if config.inipath is None and project.is_file() and "wrapq_cases_dir" in project.read_text(errors="replace"):
        raise pytest.UsageError(
            f"pytest did not read {project} (rootdir became {config.rootpath}, probably from a directory "
            f"option given as '--option DIR'); write path options as '--wrapq-report-dir=DIR'")


class _State:
    """Per-process plugin state: the pipeline memo and, on the controller, the collector."""

    def __init__(self, cases_dirs: list[Path], profiles: list[str], config: pytest.Config):
        self.cases_dirs = cases_dirs
        self.profiles = profiles
        self.is_worker = hasattr(config, "workerinput")
        report_dir = config.getoption("wrapq_report_dir")
        self.report_dir = Path(report_dir) if report_dir else config.rootpath / "reports"
        golden_dir = config.getoption("wrapq_golden_dir")
        settings = RunSettings(
            golden_dir=Path(golden_dir).resolve() if golden_dir else config.rootpath / "golden",
            update_golden=bool(config.getoption("wrapq_update_golden")),
            stage_timeout=config.getoption("wrapq_stage_timeout") or None,
            circle_cache_dir=_circle_cache_dir(config),
            export_cache_dir=_export_cache_dir(config),
        )
        self.pipelines = PipelineCache(artifact_dir=self.report_dir / "artifacts", settings=settings)
        shard = config.getoption("wrapq_shard")
        try:
            self.shard: tuple[int, int] | None = parse_shard(shard) if shard else None
        except ShardSpecError as exc:
            raise pytest.UsageError(str(exc)) from None
        self.shard_label: str | None = shard
        self.durations_path = config.rootpath / config.getini("wrapq_durations_file")
        self.durations = load_durations(self.durations_path)
        self.record_durations = bool(config.getoption("wrapq_record_durations"))
        # process name -> overhead totals, peak RSS and RSS after each finished case group
        self.workers: dict[str, dict[str, Any]] = {}
        self.rss_after_group: dict[str, float] = {}
        self.drift_moves: list[dict[str, Any]] | None = None
        if config.getoption("wrapq_drift"):
            self.drift_moves = version_moves(read_pins(config.rootpath / config.getini("wrapq_pins_file")))
        history = config.getoption("wrapq_history")
        self.history_path = (config.rootpath / history) if history else None
        prefixes = []
        for cases_dir in cases_dirs:
            try:
                prefixes.append(cases_dir.relative_to(config.rootpath).as_posix() + "/")
            except ValueError:
                prefixes.append(cases_dir.as_posix() + "/")
        self.collector = ResultCollector(case_nodeid_prefixes=tuple(prefixes))

    def process_stats(self) -> dict[str, Any]:
        return {"overhead": overhead_totals(), "peak_rss_mb": round(peak_rss_mb(), 1),
                "rss_after_group_mb": dict(self.rss_after_group)}

    def wants(self, case: Case, profile: str) -> bool:
        return "all" in self.profiles or profile in self.profiles

    # -- hooks (this object is registered as a plugin) --------------------------
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
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        """A worker finished: keep its overhead and memory figures for results.json."""
        stats = getattr(node, "workeroutput", {}).get("wrapq_stats")
        if stats:
            self.workers[node.gateway.id] = stats

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.is_worker:
            session.config.workeroutput["wrapq_stats"] = self.process_stats()
            return
        if session.config.option.collectonly or not self.collector.records:
            return  # e.g. `pytest tests`: no case items, so leave the last matrix report alone
        self._write_reports(exitstatus)  # its cost is measured by the benchmark, which re-renders the doc

    def _write_reports(self, exitstatus: int) -> None:
        from harness.golden import golden_set_id
        from harness.report.html import write_report

        workers = dict(self.workers) or {"main": self.process_stats()}
        if self.workers:
            workers["controller"] = self.process_stats()
        extra = {"golden_set": golden_set_id(self.pipelines.settings.golden_dir), "shard": self.shard_label,
                 "processes": workers}
        if self.drift_moves is not None:
            for record in self.collector.records.values():
                label_record(record, self.drift_moves)
            extra["drift"] = {"moves": self.drift_moves, "versions": describe_moves(self.drift_moves)}
        doc = self.collector.write(
            self.report_dir / "results.json", exitstatus=int(exitstatus), profiles=self.profiles, extra=extra
        )
        write_report(doc, self.report_dir / "report.html")
        if self.record_durations:
            write_durations(self.durations_path, self._group_seconds(), self.durations)
        if self.history_path is not None:
            from harness.report.history import append_run

            append_run(self.history_path, doc)

    def _group_seconds(self) -> dict[str, float]:
        totals: dict[str, float] = {}
        for record in self.collector.records.values():
            if record.get("case") and record.get("outcome") not in ("not_run", "crashed"):
                group = f"{record['case']}[{record['profile']}]"
                totals[group] = totals.get(group, 0.0) + float(record.get("duration", 0.0))
        return totals

    def pytest_terminal_summary(self, terminalreporter, exitstatus: int, config: pytest.Config) -> None:
        if self.is_worker or config.option.collectonly or not self.collector.records:
            return
        from harness.summary import render_summary_table

        terminalreporter.section("wrapq summary")
        terminalreporter.write_line(render_summary_table(self.collector.records))
        if self.drift_moves is not None:
            terminalreporter.section("wrapq drift")
            terminalreporter.write_line(render_drift_table(self.collector.records, self.drift_moves))
        terminalreporter.write_line(f"results: {self.report_dir / 'results.json'}  report: {self.report_dir / 'report.html'}")


_STATE = pytest.StashKey[_State]()
_MARKERS = pytest.StashKey[set]()


def _circle_cache_dir(config: pytest.Config) -> Path | None:
    if config.getoption("wrapq_no_circle_cache"):
        return None
    chosen = config.getoption("wrapq_circle_cache")
    return Path(chosen).resolve() if chosen else config.rootpath / ".wrapq-cache" / "circle"


def _export_cache_dir(config: pytest.Config) -> Path | None:
    if config.getoption("wrapq_no_export_cache"):
        return None
    chosen = config.getoption("wrapq_export_cache")
    return Path(chosen).resolve() if chosen else config.rootpath / ".wrapq-cache" / "export"


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    state = parent.config.stash[_STATE]
    if file_path.suffix == ".py" and file_path.parent.resolve() in state.cases_dirs and not file_path.name.startswith("_"):
        return CaseFile.from_parent(parent, path=file_path)
    return None


def _import_case_module(path: Path, rootpath: Path) -> Any:
    rel = path.resolve().relative_to(rootpath.resolve()).with_suffix("")
    if str(rootpath) not in sys.path:
        sys.path.insert(0, str(rootpath))
    return importlib.import_module(".".join(rel.parts))


class CaseFile(pytest.File):
    """One case module: defines ``CASES``, a list of harness.Case."""

    def collect(self):
        state = self.config.stash[_STATE]
        try:
            module = _import_case_module(self.path, self.config.rootpath)
            cases = getattr(module, "CASES", None)
            if not isinstance(cases, (list, tuple)):
                raise CaseDefinitionError(self.path.stem, "CASES", "module must define CASES as a list of harness.Case")
            for i, case in enumerate(cases):
                if not isinstance(case, Case):
                    raise CaseDefinitionError(f"{self.path.stem}.CASES[{i}]", "CASES", f"is {type(case).__name__}, not harness.Case")
        except Exception as exc:  # noqa: BLE001 - a broken case file fails alone, the session goes on
            yield DefinitionErrorItem.from_parent(self, name="<definition>", error=exc)
            return
        checks = all_checks()
        names = {check.name for check in checks}
        for case in cases:
            for field_name in ("not_applicable", "expected_failures"):
                unknown = sorted(set(getattr(case, field_name)) - names)
                if unknown:
                    error = CaseDefinitionError(case.name, field_name, f"names no check: {', '.join(unknown)} "
                                                f"(checks: {', '.join(sorted(names))})")
                    yield DefinitionErrorItem.from_parent(self, name=f"<definition:{case.name}.{field_name}>", error=error)
            for profile in case.profiles:
                if state.wants(case, profile):
                    yield CaseNode.from_parent(self, name=f"{case.name}[{profile}]", case=case, profile=profile, checks=checks)


# Case capabilities that become item markers (``pytest -m rotary``).
CAPABILITY_MARKERS = ("export", "rotary", "mask")


def register_marker(config: pytest.Config, name: str, description: str) -> None:
    """Register a marker once, so ``--strict-markers`` accepts it and ``pytest --markers`` lists it."""
    registered = config.stash.setdefault(_MARKERS, set())
    if name not in registered:
        registered.add(name)
        config.addinivalue_line("markers", f"{name}: {description}")


class CaseNode(pytest.Collector):
    """One (case, profile): the xdist scope that keeps its checks on one worker."""

    def __init__(self, *, case: Case, profile: str, checks: list[Check], **kwargs: Any):
        super().__init__(**kwargs)
        self.case = case
        self.profile = profile
        self.checks = checks

    def collect(self):
        for check in self.checks:
            # The id is given as the string pytest stores in its cache: pytest 9 parses stored ids
            # with brackets only at the end (NodeId.parse), so an id built segment by segment for
            # "case[profile]::check" would never equal the stored one and --lf/--ff/--sw would
            # select nothing. Parsed from the same string, both sides agree.
            yield CheckItem.from_parent(self, name=check.name, nodeid=f"{self.nodeid}::{check.name}",
                                        case=self.case, profile=self.profile, check=check)


# Headline numbers worth a junit property each (scalars; the full record goes to results.json).
JUNIT_METRICS = ("peir", "sqnr_db", "mean_abs_diff", "max_abs_diff", "fake_quantize_max_steps", "missing_unexplained",
                 "worst_score")


def stage_problem(err: StageError) -> str:
    """A failed stage as one problem line, for expectations: "stage 'torch_export' failed: Type: first line"."""
    first = err.error_text.strip().splitlines()[0] if err.error_text.strip() else ""
    return f"stage '{err.stage}' failed: {err.error_type}: {first}"


class CheckFailed(Exception):
    def __init__(self, result: CheckResult):
        self.result = result
        super().__init__("; ".join(result.problems))


class CheckItem(pytest.Item):
    """One generic check applied to one (case, profile)."""

    def __init__(self, *, case: Case, profile: str, check: Check, **kwargs: Any):
        super().__init__(**kwargs)
        self.case = case
        self.profile = profile
        self.check = check
        self.duplicate_of: str | None = None
        # -m by check, family, profile and capability: `-m "rotary_parity and gemma4"`, `-m e2b_dims`.
        register_marker(self.config, case.family, f"every check of the {case.family} family's cases")
        register_marker(self.config, profile, f"every check at the {profile} profile")
        names = [check.name, case.family, profile] + [c for c in CAPABILITY_MARKERS if getattr(case, c) is not None]
        for name in dict.fromkeys(names):
            self.add_marker(name)
        self._record_base = {"case": case.name, "family": case.family, "profile": profile, "check": check.name}

    def _record(self, **fields: Any) -> None:
        """Accumulate this item's record; ``pytest_runtest_makereport`` hangs it on the report
        (``report.wrapq_record``), which xdist carries to the controller. junit gets only a few
        scalar properties (``JUNIT_METRICS``), never the record."""
        with overhead("result_transport"):
            self.wrapq_record = jsonable(dict(getattr(self, "wrapq_record", None) or self._record_base, **fields))
            for name in JUNIT_METRICS:
                value = (fields.get("metrics") or {}).get(name)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    self.user_properties.append((f"wrapq.{name}", value))

    def setup(self) -> None:
        reason = self.case.unavailable_reason()
        if reason:
            self._skip(f"case unavailable: {reason}")
        reason = self.case.not_applicable.get(self.check.name)
        if reason:
            reason = f"not applicable: {reason}"
        else:
            reason = self.check.applies(self.case) or self.check.applies_to_profile(self.case, self.profile)
        if reason:
            self._skip(reason)

    def _skip(self, reason: str) -> None:
        self._record(skip_reason=reason)
        # Report the skip at the item (case file), not at this line of the plugin.
        raise pytest.skip.Exception(reason, _use_item_location=True)

    def runtest(self) -> None:
        if self.duplicate_of:
            raise CaseDefinitionError(self.case.name, "name", f"duplicate case name, also defined in {self.duplicate_of}")
        pipeline = self.config.stash[_STATE].pipelines.get(self.case, self.profile)
        pipeline.nodeid = self.parent.nodeid
        pipeline.guard_start()
        start = time.perf_counter()
        try:
            result = self.check.run(pipeline)
        except StageError as err:
            pipeline.guard_end()
            self._record(stage_error={"stage": err.stage, "type": err.error_type, "message": err.error_text},
                         stage_timings=dict(pipeline.timings), check_seconds=time.perf_counter() - start)
            expectation = self.case.expected_failures.get(self.check.name)
            # A stage that fails exactly as diagnosed (e.g. torch.export refusing a data-dependent
            # op) is an expected failure too; any other stage failure stays a failure.
            judgement = judge(expectation, [stage_problem(err)]) if expectation else None
            if judgement and judgement.expected:
                pytest.xfail(judgement.message)
            raise
        mutated = pipeline.guard_end()
        if mutated:
            result.fail(f"check mutated shared pipeline artifacts: {', '.join(mutated[:5])}")
        expectation = self.case.expected_failures.get(self.check.name)
        judgement = judge(expectation, result.problems) if expectation else None
        if judgement and not judgement.expected:
            result.problems.insert(0, judgement.message)
        elif judgement:
            result.notes.append(f"expected failure: {judgement.message}")
        self._record(
            metrics=result.metrics,
            problems=result.problems,
            notes=result.notes,
            evidence=result.evidence,
            stage_timings=dict(pipeline.timings),
            check_seconds=time.perf_counter() - start,
        )
        if judgement and judgement.expected:
            # Exactly the diagnosed failure: expected, with this run's problem lines.
            pytest.xfail(judgement.message)
        if not result.passed:
            raise CheckFailed(result)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style=None) -> str:
        err = excinfo.value
        if isinstance(err, CheckFailed):
            lines = [f"{self.check.name} failed for {self.case.name}[{self.profile}]:"]
            lines += [f"  - {p}" for p in err.result.problems]
            return "\n".join(lines)
        if isinstance(err, StageError):
            return f"{err}\n\n{err.traceback_text}"
        if isinstance(err, CaseDefinitionError):
            return str(err)
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, 0, f"{self.parent.name}::{self.name}"


class DefinitionErrorItem(pytest.Item):
    """Stands in for a case file that could not be loaded, so the failure is named, not lost."""

    def __init__(self, *, error: BaseException, **kwargs: Any):
        super().__init__(**kwargs)
        self.error = error

    def runtest(self) -> None:
        raise self.error

    def repr_failure(self, excinfo, style=None) -> str:
        err = excinfo.value
        if isinstance(err, CaseDefinitionError):
            return f"malformed case definition in {self.path.name}: {err}"
        return f"cannot load case module {self.path.name}: {type(err).__name__}: {err}"

    def reportinfo(self):
        return self.path, 0, f"{self.path.name}::<definition>"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    outcome = yield
    record = getattr(item, "wrapq_record", None)
    if record is not None:
        outcome.get_result().wrapq_record = record


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Flag duplicate case names, order case groups longest first, keep only this shard's."""
    _flag_duplicates(items)
    state = config.stash[_STATE]
    groups = {id(item): _group_id(item) for item in items}
    known = [g for g in groups.values() if g is not None]
    rank = {group: i for i, group in enumerate(longest_first(known, state.durations))}
    # Stable sort: a group's checks keep their order; non-case items (definition errors) lead.
    items.sort(key=lambda item: -1 if groups[id(item)] is None else rank[groups[id(item)]])
    if state.shard is None:
        return
    index, count = state.shard
    assignment = assign_shards(known, state.durations, count)
    keep = [item for item in items if groups[id(item)] is None and index == 1
            or groups[id(item)] is not None and assignment[groups[id(item)]] == index]
    kept = {id(item) for item in keep}
    dropped = [item for item in items if id(item) not in kept]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = keep


def _group_id(item: pytest.Item) -> str | None:
    return f"{item.case.name}[{item.profile}]" if isinstance(item, CheckItem) else None


def _flag_duplicates(items: list[pytest.Item]) -> None:
    """Flag case names defined more than once (every copy fails; none is silently dropped)."""
    definitions: dict[str, set[tuple[str, int]]] = {}
    for item in items:
        if isinstance(item, CheckItem):
            definitions.setdefault(item.case.name, set()).add((item.path.name, id(item.case)))
    for item in items:
        if isinstance(item, CheckItem) and len(definitions[item.case.name]) > 1:
            others = sorted(f for f, case_id in definitions[item.case.name] if case_id != id(item.case))
            item.duplicate_of = ", ".join(others)


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Drop a case's pipeline once its last item on this worker is done (bounded memory)."""
    if not isinstance(item, CheckItem):
        return
    same_next = isinstance(nextitem, CheckItem) and (nextitem.case.name, nextitem.profile) == (item.case.name, item.profile)
    if not same_next:
        state = item.config.stash[_STATE]
        _attach_wrapper_coverage(item, state)
        state.pipelines.release(item.case.name, item.profile)
        # No gc.collect(): measured, it found nothing to free after a release (0 objects, RSS
        # unchanged) and cost ~0.23 s per case group; reference counting frees the group.
        state.rss_after_group[f"{item.case.name}[{item.profile}]"] = round(current_rss_mb(), 1)


def _attach_wrapper_coverage(item: CheckItem, state: _State) -> None:
    """Once per case group on a worker, at its last item's teardown: which registered wrappers
    the case instantiated and ran in QUANT (``Pipeline.wrapper_coverage``), as the item's
    ``wrapper_coverage`` record field (the teardown report carries it to the controller). Only
    where a check built the pipeline; a failure is recorded, never raised into the item."""
    pipeline = state.pipelines.peek(item.case.name, item.profile)
    if pipeline is None or item.duplicate_of or item.case.unavailable_reason():
        return
    try:
        coverage = pipeline.wrapper_coverage
    except StageError as err:
        coverage = {"error": str(err)}
    except Exception as exc:  # noqa: BLE001 - bookkeeping must not fail a check item
        coverage = {"error": f"{type(exc).__name__}: {exc}"}
    item._record(wrapper_coverage=coverage)
