"""A check added from outside harness/ -- settings, a metric and a report fragment in one
plugin module -- reaches the matrix, the terminal summary, results.json, the HTML report and
the history, without editing the harness (issue #17's "a new check is one file")."""

from __future__ import annotations

import json
import sqlite3
import textwrap

import pytest

from harness.report import dashboard
from tests import preloaded_python
from tests.test_plugin import INI, TOY_CASES

TOY_CHECK_PLUGIN = """
from dataclasses import dataclass

import torch

from harness import Check, CheckResult, Metric


@dataclass(frozen=True)
class Settings:
    max_abs: float = 100.0


def run(pipeline):
    result = CheckResult()
    settings = pipeline.check_settings(CHECK)
    value = float(pipeline.output("quant", "default").abs().max())
    result.metrics["output_abs_max"] = value
    result.gate("quantized output |max|", value, settings.max_abs)
    return result


CHECK = Check(
    name="toy_output_range",
    run=run,
    description="quantized output magnitude stays within the case's limit",
    settings=Settings,
    metrics=(Metric("output_abs_max", label="out |max|", limit="max_abs", headline=True),),
    report="<p class='toy-fragment'>toy range: {{ rec.metrics.get('output_abs_max') | num }} "
           "&le; {{ rec.settings.max_abs | num }}</p>",
)


def pytest_wrapq_checks(config):
    return [CHECK]
"""

STRICT_CASE = """
from cases.toy import build_linear
from harness import Case

CASES = [Case(name="toy_strict", family="nn", build=build_linear,
              settings={"toy_output_range": {"max_abs": 1e-9}})]
"""


@pytest.fixture
def toy_project(pytester):
    pytester.makeini(INI)
    cases = pytester.mkpydir("cases")
    (cases / "toy.py").write_text(textwrap.dedent(TOY_CASES))
    (cases / "strict.py").write_text(textwrap.dedent(STRICT_CASE))
    (pytester.path / "toy_check_plugin.py").write_text(textwrap.dedent(TOY_CHECK_PLUGIN))
    return pytester


def test_a_plugin_check_runs_everywhere_without_editing_the_harness(toy_project):
    result = preloaded_python.runpytest(
        toy_project, "-p", "toy_check_plugin", "-k", "toy_output_range", "--profile", "tiny"
    )
    # toy_linear passes with the default limit; toy_strict's own setting fails it; the two
    # unavailable toy cases skip with their reasons.
    result.assert_outcomes(passed=1, failed=1, skipped=2)
    out = result.stdout.str()
    assert "toy_output_range failed for toy_strict[tiny]:" in out
    assert "quantized output |max|" in out and "exceeds threshold 1e-09" in out
    summary = out[out.index("wrapq summary") :]
    assert "out |max|" in summary and "toy_output_range" in summary  # its column and its headline metric

    doc = json.loads((toy_project.path / "reports" / "results.json").read_text())
    declared = doc["run"]["checks"]["toy_output_range"]
    assert declared["metrics"][0]["name"] == "output_abs_max" and declared["metrics"][0]["headline"] is True
    records = {r["case"]: r for r in doc["results"] if r["check"] == "toy_output_range"}
    assert records["toy_linear"]["settings"] == {"max_abs": 100.0}
    assert records["toy_strict"]["settings"] == {"max_abs": 1e-9}
    value = records["toy_linear"]["metrics"]["output_abs_max"]
    assert value > 0

    html = (toy_project.path / "reports" / "report.html").read_text()
    assert "<th>out |max|</th>" in html
    assert "<p class='toy-fragment'>toy range: " in html and "&le; 1e-09</p>" in html

    from harness.report import history_store as history

    db = toy_project.path / "history.sqlite"
    history.append_run(db, doc)
    with sqlite3.connect(db) as con:
        rows = con.execute(
            "SELECT case_name, metric, better FROM metrics WHERE check_name = 'toy_output_range'"
        ).fetchall()
    assert sorted(rows) == [("toy_linear", "output_abs_max", "lower"), ("toy_strict", "output_abs_max", "lower")]
    summary = dashboard.dashboard(db, toy_project.path / "dashboard.html")
    assert summary["series"] >= 2


def test_a_setting_the_check_does_not_declare_is_a_definition_error(toy_project):
    (toy_project.path / "cases" / "strict.py").write_text(
        textwrap.dedent(STRICT_CASE).replace('"max_abs"', '"max_abz"')
    )
    result = preloaded_python.runpytest(toy_project, "-p", "toy_check_plugin", "-k", "strict")
    result.assert_outcomes(failed=1)
    assert (
        "case 'toy_strict': field \"settings['toy_output_range']\": toy_output_range has no setting 'max_abz' "
        "(settings: max_abs)"
    ) in result.stdout.str()


def test_without_the_plugin_its_settings_name_no_check(toy_project):
    result = preloaded_python.runpytest(toy_project, "-k", "strict")
    result.assert_outcomes(failed=1)
    assert "case 'toy_strict': field 'settings': names no check: toy_output_range" in result.stdout.str()


def test_a_case_stating_no_replay_limits_is_held_to_the_arithmetic_floor():
    """A case that states no circle_replay limits (e.g. an algorithm case whose settings replace
    its base's) is gated at one rounding flip and 0.1 mean step, never left ungated."""
    import dataclasses

    from harness.checks.circle_replay import CHECK as CIRCLE
    from harness.checks.circle_replay import MEAN_STEPS_FLOOR, ROUNDING_FLIP_STEPS
    from harness.model.check_settings import resolve
    from tests.test_profile_limits import LINEAR

    unstated = resolve(CIRCLE, dataclasses.replace(LINEAR, settings={}), "tiny")
    assert (unstated.max_steps, unstated.mean_steps) == (ROUNDING_FLIP_STEPS, MEAN_STEPS_FLOOR) == (1.0, 0.1)


def test_settings_resolve_defaults_then_case_then_profile():
    import dataclasses

    from harness import ProfileLimits, merged_settings
    from harness.checks import all_checks
    from harness.checks.circle_replay import CHECK as CIRCLE
    from harness.model.check_settings import resolve, validate
    from tests.test_profile_limits import LINEAR

    case = dataclasses.replace(
        LINEAR,
        profiles=("tiny", "wide"),
        settings=merged_settings(LINEAR.settings, circle_replay={"mean_steps": 0.3}),
        profile_limits={"wide": ProfileLimits({"circle_replay": {"max_steps": 7.0}}, source="measured")},
    )
    tiny, wide = resolve(CIRCLE, case, "tiny"), resolve(CIRCLE, case, "wide")
    assert (tiny.max_steps, tiny.mean_steps, tiny.native_max_steps) == (
        LINEAR.settings["circle_replay"]["max_steps"],
        0.3,
        None,
    )  # the check's default where nobody says
    assert (wide.max_steps, wide.mean_steps) == (7.0, 0.3)
    assert LINEAR.settings["circle_replay"]["mean_steps"] != 0.3  # merged_settings copied, never mutated
    assert validate(case, all_checks()) == []
    bad = dataclasses.replace(LINEAR, settings={"golden": {"float_rel": None}, "lifecycle": {"x": 1}})
    messages = [str(e) for e in validate(bad, all_checks())]
    assert any("settings['golden'].float_rel" in m and "must not be None" in m for m in messages)
    assert any("settings['lifecycle']" in m and "the check has no settings" in m for m in messages)


def test_check_declarations_are_checked_when_made():
    from dataclasses import dataclass

    from harness import Check, CheckResult, Metric

    @dataclass(frozen=True)
    class NoDefault:
        limit: float

    with pytest.raises(TypeError, match="every settings field needs a default"):
        Check(name="x", run=lambda p: CheckResult(), settings=NoDefault)

    @dataclass(frozen=True)
    class Limit:
        limit: float = 1.0

    with pytest.raises(TypeError, match="gated by 'limt', which is no field of its settings"):
        Check(name="x", run=lambda p: CheckResult(), settings=Limit, metrics=(Metric("m", limit="limt"),))
    with pytest.raises(ValueError, match="better must be"):
        Metric("m", better="smaller")
