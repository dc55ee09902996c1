"""Per-profile limits: a case states, per profile, the limits it gates and where they come
from; a profile without them says so in its results; the proposer derives limits from
measured clean runs (worst over kernel selections plus a stated margin) for review."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from cases.nn import CASES as NN_CASES
from harness.checks import all_checks, describe_checks
from harness.checks.quant_accuracy import CHECK as QUANT_ACCURACY
from harness.model import limits_data
from harness.model.case import CaseDefinitionError, ProfileLimits
from harness.model.check_settings import validate
from harness.pipeline import Pipeline
from harness.report.limits_proposal import propose, render, write

REPO = Path(__file__).resolve().parents[1]
CHECKS = describe_checks(all_checks())

LINEAR = next(c for c in NN_CASES if c.name == "nn_linear")


def test_a_profile_gets_its_own_limits_and_allowlist():
    case = dataclasses.replace(
        LINEAR,
        profiles=("tiny", "wide"),
        profile_limits={
            "wide": ProfileLimits(
                {"quant_accuracy": {"max_peir": 0.5}},
                source="measured: peir 0.4; 1.25x",
                unused_observers={"obs_x": "never fed at this width"},
            )
        },
    )
    wide = Pipeline(case, "wide").check_settings(QUANT_ACCURACY)
    tiny = Pipeline(case, "tiny").check_settings(QUANT_ACCURACY)
    assert wide.max_peir == 0.5
    # the profile replaces only the field it names; the case's other limits hold on both profiles
    assert wide.max_mean_abs_diff == tiny.max_mean_abs_diff == LINEAR.settings["quant_accuracy"]["max_mean_abs_diff"]
    assert tiny.max_peir == LINEAR.settings["quant_accuracy"]["max_peir"]
    assert case.unused_observers_for("wide") == {"obs_x": "never fed at this width"}
    assert case.unused_observers_for("tiny") == LINEAR.unused_observers
    assert case.limits_source("wide") == "measured: peir 0.4; 1.25x"
    assert validate(case, all_checks()) == []


def test_a_profile_without_limits_says_so():
    case = dataclasses.replace(LINEAR, profiles=("tiny", "wide"))
    assert "no limits stated for profile 'wide'" in case.limits_source("wide")


@pytest.mark.parametrize(
    "limits, field",
    [
        ({"huge": ProfileLimits({}, source="x")}, "profile_limits['huge']"),
        ({"tiny": ProfileLimits({"quant_accuracy": {"max_peir": 0.1}}, source=" ")}, "profile_limits['tiny'].source"),
        ({"tiny": ProfileLimits({"quant_accuracy": 0.1}, source="x")}, "profile_limits['tiny'].settings"),
    ],
)
def test_bad_profile_limits_are_definition_errors(limits, field):
    with pytest.raises(CaseDefinitionError, match=field.replace("[", r"\[").replace("]", r"\]")):
        dataclasses.replace(LINEAR, profile_limits=limits)


def _record(case, check, metrics, profile="wide"):
    return {"case": case, "check": check, "profile": profile, "metrics": metrics}


def test_the_proposer_takes_the_worst_run_and_states_its_margin(tmp_path):
    native = [
        dict(
            _record("c", "quant_accuracy", {"peir": 0.08, "sqnr_db": 20.0, "peir[padded]": 0.09, "mean_abs_diff": 0.5}),
            settings={"max_peir": 0.05, "min_sqnr_db": 25.0, "max_mean_abs_diff": None, "max_abs_diff": None},
        ),
        dict(
            _record(
                "c",
                "circle_replay",
                {
                    "fake_quantize_max_steps": 0.0,
                    "fake_quantize_mean_steps": 0.0,
                    "fake_quantize_as_exported_max_steps": 9.0,
                    "fake_quantize_out1_max_steps": 3.0,
                },
            ),
            settings={
                "max_steps": 1.0,
                "mean_steps": None,
                "extra_max_steps": None,
                "extra_mean_steps": None,
                "native_max_steps": None,
            },
        ),
        _record("c", "quant_accuracy", {"peir": 5.0}, profile="tiny"),
    ]
    scalar = [_record("c", "quant_accuracy", {"peir": 0.1, "sqnr_db": 19.0})]
    proposal = propose([native, scalar], "wide", CHECKS)["c"]
    limits = {field: value[:2] for field, value in proposal.items()}
    assert limits[("quant_accuracy", "max_peir")] == (0.13, 0.1)  # 0.1 x 1.25, rounded up; the tiny run is ignored
    assert limits[("quant_accuracy", "min_sqnr_db")] == (17.5, 19.0)
    assert limits[("circle_replay", "max_steps")] == (1.0, 0.0)  # never below one rounding flip (the metric's floor)
    # the extra outputs need more than the main limit: an extra limit (max steps count flips: the
    # count measured, no headroom); as-exported metrics are not gated
    assert limits[("circle_replay", "extra_max_steps")] == (3.0, 3.0)
    # not gated by the case
    assert ("quant_accuracy", "max_mean_abs_diff") not in limits and ("circle_replay", "mean_steps") not in limits
    doc = json.loads(render({"c": proposal}, "wide", ["native", "scalar"]))
    assert "worst over 2 kernel selection(s) (native, scalar)" in doc["cases"]["c"]["source"]
    assert doc["cases"]["c"]["settings"] == {
        "quant_accuracy": {"max_peir": 0.13, "min_sqnr_db": 17.5},
        "circle_replay": {"max_steps": 1.0, "extra_max_steps": 3.0},
    }
    assert "peir 0.1" in doc["cases"]["c"]["source"]
    # --write merges: the proposed case's entry is replaced, a reviewed entry of another case is kept
    path = tmp_path / "wide.json"
    path.write_text(
        json.dumps(
            {
                "profile": "wide",
                "about": "x",
                "cases": {
                    "c": {"settings": {}, "source": "old"},
                    "other": {"settings": {"q": {"f": 1}}, "source": "reviewed"},
                },
            }
        )
    )
    assert write(path, doc) == ["c"]
    merged = json.loads(path.read_text())["cases"]
    assert merged["other"]["source"] == "reviewed" and merged["c"] == doc["cases"]["c"]


def test_every_nightly_case_states_its_limits_and_no_entry_is_stale():
    from harness.model.case_loading import load_cases

    e2b_cases = {case.name: case for _, case in load_cases() if "e2b_dims" in case.profiles}
    assert e2b_cases, "no case runs the e2b_dims profile"
    assert sorted(set(_limits_table("e2b_dims")) - set(e2b_cases)) == []  # a table entry for no case is stale
    missing = [name for name, case in e2b_cases.items() if "e2b_dims" not in case.profile_limits]
    assert missing == [], f"e2b_dims cases without stated limits: {missing}"
    for case in e2b_cases.values():
        assert case.limits_source("e2b_dims").startswith("measured on clean tico, e2b_dims")


def test_a_flip_count_read_through_float_error_is_proposed_as_the_count():
    """An INT16 output's one flip reads 1.0002 steps (float32 at 32767 steps): the proposal is
    one step, not 1.3; a reading that is no whole count keeps the headroom."""
    from harness.report.limits_proposal import _limit

    steps = next(m for m in CHECKS["circle_replay"]["metrics"] if m["name"] == "fake_quantize_max_steps")
    assert _limit(steps, [0.0, 1.0002]) == (1.0, 1.0002)
    assert _limit(steps, [2.0, 1.99998]) == (2.0, 2.0)
    assert _limit(steps, [0.0]) == (1.0, 0.0)  # the floor
    assert _limit(steps, [2.6])[0] == 3.3  # not a count: 1.25x, rounded up


def test_a_profile_gets_its_own_diagnosed_failures():
    """A finding that needs the profile's shapes (e.g. more than one KV head) is expected there only."""
    from harness import Expected

    only_wide = Expected("needs the wide shapes", problems=(r"^wide-only problem$",))
    case = dataclasses.replace(
        LINEAR,
        profiles=("tiny", "wide"),
        profile_limits={
            "wide": ProfileLimits(
                {}, source="x", expected_failures={**LINEAR.expected_failures, "qparam_consistency": only_wide}
            )
        },
    )
    assert case.expected_failures_for("wide")["qparam_consistency"] is only_wide
    assert case.expected_failures_for("tiny") == LINEAR.expected_failures
    with pytest.raises(CaseDefinitionError, match=r"profile_limits\['wide'\]\.expected_failures"):
        dataclasses.replace(
            case, profile_limits={"wide": ProfileLimits({}, source="x", expected_failures={"x": "not an Expected"})}
        )


def test_static_runtime_limits_name_only_its_cases_and_say_where_they_come_from():
    from harness.model.case_loading import load_cases

    static_cases = {case.name: case for _, case in load_cases() if "static_runtime" in case.profiles}
    assert static_cases, "no case runs the static_runtime profile"
    assert sorted(set(_limits_table("static_runtime")) - set(static_cases)) == []  # stale entries
    for name, case in static_cases.items():
        source = case.limits_source("static_runtime")
        if name in _limits_table("static_runtime"):
            assert source.startswith("measured on clean tico, static_runtime"), (name, source)
        else:  # not measured yet: the results say the first profile's settings apply
            assert source.startswith("no limits stated for profile 'static_runtime'"), (name, source)


def _limits_table(profile: str) -> dict:
    return limits_data.read(REPO / "cases", profile)


def test_a_diagnosis_whose_cause_a_profile_lacks_is_dropped_there():
    """gemma4_vision_encoder's padding hazard needs calibration on unpadded data; static_runtime calibrates
    on TICO's padded static layout, so there mask_quant carries no expectation and must pass."""
    from harness import Expected
    from harness.model.case_loading import load_cases

    encoder = next(case for _, case in load_cases() if case.name == "gemma4_vision_encoder")
    assert "mask_quant" in encoder.expected_failures_for("tiny")
    assert "mask_quant" not in encoder.expected_failures_for("static_runtime")
    assert "qparam_consistency" in encoder.expected_failures_for("static_runtime")  # the others stay

    diagnosed = dataclasses.replace(
        LINEAR,
        profiles=("tiny", "static_runtime"),
        expected_failures={
            "mask_quant": Expected("tiny only", problems=(r"^x$",)),
            "golden": Expected("both", problems=(r"^y$",)),
        },
    )
    updated = dataclasses.replace(
        diagnosed, profile_limits={"static_runtime": ProfileLimits(expected_failures={"mask_quant": None})}
    )
    assert set(updated.expected_failures_for("static_runtime")) == {"golden"}
    assert set(updated.expected_failures_for("tiny")) == {"mask_quant", "golden"}


def test_the_limits_data_beside_a_case_file_fills_its_profiles_and_keeps_what_the_case_declares(tmp_path):
    """A case declares only its diagnosis per profile; the measured numbers come from the data."""
    from harness import Expected

    only_wide = Expected("needs the wide shapes", problems=(r"^wide-only problem$",))
    case = dataclasses.replace(
        LINEAR,
        profiles=("tiny", "wide", "huge"),
        profile_limits={"wide": ProfileLimits(expected_failures={"qparam_consistency": only_wide})},
    )
    (tmp_path / "limits").mkdir()
    table = {"cases": {"nn_linear": {"settings": {"quant_accuracy": {"max_peir": 0.5}}, "source": "measured: x"}}}
    (tmp_path / "limits" / "wide.json").write_text(json.dumps(table))
    (completed,) = limits_data.complete([case], tmp_path / "nn.py")
    wide = completed.profile_limits["wide"]
    assert wide.settings == {"quant_accuracy": {"max_peir": 0.5}} and wide.source == "measured: x"
    assert completed.expected_failures_for("wide")["qparam_consistency"] is only_wide
    assert "huge" not in completed.profile_limits  # no data: the first profile's settings, and it says so
    assert "no limits stated for profile 'huge'" in completed.limits_source("huge")
    # a declared override without data keeps the case's settings and says so too
    assert "no limits stated" in case.limits_source("wide")

    (tmp_path / "limits" / "huge.json").write_text('{"cases": {"nn_linear": {"settings": {}}}}')
    with pytest.raises(ValueError, match=r"limits table .*huge\.json cannot be read: KeyError"):
        limits_data.complete([case], tmp_path / "nn.py")
