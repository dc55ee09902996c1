"""HTML report, shard merge and history dashboard, from synthetic and real results."""

from __future__ import annotations

import json
import re
import sqlite3

import pytest

from harness.commands import history as history_command
from harness.commands import merge as merge_command
from harness.report import dashboard
from harness.report import history_store as history
from harness.report import shard_merge as merge
from harness.report.html import case_rows, render_report
from tests.report_fixture import HOSTILE, results_doc


def test_report_has_overview_plot_and_stack_trace():
    html = render_report(results_doc())
    assert '<table id="overview">' in html
    assert 'class="scatter"' in html and 'class="identity"' in html  # fp-vs-quant with the y=x line
    assert 'class="histogram"' in html
    assert '<pre class="stack-trace">File &#34;wrapper.py&#34;, line 12, in forward' in html
    assert "./scripts/env.sh pytest cases/fixture.py::good_case<" in html  # a green row: its case
    assert "./scripts/env.sh pytest &#39;cases/fixture.py::bad_case::quant_accuracy[tiny]&#39;" in html  # red: items
    assert "http://" not in html.replace("http://www.w3.org/2000/svg", "") and "https://" not in html


def test_report_escapes_everything_users_type():
    html = render_report(results_doc())
    assert HOSTILE not in html
    assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in html
    # The only script element is the report's own.
    assert len(re.findall(r"<script>", html)) == 1


def test_failures_sort_first():
    rows = case_rows(results_doc())
    assert rows[0]["case"] == "bad_case" and rows[0]["status"] == "failed"


def test_merge_of_two_shards_equals_one_run():
    whole = results_doc()
    a, b = results_doc(), results_doc()
    a["results"], b["results"] = whole["results"][:3], whole["results"][3:]
    merged = merge.merge([a, b])
    assert merged["results"] == sorted(whole["results"], key=lambda r: r["nodeid"])
    assert merged["run"]["counts"] == whole["run"]["counts"]
    assert render_report(merged).count("<tr data-family=") == render_report(whole).count("<tr data-family=")


def test_merge_refuses_mixed_commits_and_duplicates():
    a, b = results_doc(commit="aaa"), results_doc(commit="bbb")
    b["results"] = []
    with pytest.raises(merge.MergeError, match="shards differ in commit"):
        merge.merge([a, b])
    assert merge.merge([a, b], allow_mixed=True)["run"]["counts"] == a["run"]["counts"]
    c = results_doc()
    c["run"]["golden_set"] = "other"
    with pytest.raises(merge.MergeError, match="golden_set"):
        merge.merge([results_doc(), c])
    with pytest.raises(merge.MergeError, match="appears in shard 0 and shard 1"):
        merge.merge([results_doc(), results_doc()])


def test_merge_refuses_shards_from_different_testbeds():
    a, b = results_doc(), results_doc()
    a["results"], b["results"] = a["results"][:2], b["results"][2:]
    a["run"]["platform"] = {"cpu": "Xeon", "cpu_capability": "AVX512", "torch_threads": 1}
    b["run"]["platform"] = {"cpu": "Xeon", "cpu_capability": "DEFAULT", "torch_threads": 1}
    with pytest.raises(merge.MergeError, match="different testbeds.*capability AVX512.*capability DEFAULT"):
        merge.merge([a, b])
    mixed = merge.merge([a, b], allow_mixed=True)
    assert mixed["run"]["platform"] is None  # no one testbed to file the numbers under
    assert [m["platform"]["cpu_capability"] for m in mixed["run"]["merged_from"]] == ["AVX512", "DEFAULT"]
    b["run"]["platform"] = dict(a["run"]["platform"])
    assert merge.merge([a, b])["run"]["platform"] == a["run"]["platform"]


def test_merge_cli_writes_results_and_report(tmp_path):
    whole = results_doc()
    a, b = results_doc(), results_doc()
    a["results"], b["results"] = whole["results"][:2], whole["results"][2:]
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    out = tmp_path / "merged" / "results.json"
    code = merge_command.main([str(tmp_path / "a.json"), str(tmp_path / "b.json"), "-o", str(out)])
    assert code == 1  # the fixture run has a failure; the merged exit status says so
    assert len(json.loads(out.read_text())["results"]) == len(whole["results"])
    assert (out.parent / "report.html").exists()


def test_history_flags_a_regression_after_three_runs(tmp_path):
    db = tmp_path / "history.sqlite"
    for i, peir in enumerate((0.050, 0.051, 0.080)):
        history.append_run(db, results_doc(peir=peir, started=f"2026-11-0{i + 1}T00:00:00Z"))
    out = tmp_path / "dashboard.html"
    summary = dashboard.dashboard(db, out, window=5, margin=0.1)
    assert summary["runs"] == 3
    assert ("good_case", "tiny", "quant_accuracy", "peir") in summary["regressions"]
    assert ("good_case", "tiny", "quant_accuracy", "sqnr_db") not in summary["regressions"]
    html = out.read_text()
    assert "REGRESSED" in html and 'class="trendline"' in html


def test_history_stable_metrics_are_not_flagged(tmp_path):
    db = tmp_path / "h.sqlite"
    for peir in (0.05, 0.05, 0.052):
        history.append_run(db, results_doc(peir=peir))
    assert dashboard.dashboard(db, tmp_path / "d.html")["regressions"] == []


def test_history_stores_hostile_names_verbatim(tmp_path):
    db = tmp_path / "h.sqlite"
    doc = results_doc()
    doc["results"][0]["case"] = "x'); DROP TABLE runs; --"
    history.append_run(db, doc)
    con = sqlite3.connect(db)
    assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 1
    assert (
        con.execute("SELECT case_name FROM metrics WHERE case_name LIKE 'x%'").fetchone()[0]
        == doc["results"][0]["case"]
    )


def test_history_cli(tmp_path, capsys):
    results = tmp_path / "results.json"
    results.write_text(json.dumps(results_doc()))
    db = tmp_path / "h.sqlite"
    assert history_command.main(["append", str(results), "--db", str(db)]) == 0
    assert history_command.main(["dashboard", "--db", str(db), "--out", str(tmp_path / "d.html")]) == 0
    assert "1 runs" in capsys.readouterr().out
