"""pytest plugin entry point: wires the harness's hooks. What each does lives in its own module:
options and ini keys (harness/run/options.py), per-process state (harness/run/session.py), the
collection tree and the items (harness/run/collection.py, harness/run/items.py), case-group order and shards
(harness/run/scheduling.py, harness/run/xdist_scheduler.py), and the end-of-run sink that writes
results.json, the report, history and goldens (harness/run/run_sink.py).

Under xdist the plugin picks ``--dist loadscope``, scoped by (case, profile) group
(harness/run/xdist_scheduler.py), so a group's items share one worker and its pipeline. Results
ride on each report (``report.wrapq_record``) to the controller, which alone writes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness import compat
from harness.checks import all_checks
from harness.primitives.stage_engine import StageError
from harness.records import rerun
from harness.run import group_args, hookspecs
from harness.run.collection import CaseFile
from harness.run.coverage_run import TicoCoverageRun
from harness.run.items import CAPABILITY_MARKERS, CheckItem, register_marker
from harness.run.options import arg_paths, pytest_addoption, refuse_lost_project_config  # noqa: F401 - pytest hook
from harness.run.run_sink import RunSink, note_group_done
from harness.run.scheduling import assign_shards, longest_first
from harness.run.select_changed import SelectChangedRun
from harness.run.session import STATE, SessionState, state_of


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspecs)


def _user_chose_dist(config: pytest.Config) -> bool:
    args = config.invocation_params.args
    return any(a in ("--dist", "-d") or a.startswith("--dist=") for a in map(str, args))


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    # Group each case's checks on one worker unless the user chose a distribution mode.
    # xdist's own tryfirst hook may already have turned "-n N" into --dist load, or may run next
    # (it leaves a mode other than "no" alone), so both values mean "not chosen".
    if (
        getattr(config.option, "numprocesses", None)
        and not _user_chose_dist(config)
        and getattr(config.option, "dist", "no") in ("no", "load")
    ):
        config.option.dist = "loadscope"
        # Keep our longest-first collection order (xdist would re-sort scopes by item count).
        config.option.loadscopereorder = False


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """loadscope, except that an item whose worker died is not handed out again."""
    if config.getvalue("dist") != "loadscope":
        return None
    from harness.run.xdist_scheduler import CrashSafeLoadScopeScheduling  # deferred: imports xdist's scheduler

    return CrashSafeLoadScopeScheduling(config, log)


def pytest_configure(config: pytest.Config) -> None:
    refuse_lost_project_config(config)
    try:
        compat.require()
    except compat.CompatError as exc:
        raise pytest.UsageError(f"wrapq harness: {exc}") from None
    import torch

    torch.set_num_threads(max(1, config.getoption("wrapq_torch_threads")))
    # conftest and -p plugins are registered by now, so their checks are found.
    checks = all_checks(check for found in config.hook.pytest_wrapq_checks(config=config) for check in found)
    state = SessionState(config, checks)
    config.stash[STATE] = state
    rerun.configure(state.given_cases_dirs)
    if state.given_cases_dirs and config.args_source == pytest.Config.ArgsSource.TESTPATHS:
        # --wrapq-cases-dir without path arguments: run those cases, not the project's testpaths.
        config.args = [str(d) for d in state.given_cases_dirs]
    group_args.rewrite(config)
    for check in checks:
        register_marker(config, check.name, f"the {check.name} check of every case")
    register_marker(config, "sweep", "every variant of a swept case (Case.sweep); sweep(axis=value) selects by value")
    for capability in CAPABILITY_MARKERS:
        register_marker(config, capability, f"every check of cases that declare a {capability} capability")
    if config.getoption("wrapq_tico_coverage"):
        config.pluginmanager.register(TicoCoverageRun(state), "wrapq-tico-coverage")
    base = config.getoption("wrapq_select_changed")
    if base is not None:
        given = config.getoption("wrapq_item_map")
        config.pluginmanager.register(
            SelectChangedRun(state, base, Path(given) if given else None), "wrapq-select-changed"
        )
    elif config.getoption("wrapq_item_map"):
        raise pytest.UsageError("--item-map is the map --select-changed BASE reads; give --select-changed too")
    config.pluginmanager.register(RunSink(state), "wrapq-run-sink")


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    state = state_of(parent.config)
    if (
        file_path.suffix == ".py"
        and file_path.parent.resolve() in state.cases_dirs
        and not file_path.name.startswith("_")
    ):
        return CaseFile.from_parent(parent, path=file_path)
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    outcome = yield
    record = getattr(item, "wrapq_record", None)
    if record is not None:
        outcome.get_result().wrapq_record = record


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep the groups the arguments name, flag duplicate case names, order case groups longest first,
    keep only this shard's."""
    group_args.deselect(config, items)
    _flag_duplicates(items)
    state = state_of(config)
    groups = {id(item): _group_id(item) for item in items}
    known = [g for g in groups.values() if g is not None]
    rank = {group: i for i, group in enumerate(longest_first(known, state.durations))}
    # Stable sort: a group's checks keep their order; non-case items (definition errors) lead.
    items.sort(key=lambda item: -1 if groups[id(item)] is None else rank[groups[id(item)]])
    if state.shard is None:
        return
    index, count = state.shard
    assignment = assign_shards(known, state.durations, count)
    keep = [
        item
        for item in items
        if groups[id(item)] is None
        and index == 1
        or groups[id(item)] is not None
        and assignment[groups[id(item)]] == index
    ]
    kept = {id(item) for item in keep}
    dropped = [item for item in items if id(item) not in kept]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = keep


def pytest_collection_finish(session: pytest.Session) -> None:
    """A selection that finds nothing because it points outside every case directory is a usage
    error that says so, not a quiet "no tests ran"."""
    if session.items:
        return
    config = session.config
    state = state_of(config)
    dirs = ", ".join(str(d) for d in state.cases_dirs)
    hint = "a case directory elsewhere is given with --wrapq-cases-dir=DIR (or listed under wrapq_cases_dir)"
    outside = [
        arg
        for arg, path in zip(config.args, arg_paths(config))
        if path.exists() and not any(path.is_relative_to(d) or d.is_relative_to(path) for d in state.cases_dirs)
    ]
    if outside:
        raise pytest.UsageError(f"{', '.join(outside)} lies outside every case directory ({dirs}); {hint}")
    keyword = config.getoption("keyword")
    if keyword:
        raise pytest.UsageError(f"-k {keyword!r} matches no item of the case directories ({dirs}); {hint}")


def _group_id(item: pytest.Item) -> str | None:
    return f"{item.case.name}[{item.label}]" if isinstance(item, CheckItem) else None


def _flag_duplicates(items: list[pytest.Item]) -> None:
    """Flag case names defined more than once (every copy fails; none is silently dropped)."""
    definitions: dict[str, set[tuple[str, int]]] = {}
    for item in items:
        if isinstance(item, CheckItem):
            definitions.setdefault(item.case.name, set()).add((item.path.name, id(item.declared)))
    for item in items:
        if isinstance(item, CheckItem) and len(definitions[item.case.name]) > 1:
            others = sorted(f for f, case_id in definitions[item.case.name] if case_id != id(item.declared))
            item.duplicate_of = ", ".join(others)


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Drop a case's pipeline once its last item on this worker is done (bounded memory)."""
    if not isinstance(item, CheckItem):
        return
    same_next = isinstance(nextitem, CheckItem) and (nextitem.case.name, nextitem.label) == (item.case.name, item.label)
    if not same_next:
        state = state_of(item.config)
        _attach_wrapper_coverage(item, state)
        note_group_done(state, item.case.name, item.label)


def _attach_wrapper_coverage(item: CheckItem, state: SessionState) -> None:
    """Once per case group on a worker, at its last item's teardown: which registered wrappers
    the case instantiated and ran in QUANT (``Pipeline.wrapper_coverage``), as the item's
    ``wrapper_coverage`` record field (the teardown report carries it to the controller). Only
    where a check built the pipeline; a failure is recorded, never raised into the item."""
    pipeline = state.pipelines.peek(item.case.name, item.label)
    if pipeline is None or item.duplicate_of or item.case.unavailable_reason():
        return
    try:
        coverage = pipeline.wrapper_coverage
    except StageError as err:
        coverage = {"error": str(err)}
    except Exception as exc:  # noqa: BLE001 - bookkeeping must not fail a check item
        coverage = {"error": f"{type(exc).__name__}: {exc}"}
    item._record(wrapper_coverage=coverage)
