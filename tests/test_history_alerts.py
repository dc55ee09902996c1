"""The nightly dashboard alerts (issue #21): ``--fail-on-regression``, ``--summary-md``,
acknowledged expected changes (and stale acknowledgements), and what moved where a change
started -- a dependency bump told apart from a commit. On a synthetic history built from
tests/report_fixture.py's results_doc."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.commands import history as history_command
from harness.report import alerts, dashboard
from harness.report import history_store as history
from tests.report_fixture import results_doc

REPO = Path(__file__).resolve().parents[1]
C1, C2 = "1111111aaaaaaa", "2222222bbbbbbb"
PEIR = ("good_case", "tiny", "quant_accuracy", "peir")
SQNR = ("good_case", "tiny", "quant_accuracy", "sqnr_db")
STEPS = ("good_case", "tiny", "circle_replay", "fake_quantize_max_steps")


def _doc(commit: str, day: int, tico: str, peir: float = 0.05, sqnr: float = 30.0, steps: float = 1.0) -> dict:
    doc = results_doc(commit=commit, peir=peir, started=f"2026-11-{day:02d}T02:00:00Z")
    doc["run"]["versions"]["tico"] = tico
    for rec in doc["results"]:
        if rec["nodeid"] == "cases/fixture.py::good_case::quant_accuracy[tiny]":
            rec["metrics"]["sqnr_db"] = sqnr
        if rec["nodeid"] == "cases/fixture.py::good_case::circle_replay[tiny]":
            rec["metrics"]["fake_quantize_max_steps"] = steps
    return doc


@pytest.fixture
def db(tmp_path) -> Path:
    """Runs 1-3: commit C1 on tico 0.3.0. Run 4: the same commit on tico 0.3.1, Circle steps
    1 -> 3 (a dependency bump). Run 5: commit C2, PEIR 0.05 -> 0.08 (a regression) and SQNR
    30 -> 24 dB (the change commit C2 was expected to make: acknowledged below)."""
    path = tmp_path / "history.sqlite"
    for day in (1, 2, 3):
        history.append_run(path, _doc(C1, day, "0.3.0"))
    history.append_run(path, _doc(C1, 4, "0.3.1", steps=3.0))
    history.append_run(path, _doc(C2, 5, "0.3.1", peir=0.08, sqnr=24.0, steps=3.0))
    return path


def _acks(tmp_path: Path, *entries: str, name: str = "ack.toml") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(entries))
    return path


ACK_SQNR = f"""[[acknowledged]]
case = "good_case"
check = "quant_accuracy"
metric = "sqnr_db"
commit = "{C2[:8]}"
reason = "int16 mask observer: SQNR moves by design"
link = "https://example.invalid/pr/7"
"""
ACK_STEPS = """[[acknowledged]]
case = "good_case"
profile = "tiny"
check = "circle_replay"
metric = "fake_quantize_*"
run = 4
reason = "tico 0.3.1 rounds Circle requantization differently"
"""
ACK_PEIR = """[[acknowledged]]
case = "good_case"
check = "quant_accuracy"
metric = "peir"
date = 2026-11-05
reason = "accepted: PEIR regression of PR 8, tracked in issue 9"
"""


def _entry(summary: dict, key: tuple, kind: str) -> dict:
    return next(e for e in summary[f"{kind}_entries"] if (e["case"], e["profile"], e["check"], e["metric"]) == key)


def test_regression_acknowledged_change_and_dependency_bump_are_three_different_things(db, tmp_path):
    acks = alerts.load_acknowledgements(_acks(tmp_path, ACK_SQNR))
    summary = dashboard.dashboard(db, tmp_path / "d.html", window=5, margin=0.1, acknowledgements=acks)
    assert summary["regressions"] == [STEPS, PEIR]
    assert summary["acknowledged"] == [SQNR]
    assert summary["stale"] == [] and summary["improvements"] == []

    peir = _entry(summary, PEIR, "regression")
    assert peir["moved"]["text"] == f"commit {C1[:12]} -> {C2[:12]}; versions unchanged"
    assert (peir["moved"]["from_run"], peir["moved"]["to_run"]) == (4, 5) and not peir["moved"]["dependency_bump"]
    assert peir["repro"] == "./scripts/env.sh pytest 'cases/fixture.py::good_case::quant_accuracy[tiny]'"

    steps = _entry(summary, STEPS, "regression")
    assert steps["moved"]["text"] == f"versions moved: tico 0.3.0 -> 0.3.1; same commit {C1[:12]}"
    assert (steps["moved"]["from_run"], steps["moved"]["to_run"]) == (3, 4) and steps["moved"]["dependency_bump"]

    sqnr = _entry(summary, SQNR, "acknowledged")
    assert sqnr["status"] == "acknowledged" and sqnr["ack"]["reason"] == "int16 mask observer: SQNR moves by design"
    assert summary["versions_moved"] == "versions moved: tico 0.3.0 -> 0.3.1"

    html = (tmp_path / "d.html").read_text()
    regressions = html[html.index('id="regressions"') : html.index('id="acknowledged"')]
    acknowledged = html[html.index('id="acknowledged"') : html.index('id="improvements"')]
    assert "peir" in regressions and "fake_quantize_max_steps" in regressions and "sqnr_db" not in regressions
    assert "versions moved: tico 0.3.0 -&gt; 0.3.1; same commit" in regressions
    assert "sqnr_db" in acknowledged and "int16 mask observer" in acknowledged


def test_fail_on_regression_exits_non_zero_only_for_unacknowledged_regressions(db, tmp_path, capsys):
    base = ["dashboard", "--db", str(db), "--out", str(tmp_path / "d.html"), "--window", "5"]
    assert history_command.main(base) == 0  # without the flag the dashboard only reports
    capsys.readouterr()
    both = _acks(tmp_path, ACK_SQNR, ACK_STEPS, name="two.toml")
    assert history_command.main(base + ["--fail-on-regression", "--acknowledged", str(both)]) == 1
    out = capsys.readouterr().out
    flagged = [line for line in out.splitlines() if line.startswith("  REGRESSION")]
    assert flagged == [
        f"  REGRESSION good_case[tiny] quant_accuracy peir: 0.08 vs median 0.05 "
        f"(commit {C1[:12]} -> {C2[:12]}; versions unchanged)"
    ]
    assert "repro: ./scripts/env.sh pytest 'cases/fixture.py::good_case::quant_accuracy[tiny]'" in out
    assert "ACKNOWLEDGED good_case[tiny] circle_replay fake_quantize_max_steps" in out
    assert "ACKNOWLEDGED good_case[tiny] quant_accuracy sqnr_db" in out
    all_three = _acks(tmp_path, ACK_SQNR, ACK_STEPS, ACK_PEIR, name="three.toml")
    assert history_command.main(base + ["--fail-on-regression", "--acknowledged", str(all_three)]) == 0
    assert "0 regressions, 3 acknowledged" in capsys.readouterr().out


def test_an_acknowledgement_covers_the_change_at_its_point_not_a_later_one(db, tmp_path):
    early = ACK_PEIR.replace("date = 2026-11-05", f'commit = "{C1[:7]}"')  # C1 is run 1; PEIR moved at run 5
    acks = alerts.load_acknowledgements(_acks(tmp_path, early))
    summary = dashboard.dashboard(db, tmp_path / "d.html", acknowledgements=acks)
    assert PEIR in summary["regressions"]
    [stale] = summary["stale"]
    assert (
        stale["why"]
        == f"the matching change(s) started at run 5, not at its commit {C1[:7]} (run 1): a different change"
    )


def test_stale_acknowledgements_say_why(db, tmp_path):
    typo = ACK_SQNR.replace('case = "good_case"', 'case = "good_cas"')
    quiet = ACK_SQNR.replace('metric = "sqnr_db"', 'metric = "cosine"')  # cosine did not move
    unknown = ACK_SQNR.replace(f'commit = "{C2[:8]}"', 'commit = "deadbeef"')
    future = ACK_PEIR.replace("2026-11-05", "2026-12-24")
    acks = alerts.load_acknowledgements(_acks(tmp_path, typo, quiet, unknown, future))
    summary = dashboard.dashboard(db, tmp_path / "d.html", acknowledgements=acks)
    why = {s["index"]: s["why"] for s in summary["stale"]}
    assert why == {
        1: "matches no series of the history (check the case, profile, check and metric names)",
        2: "none of its 1 series moved beyond the margin in the latest run (the change is in the baseline now, "
        "or it did not happen): remove the entry",
        3: "commit deadbeef is in no run of the history",
        4: "no run of the history started on or after 2026-12-24",
    }
    assert SQNR in summary["regressions"]  # none of them covers the SQNR change
    assert "Stale acknowledgements (4)" in (tmp_path / "d.html").read_text()


def test_summary_markdown_lists_regressions_then_acknowledged_then_stale(db, tmp_path, capsys):
    acks = _acks(tmp_path, ACK_SQNR, ACK_SQNR.replace('metric = "sqnr_db"', 'metric = "cosine"'))
    md = tmp_path / "summary.md"
    code = history_command.main(
        [
            "dashboard",
            "--db",
            str(db),
            "--out",
            str(tmp_path / "d.html"),
            "--acknowledged",
            str(acks),
            "--summary-md",
            str(md),
            "--fail-on-regression",
        ]
    )
    assert code == 1
    text = md.read_text()
    assert "**2 unacknowledged regression(s)**" in text
    assert "- versions moved: tico 0.3.0 -> 0.3.1 (latest run against its baseline window)" in text
    regressions = text[text.index("### Regressions (2)") : text.index("### Acknowledged (1)")]
    assert "`./scripts/env.sh pytest 'cases/fixture.py::good_case::quant_accuracy[tiny]'`" in regressions
    assert "versions moved: tico 0.3.0 -> 0.3.1; same commit" in regressions
    assert "+60.0%" in regressions
    acknowledged = text[text.index("### Acknowledged (1)") : text.index("### Stale acknowledgements (1)")]
    assert "int16 mask observer: SQNR moves by design ([link](https://example.invalid/pr/7))" in acknowledged
    assert "sqnr_db" in acknowledged and "peir" not in acknowledged
    assert "none of its 1 series moved beyond the margin" in text[text.index("### Stale") :]


def test_improvements_are_not_regressions(tmp_path):
    db = tmp_path / "h.sqlite"
    for day, peir in enumerate((0.05, 0.05, 0.05, 0.02), start=1):
        history.append_run(db, _doc(C1 if day < 4 else C2, day, "0.3.0", peir=peir))
    summary = dashboard.dashboard(db, tmp_path / "d.html")
    assert summary["improvements"] == [PEIR] and summary["regressions"] == []
    assert (
        history_command.main(["dashboard", "--db", str(db), "--out", str(tmp_path / "d.html"), "--fail-on-regression"])
        == 0
    )


def test_default_acknowledgements_file_and_json(db, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = ["dashboard", "--db", str(db), "--out", str(tmp_path / "d.html"), "--fail-on-regression"]
    (tmp_path / "acknowledged.toml").write_text("\n".join((ACK_SQNR, ACK_STEPS, ACK_PEIR)))
    assert history_command.main(args) == 0  # ./acknowledged.toml is read when present
    (tmp_path / "acknowledged.toml").unlink()
    assert history_command.main(args) == 1
    entries = [
        {"case": "good_case", "check": "quant_accuracy", "metric": "*", "run": 5, "reason": "expected"},
        {"case": "good_case", "check": "circle_replay", "metric": "*", "date": "2026-11-04", "reason": "bump"},
    ]
    (tmp_path / "ack.json").write_text(json.dumps({"acknowledged": entries}))
    assert history_command.main(args + ["--acknowledged", str(tmp_path / "ack.json")]) == 0
    assert "0 regressions, 3 acknowledged" in capsys.readouterr().out


@pytest.mark.parametrize(
    "text, message",
    [
        ('[[acknowledged]]\ncase = "a"\ncheck = "b"\nmetric = "c"\nrun = 1\n', "entry 1 (a b c): 'reason' is required"),
        (
            '[[acknowledged]]\ncase = "a"\ncheck = "b"\nmetric = "c"\nreason = "r"\n',
            "give exactly one of run, commit or date -- from which run the change is expected (got none)",
        ),
        (
            '[[acknowledged]]\ncase = "a"\ncheck = "b"\nmetric = "c"\nreason = "r"\nrun = 1\ndate = 2026-11-01\n',
            "(got run, date)",
        ),
        (
            '[[acknowledged]]\ncase = "a"\ncheck = "b"\nmetric = "c"\nreason = "r"\nrun = 1\nmetrc = "x"\n',
            "unknown field(s) metrc",
        ),
        (
            '[[acknowledged]]\ncase = "a"\ncheck = "b"\nmetric = "c"\nreason = "r"\ncommit = "abc"\n',
            "'commit' must be a commit sha or a prefix of at least 7 hex digits, got 'abc'",
        ),
        ('[[acknowledged]\ncase = "a"\n', "cannot be parsed"),
    ],
)
def test_a_bad_acknowledgements_file_exits_2_with_a_message(db, tmp_path, capsys, text, message):
    path = _acks(tmp_path, text)
    assert (
        history_command.main(
            ["dashboard", "--db", str(db), "--out", str(tmp_path / "d.html"), "--acknowledged", str(path)]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert err.startswith(f"history: error: {path}") and message in err


def test_missing_inputs_exit_2(db, tmp_path, capsys):
    assert history_command.main(["dashboard", "--db", str(tmp_path / "none.sqlite")]) == 2
    assert "history database not found" in capsys.readouterr().err
    assert not (tmp_path / "none.sqlite").exists()  # not created empty as a side effect
    assert history_command.main(["dashboard", "--db", str(db), "--acknowledged", str(tmp_path / "nope.toml")]) == 2
    assert f"acknowledgements file not found: {tmp_path / 'nope.toml'}" in capsys.readouterr().err


def test_the_committed_acknowledgements_file_and_its_example_are_valid(tmp_path):
    path = REPO / alerts.DEFAULT_FILE
    assert isinstance(alerts.load_acknowledgements(path), list)  # raises AckError on a bad entry
    # the commented example, uncommented, is one valid entry
    lines = path.read_text().splitlines()
    example = [line[2:] for line in lines[lines.index("# [[acknowledged]]") :] if line.startswith("# ")]
    [entry] = alerts.load_acknowledgements(_acks(tmp_path, *example))
    assert (entry.case, entry.profile, entry.metric, entry.commit) == (
        "llama_attention_prefill",
        "tiny",
        "peir",
        "0123abc",
    )
