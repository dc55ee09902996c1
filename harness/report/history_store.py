"""Nightly history store: runs appended to SQLite (parameterised SQL only), one transaction each.

The database's schema is versioned (``PRAGMA user_version``, SCHEMA_VERSION) and migrated on open.
A series is one (testbed, case, profile, check, metric); which metrics are tracked and which
direction is worse come from the checks' declarations results.json carries (``Metric(better=...)``).
Judging a series is harness/report/regression.py, the dashboard harness/report/dashboard.py and the
command ``python -m harness history``.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import math
import sqlite3
from pathlib import Path
from typing import Any

from harness.golden.platform_info import TESTBED_KEYS
from harness.records import node_ids

ABS_FLOOR = 1e-9
NOISE_FLOOR_REL = 1e-3  # a spread under 0.1% of the baseline is not noise: the series is judged by its margin
MIN_NOISE_RUNS = 3  # the fewest previous values a spread is measured over
NOISE_RUNS = 20  # the previous runs the spread is measured over (longer than the baseline window: steadier)
MAD_TO_SIGMA = 1.4826  # median absolute deviation -> standard deviation of a normal distribution
CHART_RUNS = 100  # nights per testbed embedded for the sparklines and the on-demand charts

# The history database's schema version (``PRAGMA user_version``). 0 is a database written before
# the schema was versioned: runs, items and metrics, with or without ``metrics.better``.
# 1 adds what a run ran on (``runs.testbed``, ``runs.platform``), each item's family and each
# value's declared regression policy. 2 rewrites the items' node ids in today's form
# (harness/records/node_ids.py). ``connect`` migrates an older database in one transaction.
SCHEMA_VERSION = 2
_TABLES = (
    """CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    started_at TEXT NOT NULL,
    commit_sha TEXT,
    profiles TEXT NOT NULL,
    versions TEXT NOT NULL,
    exitstatus INTEGER
)""",
    """CREATE TABLE IF NOT EXISTS items (
    run_id INTEGER NOT NULL REFERENCES runs(id),
    nodeid TEXT NOT NULL,
    case_name TEXT,
    profile TEXT,
    check_name TEXT,
    outcome TEXT NOT NULL
)""",
    """CREATE TABLE IF NOT EXISTS metrics (
    run_id INTEGER NOT NULL REFERENCES runs(id),
    case_name TEXT NOT NULL,
    profile TEXT NOT NULL,
    check_name TEXT NOT NULL,
    metric TEXT NOT NULL,
    value REAL NOT NULL
)""",
)
# (table, column, declaration, schema version that added it), applied in order where missing
_COLUMNS = (
    ("metrics", "better", "TEXT", 0),
    ("runs", "testbed", "TEXT", 1),
    ("runs", "platform", "TEXT", 1),
    ("items", "family", "TEXT", 1),
    ("metrics", "policy", "TEXT", 1),
)
_INDEXES = (
    "CREATE INDEX IF NOT EXISTS metrics_key ON metrics(case_name, profile, metric, run_id)",
    "CREATE INDEX IF NOT EXISTS items_run ON items(run_id)",
)


class HistoryError(RuntimeError):
    """A history database this code cannot use (e.g. written by a newer harness)."""


def _migrate(con: sqlite3.Connection) -> None:
    """Bring the schema to SCHEMA_VERSION in one IMMEDIATE transaction (several shards opening
    one database at once: the first migrates, the others find it done)."""
    if con.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION:
        return
    con.execute("BEGIN IMMEDIATE")
    try:
        version = con.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise HistoryError(
                f"history database has schema version {version}; this harness reads up to "
                f"{SCHEMA_VERSION} (a newer harness wrote it)"
            )
        if version < SCHEMA_VERSION:
            for statement in _TABLES:
                con.execute(statement)
            for table, column, declaration, _ in _COLUMNS:
                if column not in {row[1] for row in con.execute(f"PRAGMA table_info({table})")}:
                    con.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")
            for statement in _INDEXES:
                con.execute(statement)
            if version < 2:
                con.create_function("wrapq_current_nodeid", 1, node_ids.current, deterministic=True)
                con.execute("UPDATE items SET nodeid = wrapq_current_nodeid(nodeid)")
            con.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise


def connect(db: Path) -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit) to a database at SCHEMA_VERSION."""
    db.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(str(db), timeout=60, isolation_level=None)
    try:
        _migrate(con)
    except BaseException:
        con.close()
        raise
    return con


def schema_version(db: Path) -> int:
    con = sqlite3.connect(str(db))
    try:
        return int(con.execute("PRAGMA user_version").fetchone()[0])
    finally:
        con.close()


# -- testbeds -----------------------------------------------------------------------------------
def _versions(run: dict[str, Any]) -> dict[str, Any]:
    """Package versions plus the tico sources' fingerprint: a nightly or a checkout keeps its version
    string while its code moves, and the dashboard's "what moved" must see that."""
    versions = dict(run.get("versions") or {})
    sources = (run.get("tico") or {}).get("source_sha256")
    if sources:
        versions["tico_sources"] = str(sources)[:12]
    return versions


def testbed_id(platform: dict[str, Any] | None) -> str | None:
    """A short stable id of what decides float bits (harness/golden/platform_info.py's record: CPU model,
    architecture, torch's kernel selection, BLAS, threads, the overriding environment variables);
    None for a run that recorded no platform. Package versions are not part of it: a version bump
    on one testbed is a change the dashboard shows, not a new series."""
    if not platform:
        return None
    key = {k: platform.get(k) for k in TESTBED_KEYS}
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:10]


def testbed_label(platform: dict[str, Any] | None) -> str:
    if not platform:
        return "testbed not recorded"
    env = ", ".join(f"{k}={v}" for k, v in sorted((platform.get("env") or {}).items()))
    threads = platform.get("torch_threads")
    parts = [
        str(platform.get("cpu") or "unknown CPU"),
        f"capability {platform.get('cpu_capability') or '?'}",
        f"{threads} thread{'s' if threads != 1 else ''}" if threads is not None else "threads ?",
    ]
    return " / ".join(parts + ([env] if env else []))


# -- append -------------------------------------------------------------------------------------
def tracked(doc: dict[str, Any], rec: dict[str, Any]) -> list[tuple[str, float, str, str | None]]:
    """(metric, value, better, declared regression policy as JSON) for the record's finite
    metrics its check declares with a direction; per-sample variants (``peir[padded]``) stay in
    results.json only."""
    declared = (((doc.get("run") or {}).get("checks") or {}).get(rec.get("check") or "") or {}).get("metrics") or []
    out = []
    for key, value in (rec.get("metrics") or {}).items():
        if "[" in key or not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            continue
        for metric in declared:
            if metric.get("better") and fnmatch.fnmatchcase(key, metric["name"]):
                policy = metric.get("regression")
                out.append(
                    (key, float(value), metric["better"], json.dumps(policy, sort_keys=True) if policy else None)
                )
                break
    return out


def coverage_series(run: dict[str, Any]) -> list[tuple[str, str, str, str, float]]:
    """(case, profile, check, metric, value) rows for a ``--tico-coverage`` run's percentages of the
    wrappers' lines and branches (all, and those a case can reach) and of each converter area's branches,
    tracked as the series of a pseudo-case ``tico``."""
    coverage = run.get("tico_coverage") or {}
    scope = coverage.get("scope_totals") or {}
    profile = ",".join(run.get("profiles") or ["tiny"])
    rows = [
        ("tico", profile, "tico_coverage", f"wrappers_{kind}_percent", float(scope[f"percent_{kind}"]))
        for kind in ("lines", "branches")
        if isinstance(scope.get(f"percent_{kind}"), (int, float))
    ]
    reachable = ((coverage.get("reach") or {}).get("total") or {}).get("percent_reachable")
    if isinstance(reachable, (int, float)):
        rows.append(("tico", profile, "tico_coverage", "wrappers_reachable_branches_percent", float(reachable)))
    for area, figures in (coverage.get("areas") or {}).items():  # the converter's areas beside the wrappers
        share = figures.get("percent_branches")
        if area != "wrappers" and isinstance(share, (int, float)):
            metric = f"{area.replace('/', '_')}_branches_percent"
            rows.append(("tico", profile, "tico_coverage", metric, float(share)))
    return rows


def append_run(db: Path, doc: dict[str, Any]) -> int:
    """Append one run -- its items and tracked metrics -- in one transaction: a crash or an error
    part way leaves no trace of the run, and concurrent appends (several shards) serialise on
    SQLite's write lock (``BEGIN IMMEDIATE``, waiting up to 60 s)."""
    run = doc.get("run", {})
    platform = run.get("platform") or None
    con = connect(db)
    try:
        con.execute("BEGIN IMMEDIATE")
        try:
            cur = con.execute(
                "INSERT INTO runs (started_at, commit_sha, profiles, versions, exitstatus, testbed, platform) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    run.get("started_at", ""),
                    run.get("commit"),
                    json.dumps(run.get("profiles", [])),
                    json.dumps(_versions(run), sort_keys=True),
                    run.get("exitstatus"),
                    testbed_id(platform),
                    json.dumps(platform, sort_keys=True) if platform else None,
                ),
            )
            run_id = int(cur.lastrowid)
            for rec in doc.get("results", []):
                con.execute(
                    "INSERT INTO items (run_id, nodeid, case_name, profile, check_name, outcome, family) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (
                        run_id,
                        rec["nodeid"],
                        rec.get("case"),
                        rec.get("profile"),
                        rec.get("check"),
                        rec["outcome"],
                        rec.get("family"),
                    ),
                )
                con.executemany(
                    "INSERT INTO metrics (run_id, case_name, profile, check_name, metric, value, better, policy) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    [
                        (run_id, rec["case"], rec["profile"], rec["check"], metric, value, better, policy)
                        for metric, value, better, policy in tracked(doc, rec)
                    ],
                )
            con.executemany(
                "INSERT INTO metrics (run_id, case_name, profile, check_name, metric, value, better, policy) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(run_id, *row, "higher", None) for row in coverage_series(run)],
            )
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
    finally:
        con.close()
    return run_id
