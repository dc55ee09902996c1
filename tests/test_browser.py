"""The HTML report opened in a real headless Chromium (Debian's package; .ci/run installs it):
the script runs without console errors, the overview, a scatter plot and a stack trace are in
the rendered DOM, and hostile text stays text."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from harness.report import dashboard
from harness.report.html import write_report
from tests.report_fixture import results_doc

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--enable-logging=stderr",
    "--v=0",
]


@pytest.fixture
def chromium():
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed; .ci/run must install Debian's chromium package")
        pytest.skip("chromium not installed here (apt-get install chromium); CI installs it and runs this test")
    return CHROMIUM


def test_report_renders_in_headless_chromium(chromium, tmp_path):
    report = write_report(results_doc(), tmp_path / "report.html")
    done = subprocess.run(
        [chromium, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", report.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    dom, log = done.stdout, done.stderr
    console = [line for line in log.splitlines() if ":CONSOLE" in line]
    assert console == [], console
    assert 'data-ready="1"' in dom, "the report's script did not finish"
    assert re.search(r'<p id="js-errors"></p>', dom), "script errors were recorded in the page"
    assert '<table id="overview">' in dom and "good_case" in dom
    assert 'class="scatter"' in dom and 'class="identity"' in dom
    assert 'class="stack-trace"' in dom and "x = x.transpose(1, 2)" in dom
    # The hostile message is rendered as text, never as an element.
    assert "&lt;script&gt;alert('x')&lt;/script&gt;" in dom
    assert "<script>alert" not in dom


def test_an_xfailed_case_shows_its_attribution_in_chromium(chromium, tmp_path):
    """Issue #18: the attribution of every failing or xfailed case is in the report. A real run
    of the check on the case whose mask-add observer is a diagnosed expected failure."""
    from cases.qwen3_vl_text import CASES
    from tests.helpers import run_clean_check
    from tests.report_fixture import record

    case = next(c for c in CASES if c.name == "qwen3_vl_text_attention_prefill")
    result = run_clean_check(case, "attribution")
    doc = results_doc()
    doc["results"].append(
        record(
            case.name,
            "attribution",
            outcome="xfailed",
            message="obs_mask_add (diagnosed)",
            metrics=result.metrics,
            evidence=result.evidence,
            problems=result.problems,
        )
    )
    report = write_report(doc, tmp_path / "report.html")
    done = subprocess.run(
        [chromium, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", report.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout
    assert 'data-ready="1"' in dom and re.search(r'<p id="js-errors"></p>', dom)
    assert "<td>wrapped.obs_mask_add</td>" in dom  # the ranked site table
    assert "<title>wrapped.obs_mask_add: " in dom  # the bar chart
    assert "Per wrapped submodule" in dom and "<td>wrapped.q_proj.wrapped</td>" in dom


DASHBOARD_BUDGET = (
    2_000_000  # bytes: 50 cases x 3 profiles x 30 nights (1800 series), every value jittered; measured 1.55 MB
)


def test_dashboard_overview_and_an_expanded_chart_render_in_chromium(chromium, tmp_path):
    """Issue #21: 30 synthetic nights x a 50-case set in five families x 3 profiles, with one
    regression after a commit, one acknowledged change and one dependency bump. Opened with a
    URL fragment naming the regression's series, whose chart the page builds on load."""
    from harness.report import alerts
    from tests import dashboard_fixture as fx

    db = fx.build(tmp_path / "h.sqlite", cases=50, nights=30, noisy=True)
    (tmp_path / "ack.toml").write_text(fx.ack_toml())
    out = tmp_path / "dashboard.html"
    summary = dashboard.dashboard(db, out, acknowledgements=alerts.load_acknowledgements(tmp_path / "ack.toml"))
    assert summary["regressions"] == [fx.BUMP, fx.REGRESSION] and summary["acknowledged"] == [fx.ACKNOWLEDGED]
    size = out.stat().st_size
    assert size < DASHBOARD_BUDGET, f"dashboard is {size} bytes (budget {DASHBOARD_BUDGET})"
    regression = next(e for e in summary["regression_entries"] if e["metric"] == "peir")
    done = subprocess.run(
        [
            chromium,
            *FLAGS,
            f"--user-data-dir={tmp_path / 'profile'}",
            "--dump-dom",
            f"{out.as_uri()}#s{regression['index']}",
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
    assert console == [], console
    assert 'data-ready="1"' in dom and re.search(r'<p id="js-errors"></p>', dom), "the dashboard's script failed"

    # the overview comes first: heat map, then families, then the alert lists, then the table
    positions = [
        dom.index(marker)
        for marker in (
            '<table class="heatmap" id="heatmap-0"',
            '<table id="families"',
            '<ul id="regressions"',
            '<table id="series"',
        )
    ]
    assert positions == sorted(positions)
    heatmap = dom[positions[0] : positions[1]]
    assert heatmap.count('data-st="') == summary["series"]
    cells = re.findall(
        r'<a href="#s\d+" class="(\w+)" data-st="(\w+)"(?: data-cause="(\w+)")? title="([^"]*)">(.?)</a>', heatmap
    )
    flagged = {(st, cause, glyph): title for cls, st, cause, title, glyph in cells if st != "ok"}
    # the three are three different things, in the heat map and in the lists
    commit_title = flagged[("regressed", "commit", "!")]
    bump_title = flagged[("regressed", "dependency", "D")]
    ack_title = flagged[("acknowledged", "commit", "A")]
    assert len(flagged) == 3
    assert "llama_case_00 [tiny] quant_accuracy peir" in commit_title and re.search(
        r"; \+(59|60)\.\d%; \+\d+\.\d x noise", commit_title
    )
    assert "versions moved: tico 0.3.0 -&gt; 0.3.1; same commit" in bump_title
    assert "acknowledged: int16 mask observer" in ack_title
    regressions = dom[dom.index('<ul id="regressions"') : dom.index('<ul id="acknowledged"')]
    assert regressions.count('data-cause="dependency"') == 1 and regressions.count('data-cause="commit"') == 1
    assert '<span class="cause dependency">dependency bump</span>' in regressions
    assert "qwen3_vl_case_01" in dom[dom.index('<ul id="acknowledged"') : dom.index('<ul id="improvements"')]
    families = dom[positions[1] : positions[2]]
    assert families.count("<tr") == 1 + len(fx.FAMILIES)

    # one sparkline per series; exactly one detailed chart, the one the fragment named, built in the DOM
    assert dom.count('<svg class="spark') == summary["series"]
    assert dom.count('<svg class="chart"') == 1
    chart = dom[dom.index(f'<tr class="chart-row" data-chart="{regression["index"]}"') :]
    chart = chart[: chart.index("</tr>")]
    assert 'aria-label="llama_case_00 [tiny] quant_accuracy peir"' in chart
    assert chart.count("<circle") == 30 and 'class="trendline"' in chart and 'class="baseline"' in chart
    assert 'class="version-move"' in chart and "tico 0.3.0 -&gt; 0.3.1" in chart
    assert re.search(r'<details data-s="%d" open="">' % regression["index"], dom)


def test_the_overview_of_the_whole_matrix_fits_a_1400_px_window(chromium, tmp_path):
    """Every case row of a run as wide as the matrix (its headline metrics included), with the
    failing case's section open and the passing ones collapsed, skips one line per case."""
    doc = results_doc()
    template = doc["results"][0]
    names = ["gemma4_text_decoder_layer_sliding_prefill", "qwen3_vl_vision_patch_merger", "llama_for_causal_lm"]
    for i, name in enumerate(names * 10):
        doc["results"].append(
            dict(template, case=f"{name}_{i}", nodeid=f"cases/x.py::{name}_{i}::noquant_parity[tiny]")
        )
    report = write_report(doc, tmp_path / "report.html")
    done = subprocess.run(
        [
            chromium,
            *FLAGS,
            "--window-size=1400,1000",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--dump-dom",
            report.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    width = re.search(r'data-overview-width="(\d+)"', done.stdout)
    assert width and int(width.group(1)) <= 1400, width.group(0) if width else done.stdout[:500]
    assert re.search(r'<details class="case" id="[^"]+" open="">', done.stdout)  # the failing case is open
