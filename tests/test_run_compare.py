"""``python -m harness compare BASE HEAD`` (issue #21: PR comparison): verdict changes first,
then moves of declared metrics beyond the margin, each with its repro command; different
stacks refused; exit 0 / 1 / 2. On synthetic docs (tests/report_fixture.py) and on a small real
run whose copy is seeded with a defect."""

from __future__ import annotations

import copy
import json
import os
import re
import sys
from pathlib import Path

import pytest

from harness.__main__ import main
from harness.records import rerun
from harness.report import comparison_report, run_compare
from tests import preloaded_python
from tests.report_fixture import HOSTILE, results_doc

REPO = Path(__file__).resolve().parents[1]
GOLDEN = "cases/fixture.py::good_case::golden[tiny]"
ACCURACY = "cases/fixture.py::good_case::quant_accuracy[tiny]"


def _write(path: Path, doc: dict) -> str:
    path.write_text(json.dumps(doc))
    return str(path)


def _record(doc: dict, nodeid: str) -> dict:
    return next(r for r in doc["results"] if r["nodeid"] == nodeid)


def _seeded(doc: dict, flip: str, peir_factor: float = 1.6) -> dict:
    """A copy of ``doc`` with one verdict flipped to failed and a worse PEIR on another item."""
    head = copy.deepcopy(doc)
    rec = _record(head, flip)
    rec["outcome"], rec["message"] = "failed", "- seeded: golden output drifted by 3 steps"
    acc = next(r for r in head["results"] if r.get("check") == "quant_accuracy" and r["outcome"] == "passed")
    acc["metrics"]["peir"] *= peir_factor
    return head


def test_identical_runs_exit_0(tmp_path, capsys):
    doc = results_doc()
    assert main(["compare", _write(tmp_path / "a.json", doc), _write(tmp_path / "b.json", doc)]) == 0
    out = capsys.readouterr().out
    assert "nothing got worse" in out and "0 verdict change(s), 0 metric move(s)" in out


def test_seeded_defect_lists_changed_items_first_with_repro_and_exits_1(tmp_path, capsys):
    base = results_doc(peir=0.05)
    head = _seeded(base, GOLDEN)
    md, html = tmp_path / "cmp.md", tmp_path / "cmp.html"
    code = main(
        [
            "compare",
            _write(tmp_path / "base.json", base),
            _write(tmp_path / "head.json", head),
            "--markdown",
            str(md),
            "--html",
            str(html),
        ]
    )
    assert code == 1
    out = capsys.readouterr().out
    assert "WORSE: 1 verdict(s) regressed, 1 metric(s) worse by more than 10%" in out
    # verdict changes before metric moves; each row carries the command that reruns the item
    verdicts, metrics = out.index("verdict changes:"), out.index("metric moves beyond 10%:")
    assert verdicts < metrics
    verdict_part, metric_part = out[verdicts:metrics], out[metrics:]
    assert GOLDEN in verdict_part and "passed -> failed (regressed)" in verdict_part
    assert rerun.command(GOLDEN) in verdict_part
    assert "seeded: golden output drifted by 3 steps" in verdict_part
    peir_row = next(line for line in metric_part.splitlines() if ACCURACY in line and " peir " in line)
    assert peir_row.startswith("WORSE") and "+60.0%" in peir_row and "lower is better" in peir_row
    assert rerun.command(ACCURACY) in peir_row
    # nothing else moved: the other metrics and items are not listed
    assert metric_part.count("WORSE") == 1 and "sqnr_db" not in metric_part
    text = md.read_text()
    assert text.index("### Verdict changes") < text.index(f"`{GOLDEN}`") < text.index("### Metric moves beyond 10%")
    assert f"`{rerun.command(ACCURACY)}`" in text
    page = html.read_text()
    assert "default-src 'none'" in page and page.index('id="verdicts"') < page.index('id="metrics"')
    assert rerun.command(GOLDEN).replace("'", "&#39;") in page


def test_direction_comes_from_the_declarations(tmp_path):
    base = results_doc()
    head = copy.deepcopy(base)
    acc = _record(head, ACCURACY)["metrics"]
    acc["sqnr_db"] = 40.0  # higher is better: +33% is an improvement
    acc["mean_abs_diff"] = 0.0105  # +5%: inside the 10% margin
    acc["max_abs_diff"] = 0.05  # lower is better: -50% is an improvement
    cmp = run_compare.compare(base, head)
    moves = {m.metric: m.kind for m in cmp.metrics}
    assert moves == {"sqnr_db": "better", "max_abs_diff": "better"}
    assert not cmp.got_worse()
    acc["sqnr_db"] = 20.0  # -33%: worse
    cmp = run_compare.compare(base, head)
    assert [m.metric for m in cmp.worse_metrics] == ["sqnr_db"] and cmp.got_worse()
    # a tighter margin reports the 5% move too; a metric no check declares with a direction is never listed
    _record(head, ACCURACY)["metrics"]["undeclared_thing"] = 1e6
    _record(base, ACCURACY)["metrics"]["undeclared_thing"] = 1.0
    moved = {m.metric for m in run_compare.compare(base, head, margin=0.01).metrics}
    assert "mean_abs_diff" in moved and "undeclared_thing" not in moved


def test_non_finite_values_compare_by_direction():
    assert run_compare.metric_move(30.0, float("inf"), "higher", 0.1, 1e-9) == "better"
    assert run_compare.metric_move(float("inf"), 30.0, "higher", 0.1, 1e-9) == "worse"
    assert run_compare.metric_move(0.1, float("nan"), "lower", 0.1, 1e-9) == "worse"
    assert run_compare.metric_move(float("inf"), float("inf"), "higher", 0.1, 1e-9) is None
    base = results_doc()
    head = copy.deepcopy(base)
    _record(base, ACCURACY)["metrics"]["sqnr_db"] = "inf"  # results.json writes non-finite floats as strings
    cmp = run_compare.compare(base, head)
    assert [(m.metric, m.kind) for m in cmp.metrics] == [("sqnr_db", "worse")]


@pytest.mark.parametrize(
    "before, after, kind, label",
    [
        ("passed", "failed", "worse", "passed -> failed (regressed)"),
        ("xfailed", "failed", "worse", "xfail -> fail"),
        ("passed", "xfailed", "worse", "passed -> xfail"),
        ("passed", "skipped", "worse", "passed -> skipped (no longer checked)"),
        (None, "error", "worse", "new failure (error)"),
        ("failed", "passed", "better", "failed -> passed (fixed)"),
        ("failed", "xfailed", "better", "fail -> xfail"),
        ("xfailed", "passed", "better", "xfail -> passed"),
        (None, "passed", "changed", "new item (passed)"),
        ("passed", None, "changed", "removed item (was passed)"),
        ("failed", "error", "changed", "failed -> error (still failing)"),
    ],
)
def test_verdict_transitions(before, after, kind, label):
    assert run_compare.classify(before, after)[0] == kind
    assert run_compare.classify(before, after)[1].startswith(label)
    assert run_compare.classify(before, before) is None


def test_new_and_removed_items_and_ordering():
    base = results_doc()
    head = copy.deepcopy(base)
    removed = head["results"].pop(3)  # good_case golden
    head["results"].append(
        {
            **copy.deepcopy(removed),
            "nodeid": "cases/fixture.py::new_case::golden[tiny]",
            "case": "new_case",
            "outcome": "failed",
            "message": "E   AssertionError: boom",
        }
    )
    _record(head, "cases/fixture.py::bad_case::quant_accuracy[tiny]")["outcome"] = "passed"
    cmp = run_compare.compare(base, head)
    assert [(v.kind, v.nodeid) for v in cmp.verdicts] == [
        ("worse", "cases/fixture.py::new_case::golden[tiny]"),
        ("better", "cases/fixture.py::bad_case::quant_accuracy[tiny]"),
        ("changed", removed["nodeid"]),
    ]
    assert cmp.verdicts[0].message == "AssertionError: boom"


def test_an_item_red_on_both_sides_is_worse_where_the_head_has_a_new_problem():
    """Red on the base says nothing about what the head did to the item: a problem the base run did not
    have (numbers, paths and line numbers aside) is the change's, named; the same problems are not."""
    base = results_doc()
    rec = _record(base, GOLDEN)
    rec["outcome"], rec["problems"] = "failed", ["output drifted by 3 steps at /a/tico/x.py:12"]
    same = copy.deepcopy(base)
    _record(same, GOLDEN)["problems"] = ["output drifted by 7 steps at /b/tico/x.py:40"]
    assert not run_compare.compare(base, same).verdicts
    head = copy.deepcopy(base)
    _record(head, GOLDEN)["problems"].append("circle_structure: ADD 2 -> 3 in QuantLlamaAttention")
    (verdict,) = run_compare.compare(base, head).verdicts
    assert verdict.kind == "worse" and verdict.label == "failed -> failed (still failing, with a new problem)"
    assert verdict.message == "circle_structure: ADD 2 -> 3 in QuantLlamaAttention"
    # judged against this base with --baseline: a failure the base had the same way is not a change
    pre = copy.deepcopy(base)
    _record(pre, GOLDEN).update(outcome="xfailed", baseline="pre-existing")
    assert not run_compare.compare(base, pre).verdicts


def test_runs_recorded_with_the_older_node_ids_compare_item_by_item():
    base = results_doc()
    for rec in base["results"]:
        parts = rec["nodeid"].split("::")
        if len(parts) == 3 and "[" in parts[2]:  # back to file::case[profile]::check
            check, label = parts[2][:-1].split("[")
            rec["nodeid"] = f"{parts[0]}::{parts[1]}[{label}]::{check}"
    head = _seeded(results_doc(), GOLDEN)
    comparison = run_compare.compare(base, head)
    assert comparison.items_both == comparison.items_head
    assert [v.nodeid for v in comparison.worse_verdicts] == [GOLDEN]


def test_fail_on_chooses_what_counts(tmp_path):
    base = results_doc()
    only_metric = copy.deepcopy(base)
    _record(only_metric, ACCURACY)["metrics"]["peir"] *= 2
    b, h = _write(tmp_path / "b.json", base), _write(tmp_path / "h.json", only_metric)
    assert main(["compare", b, h]) == 1
    assert main(["compare", b, h, "--fail-on", "verdict"]) == 0
    assert main(["compare", b, h, "--fail-on", "metric"]) == 1
    assert main(["compare", b, h, "--fail-on", "none"]) == 0
    only_verdict = copy.deepcopy(base)
    _record(only_verdict, GOLDEN)["outcome"] = "failed"
    h2 = _write(tmp_path / "h2.json", only_verdict)
    assert main(["compare", b, h2, "--fail-on", "metric"]) == 0
    assert main(["compare", b, h2, "--fail-on", "verdict"]) == 1


def test_version_mismatch_is_refused_with_the_versions_named(tmp_path, capsys):
    base = results_doc()
    head = copy.deepcopy(base)
    head["run"]["versions"]["tico"] = "0.3.1"
    head["run"]["versions"]["transformers"] = "5.24.0"  # recorded only in head
    b, h = _write(tmp_path / "b.json", base), _write(tmp_path / "h.json", head)
    assert main(["compare", b, h]) == 2
    err = capsys.readouterr().err
    assert "refusing to compare runs on different pinned stacks" in err
    assert "transformers not recorded -> 5.24.0" in err and "tico" not in err  # tico is what a PR changes
    assert "--allow-version-mismatch" in err
    assert main(["compare", b, h, "--allow-version-mismatch"]) == 0
    out = capsys.readouterr().out
    assert "versions differ (compared anyway, --allow-version-mismatch): transformers not recorded -> 5.24.0" in out
    assert "the tico under review differs from the base's, as a pull request makes it: tico 0.3.0 -> 0.3.1" in out


def test_a_local_build_label_is_the_same_release():
    base = results_doc()
    head = copy.deepcopy(base)
    head["run"]["versions"]["torch"] = "2.13.0+cpu"
    assert run_compare.compare(base, head).version_diffs == []


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"run": {}, "results": [', "is not valid JSON: Expecting value (line 1, column 25; truncated or corrupt?)"),
        ('{"hello": 1}', "is not a wrapq results.json"),
        ('{"run": {}, "results": [{"nodeid": "x"}]}', "results[0] is not an item record"),
        (b"\xff\xfe{", "is not UTF-8 text"),
    ],
)
def test_corrupt_input_exits_2_with_a_message(tmp_path, capsys, content, message):
    good = _write(tmp_path / "good.json", results_doc())
    bad = tmp_path / "bad.json"
    bad.write_bytes(content if isinstance(content, bytes) else content.encode())
    assert main(["compare", good, str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"compare: error: head file {bad}") and message in err


def test_missing_file_exits_2(tmp_path, capsys):
    good = _write(tmp_path / "good.json", results_doc())
    assert main(["compare", str(tmp_path / "nope.json"), good]) == 2
    assert f"compare: error: base file not found: {tmp_path / 'nope.json'}" in capsys.readouterr().err
    assert main(["compare", good]) == 2  # argparse usage error: also bad input


def test_hostile_names_are_escaped(tmp_path):
    base = results_doc()
    head = copy.deepcopy(base)
    weird = next(r for r in head["results"] if HOSTILE in r["case"])
    weird["outcome"], weird["message"] = "failed", f"- problem {HOSTILE} | pipe"
    cmp = run_compare.compare(base, head)
    html = comparison_report.render_html(cmp)
    assert HOSTILE not in html and "&lt;script&gt;" in html
    md = comparison_report.render_markdown(cmp)
    assert "<script" not in re.sub(r"`[^`]*`", "", md)  # no raw HTML outside code spans
    assert "problem &lt;script>alert" in md and "\\| pipe" in md
    # the node id stays in a code span, where markdown shows it literally
    assert f"`{weird['nodeid']}`" in md


# -- a small real run ---------------------------------------------------------------------------
REAL_SELECTION = "nn_linear and (quant_accuracy or golden or noquant_parity)"


@pytest.fixture(scope="module")
def real_results(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("real")
    done = preloaded_python.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:xdist",
            "-k",
            REAL_SELECTION,
            "--sweep",
            "off",
            f"--wrapq-report-dir={out}",
        ],
        cwd=REPO,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    return json.loads((out / "results.json").read_text())


def test_real_runs_compare(real_results, tmp_path, capsys):
    doc = real_results
    nodeids = {r["nodeid"] for r in doc["results"]}
    golden = "cases/nn.py::nn_linear::golden[tiny]"
    accuracy = "cases/nn.py::nn_linear::quant_accuracy[tiny]"
    assert {golden, accuracy} <= nodeids and all(r["outcome"] == "passed" for r in doc["results"])
    base = _write(tmp_path / "base.json", doc)
    assert main(["compare", base, _write(tmp_path / "same.json", copy.deepcopy(doc))]) == 0
    assert "nothing got worse" in capsys.readouterr().out

    head = _seeded(doc, golden, peir_factor=1.25)
    assert main(["compare", base, _write(tmp_path / "head.json", head), "--markdown", str(tmp_path / "c.md")]) == 1
    out = capsys.readouterr().out
    lines = out.splitlines()
    first_row = lines[lines.index("verdict changes:") + 3]
    assert first_row.startswith("WORSE") and golden in first_row and rerun.command(golden) in first_row
    peir_row = next(line for line in lines if accuracy in line and " peir " in line)
    assert "+25.0%" in peir_row and out.index(golden) < out.index(peir_row)
    # the direction came from the real run's declarations, not from the test
    peir_decl = next(m for m in doc["run"]["checks"]["quant_accuracy"]["metrics"] if m["name"] == "peir")
    assert peir_decl["better"] == "lower"

    bumped = copy.deepcopy(doc)
    bumped["run"]["versions"]["transformers"] = "5.24.0"
    assert main(["compare", base, _write(tmp_path / "bumped.json", bumped)]) == 2
    assert f"transformers {doc['run']['versions']['transformers']} -> 5.24.0" in capsys.readouterr().err
    # the tico under review is compared: a pull request's change is a tico change
    reviewed = copy.deepcopy(doc)
    reviewed["run"]["versions"]["tico"] = "0.3.1"
    assert main(["compare", base, _write(tmp_path / "reviewed.json", reviewed)]) == 0
    assert f"tico {doc['run']['versions']['tico']} -> 0.3.1" in capsys.readouterr().out


def test_runs_on_different_testbeds_are_said_to_be(tmp_path):
    from tests.report_fixture import results_doc

    base, head = results_doc(), results_doc()
    platform = {
        "cpu": "Intel Xeon",
        "machine": "x86_64",
        "cpu_capability": "AVX512",
        "blas": "MKL",
        "torch_threads": 1,
        "env": {},
    }
    base["run"]["platform"] = platform
    head["run"]["platform"] = {**platform, "cpu_capability": "DEFAULT"}
    text = comparison_report.render_text(run_compare.compare(base, head))
    assert (
        "testbeds differ (metric moves may come from the machine, not the commit): cpu_capability 'AVX512' -> 'DEFAULT'"
        in text
    )
    head["run"]["platform"] = platform
    assert "testbeds differ" not in comparison_report.render_text(run_compare.compare(base, head))
