"""Drift mode: on a stack that differs from the pins, every failure is labelled drift with
the versions that moved and the error; a strict expectation that starts passing is drift too."""

from __future__ import annotations

import json
import textwrap

from harness.tico_facts.drift import describe_moves, read_pins, version_moves
from tests import preloaded_python
from tests.helpers import PINNED

DRIFT_CASES = """
import torch
from harness import Built, Case, CaseInputs, Expected, Sample


def build_linear(profile):
    module = torch.nn.Linear(8, 4)
    sample = lambda: Sample(args=(torch.randn(2, 8),))
    return Built(module=module, inputs=CaseInputs(calibration=(sample(),), evaluation={"default": sample()}))


def build_broken(profile):
    raise AttributeError("Qwen3VLModel has no attribute 'get_rope_index' (a moved API)")


CASES = [
    Case(name="too_strict", family="nn", build=build_linear, settings={"quant_accuracy": {"max_peir": 1e-12}}),
    Case(name="api_moved", family="nn", build=build_broken),
    Case(name="fixed_upstream", family="nn", build=build_linear,
         expected_failures={"noquant_parity": Expected("pretend the wrapper was broken on the pinned stack",
                                                       problems=("not close",))}),
]
"""


def _project(pytester):
    pytester.makeini("[pytest]\ntestpaths = cases\nwrapq_cases_dir = cases\naddopts = -p no:cacheprovider\n")
    pytester.mkpydir("cases")
    (pytester.path / "cases" / "drift.py").write_text(textwrap.dedent(DRIFT_CASES))
    # The "gate" pins an older transformers than the one installed here.
    (pytester.path / "constraints.txt").write_text("transformers==5.0.0\ntico==0.3.0\n")
    return pytester


def test_failures_are_labelled_drift_with_versions_and_error(pytester):
    project = _project(pytester)
    result = preloaded_python.runpytest(project, "-p", "no:xdist", "--drift", "-k", "quant_accuracy or noquant_parity")
    out = result.stdout.str()
    assert "wrapq drift" in out and f"transformers 5.0.0 -> {PINNED['transformers']}" in out
    doc = json.loads((project.path / "reports" / "results.json").read_text())
    assert doc["run"]["drift"]["moves"] == [
        {"package": "transformers", "pinned": "5.0.0", "installed": PINNED["transformers"]}
    ]
    by_id = {r["nodeid"]: r for r in doc["results"]}
    strict = by_id["cases/drift.py::too_strict::quant_accuracy[tiny]"]
    assert strict["drift"]["kind"] == "failed" and strict["drift"]["error"].startswith("- [default] PEIR")
    moved = by_id["cases/drift.py::api_moved::noquant_parity[tiny]"]
    assert moved["drift"]["versions"] == f"transformers 5.0.0 -> {PINNED['transformers']}"
    assert "get_rope_index" in moved["drift"]["error"] and "reference" in moved["drift"]["error"]
    fixed = by_id["cases/drift.py::fixed_upstream::noquant_parity[tiny]"]
    assert fixed["drift"]["kind"] == "expected failure now passes"
    assert "drift" not in by_id["cases/drift.py::too_strict::noquant_parity[tiny]"]  # passed: not drift
    assert "drift run" in (project.path / "reports" / "report.html").read_text()


def test_without_drift_mode_nothing_is_labelled(pytester):
    project = _project(pytester)
    preloaded_python.runpytest(project, "-p", "no:xdist", "-k", "too_strict and quant_accuracy")
    doc = json.loads((project.path / "reports" / "results.json").read_text())
    assert "drift" not in doc["run"] and not any("drift" in r for r in doc["results"])


def test_pins_and_moves(tmp_path):
    pins = tmp_path / "c.txt"
    pins.write_text(f"# comment\nTransformers==5.0.0\ntico == {PINNED['tico']} ; python_version>'3'\nnot-a-pin>=1\n")
    assert read_pins(pins) == {"transformers": "5.0.0", "tico": PINNED["tico"]}
    moves = version_moves(read_pins(pins))
    assert describe_moves(moves) == f"transformers 5.0.0 -> {PINNED['transformers']}"


def test_headline_skips_worker_banner_and_finds_the_cause():
    from harness.tico_facts.drift import _same_release, headline

    banner = "[gw1] linux -- Python 3.11.7 /x/.venv-drift/bin/python\n"
    assert (
        headline(banner + "m[tiny]: stage 'calibrate' failed: ImportError: cannot import name 'x'\n\ntraceback")
        == "m[tiny]: stage 'calibrate' failed: ImportError: cannot import name 'x'"
    )
    assert (
        headline(banner + "quant_accuracy failed for m[tiny]:\n  - [default] PEIR 0.3 exceeds threshold 0.1")
        == "- [default] PEIR 0.3 exceeds threshold 0.1"
    )
    assert (
        headline(banner + "cls = <class 'CallInfo'>\n>   raise\nE   ImportError: no name 'y'\n")
        == "ImportError: no name 'y'"
    )
    assert _same_release("2.13.0+cpu", "2.13.0") and not _same_release("5.24.0", "5.22.2")


def test_a_drifted_item_says_what_the_findings_data_explains_it_by():
    from harness.tico_facts.drift import explained_by

    base = {"case": "llama_model", "profile": "tiny", "check": "rotary_parity", "outcome": "failed"}
    moved_api = dict(base, message="E   AttributeError: 'QuantLlamaModel' object has no attribute 'rope_cos_template'")
    assert explained_by(moved_api) == "tico change rope-templates-removed (the case must follow)"
    assert explained_by(dict(base, looks_like=["rotate-half-two-qparams"])) == "finding rotate-half-two-qparams"
    assert explained_by(dict(base, problems=["something no finding knows"])) == "unexplained"
