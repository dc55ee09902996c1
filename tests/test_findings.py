"""tico's findings as data (findings/tico.toml): every case expectation names findings by id, no
pattern depends on a line number or an install path, and a finding that no longer occurs is an
error on the recorded tico and good news on any other."""

from __future__ import annotations

import json
import os
import re
import textwrap

import pytest

from harness import Expected
from harness.commands.findings import declared_expectations
from harness.model.expectations import judge, matchable
from harness.tico_facts.findings_data import (
    FINDINGS_FILE,
    FindingsError,
    definition_errors,
    expect,
    looks_like,
    parse,
    pattern_flaw,
    registry,
)
from harness.tico_facts.tico_identity import package_dir, source_fingerprint
from tests import preloaded_python


def _in_tree_expectations():
    """(case file, 'case[profile,variant]:check', check, Expected) over every profile and sweep variant."""
    return declared_expectations()


def test_no_expectation_pattern_names_a_line_number_or_an_install_path():
    flawed = [
        (where, pattern, pattern_flaw(pattern))
        for _, where, _, expectation in _in_tree_expectations()
        for pattern in expectation.problems
        if pattern_flaw(pattern)
    ]
    assert flawed == []


def test_every_expectation_under_cases_names_registered_findings_for_its_check():
    anonymous, wrong = [], []
    for path, where, check, expectation in _in_tree_expectations():
        if not str(path).startswith("cases/"):
            continue  # an out-of-tree example diagnoses its own wrapper, not tico
        if any(part.finding is None for part in expectation.parts):
            anonymous.append(where)
        wrong += [f"{where}: {e}" for e in definition_errors(check, expectation)]
    assert anonymous == [] and wrong == []


def test_every_recorded_finding_is_declared_by_a_case():
    declared = {fid for _, _, _, expectation in _in_tree_expectations() for fid in expectation.findings}
    assert set(registry().findings) - declared == set()


@pytest.mark.skipif(bool(os.environ.get("WRAPQ_TICO")), reason="runs on a tico under review, not the pinned one")
def test_the_recorded_fingerprint_is_the_pinned_ticos():
    assert source_fingerprint(package_dir()) == registry().recorded_sources


def test_the_fingerprint_ignores_where_tico_is_installed(tmp_path):
    import shutil

    shutil.copytree(package_dir(), tmp_path / "elsewhere" / "tico", ignore=shutil.ignore_patterns("__pycache__"))
    assert source_fingerprint(tmp_path / "elsewhere" / "tico") == source_fingerprint(package_dir())
    first = next((tmp_path / "elsewhere" / "tico").rglob("quant_linear.py"))
    first.write_text("# one comment\n" + first.read_text())
    assert source_fingerprint(tmp_path / "elsewhere" / "tico") != source_fingerprint(package_dir())


@pytest.mark.parametrize(
    "pattern, flaw",
    [
        (r"^tensor add \(tico/quantization/wrapq/wrappers/llama/quant_decoder_layer\.py:359, aten", "a line number"),
        (r"File .*quant_attention\.py, line 250, in forward", "a line number"),
        (r"\(/usr/lib/python3/site-packages/tico/x\.py\)", "an install path"),
    ],
)
def test_the_data_refuses_patterns_that_break_on_a_refactor(pattern, flaw):
    data = {
        "recorded": {"version": "0", "source_sha256": "x"},
        "finding": [{"id": "some-finding", "title": "t", "cause": "c", "patterns": {"qparam_audit": [pattern]}}],
    }
    with pytest.raises(FindingsError, match=flaw):
        parse(data)


def test_the_data_file_parses_and_ids_are_stable_words():
    reg = registry(FINDINGS_FILE)
    assert len(reg.findings) >= 20
    assert all(re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", fid) for fid in reg.findings)


def test_matchable_drops_install_prefixes_and_line_numbers_only():
    line = (
        "tensor neg_1 (/x/venv/lib/python3.11/site-packages/tico/quantization/wrapq/wrappers/llama/"
        "quant_attention.py:251, aten.neg.default): torch applies no fake-quant"
    )
    assert matchable(line) == (
        "tensor neg_1 (tico/quantization/wrapq/wrappers/llama/quant_attention.py, "
        "aten.neg.default): torch applies no fake-quant"
    )
    assert matchable('File "/src/TICO/tico/a/b.py", line 9, in fn') == 'File "tico/a/b.py", in fn'
    assert matchable("scale 0.0131 zp 124 (range 0..255)") == "scale 0.0131 zp 124 (range 0..255)"


# -- tico API changes a case must follow ---------------------------------------------------------


def test_api_changes_parse_and_refuse_what_findings_refuse():
    base = {"recorded": {"version": "0", "source_sha256": "x"}, "finding": []}
    ok = dict(
        base,
        api_change=[
            {
                "id": "new-call",
                "title": "t",
                "since": "1.0",
                "follow": "call it",
                "patterns": [r"requires new_call\(\)"],
            }
        ],
    )
    assert parse(ok).api_changes["new-call"].follow == "call it"
    for bad, why in ((r"x\.py:\d+", "a line number"), ("[", "bad regular expression")):
        data = dict(base, api_change=[dict(ok["api_change"][0], patterns=[bad])])
        with pytest.raises(FindingsError, match=re.escape(why)):
            parse(data)
    with pytest.raises(FindingsError, match="follow"):
        parse(dict(base, api_change=[{"id": "a-b", "title": "t", "since": "1", "patterns": ["x"]}]))


def test_a_failure_an_api_change_explains_is_sorted_there_and_anything_else_stays_new():
    from harness.tico_facts.finding_status import render_lines, summarize

    traced = (
        "stage 'torch_export' failed: Unsupported: Observed exception\n  Developer debug context: raised "
        "exception ValueError('Static decoder export requires an explicit attention_mask.')"
    )
    records = [
        {
            "case": "a",
            "profile": "tiny",
            "check": "torch_export",
            "outcome": "failed",
            "nodeid": "cases/x.py::a[tiny]",
            "stage_error": {"stage": "torch_export", "type": "Unsupported", "message": traced},
        },
        {
            "case": "b",
            "profile": "tiny",
            "check": "golden",
            "outcome": "failed",
            "nodeid": "cases/x.py::b[tiny]",
            "message": "E  AttributeError: 'QuantLlamaModel' object has no attribute 'rope_cos_template'",
        },
        {
            "case": "c",
            "profile": "tiny",
            "check": "qparam_audit",
            "outcome": "failed",
            "nodeid": "cases/x.py::c[tiny]",
            "problems": ["node add has no qparam"],
        },
    ]
    summary = summarize(records)
    assert {a["id"]: a["items"] for a in summary["api_changes"]} == {
        "static-decoder-explicit-mask": ["a[tiny]::torch_export"],
        "rope-templates-removed": ["b[tiny]::golden"],
    }
    assert [p["where"] for p in summary["new_problems"]] == ["c[tiny]::qparam_audit"]
    lines = render_lines(summary)
    assert any(line.startswith("api    static-decoder-explicit-mask: 1 item(s) red") for line in lines)


def test_new_problems_of_one_shape_are_one_line_with_their_count():
    from harness.tico_facts.finding_status import render_lines

    fed = "observer layers.{i}.self_attn.obs_past_key was never fed during calibration"
    summary = {
        "findings": [],
        "new_problems": [{"where": f"m{i}[tiny]::observer_use", "problem": fed.format(i=i)} for i in range(24)]
        + [{"where": "g[tiny]::golden", "problem": "golden tensor set changed"}],
    }
    lines = render_lines(summary)
    assert lines == [
        "new    24 items (m0[tiny]::observer_use, ...): observer layers.0.self_attn.obs_past_key was never fed during "
        "calibr...",
        "new    g[tiny]::golden: golden tensor set changed",
        "       a suggested finding record per shape (2): python -m harness findings",
    ]


def test_each_shape_of_new_problem_gets_a_suggested_record_whose_patterns_match_it():
    import tomllib

    from harness.model.expectations import matchable
    from harness.tico_facts.finding_suggestion import suggestions
    from harness.tico_facts.findings_data import pattern_flaw

    fed = "observer layers.{i}.self_attn.obs_past_key (/x/site-packages/tico/a/b.py:{i}) scale {i}.5e-3 never fed"
    problems = [{"where": f"m{i}[tiny]::observer_use", "problem": fed.format(i=i)} for i in range(3)]
    problems.append({"where": "g[tiny]::golden", "problem": "golden tensor set changed"})
    drafts = suggestions(problems)
    assert len(drafts) == 2 and drafts[0].startswith("# seen on 3 item(s), e.g. m0[tiny]::observer_use")
    record = tomllib.loads(drafts[0])["finding"][0]
    assert record["id"] == "observer-layers-self-attn-obs-past" and record["symbols"] == []
    (pattern,) = record["patterns"]["observer_use"]
    assert pattern_flaw(pattern) is None  # no install path, no line number
    for problem in problems[:3]:
        assert re.match(pattern, matchable(problem["problem"])), (pattern, problem)
    assert not re.match(pattern, matchable(fed.format(i=1).replace("never fed", "fed twice")))
    assert tomllib.loads(drafts[1])["finding"][0]["patterns"] == {"golden": ["^golden tensor set changed$"]}


# -- judging on the recorded tico and on another -----------------------------------------------

TWO = Expected("a", problems=(r"^alpha \d+$",), finding="first") + Expected(
    "b", problems=(r"^beta$",), finding="second"
)


def test_strict_a_gone_finding_fails_review_reports_it_fixed():
    strict = judge(TWO, ["alpha 1"], strict=True)
    assert strict.verdict == "failed" and "no longer occur" in strict.message
    review = judge(TWO, ["alpha 1"], strict=False)
    assert review.verdict == "expected" and review.parts == {"finding first": "occurs", "finding second": "fixed"}
    assert "no longer occurs on this tico: finding second" in review.message


def test_review_every_finding_gone_passes_as_fixed():
    verdict = judge(TWO, [], strict=False)
    assert verdict.verdict == "fixed" and "remove it" in verdict.message


def test_a_new_problem_is_red_on_any_tico_and_names_the_line_no_pattern_matches():
    for strict in (True, False):
        verdict = judge(TWO, ["alpha 1", "beta", "gamma"], strict=strict)
        assert verdict.verdict == "failed" and verdict.unmatched == ("gamma",) and "gamma" in verdict.message


def test_a_partly_fixed_finding_is_not_red_for_review():
    probes = expect("mask-fill-clamped-by-observer", check="mask_quant", probes=("dynamic:padded", "export:padded"))
    lines = [
        "QUANT mask [dynamic:padded]: fill value -120.0 became 0 after fake-quant (observer clamps it)",
        "QUANT mask [dynamic:padded]: a masked key keeps softmax weight 0.125 (limit 1e-06): padding leaks",
    ]
    assert judge(probes, lines, strict=True).verdict == "failed"
    review = judge(probes, lines, strict=False)
    assert review.verdict == "expected" and review.parts == {"finding mask-fill-clamped-by-observer": "changed"}


def test_looks_like_names_a_known_finding_on_an_undeclared_case():
    line = (
        "tensor add_3 (tico/quantization/wrapq/wrappers/llama/quant_decoder_layer.py:359, aten.add.Tensor): torch "
        "fake-quantizes it only where wrapped.post_attention_layernorm.wrapped.obs_act_in reads it and add_4 "
        "read(s) it in float; the Circle model quantizes it for every user with scale 0.03 zp 138 (the qparams of "
        "wrapped.post_attention_layernorm.wrapped.obs_act_in, which FoldQuantOps folded onto it)"
    )
    assert looks_like("qparam_consistency", line) == ("llama-residual-float-add",)
    assert looks_like("observer_use", line) == ()


def _item(case: str, check: str, outcome: str, *problems: str) -> dict:
    return {
        "nodeid": f"cases/x.py::{case}::{check}[tiny]",
        "case": case,
        "profile": "tiny",
        "check": check,
        "outcome": outcome,
        "problems": list(problems),
    }


def test_a_finding_is_suggested_only_where_its_group_shows_every_symptom():
    """A generic line alone (no per-tensor output scale) matches fairseq-prenorm-float-residual's replay pattern;
    seen on cnn_prelu with its output fake-quant dropped (the PReLU node, not a fairseq residual, has no qparam),
    it is a new problem. With the finding's qparam_audit symptom in the same group, it is that finding."""
    from harness.tico_facts.finding_status import summarize

    replay = "Circle FAKE_QUANTIZE: output tensor has no per-tensor scale (0 scales), cannot express in steps"
    assert looks_like("circle_replay", replay) == ("fairseq-prenorm-float-residual",)
    prelu = [
        dict(_item("prelu", "circle_replay", "failed", replay), looks_like=["fairseq-prenorm-float-residual"]),
        _item("prelu", "qparam_audit", "failed", "node prelu_1 (prelu, 1 users) has no qparam: no stack trace"),
    ]
    summary = summarize(prelu)
    assert summary["findings"] == [] and prelu[0]["looks_like"] == []
    assert prelu[0]["looks_like_unconfirmed"] == ["fairseq-prenorm-float-residual"]
    assert [p["where"] for p in summary["new_problems"]] == ["prelu[tiny]::circle_replay", "prelu[tiny]::qparam_audit"]
    residual = (
        'node add_1 (aten.add.Tensor, 2 users) has no qparam: File "tico/quantization/wrapq/wrappers/fairseq/'
        'quant_encoder_layer.py", line 80, in forward | x = residual + x'
    )
    prenorm = [
        dict(_item("prenorm", "circle_replay", "failed", replay), looks_like=["fairseq-prenorm-float-residual"]),
        _item("prenorm", "qparam_audit", "failed", residual),
    ]
    (finding,) = summarize(prenorm)["findings"]
    assert finding["id"] == "fairseq-prenorm-float-residual"
    assert finding["undeclared"] == ["prenorm[tiny]::circle_replay"]


def test_expect_refuses_unknown_ids_and_ambiguous_checks():
    with pytest.raises(FindingsError, match="unknown finding"):
        expect("no-such-finding")
    with pytest.raises(FindingsError, match="say check="):
        expect("int16-output-after-uint8")
    assert definition_errors("mask_fill", expect("export-adapter-accepts-calib"))


# -- through pytest: review mode sets stale allow-lists aside, a fixed finding passes ------------

CASES = """
import torch
from harness import Built, Case, CaseInputs, Expected, Sample


def build_linear(profile):
    module = torch.nn.Linear(8, 4)
    sample = lambda: Sample(args=(torch.rand(2, 8),))
    return Built(module=module, inputs=CaseInputs(calibration=(sample(), sample()), evaluation={"default": sample()}))


GONE = Expected("diagnosed on the recorded tico", problems=(r"PEIR \\S+ exceeds threshold",), finding="gone-finding")
CASES = [
    Case(name="fixed_here", family="toy", build=build_linear, expected_failures={"quant_accuracy": GONE}),
    Case(name="stale_allowlist", family="toy", build=build_linear, unused_observers={"obs_renamed*": "by design"}),
]
"""


@pytest.mark.parametrize("recorded", [True, False], ids=["recorded_tico", "other_tico"])
def test_review_mode_through_pytest(pytester, recorded):
    # The run stands in for one on another tico: its conftest says whether tico is the recorded one.
    pytester.makeconftest(
        "import harness.tico_facts.findings_data\n"
        f"harness.tico_facts.findings_data.recorded_here = lambda: {recorded}\n"
    )
    pytester.makeini("[pytest]\ntestpaths = cases\nwrapq_cases_dir = cases\n")
    (pytester.mkpydir("cases") / "toy.py").write_text(textwrap.dedent(CASES))
    result = preloaded_python.runpytest(pytester, "-p", "no:xdist", "-k", "quant_accuracy or observer_use")
    doc = json.loads((pytester.path / "reports" / "results.json").read_text())
    outcomes = {f"{r['case']}::{r['check']}": r["outcome"] for r in doc["results"] if r["case"]}
    if recorded:
        assert outcomes == {
            "fixed_here::quant_accuracy": "failed",
            "fixed_here::observer_use": "passed",
            "stale_allowlist::quant_accuracy": "passed",
            "stale_allowlist::observer_use": "failed",
        }
        return
    assert set(outcomes.values()) == {"passed"}, outcomes
    stale = next(r for r in doc["results"] if r["nodeid"].endswith("stale_allowlist::observer_use[tiny]"))
    assert stale["stale_allowlist"] and "obs_renamed*" in stale["stale_allowlist"][0]
    statuses = {f["id"]: f["status"] for f in doc["run"]["findings"]}
    assert statuses == {"gone-finding": "fixed"}
    assert "fixed  gone-finding" in result.stdout.str()


def test_a_finding_a_newer_tico_brought_is_not_expected_on_the_recorded_one(monkeypatch):
    from harness.tico_facts import findings_data as findings

    newer = registry().get("llama-decoder-float-residual-stream")
    assert newer.since and newer.since != registry().recorded_version
    both = expect("rotate-half-two-qparams", check="qparam_consistency") + expect(newer.id)
    monkeypatch.setattr(findings, "recorded_here", lambda: True)
    assert findings.for_this_tico(both).findings == ("rotate-half-two-qparams",)
    assert findings.for_this_tico(expect(newer.id)) is None
    monkeypatch.setattr(findings, "recorded_here", lambda: False)
    assert findings.for_this_tico(both).findings == ("rotate-half-two-qparams", newer.id)


def test_a_newer_finding_absent_on_another_tico_is_neither_open_nor_fixed():
    from harness.tico_facts import findings_data as findings

    newer = expect("llama-decoder-float-residual-stream")
    both = expect("rotate-half-two-qparams", check="qparam_consistency") + newer
    statuses = {"finding rotate-half-two-qparams": "occurs", "finding llama-decoder-float-residual-stream": "fixed"}
    assert findings.without_absent_newer(both, statuses).findings == ("rotate-half-two-qparams",)
    assert findings.without_absent_newer(newer, {"finding llama-decoder-float-residual-stream": "fixed"}) is None
    occurring = {"finding llama-decoder-float-residual-stream": "occurs"}
    assert findings.without_absent_newer(newer, occurring) is newer
