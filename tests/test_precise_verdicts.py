"""Precise verdicts: an expectation covers exactly its diagnosed problems, stale allowlists and
case keys fail, nothing passes on zero elements, and pytest's own conventions (--lf, -m,
junit) work on the matrix."""

from __future__ import annotations

import dataclasses
import json
import textwrap
import xml.etree.ElementTree as ET

import pytest
import torch

from cases.nn import CASES as NN_CASES
from harness import Expected
from harness.model.case import CaseDefinitionError
from harness.model.expectations import judge
from harness.primitives.tensor_compare import compare_close
from tests import preloaded_python
from tests.helpers import problems_text, run_check

NN_LINEAR = next(c for c in NN_CASES if c.name == "nn_linear")

# -- judging expectations ------------------------------------------------------------------

PEIR = Expected("diagnosed: output scale too coarse", problems=(r"PEIR \S+ exceeds threshold",))


def test_exactly_the_expected_problem_is_an_expected_failure():
    verdict = judge(PEIR, ["[default] PEIR 0.31 exceeds threshold 0.1"])
    assert verdict.expected and "measured now: [default] PEIR 0.31 exceeds threshold 0.1" in verdict.message


def test_an_extra_problem_is_not_swallowed():
    verdict = judge(PEIR, ["[default] PEIR 0.31 exceeds threshold 0.1", "[default] SQNR dB 3 is below threshold 10"])
    assert not verdict.expected and "unexpected problem(s)" in verdict.message and "SQNR" in verdict.message


def test_a_vanished_problem_fails_strictly():
    assert "the check passed" in judge(PEIR, []).message and not judge(PEIR, []).expected
    changed = judge(Expected("two problems", problems=("PEIR", "SQNR")), ["[default] PEIR 0.31 exceeds threshold 0.1"])
    assert not changed.expected and "no longer occur: SQNR" in changed.message


def test_a_bare_string_expectation_is_a_definition_error():
    with pytest.raises(CaseDefinitionError, match="must map check names to Expected"):
        dataclasses.replace(NN_LINEAR, expected_failures={"quant_accuracy": "fails somehow"})
    with pytest.raises(ValueError, match="bad regular expression"):
        Expected("x", problems=("(unclosed",))


# -- stale allowlists and vacuous passes ---------------------------------------------------


def test_allowlisted_observer_that_is_fed_fails_observer_use():
    case = dataclasses.replace(NN_LINEAR, unused_observers={"obs_act_in": "pretend it is never fed"})
    text = problems_text(run_check(case, "observer_use"))
    assert "unused_observers entry 'obs_act_in': every observer it covers (obs_act_in) is fed and applied now" in text


def test_allowlist_pattern_matching_nothing_fails():
    case = dataclasses.replace(NN_LINEAR, unused_observers={"no_such_observer*": "stale"})
    assert "unused_observers entry 'no_such_observer*' matches no observer" in problems_text(
        run_check(case, "observer_use")
    )
    assert "matches no observer of the wrapper tree" in problems_text(run_check(case, "calibration_coverage"))


def test_stale_qparam_allowlist_entry_fails():
    case = dataclasses.replace(NN_LINEAR, qparam_allowlist={"aten.permute.default": "stale: no permute here"})
    text = problems_text(run_check(case, "qparam_audit"))
    assert "qparam_allowlist entry 'aten.permute.default' matches no node without qparam" in text


def test_ungated_sample_that_does_not_exist_fails():
    case = dataclasses.replace(NN_LINEAR, ungated_samples={"padded": "no such sample in nn_linear"})
    assert "ungated_samples entry 'padded' names no evaluation sample" in problems_text(
        run_check(case, "quant_accuracy")
    )


def test_comparison_over_zero_elements_is_a_problem_not_a_pass():
    x = torch.randn(1, 4, 8)
    metrics, problem = compare_close(
        "all padding", x, x, atol=1e-5, rtol=0, valid_tokens=torch.zeros(1, 4, dtype=torch.bool)
    )
    assert metrics["compared_elements"] == 0 and "no valid element to compare" in problem


# -- through pytest ------------------------------------------------------------------------

CASES = """
import torch
from harness import Built, Case, CaseInputs, Expected, Sample


def build_linear(profile):
    module = torch.nn.Linear(8, 4)
    sample = lambda: Sample(args=(torch.rand(2, 8),))
    return Built(module=module, inputs=CaseInputs(calibration=(sample(), sample()), evaluation={"default": sample()}))


PEIR = Expected("diagnosed: PEIR above a deliberately impossible limit", problems=(r"PEIR \\S+ exceeds threshold",))
CASES = [
    Case(name="expected_only", family="toy", build=build_linear, settings={"quant_accuracy": {"max_peir": 1e-12}},
         expected_failures={"quant_accuracy": PEIR}),
    Case(name="extra_problem", family="toy", build=build_linear,
         settings={"quant_accuracy": {"max_peir": 1e-12, "max_mean_abs_diff": 1e-12}},
         expected_failures={"quant_accuracy": PEIR}),
    Case(name="fixed", family="toy", build=build_linear, expected_failures={"quant_accuracy": PEIR}),
    Case(name="typo", family="other", build=build_linear, not_applicable={"quant_acuracy": "typo in a check name"}),
]
"""
INI = "[pytest]\ntestpaths = cases\nwrapq_cases_dir = cases\n"


@pytest.fixture
def project(pytester):
    pytester.makeini(INI)
    (pytester.mkpydir("cases") / "toy.py").write_text(textwrap.dedent(CASES))
    return pytester


def _outcomes(pytester) -> dict[str, str]:
    doc = json.loads((pytester.path / "reports" / "results.json").read_text())
    return {f"{r['case']}::{r['check']}": r["outcome"] for r in doc["results"] if r["case"]}


def test_expectations_and_case_keys_through_pytest(project):
    result = preloaded_python.runpytest(project, "-p", "no:xdist", "-k", "quant_accuracy or definition")
    outcomes = _outcomes(project)
    assert outcomes["expected_only::quant_accuracy"] == "xfailed"
    assert outcomes["extra_problem::quant_accuracy"] == "failed"
    assert outcomes["fixed::quant_accuracy"] == "failed"
    out = result.stdout.str()
    assert "unexpected problem(s) beside the expected failure" in out and "mean |diff|" in out
    assert "expected failure no longer occurs: the check passed" in out
    assert "field 'not_applicable': names no check: quant_acuracy" in out


def test_last_failed_selects_the_failing_items_only(project):
    preloaded_python.runpytest(project, "-p", "no:xdist", "-k", "quant_accuracy")
    rerun = preloaded_python.runpytest(project, "-p", "no:xdist", "--lf", "-k", "quant_accuracy")
    rerun.assert_outcomes(failed=2)


def test_markers_select_by_check_family_and_profile(project):
    by_check = preloaded_python.runpytest(project, "-p", "no:xdist", "--collect-only", "-q", "-m", "lifecycle and toy")
    lines = [line for line in by_check.stdout.lines if "::" in line]
    assert len(lines) == 3 and all(line.endswith("::lifecycle[tiny]") for line in lines)
    assert (
        preloaded_python.runpytest(
            project, "-p", "no:xdist", "--collect-only", "-q", "-m", "other and tiny", "--strict-markers"
        ).ret
        == 0
    )


def test_junit_carries_scalars_not_the_record(project):
    preloaded_python.runpytest(
        project, "-p", "no:xdist", "-k", "expected_only and quant_accuracy", "--junitxml=junit.xml"
    )
    props = [(p.get("name"), p.get("value")) for p in ET.parse(project.path / "junit.xml").iter("property")]
    assert ("wrapq.peir" in dict(props)) and all(len(value) < 40 for _, value in props), props


def test_existing_report_dir_given_with_a_space_is_refused_not_misread(tmp_path):
    """pytest would take the existing directory as its rootdir and collect tests/ instead of the
    cases; the plugin refuses with the fix instead of running the wrong thing, and scripts/env.sh applies it."""
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    done = preloaded_python.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "--wrapq-report-dir", str(tmp_path)],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0 and f"add --config-file={repo / 'pyproject.toml'}" in done.stderr + done.stdout
    fixed = preloaded_python.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", f"--wrapq-report-dir={tmp_path}"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert fixed.returncode == 0 and "tests collected" in fixed.stdout
    # the README's wrapper names the config, so the shipped command takes either form
    import subprocess

    wrapped = subprocess.run(
        ["./scripts/env.sh", "pytest", "--collect-only", "-q", "--wrapq-report-dir", str(tmp_path), "cases/nn.py"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert wrapped.returncode == 0 and "cases/nn.py::nn_linear::golden[tiny]" in wrapped.stdout, wrapped.stderr[-2000:]


def test_an_identity_observer_is_float_by_policy_and_a_never_fed_affine_one_still_fails():
    from types import SimpleNamespace

    from tico.quantization.wrapq.observers.identity import IdentityObserver
    from tico.quantization.wrapq.observers.minmax import MinMaxObserver

    from harness.checks import calibration_coverage

    root = torch.nn.Module()
    root.obs_float = IdentityObserver(name="float")
    root.obs_forgotten = MinMaxObserver(name="forgotten")
    pipeline = SimpleNamespace(
        quantized=root, profile="tiny", case=SimpleNamespace(unused_observers_for=lambda profile: {})
    )
    result = calibration_coverage.run(pipeline)
    assert result.problems == ["observer obs_forgotten (MinMaxObserver): never fed: observed min/max are not finite"]
    assert result.metrics["float_by_policy"] == 1 and any("IdentityObserver" in n for n in result.notes)


def test_per_sample_limits_replace_the_cases_for_that_sample_and_a_stale_one_fails():
    limits = {"max_peir": 1.0, "samples": {"outlier_last_token": {"max_peir": 1e-9}}}
    case = dataclasses.replace(NN_LINEAR, settings={"quant_accuracy": limits})
    text = problems_text(run_check(case, "quant_accuracy"))
    assert "per-sample limits name 'outlier_last_token', which is no evaluation sample (stale)" in text
    assert "[default]" not in text  # the case's own limit (PEIR 1.0) gates the default sample
    own = dataclasses.replace(NN_LINEAR, settings={"quant_accuracy": {"samples": {"default": {"max_peir": 1e-9}}}})
    assert "[default] PEIR" in problems_text(run_check(own, "quant_accuracy"))
    typo = dataclasses.replace(NN_LINEAR, settings={"quant_accuracy": {"samples": {"default": {"max_pier": 1}}}})
    assert "[default] per-sample limits:" in problems_text(run_check(typo, "quant_accuracy"))
