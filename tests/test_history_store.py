"""The nightly history's storage and judging (issue #21): a versioned schema migrated from the
previous one, appends from several processes at once, no half-run after a crash, series keyed
by testbed, regression policies (Metric.regression, regression_policy.toml, the noise band) and
the dashboard's page weight at 50 cases x 3 profiles x 100 nights."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.checks.base import Metric, RegressionPolicy
from harness.commands import history as history_command
from harness.report import dashboard, policy, regression
from harness.report import history_store as history
from tests import dashboard_fixture
from tests.report_fixture import results_doc

REPO = Path(__file__).resolve().parents[1]
PEIR = ("good_case", "tiny", "quant_accuracy", "peir")
PLATFORM_A = {
    "cpu": "Intel Xeon A",
    "machine": "x86_64",
    "cpu_capability": "AVX512",
    "blas": "MKL",
    "torch_threads": 1,
    "env": {},
}
PLATFORM_B = {**PLATFORM_A, "cpu": "Apple M2", "machine": "arm64", "cpu_capability": "DEFAULT", "blas": "OpenBLAS"}

# The schema as it was before it was versioned (PRAGMA user_version 0), verbatim.
PREVIOUS_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    started_at TEXT NOT NULL,
    commit_sha TEXT,
    profiles TEXT NOT NULL,
    versions TEXT NOT NULL,
    exitstatus INTEGER
);
CREATE TABLE IF NOT EXISTS items (
    run_id INTEGER NOT NULL REFERENCES runs(id),
    nodeid TEXT NOT NULL,
    case_name TEXT,
    profile TEXT,
    check_name TEXT,
    outcome TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS metrics (
    run_id INTEGER NOT NULL REFERENCES runs(id),
    case_name TEXT NOT NULL,
    profile TEXT NOT NULL,
    check_name TEXT NOT NULL,
    metric TEXT NOT NULL,
    value REAL NOT NULL,
    better TEXT
);
CREATE INDEX IF NOT EXISTS metrics_key ON metrics(case_name, profile, metric, run_id);
"""


def _doc(peir: float = 0.05, commit: str = "abc1234", day: int = 1, platform: dict | None = PLATFORM_A) -> dict:
    doc = results_doc(commit=commit, peir=peir, started=f"2026-11-{day:02d}T02:00:00Z")
    if platform is not None:
        doc["run"]["platform"] = platform
    return doc


def _counts(db: Path) -> tuple[int, int, int]:
    con = sqlite3.connect(db)
    try:
        return tuple(con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("runs", "items", "metrics"))
    finally:
        con.close()


# -- schema versioning --------------------------------------------------------------------------
@pytest.mark.parametrize("with_better", [True, False], ids=["previous", "before-directions"])
def test_a_database_in_the_previous_schema_is_migrated_and_its_data_survive(tmp_path, with_better):
    db = tmp_path / "old.sqlite"
    con = sqlite3.connect(db)
    schema = PREVIOUS_SCHEMA if with_better else PREVIOUS_SCHEMA.replace(",\n    better TEXT", "")
    con.executescript(schema)
    for run_id, peir in enumerate((0.05, 0.05, 0.05, 0.08), start=1):
        con.execute(
            "INSERT INTO runs (started_at, commit_sha, profiles, versions, exitstatus) VALUES (?, ?, ?, ?, ?)",
            (f"2026-10-0{run_id}T00:00:00Z", f"c{run_id}000000", '["tiny"]', '{"tico": "0.3.0"}', 0),
        )
        con.execute(
            "INSERT INTO items (run_id, nodeid, case_name, profile, check_name, outcome) VALUES (?, ?, ?, ?, ?, ?)",
            (
                run_id,
                "cases/fixture.py::good_case[tiny]::quant_accuracy",  # the node ids of that time
                "good_case",
                "tiny",
                "quant_accuracy",
                "passed",
            ),
        )
        columns = "run_id, case_name, profile, check_name, metric, value" + (", better" if with_better else "")
        values = (run_id, "good_case", "tiny", "quant_accuracy", "peir", peir) + (("lower",) if with_better else ())
        con.execute(f"INSERT INTO metrics ({columns}) VALUES ({', '.join('?' * len(values))})", values)
    con.commit()
    con.close()
    assert history.schema_version(db) == 0

    summary = dashboard.dashboard(db, tmp_path / "d.html")  # opening with the new code migrates
    assert history.schema_version(db) == history.SCHEMA_VERSION == 2
    con = sqlite3.connect(db)
    assert {r[1] for r in con.execute("PRAGMA table_info(runs)")} >= {"testbed", "platform"}
    assert {r[1] for r in con.execute("PRAGMA table_info(metrics)")} >= {"better", "policy"}
    assert con.execute("SELECT value FROM metrics ORDER BY run_id").fetchall() == [(0.05,), (0.05,), (0.05,), (0.08,)]
    assert con.execute("SELECT commit_sha FROM runs WHERE id = 4").fetchone() == ("c4000000",)
    # the items' node ids read in today's form, so their rerun commands run
    assert {r[0] for r in con.execute("SELECT nodeid FROM items")} == {
        "cases/fixture.py::good_case::quant_accuracy[tiny]"
    }
    con.close()
    assert summary["runs"] == 4
    if with_better:  # the old rows are judged as before, on the "testbed not recorded"
        assert summary["regressions"] == [PEIR]
        assert summary["testbeds"] == [{"id": None, "label": "testbed not recorded", "runs": 4, "series": 1}]
    else:  # rows without a direction are kept, not judged
        assert summary["series"] == 0

    # a new run records its testbed: a new series, never judged against the unrecorded runs
    history.append_run(db, _doc(peir=0.2, day=5))
    summary = dashboard.dashboard(db, tmp_path / "d.html")
    assert [tb["id"] for tb in summary["testbeds"]] == [history.testbed_id(PLATFORM_A), None]
    assert history.schema_version(db) == 2 and _counts(db)[0] == 5


def test_a_database_from_a_newer_harness_is_refused(tmp_path, capsys):
    db = tmp_path / "new.sqlite"
    history.append_run(db, _doc())
    con = sqlite3.connect(db)
    con.execute(f"PRAGMA user_version = {history.SCHEMA_VERSION + 1}")
    con.close()
    newer, ours = history.SCHEMA_VERSION + 1, history.SCHEMA_VERSION
    with pytest.raises(history.HistoryError, match=f"schema version {newer}; this harness reads up to {ours}"):
        history.append_run(db, _doc())
    assert history_command.main(["dashboard", "--db", str(db), "--out", str(tmp_path / "d.html")]) == 2
    assert f"schema version {newer}" in capsys.readouterr().err
    assert _counts(db)[0] == 1


# -- concurrency and atomicity ------------------------------------------------------------------
APPENDER = """
import json, sys, time
from pathlib import Path
from harness.report import history_store as history
db, doc_path, start = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
worker, runs = sys.argv[4], int(sys.argv[5])
doc = json.loads(doc_path.read_text())
while not start.exists():
    time.sleep(0.005)
for k in range(runs):
    doc["run"]["commit"] = f"{worker}-{k}"
    history.append_run(db, doc)
"""


def test_appends_from_several_processes_at_once_lose_no_run(tmp_path):
    """Four shards append five runs each into one database that does not exist yet (so they also
    race to create and version it); every run arrives whole."""
    db, start = tmp_path / "h.sqlite", tmp_path / "go"
    doc = _doc()
    (tmp_path / "doc.json").write_text(json.dumps(doc))
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", APPENDER, str(db), str(tmp_path / "doc.json"), str(start), str(w), "5"],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        for w in range(4)
    ]
    time.sleep(1.0)  # let every process import and wait at the barrier
    start.touch()
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
    per_run_items = len(doc["results"])
    per_run_metrics = sum(len(history.tracked(doc, rec)) for rec in doc["results"])
    con = sqlite3.connect(db)
    commits = sorted(c for (c,) in con.execute("SELECT commit_sha FROM runs"))
    assert commits == sorted(f"{w}-{k}" for w in range(4) for k in range(5))
    items = dict(con.execute("SELECT run_id, count(*) FROM items GROUP BY run_id").fetchall())
    metrics = dict(con.execute("SELECT run_id, count(*) FROM metrics GROUP BY run_id").fetchall())
    ids = [i for (i,) in con.execute("SELECT id FROM runs")]
    assert all(items[i] == per_run_items and metrics[i] == per_run_metrics for i in ids)
    assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert con.execute("PRAGMA user_version").fetchone() == (history.SCHEMA_VERSION,)
    con.close()


def test_a_failure_mid_append_leaves_no_half_run(tmp_path, monkeypatch):
    db = tmp_path / "h.sqlite"
    history.append_run(db, _doc())
    before = _counts(db)
    real, calls = history.tracked, []

    def failing(doc, rec):
        calls.append(rec["nodeid"])
        if len(calls) == 3:  # the run row, two items and their metrics are written by now
            raise OSError("disk full (injected)")
        return real(doc, rec)

    monkeypatch.setattr(history, "tracked", failing)
    with pytest.raises(OSError, match="injected"):
        history.append_run(db, _doc(peir=0.9))
    assert _counts(db) == before
    monkeypatch.setattr(history, "tracked", real)
    history.append_run(db, _doc())
    assert _counts(db) == (2, 2 * before[1], 2 * before[2])


KILLED = """
import json, os, sys
from pathlib import Path
from harness.report import history_store as history
real, calls = history.tracked, []
def dying(doc, rec):
    calls.append(1)
    if len(calls) == 3:
        os._exit(9)  # the process dies mid-append: no exception handler, no rollback, no close
    return real(doc, rec)
history.tracked = dying
history.append_run(Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text()))
"""


def test_a_process_killed_mid_append_leaves_no_half_run(tmp_path):
    db = tmp_path / "h.sqlite"
    history.append_run(db, _doc())
    before = _counts(db)
    (tmp_path / "doc.json").write_text(json.dumps(_doc(peir=0.9)))
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run(
        [sys.executable, "-c", KILLED, str(db), str(tmp_path / "doc.json")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 9, done.stderr[-2000:]
    assert _counts(db) == before  # SQLite rolls the hot journal back on the next open
    history.append_run(db, _doc())
    assert _counts(db)[0] == 2
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    con.close()


# -- testbeds -----------------------------------------------------------------------------------
def test_series_are_compared_only_within_one_testbed(tmp_path, capsys):
    """Nights alternate between two machines whose float bits differ (PEIR 0.05 on one, 0.08 on
    the other): no regression. A move on one machine is judged against that machine's runs."""
    db = tmp_path / "h.sqlite"
    for day in range(1, 9):
        a = day % 2 == 1
        history.append_run(db, _doc(peir=0.05 if a else 0.08, day=day, platform=PLATFORM_A if a else PLATFORM_B))
    summary = dashboard.dashboard(db, tmp_path / "d.html")
    assert summary["regressions"] == [] and summary["improvements"] == []
    assert [tb["id"] for tb in summary["testbeds"]] == [history.testbed_id(PLATFORM_B), history.testbed_id(PLATFORM_A)]
    assert summary["testbeds"][0]["label"] == "Apple M2 / capability DEFAULT / 1 thread"
    history.append_run(db, _doc(peir=0.09, day=9, platform=PLATFORM_A))  # worse on A (0.05), better than B (0.08)
    summary = dashboard.dashboard(db, tmp_path / "d.html")
    [entry] = summary["regression_entries"]
    assert (entry["testbed"], entry["baseline"], entry["latest"]) == (history.testbed_id(PLATFORM_A), 0.05, 0.09)
    assert entry["moved"]["from_run"] == 7 and entry["moved"]["to_run"] == 9  # A's previous run, not B's run 8
    html = (tmp_path / "d.html").read_text()
    assert html.count('<table class="heatmap"') == 2 and "Testbed: Apple M2" in html
    assert history_command.main(["dashboard", "--db", str(db), "--out", str(tmp_path / "d.html")]) == 0
    assert "testbed " + history.testbed_id(PLATFORM_A) in capsys.readouterr().out


def test_the_testbed_is_what_decides_float_bits_not_the_versions():
    assert history.testbed_id({**PLATFORM_A, "cpu_capability": "AVX2"}) != history.testbed_id(PLATFORM_A)
    assert history.testbed_id({**PLATFORM_A, "env": {"ATEN_CPU_CAPABILITY": "default"}}) != history.testbed_id(
        PLATFORM_A
    )
    assert history.testbed_id({**PLATFORM_A, "torch_threads": 2}) != history.testbed_id(PLATFORM_A)
    assert history.testbed_id(dict(reversed(list(PLATFORM_A.items())))) == history.testbed_id(PLATFORM_A)
    assert history.testbed_id(None) is None


# -- policies -----------------------------------------------------------------------------------
def test_metric_declares_a_regression_policy_stored_with_its_values(tmp_path):
    assert Metric("x").regression == RegressionPolicy(margin=None, noise_k=3.0, abs_floor=1e-9)
    with pytest.raises(ValueError, match="margin must be a finite number >= 0"):
        RegressionPolicy(margin=-1)
    doc = _doc()
    peir = next(m for m in doc["run"]["checks"]["quant_accuracy"]["metrics"] if m["name"] == "peir")
    assert peir["regression"] == {"margin": None, "noise_k": 3.0, "abs_floor": 1e-9}
    db = tmp_path / "h.sqlite"
    for day, value in enumerate((0.05, 0.05, 0.05, 0.08), start=1):
        doc = _doc(peir=value, day=day)
        next(m for m in doc["run"]["checks"]["quant_accuracy"]["metrics"] if m["name"] == "peir")["regression"] = {
            "margin": 0.7,
            "noise_k": 3.0,
            "abs_floor": 1e-9,
        }
        history.append_run(db, doc)
    con = sqlite3.connect(db)
    assert (
        json.loads(con.execute("SELECT policy FROM metrics WHERE metric = 'peir' LIMIT 1").fetchone()[0])["margin"]
        == 0.7
    )
    con.close()
    summary = dashboard.dashboard(db, tmp_path / "d.html", margin=0.1)
    assert (
        PEIR not in summary["regressions"]
    )  # +60% is inside the metric's own 70% margin; --margin is its default only


def _noisy_history(db: Path, latest: float) -> None:
    """PEIR with a night-to-night spread of about 0.007 (sigma; 14% of 0.05), then ``latest``."""
    jitter = (0.0, 0.004, -0.003, 0.005, -0.004, 0.003, -0.005, 0.004, -0.002, 0.003, -0.004, 0.005)
    for day, j in enumerate(jitter, start=1):
        history.append_run(db, _doc(peir=0.05 + j, day=day))
    history.append_run(db, _doc(peir=latest, day=len(jitter) + 1))


def test_the_noise_band_widens_the_margin_for_a_noisy_series_and_a_policy_file_overrides_it(tmp_path, capsys):
    db = tmp_path / "h.sqlite"
    _noisy_history(db, latest=0.062)  # +17% on the median 0.053: beyond the 10% margin, within 3 x its noise
    summary = dashboard.dashboard(db, tmp_path / "d.html")
    assert PEIR not in summary["regressions"]
    values = [0.05, 0.054, 0.047, 0.055, 0.046, 0.053, 0.045, 0.054, 0.048, 0.053, 0.046, 0.055]
    noise = regression.noise_of(values, 0.05)
    assert noise is not None and 0.005 < noise < 0.012
    verdict = regression.judge(values + [0.062], True, 5, 0.1, noise_k=3.0)
    assert verdict["baseline"] == 0.053 and verdict["allowed"] == pytest.approx(3 * noise) and not verdict["regressed"]
    assert regression.judge(values + [0.062], True, 5, 0.1, noise_k=0.0)["regressed"]
    assert regression.noise_of([0.05] * 12, 0.05) is None  # deterministic: judged by the margin alone
    assert regression.noise_of([0.05, 0.06], 0.05) is None  # too few runs to measure a spread

    pol = tmp_path / "policy.toml"
    pol.write_text(
        '[[policy]]\ncase = "good_*"\ncheck = "quant_accuracy"\nmetric = "peir"\nnoise_k = 0\n'
        'reason = "PEIR is deterministic on a testbed: any move beyond the margin counts"\n'
        '[[policy]]\ncase = "no_such_case"\nmargin = 0.5\nreason = "typo"\n'
    )
    args = [
        "dashboard",
        "--db",
        str(db),
        "--out",
        str(tmp_path / "d.html"),
        "--policy",
        str(pol),
        "--fail-on-regression",
    ]
    assert history_command.main(args) == 1
    out = capsys.readouterr().out
    assert "REGRESSION good_case[tiny] quant_accuracy peir" in out
    assert "UNUSED policy entry 2 (typo): matches no series" in out
    entries = policy.load_policies(pol)
    resolved = policy.resolve(
        {"margin": None, "noise_k": 3.0, "abs_floor": 1e-9},
        entries,
        0.1,
        ("tb", "good_case", "tiny", "quant_accuracy", "peir"),
    )
    assert (resolved["margin"], resolved["noise_k"]) == (0.1, 0.0)
    assert resolved["sources"] == {"margin": "--margin", "noise_k": "policy entry 1", "abs_floor": "metric"}


def test_a_policy_per_case_and_the_default_policy_file(tmp_path, monkeypatch, capsys):
    db = tmp_path / "h.sqlite"
    for day, value in enumerate((0.05, 0.05, 0.05, 0.08), start=1):
        history.append_run(db, _doc(peir=value, day=day))
    monkeypatch.chdir(tmp_path)
    args = ["dashboard", "--db", str(db), "--out", str(tmp_path / "d.html"), "--fail-on-regression"]
    assert history_command.main(args) == 1
    (tmp_path / "regression_policy.toml").write_text(
        '[[policy]]\ncase = "good_case"\nprofile = "tiny"\nmetric = "peir"\nmargin = 0.75\n'
        'reason = "good_case PEIR swings with its calibration set"\n'
    )
    assert history_command.main(args) == 0  # ./regression_policy.toml is read when present
    assert "0 regressions" in capsys.readouterr().out


@pytest.mark.parametrize(
    "text, message",
    [
        ("[[policy]]\nmargin = 0.2\n", "entry 1: 'reason' is required"),
        ('[[policy]]\nreason = "r"\n', "set at least one of margin, noise_k, abs_floor"),
        ('[[policy]]\nmargin = -0.1\nreason = "r"\n', "'margin' must be a finite number >= 0, got -0.1"),
        ('[[policy]]\nmargn = 0.1\nreason = "r"\n', "unknown field(s) margn"),
        ("[policy]\nmargin = 0.1\n", "'policy' must be a list of entries"),
        ("[[policy]\n", "cannot be parsed"),
    ],
)
def test_a_bad_policy_file_exits_2_with_a_message(tmp_path, capsys, text, message):
    db = tmp_path / "h.sqlite"
    history.append_run(db, _doc())
    path = tmp_path / "p.toml"
    path.write_text(text)
    assert (
        history_command.main(["dashboard", "--db", str(db), "--out", str(tmp_path / "d.html"), "--policy", str(path)])
        == 2
    )
    err = capsys.readouterr().err
    assert err.startswith("history: error: ") and message in err


def test_the_committed_policy_file_is_valid():
    path = REPO / policy.DEFAULT_FILE
    assert isinstance(policy.load_policies(path), list)
    lines = path.read_text().splitlines()
    example = "\n".join(line[2:] for line in lines[lines.index("# [[policy]]") :] if line.startswith("# "))
    [entry] = policy.parse_policies(__import__("tomllib").loads(example), "example")
    assert entry.values == (("noise_k", 4.0),)


# -- scale --------------------------------------------------------------------------------------
PAGE_BUDGET = 3_000_000  # bytes at 50 cases x 3 profiles x 100 nights, 1800 series, every value jittered


def test_page_weight_at_50_cases_3_profiles_100_nights(tmp_path):
    db = dashboard_fixture.build(tmp_path / "h.sqlite", cases=50, nights=100, noisy=True)
    out = tmp_path / "dashboard.html"
    started = time.perf_counter()
    summary = dashboard.dashboard(db, out)
    elapsed = time.perf_counter() - started
    size = out.stat().st_size
    assert summary["series"] == 50 * 3 * 12 and summary["runs"] == 100
    assert size < PAGE_BUDGET, f"dashboard is {size} bytes (budget {PAGE_BUDGET})"
    assert elapsed < 30, f"rendering took {elapsed:.1f} s"
    html = out.read_text()
    assert html.count('<svg class="spark') == summary["series"]
    assert html.count("<details data-s=") == summary["series"]
    assert '<svg class="chart"' not in html  # detailed charts are built on demand only
    assert "http://" not in html.replace('"http://www.w3.org/2000/svg"', "") and "https://" not in html


def _decode(enc: list) -> list:
    """The page script's ``decode``, in Python."""
    exponent, text = enc
    out, q = [], 0
    for tok in text.split(",") if text else []:
        if tok == "n":
            out.append(None)
        elif tok.startswith("*"):
            out += [q * 10.0**exponent] * int(tok[1:])
        else:
            q += int(tok)
            out.append(q * 10.0**exponent)
    return out


@pytest.mark.parametrize(
    "values",
    [
        [0.05] * 100,
        [0.05, None, 0.05, 0.0512, 0.0512, 0.0512, None, None, 0.049],
        [30.01, 29.98, 30.02, 24.0],
        [0.0, 0.0, 1.0, 3.0, 3.0],
        [None, 1e-6, 1.2e-6],
        [],
    ],
)
def test_chart_values_round_trip_to_five_significant_digits(values):
    enc = dashboard.encode_values(values)
    decoded = _decode(enc)
    assert len(decoded) == len(values)
    top = max((abs(v) for v in values if v is not None), default=0.0)
    for got, want in zip(decoded, values):
        assert (got is None) == (want is None)
        if want is not None:
            assert abs(got - want) <= top * 1e-4
    if values == [0.05] * 100:
        assert len(json.dumps(enc)) < 20  # a steady series costs a few bytes


def test_a_tico_coverage_run_tracks_its_percentages_and_a_drop_is_a_regression(tmp_path):
    """--tico-coverage's branch and line percentages of the wrappers are series of the pseudo-case
    ``tico``: the dashboard flags a night that runs fewer of tico's branches."""
    db = tmp_path / "h.sqlite"
    for day, branches in enumerate((42.0, 42.0, 42.1, 42.0, 30.0), start=1):
        doc = _doc(day=day)
        doc["run"]["tico_coverage"] = {
            "scope_totals": {"percent_lines": 66.0, "percent_branches": branches},
            "reach": {"total": {"percent_reachable": branches + 10}},
            "areas": {"wrappers": {"percent_branches": branches}, "passes": {"percent_branches": 70.0 - day}},
        }
        history.append_run(db, doc)
    history.append_run(db, _doc(day=6))  # a run without --tico-coverage adds no point
    con = sqlite3.connect(db)
    try:
        points = con.execute(
            "SELECT value FROM metrics WHERE case_name = 'tico' AND metric = ? ORDER BY run_id",
            ("wrappers_branches_percent",),
        ).fetchall()
    finally:
        con.close()
    assert [p[0] for p in points] == [42.0, 42.0, 42.1, 42.0, 30.0]
    con = sqlite3.connect(db)
    try:
        reachable = con.execute(
            "SELECT value FROM metrics WHERE case_name = 'tico' AND metric = ? ORDER BY run_id",
            ("wrappers_reachable_branches_percent",),
        ).fetchall()
    finally:
        con.close()
    assert [p[0] for p in reachable] == [52.0, 52.0, 52.1, 52.0, 40.0]  # the reachable figure, beside it
    con = sqlite3.connect(db)
    try:
        areas = con.execute(  # each converter area is a series of its own; the wrappers' is the scope's
            "SELECT metric, value FROM metrics WHERE case_name = 'tico' AND metric LIKE '%passes%' ORDER BY run_id"
        ).fetchall()
        wrappers_area = con.execute("SELECT COUNT(*) FROM metrics WHERE metric LIKE 'wrappers_branches%'").fetchone()
    finally:
        con.close()
    assert areas == [("passes_branches_percent", 70.0 - day) for day in range(1, 6)] and wrappers_area == (5,)
    summary = dashboard.dashboard(db, tmp_path / "d.html")
    assert any(
        e["case"] == "tico" and e["metric"] == "wrappers_branches_percent" for e in summary["regression_entries"]
    )
