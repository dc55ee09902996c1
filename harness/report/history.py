"""Nightly history: append runs to SQLite (parameterised SQL only), render a trend dashboard.

    python -m harness.report.history append reports/results.json [--db reports/history.sqlite]
    python -m harness.report.history dashboard [--db ...] [--out reports/dashboard.html] [--window 5] [--margin 0.1]
        [--acknowledged acknowledged.toml] [--policy regression_policy.toml] [--fail-on-regression]
        [--summary-md FILE] [--nights 100]

A metric regresses when its latest value is worse than the median of the previous ``window``
runs on the same testbed by more than its policy allows: ``max(margin * |baseline| + abs_floor,
noise_k * noise)``, the noise being the series' own spread over the window where measurable
(harness/report/policy.py says where margin, noise_k and abs_floor come from). Which metrics are
tracked and which direction is worse come from the checks' declarations that results.json
carries (``Metric(better=...)``); a series is one (testbed, case, profile, check, metric): runs
on different CPUs or kernel selections are never mixed in one baseline. What an alert says --
acknowledged expected changes, stale acknowledgements, and what moved (versions, commit) where a
change started -- is harness/report/alerts.py. The database's schema is versioned
(``PRAGMA user_version``, SCHEMA_VERSION) and migrated on open; each run is appended in one
transaction.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import math
import shlex
import sqlite3
import statistics
import sys
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup

from harness.report import alerts, svg
from harness.report import policy as policy_mod
from harness.results import atomic_write_text
from harness.platform_info import TESTBED_KEYS

ABS_FLOOR = 1e-9
NOISE_FLOOR_REL = 1e-3  # a spread under 0.1% of the baseline is not noise: the series is judged by its margin
MIN_NOISE_RUNS = 3  # the fewest previous values a spread is measured over
NOISE_RUNS = 20  # the previous runs the spread is measured over (longer than the baseline window: steadier)
MAD_TO_SIGMA = 1.4826  # median absolute deviation -> standard deviation of a normal distribution
CHART_RUNS = 100  # nights per testbed embedded for the sparklines and the on-demand charts

# The history database's schema version (``PRAGMA user_version``). 0 is a database written before
# the schema was versioned: runs, items and metrics, with or without ``metrics.better``.
# 1 adds what a run ran on (``runs.testbed``, ``runs.platform``), each item's family and each
# value's declared regression policy. ``connect`` migrates an older database in one transaction.
SCHEMA_VERSION = 1
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
_INDEXES = ("CREATE INDEX IF NOT EXISTS metrics_key ON metrics(case_name, profile, metric, run_id)",
            "CREATE INDEX IF NOT EXISTS items_run ON items(run_id)")


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
            raise HistoryError(f"history database has schema version {version}; this harness reads up to "
                               f"{SCHEMA_VERSION} (a newer harness wrote it)")
        if version < SCHEMA_VERSION:
            for statement in _TABLES:
                con.execute(statement)
            for table, column, declaration, _ in _COLUMNS:
                if column not in {row[1] for row in con.execute(f"PRAGMA table_info({table})")}:
                    con.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")
            for statement in _INDEXES:
                con.execute(statement)
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
    """A short stable id of what decides float bits (harness/platform_info.py's record: CPU model,
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
    parts = [str(platform.get("cpu") or "unknown CPU"), f"capability {platform.get('cpu_capability') or '?'}",
             f"{threads} thread{'s' if threads != 1 else ''}" if threads is not None else "threads ?"]
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
                out.append((key, float(value), metric["better"], json.dumps(policy, sort_keys=True) if policy else None))
                break
    return out


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
                (run.get("started_at", ""), run.get("commit"), json.dumps(run.get("profiles", [])),
                 json.dumps(_versions(run), sort_keys=True), run.get("exitstatus"), testbed_id(platform),
                 json.dumps(platform, sort_keys=True) if platform else None),
            )
            run_id = int(cur.lastrowid)
            for rec in doc.get("results", []):
                con.execute(
                    "INSERT INTO items (run_id, nodeid, case_name, profile, check_name, outcome, family) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (run_id, rec["nodeid"], rec.get("case"), rec.get("profile"), rec.get("check"), rec["outcome"],
                     rec.get("family")),
                )
                con.executemany(
                    "INSERT INTO metrics (run_id, case_name, profile, check_name, metric, value, better, policy) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    [(run_id, rec["case"], rec["profile"], rec["check"], metric, value, better, policy)
                     for metric, value, better, policy in tracked(doc, rec)],
                )
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
    finally:
        con.close()
    return run_id


# -- judging ------------------------------------------------------------------------------------
SeriesKey = tuple[str | None, str, str, str, str]  # (testbed, case, profile, check, metric)


def series(con: sqlite3.Connection) -> tuple[dict[SeriesKey, list[tuple[int, float]]], dict[SeriesKey, str | None],
                                            dict[SeriesKey, dict[str, Any] | None]]:
    """(testbed, case, profile, check, metric) -> [(run, value)], each series' direction and its
    declared regression policy (both from its newest row that has one). A series never spans
    two testbeds."""
    out: dict[SeriesKey, list[tuple[int, float]]] = {}
    better: dict[SeriesKey, str | None] = {}
    policy: dict[SeriesKey, dict[str, Any] | None] = {}
    rows = con.execute("SELECT r.testbed, m.case_name, m.profile, m.check_name, m.metric, m.run_id, m.value, m.better, "
                       "m.policy FROM metrics m JOIN runs r ON r.id = m.run_id ORDER BY m.run_id")
    for testbed, case, profile, check, metric, run_id, value, direction, declared in rows:
        key = (testbed, case, profile, check, metric)
        out.setdefault(key, []).append((run_id, value))
        better[key] = direction or better.get(key)
        policy[key] = json.loads(declared) if declared else policy.get(key)
    return out, better, policy


def noise_of(previous: list[float], baseline: float, abs_floor: float = ABS_FLOOR) -> float | None:
    """The series' own night-to-night spread before the latest run: the median absolute change
    between consecutive runs over the last NOISE_RUNS values, scaled to a standard deviation
    (x 1.4826 / sqrt 2; a step change is one outlier the median ignores). None where it is not
    measurable: fewer than MIN_NOISE_RUNS values, or a spread under NOISE_FLOOR_REL of the
    baseline (plus ``abs_floor``) -- a deterministic series, judged by its margin alone."""
    recent = previous[-NOISE_RUNS:]
    if len(recent) < MIN_NOISE_RUNS:
        return None
    spread = MAD_TO_SIGMA / math.sqrt(2) * statistics.median(abs(b - a) for a, b in zip(recent, recent[1:]))
    return spread if spread > NOISE_FLOOR_REL * abs(baseline) + abs_floor else None


def judge(values: list[float], lower_is_better: bool, window: int, margin: float, noise_k: float | None = None,
          abs_floor: float = ABS_FLOOR) -> dict[str, Any]:
    """The latest value against the median of the previous ``window``: regressed / improved when
    it moved the wrong / right way by more than ``max(margin * |baseline| + abs_floor,
    noise_k * noise)``. ``worse`` > 0 is a move the wrong way; ``relative`` and ``z`` (in units of
    the noise, where measurable) are signed the same way."""
    latest = values[-1]
    previous = values[-1 - window : -1]
    if not previous:
        return {"latest": latest, "baseline": None, "regressed": False, "improved": False, "change": None,
                "allowed": None, "noise": None, "worse": None, "relative": None, "z": None, "sigmas": None}
    baseline = statistics.median(previous)
    noise = noise_of(values[:-1], baseline, abs_floor)
    allowed = abs(baseline) * margin + abs_floor
    if noise is not None and noise_k:
        allowed = max(allowed, noise_k * noise)
    worse = latest - baseline if lower_is_better else baseline - latest
    return {"latest": latest, "baseline": baseline, "regressed": worse > allowed, "improved": -worse > allowed,
            "change": latest - baseline, "allowed": allowed, "noise": noise, "worse": worse,
            "relative": worse / abs(baseline) if baseline else None, "z": worse / noise if noise else None,
            "sigmas": (latest - baseline) / noise if noise else None}


def change_start(points: list[tuple[int, float]], lower_is_better: bool, window: int, margin: float,
                 regressed: bool, allowed: float | None = None) -> int:
    """Index in ``points`` of the first run of the latest stretch beyond the margin (the same
    way as the latest value): where the series left its baseline. The window's median lies
    inside the band, so the stretch starts after the window's first value."""
    values = [v for _, v in points]
    baseline = statistics.median(values[-1 - window : -1])
    if allowed is None:
        allowed = abs(baseline) * margin + ABS_FLOOR

    def beyond(value: float) -> bool:
        worse = value - baseline if lower_is_better else baseline - value
        return worse > allowed if regressed else -worse > allowed

    start = len(points) - 1
    while start - 1 >= max(1, len(points) - 1 - window) and beyond(values[start - 1]):
        start -= 1
    return start


def heat_level(entry: dict[str, Any]) -> float | None:
    """How far the latest value moved, signed (> 0: worse), in units of the threshold that would
    flag it: noise units / noise_k where the noise is measurable, else the relative change /
    margin; 1.0 is the edge of the allowed band. None: no baseline yet."""
    if entry.get("baseline") is None:
        return None
    policy, worse = entry["policy"], entry["worse"]
    if entry.get("z") is not None and policy["noise_k"]:
        return entry["z"] / policy["noise_k"]
    if entry.get("relative") is not None:
        if policy["margin"] > 0:
            return entry["relative"] / policy["margin"]
        return math.copysign(math.inf, worse) if abs(worse) > policy["abs_floor"] else 0.0
    return math.copysign(math.inf, worse) if abs(worse) > policy["abs_floor"] else 0.0


def _bucket(level: float | None) -> str:
    """CSS class of a heat-map cell: w1..w4 worse, b1..b4 better (3 and 4: beyond the band, i.e.
flagged), n0 within 40% of the band (e.g. within 1.2 sigma at k = 3)."""
    if level is None:
        return "nb"
    size = abs(level)
    step = 0 if size < 0.4 else 1 if size < 0.7 else 2 if size < 1 else 3 if size < 2 else 4
    return "n0" if step == 0 else ("w" if level > 0 else "b") + str(step)


def _nodeids_by_run(con: sqlite3.Connection) -> dict[tuple[str, str, str, int], str]:
    rows = con.execute("SELECT case_name, profile, check_name, run_id, nodeid FROM items")
    return {(case, profile, check, run_id): nodeid for case, profile, check, run_id, nodeid in rows}


def _families(con: sqlite3.Connection) -> dict[str, str]:
    """case -> family, as its newest item recorded it."""
    rows = con.execute("SELECT case_name, family FROM items WHERE family IS NOT NULL ORDER BY run_id")
    return {case: family for case, family in rows}


def _num(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else ("" if value is None else str(value))


def _hover(entry: dict[str, Any]) -> str:
    """The numbers behind a heat-map cell."""
    head = f"{entry['case']} [{entry['profile']}] {entry['check']} {entry['metric']}"
    if entry["baseline"] is None:
        return f"{head}: {_num(entry['latest'])} (no baseline yet)"
    parts = [f"{head}: {_num(entry['latest'])} vs median {_num(entry['baseline'])}"]
    if entry["relative"] is not None:
        parts.append(f"{(entry['latest'] - entry['baseline']) / abs(entry['baseline']):+.1%}")
    else:
        parts.append(f"change {entry['change']:+.4g}")
    parts.append(f"{entry['sigmas']:+.1f} x noise {entry['noise']:.3g}" if entry["sigmas"] is not None
                 else "noise not measurable")
    parts.append(f"allowed {entry['allowed']:.3g}")
    text = "; ".join(parts) + f"; {entry['status']}"
    if entry.get("moved"):
        text += f" ({entry['moved']['text']})"
    if entry.get("ack"):
        text += f"; acknowledged: {entry['ack']['reason']}"
    return text


def _sig(value: float | None) -> float | None:
    return None if value is None else float(f"{value:.6g}")


def encode_values(values: list[float | None]) -> list[Any]:
    """A series' values, compact for the page: ``[exponent, "tokens"]`` where each value is an
    integer multiple of 10**exponent (5 significant digits of the largest), written as the change
    from the previous one; ``n`` is a run without a value, ``*k`` k repeats of the previous value.
    The page's script decodes it (``decode``); a steady 100-night series takes a few bytes."""
    finite = [abs(v) for v in values if v is not None]
    top = max(finite, default=0.0)
    exponent = (math.floor(math.log10(top)) - 4) if top > 0 else 0
    scale = 10.0 ** exponent
    tokens: list[str] = []
    previous, repeats = 0, 0
    for value in values:
        if value is None:
            if repeats:
                tokens.append(f"*{repeats}" if repeats > 1 else "0")
                repeats = 0
            tokens.append("n")
            continue
        q = round(value / scale)
        if q == previous and tokens:
            repeats += 1
            continue
        if repeats:
            tokens.append(f"*{repeats}" if repeats > 1 else "0")
            repeats = 0
        tokens.append(str(q - previous))
        previous = q
    if repeats:
        tokens.append(f"*{repeats}" if repeats > 1 else "0")
    return [exponent, ",".join(tokens)]


def dashboard(db: Path, out: Path, window: int = 5, margin: float = 0.1,
              acknowledgements: list[alerts.Acknowledgement] | None = None,
              policies: list[policy_mod.PolicyEntry] | None = None, chart_runs: int = CHART_RUNS) -> dict[str, Any]:
    """Render the dashboard; returns what it flagged. ``regressions`` are the unacknowledged
    ones (case, profile, check, metric); acknowledged changes, improvements and stale
    acknowledgements are listed apart, each flagged change with what moved where it started.
    Every series is judged within its testbed; policies resolve as harness/report/policy.py says."""
    con = connect(db)
    try:
        rows = con.execute("SELECT id, started_at, commit_sha, versions, testbed, platform FROM runs ORDER BY id").fetchall()
        data, better, declared = series(con)
        nodeids = _nodeids_by_run(con)
        families = _families(con)
    finally:
        con.close()
    runs = [{"id": rid, "started_at": started, "commit": commit, "versions": json.loads(versions or "{}"),
             "testbed": testbed, "platform": json.loads(platform) if platform else None}
            for rid, started, commit, versions, testbed, platform in rows]
    by_id = {run["id"]: run for run in runs}
    latest = runs[-1] if runs else None
    # testbeds: the latest run's first, then by their newest run
    newest: dict[str | None, int] = {}
    for run in runs:
        newest[run["testbed"]] = run["id"]
    testbed_order = sorted(newest, key=lambda t: -newest[t])
    testbeds = []
    for index, tb in enumerate(testbed_order):
        tb_runs = [run for run in runs if run["testbed"] == tb]
        testbeds.append({"id": tb, "index": index, "label": testbed_label(tb_runs[-1]["platform"]),
                         "runs": tb_runs, "run_ids": [run["id"] for run in tb_runs], "entries": [],
                         "platform": tb_runs[-1]["platform"]})
    tb_by_id = {tb["id"]: tb for tb in testbeds}
    entries = []
    used_policies: set[int] = set()
    for key in sorted(data, key=lambda k: (tb_by_id[k[0]]["index"], k[1:])):
        testbed, case, profile, check, metric = key
        points = data[key]
        direction = better.get(key)
        if direction not in ("lower", "higher"):
            continue  # rows from before directions were stored: kept, not judged
        tb = tb_by_id[testbed]
        pol = policy_mod.resolve(declared.get(key), policies or [], margin, key)
        used_policies.update(int(src.split()[-1]) for src in pol["sources"].values() if src.startswith("policy entry"))
        by_run = dict(points)
        present = [(rid, by_run[rid]) for rid in tb["run_ids"] if rid in by_run]
        lower = direction == "lower"
        verdict = judge([v for _, v in present], lower, window, pol["margin"], pol["noise_k"], pol["abs_floor"])
        status = "new" if verdict["baseline"] is None else "ok"
        moved = None
        if verdict["regressed"] or verdict["improved"]:
            status = "regressed" if verdict["regressed"] else "improved"
            start = change_start(present, lower, window, pol["margin"], verdict["regressed"], verdict["allowed"])
            moved = alerts.what_moved(by_id[present[start - 1][0]], by_id[present[start][0]])
        nodeid = nodeids.get((case, profile, check, present[-1][0]))
        entry = {"testbed": testbed, "case": case, "profile": profile, "check": check, "metric": metric,
                 "family": families.get(case) or "unknown", "values": [by_run.get(rid) for rid in tb["run_ids"]],
                 "lower_is_better": lower, **verdict, "status": status, "moved": moved, "ack": None,
                 "policy": pol, "latest_run": present[-1][0], "nodeid": nodeid,
                 "repro": f"./scripts/env.sh pytest {shlex.quote(nodeid)}" if nodeid else None}
        entries.append(entry)
        tb["entries"].append(entry)
    stale = alerts.apply(acknowledgements or [], entries, runs)
    for i, entry in enumerate(entries):
        entry["index"] = i
        entry["cause"] = ("dependency" if entry["moved"] and entry["moved"]["dependency_bump"] else
                          "commit" if entry["moved"] and entry["moved"]["commit_moved"] else
                          "unchanged" if entry["moved"] else None)
        entry["level"] = heat_level(entry)
        entry["cell"] = _bucket(entry["level"])
        entry["hover"] = _hover(entry)
        tb = tb_by_id[entry["testbed"]]
        shown = entry["values"][-chart_runs:]
        entry["spark"] = Markup(svg.sparkline(shown, flagged=entry["status"] == "regressed"))
        entry["policy_text"] = policy_mod.describe(entry["policy"])
    heatmaps = [_heatmap(tb) for tb in testbeds]
    family_rows = _family_summary(entries)
    primary = [run for run in runs if latest and run["testbed"] == latest["testbed"]]
    versions_moved = (alerts.describe_version_moves(alerts.version_moves(primary[-1 - window : -1], latest))
                      if latest else "")
    chart_data = {
        "window": window,
        "testbeds": [{"label": tb["label"],
                      "runs": [[run["id"], run["started_at"], (run["commit"] or "")[:12], _run_moves(tb["runs"], j)]
                               for j, run in enumerate(tb["runs"])][-chart_runs:]} for tb in testbeds],
        "series": [[tb_by_id[e["testbed"]]["index"], f"{e['case']} [{e['profile']}] {e['check']} {e['metric']}",
                    1 if e["lower_is_better"] else 0, encode_values(e["values"][-chart_runs:]),
                    _sig(e["baseline"]), _sig(e["allowed"]), e["status"], e["policy_text"]] for e in entries],
    }
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(Path(__file__).parent / "templates")), autoescape=True,
                             trim_blocks=True, lstrip_blocks=True)
    env.filters["num"] = lambda v: (f"{v:.4g}" if isinstance(v, float) else ("" if v is None else v))
    by_status = {s: [e for e in entries if e["status"] == s] for s in ("regressed", "acknowledged", "improved")}
    unused = [p for p in (policies or []) if p.index not in used_policies]
    html = env.get_template("dashboard.html.j2").render(
        runs=rows, entries=entries, regressions=by_status["regressed"], acknowledged=by_status["acknowledged"],
        improvements=by_status["improved"], stale=stale, versions_moved=versions_moved, window=window, margin=margin,
        testbeds=testbeds, heatmaps=heatmaps, families=family_rows, multi_testbed=len(testbeds) > 1,
        chart_data=Markup(json.dumps(chart_data, separators=(",", ":"), allow_nan=False)
                          .replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")),
        noise_floor=NOISE_FLOOR_REL, noise_runs=NOISE_RUNS, unused_policies=unused, chart_runs=chart_runs)
    atomic_write_text(out, html)

    def key(e: dict[str, Any]) -> tuple[str, str, str, str]:
        return (e["case"], e["profile"], e["check"], e["metric"])

    def plain(e: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in e.items() if k not in ("spark", "values", "hover")}

    return {"runs": len(runs), "series": len(entries), "window": window, "margin": margin,
            "latest": {k: latest[k] for k in ("id", "started_at", "commit")} if latest else None,
            "versions_moved": versions_moved,
            "testbeds": [{"id": tb["id"], "label": tb["label"], "runs": len(tb["runs"]), "series": len(tb["entries"])}
                         for tb in testbeds],
            "regressions": [key(e) for e in by_status["regressed"]],
            "acknowledged": [key(e) for e in by_status["acknowledged"]],
            "improvements": [key(e) for e in by_status["improved"]],
            "regression_entries": [plain(e) for e in by_status["regressed"]],
            "acknowledged_entries": [plain(e) for e in by_status["acknowledged"]],
            "improvement_entries": [plain(e) for e in by_status["improved"]],
            "families": family_rows,
            "unused_policies": [{"index": p.index, "reason": p.reason} for p in unused],
            "stale": stale, "acknowledgements_count": len(acknowledgements or [])}


def _run_moves(tb_runs: list[dict[str, Any]], j: int) -> str:
    """What moved into run j of a testbed from the run before it ("" when nothing did)."""
    if j == 0:
        return ""
    moves = alerts.version_moves([tb_runs[j - 1]], tb_runs[j])
    return ", ".join(f"{name} {old} -> {new}" for name, old, new in moves)


def _heatmap(tb: dict[str, Any]) -> dict[str, Any]:
    """Rows (case, profile) grouped by family, columns (check, metric): one testbed's latest run."""
    columns = sorted({(e["check"], e["metric"]) for e in tb["entries"]})
    col_index = {c: i for i, c in enumerate(columns)}
    rows: dict[tuple[str, str, str], list[dict[str, Any] | None]] = {}
    for e in tb["entries"]:
        row = rows.setdefault((e["family"], e["case"], e["profile"]), [None] * len(columns))
        row[col_index[(e["check"], e["metric"])]] = e
    ordered = sorted(rows.items())
    out_rows, previous_family = [], None
    for (family, case, profile), cells in ordered:
        span = sum(1 for (f, _, _), _ in ordered if f == family) if family != previous_family else 0
        out_rows.append({"family": family, "span": span, "case": case, "profile": profile, "cells": cells})
        previous_family = family
    return {"testbed": tb, "columns": columns, "rows": out_rows}


def _family_summary(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for e in entries:
        row = out.setdefault(e["family"], {"family": e["family"], "cases": set(), "series": 0, "regressed": 0,
                                           "acknowledged": 0, "improved": 0, "steady": 0, "new": 0})
        row["cases"].add(e["case"])
        row["series"] += 1
        row[{"ok": "steady"}.get(e["status"], e["status"])] += 1
    return [{**row, "cases": len(row["cases"])} for _, row in sorted(out.items())]


def _reviewed(path: Path | None, default_name: str, load):
    """(entries, the file read): the given file (it must exist), else the default one where it
    exists, else none."""
    if path is None:
        default = Path(default_name)
        if not default.is_file():
            return [], None
        path = default
    return load(path), path


def _policies(path: Path | None) -> tuple[list[policy_mod.PolicyEntry], Path | None]:
    return _reviewed(path, policy_mod.DEFAULT_FILE, policy_mod.load_policies)


def _acknowledgements(path: Path | None) -> tuple[list[alerts.Acknowledgement], Path | None]:
    return _reviewed(path, alerts.DEFAULT_FILE, alerts.load_acknowledgements)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.report.history", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    app = sub.add_parser("append", help="append a results.json to the history database")
    app.add_argument("results", type=Path)
    app.add_argument("--db", type=Path, default=Path("reports/history.sqlite"))
    dash = sub.add_parser("dashboard", help="render the trend dashboard",
                          epilog="exit status: 0; 1 with --fail-on-regression when an unacknowledged regression is "
                                 "flagged; 2 on bad input (no database, a bad acknowledgements file)")
    dash.add_argument("--db", type=Path, default=Path("reports/history.sqlite"))
    dash.add_argument("--out", type=Path, default=Path("reports/dashboard.html"))
    dash.add_argument("--window", type=int, default=5, help="previous runs whose median is the baseline")
    dash.add_argument("--margin", type=float, default=0.1,
                      help="relative worsening that counts as a regression, for metrics whose policy sets no margin")
    dash.add_argument("--policy", type=Path, default=None, metavar="FILE",
                      help=f"per case/metric/testbed regression policies (.toml or .json; default "
                           f"./{policy_mod.DEFAULT_FILE} where it exists)")
    dash.add_argument("--nights", type=int, default=CHART_RUNS,
                      help="runs per testbed shown in the sparklines and charts (judging is unaffected)")
    dash.add_argument("--acknowledged", type=Path, default=None, metavar="FILE",
                      help=f"reviewed expected changes (.toml or .json; default ./{alerts.DEFAULT_FILE} where it exists)")
    dash.add_argument("--fail-on-regression", action="store_true",
                      help="exit 1 when a regression no acknowledgement covers is flagged")
    dash.add_argument("--summary-md", type=Path, default=None, metavar="FILE",
                      help="write the regressions, acknowledged changes, improvements and stale acknowledgements "
                           "as markdown (a CI job summary, an issue comment)")
    args = parser.parse_args(argv)
    if args.command == "append":
        try:
            run_id = append_run(args.db, json.loads(args.results.read_text()))
        except HistoryError as exc:
            print(f"history: error: {exc}", file=sys.stderr)
            return 2
        print(f"appended run {run_id} to {args.db}")
        return 0
    if not args.db.is_file():
        print(f"history: error: history database not found: {args.db}", file=sys.stderr)
        return 2
    if args.window < 1 or args.margin < 0 or args.nights < 1:
        print(f"history: error: --window and --nights must be >= 1 and --margin >= 0 (got {args.window}, "
              f"{args.nights}, {args.margin})", file=sys.stderr)
        return 2
    try:
        acks, ack_path = _acknowledgements(args.acknowledged)
        policies, policy_path = _policies(args.policy)
        summary = dashboard(args.db, args.out, args.window, args.margin, acknowledgements=acks, policies=policies,
                            chart_runs=args.nights)
    except (alerts.AckError, policy_mod.PolicyError, HistoryError) as exc:
        print(f"history: error: {exc}", file=sys.stderr)
        return 2
    summary["acknowledgements_file"] = ack_path
    summary["policy_file"] = policy_path
    print(f"{args.out}: {summary['runs']} runs, {summary['series']} series, {len(summary['regressions'])} regressions, "
          f"{len(summary['acknowledged'])} acknowledged, {len(summary['improvements'])} improvements, "
          f"{len(summary['stale'])} stale acknowledgements")
    if summary["versions_moved"]:
        print(f"  {summary['versions_moved']} (latest run against its baseline window)")
    for label, entries in (("REGRESSION", summary["regression_entries"]), ("ACKNOWLEDGED", summary["acknowledged_entries"]),
                           ("IMPROVED", summary["improvement_entries"])):
        for e in entries:
            line = (f"  {label} {e['case']}[{e['profile']}] {e['check']} {e['metric']}: {e['latest']:.4g} vs median "
                    f"{e['baseline']:.4g} ({e['moved']['text']})")
            if e.get("ack"):
                line += f" -- {e['ack']['reason']}"
            print(line)
            if label == "REGRESSION" and e.get("repro"):
                print(f"    repro: {e['repro']}")
    if len(summary["testbeds"]) > 1:
        for tb in summary["testbeds"]:
            print(f"  testbed {tb['id'] or '-'}: {tb['label']} ({tb['runs']} runs, {tb['series']} series)")
    for p in summary["unused_policies"]:
        print(f"  UNUSED policy entry {p['index']} ({p['reason']}): matches no series")
    for s in summary["stale"]:
        print(f"  STALE acknowledgement {s['index']} ({s['series']}, {s['since']}): {s['why']}")
    if args.summary_md:
        atomic_write_text(args.summary_md, alerts.summary_markdown(summary))
        print(f"summary: {args.summary_md}")
    return 1 if args.fail_on_regression and summary["regressions"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
