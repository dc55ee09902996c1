"""Command-line options and ini keys of the harness, and what they resolve to for a run."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.golden.baseline import RUN_GOLDEN_DIR
from harness.golden.tensors import staging_dir
from harness.pipeline import RunSettings

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
        "--sweep",
        dest="wrapq_sweep",
        default="pr",
        choices=("pr", "nightly", "off"),
        help="which variants of swept cases run (Case.sweep): the PR-gate subset (default), the nightly set, or "
        "none (each case as declared only)",
    )
    group.addoption(
        "--strict-findings",
        dest="wrapq_strict_findings",
        action="store_true",
        default=False,
        help="judge expectations strictly on any tico: a finding that no longer occurs fails (default: strict only "
        "on the tico findings/tico.toml was recorded for; elsewhere it is reported fixed)",
    )
    group.addoption(
        "--wrapq-cases-dir",
        dest="wrapq_cases_dirs",
        action="append",
        default=None,
        metavar="DIR",
        help="a directory of case modules outside the project's wrapq_cases_dir (repeatable); its package root "
        "goes on the path, so the case can import a wrapper package beside it. Without path arguments only these "
        "directories are collected",
    )
    group.addoption(
        "--baseline",
        dest="wrapq_baseline",
        default=None,
        metavar="RESULTS",
        help="judge against a base run (its results.json or report directory, e.g. the base tico's run): goldens "
        "compare with the base run's tensors, and a failure the base run had the same way is pre-existing, not red",
    )
    group.addoption(
        "--tico-coverage",
        dest="wrapq_tico_coverage",
        action="store_true",
        default=False,
        help="measure which of tico's lines and branches the run executes (branch coverage of the tico package, "
        "every process; the export and Circle caches are off, since a hit would skip the code measured): "
        "<report dir>/tico-coverage/, summarized in results.json and by `python -m harness tico-coverage`",
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
        nargs="?",
        const="write",
        default=None,
        choices=("write", "fail"),
        help="rewrite the selected cases' goldens at the end of the run instead of comparing (the only way goldens "
        "change); each item says what its rewrite changes. --update-golden=fail also fails every item whose golden "
        "is new or changed beyond the measured noise, so a CI job cannot turn itself green by regenerating",
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
        "machine; merge shard results with `python -m harness merge`",
    )
    group.addoption(
        "--select-changed",
        dest="wrapq_select_changed",
        default=None,
        metavar="BASE",
        help="run only the items a change to tico can reach: the tico under review against BASE (a checkout, a tree "
        "holding tico/, a wheel file or a version, as WRAPQ_TICO takes), chosen by the per-item map; prints why",
    )
    group.addoption(
        "--item-map",
        dest="wrapq_item_map",
        default=None,
        metavar="PATH",
        help="the per-item map --select-changed reads (default: the committed map of the pinned tico, "
        "golden/item-map/pinned-tico.json.gz; a --tico-coverage run writes <report dir>/tico-coverage/item-map.json)",
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
    parser.addini(
        "wrapq_pins_file", "the pinned gate's constraints (drift mode compares against it)", default="constraints.txt"
    )
    parser.addini(
        "wrapq_durations_file", "recorded per-case durations (relative to rootdir)", default="case_durations.json"
    )
    parser.addini(
        "wrapq_cases_dir",
        "directories (relative to rootdir, one per line) holding case modules; a directory elsewhere "
        "can be given per run with --wrapq-cases-dir DIR",
        type="linelist",
        default=["cases"],
    )


def given_cases_dirs(config: pytest.Config) -> list[Path]:
    """The --wrapq-cases-dir directories, relative to where pytest was invoked (as a path argument
    would be); a usage error names any that is not a directory."""
    given = [
        (config.invocation_params.dir / Path(d).expanduser()).resolve()
        for d in config.getoption("wrapq_cases_dirs") or []
    ]
    missing = [str(d) for d in given if not d.is_dir()]
    if missing:
        raise pytest.UsageError(f"--wrapq-cases-dir: no such directory: {', '.join(missing)}")
    return given


def arg_paths(config: pytest.Config) -> list[Path]:
    """The files and directories the path arguments name (a node id's file part)."""
    return [(config.invocation_params.dir / arg.split("::")[0]).resolve() for arg in config.args]


def run_settings(config: pytest.Config, run_id: str, given: list[Path]) -> RunSettings:
    """The session options the pipeline and the checks read; goldens rewritten by this run are
    staged under the golden directory, by run id, until the run ends. ``given``: the
    --wrapq-cases-dir directories."""

    chosen = config.getoption("wrapq_golden_dir")
    if chosen:
        golden_dir = Path(chosen).resolve()
    elif given and _only_given_dirs_run(config, given):
        # only the given case directories run: their goldens live beside them, not in the project
        golden_dir = given[0] / "golden"
    else:
        golden_dir = config.rootpath / "golden"
    baseline = config.getoption("wrapq_baseline")
    return RunSettings(
        run_id=run_id,
        run_golden_dir=report_dir(config) / RUN_GOLDEN_DIR,
        base_results=Path(baseline) if baseline else None,
        golden_dir=golden_dir,
        update_golden=config.getoption("wrapq_update_golden"),
        golden_staging_dir=staging_dir(golden_dir, run_id),
        stage_timeout=config.getoption("wrapq_stage_timeout") or None,
        circle_cache_dir=circle_cache_dir(config),
        export_cache_dir=export_cache_dir(config),
        measure_traced_code=bool(config.getoption("wrapq_tico_coverage")),
    )


def _only_given_dirs_run(config: pytest.Config, given: list[Path]) -> bool:
    """No path arguments (the given directories replace testpaths), or every one inside them."""
    if config.args_source == pytest.Config.ArgsSource.TESTPATHS:
        return True
    paths = arg_paths(config)
    return bool(paths) and all(any(path.is_relative_to(d) for d in given) for path in paths)


def report_dir(config: pytest.Config) -> Path:
    chosen = config.getoption("wrapq_report_dir")
    return Path(chosen) if chosen else config.rootpath / "reports"


def refuse_lost_project_config(config: pytest.Config) -> None:
    """pytest picks its rootdir from arguments that name existing paths, so a case file outside the
    project, or ``--wrapq-report-dir /tmp/r`` with /tmp/r present, moves the rootdir there, drops the
    project's config and collects the wrong files. scripts/env.sh names the config; plain pytest run
    from a wrapq project without its config is refused with the fix."""
    project = config.invocation_params.dir / "pyproject.toml"
    if config.inipath is None and project.is_file() and "wrapq_cases_dir" in project.read_text(errors="replace"):
        raise pytest.UsageError(
            f"pytest did not read {project} (rootdir became {config.rootpath}, from a path outside the project "
            f"or an option given as '--option DIR'); run it as ./scripts/env.sh pytest ..., or add "
            f"--config-file={project}"
        )


def circle_cache_dir(config: pytest.Config) -> Path | None:
    # --tico-coverage measures tico's code running: a cache hit would skip the code it measures
    if config.getoption("wrapq_no_circle_cache") or config.getoption("wrapq_tico_coverage"):
        return None
    chosen = config.getoption("wrapq_circle_cache")
    return Path(chosen).resolve() if chosen else config.rootpath / ".wrapq-cache" / "circle"


def export_cache_dir(config: pytest.Config) -> Path | None:
    if config.getoption("wrapq_no_export_cache") or config.getoption("wrapq_tico_coverage"):
        return None
    chosen = config.getoption("wrapq_export_cache")
    return Path(chosen).resolve() if chosen else config.rootpath / ".wrapq-cache" / "export"
