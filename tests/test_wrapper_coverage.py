"""The wrapper coverage map: measured at run time, committed as a snapshot, enforced against
the reviewed reasons in cases/wrapper_coverage_reasons.toml."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from harness.commands import _coverage_measure as coverage_measure
from harness.model.case_loading import add_configured_import_roots, load_cases
from harness.tico_facts import wrapper_coverage as wc
from tests import preloaded_python

# Cheap cases that between them have a root with children (RMSNorm, SiLU, MLP, attention
# inside a decoder layer) and a tree with no root wrapper (the tied embedding, prepared child
# by child).
FRESH = ("llama_decoder_layer_prefill", "nn_tied_embedding", "gemma4_vision_pooler")


@pytest.fixture(scope="module")
def snapshot() -> dict:
    return wc.load_snapshot()["cases"]


def test_registry_enumeration_agrees_with_tico_lookup():
    """The one private read (registry._WRAPPERS) returns what tico's public lookup resolves."""
    from tico.quantization.wrapq.wrappers.registry import lookup

    registered = wc.registered_wrappers()
    pairs = [(fp, w) for w, fps in registered.items() for fp in fps]
    assert pairs and all(lookup(fp) is w for fp, w in pairs)
    tico = wc.tico_wrappers(registered)
    assert set(tico) == {w.__name__ for w in registered if w.__module__.startswith("tico.")}
    assert tico["QuantRMSNorm"]["float_classes"] == sorted(
        [
            "transformers.models.llama.modeling_llama.LlamaRMSNorm",
            "transformers.models.qwen3_vl.modeling_qwen3_vl.Qwen3VLTextRMSNorm",
        ]
    )


def test_missing_private_registry_attribute_fails_clearly(monkeypatch):
    from tico.quantization.wrapq.wrappers import registry

    monkeypatch.delattr(registry, "_WRAPPERS")
    with pytest.raises(RuntimeError, match="no non-empty _WRAPPERS dict.*registered_wrappers must be updated"):
        wc.registered_wrappers()


def test_every_registered_wrapper_is_exercised_or_explained(snapshot):
    problems = wc.problems(wc.tico_wrappers(), wc.aggregate(snapshot), wc.load_reasons())
    assert problems == [], "\n".join(problems)


def test_snapshot_covers_exactly_the_tiny_cases(snapshot):
    add_configured_import_roots()
    tiny = {case.name for _, case in load_cases() if wc.SNAPSHOT_PROFILE in case.profiles}
    assert set(snapshot) == tiny, "run: ./scripts/env.sh python -m harness wrappers --measure --write"
    assert not [case for case, cov in snapshot.items() if "error" in cov]


def test_snapshot_agrees_with_a_fresh_measurement(snapshot):
    fresh = coverage_measure.measure_all(FRESH)
    for case in FRESH:
        record = {k: v for k, v in fresh[case].items() if k != "seconds"}
        assert record == snapshot[case], f"{case}: run ./scripts/env.sh python -m harness wrappers --measure --write"
    layer = fresh["llama_decoder_layer_prefill"]
    assert layer["root"] == "QuantLlamaDecoderLayer" and layer["root_ran"]
    assert {"QuantLlamaAttention", "QuantLlamaMLP", "QuantRMSNorm", "QuantSiLU", "QuantLinear"} <= set(
        layer["ran_as_child"]
    )
    assert fresh["nn_tied_embedding"]["root"] is None
    assert set(fresh["nn_tied_embedding"]["ran_as_child"]) == {"QuantEmbedding", "QuantLinear"}


def test_readme_table_is_current():
    """Judged in a fresh process: tico's registry as the pinned stack registers it. (In a test
    worker, modules other tests imported can register more float classes, so the count in the
    table's header would depend on test order.)"""
    code = (
        "from harness.tico_facts import wrapper_coverage as wc\n"
        "table = wc.table(wc.load_snapshot()['cases'], wc.load_reasons(), wc.tico_wrappers()).strip()\n"
        "raise SystemExit(0 if wc.readme_table() == table else 1)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    assert done.returncode == 0, (
        "run: ./scripts/env.sh python -m harness wrappers --measure --write\n"
        + done.stdout[-2000:]
        + done.stderr[-2000:]
    )


# -- the enforcement can fail -------------------------------------------------------------
def _without(snapshot: dict, wrapper: str) -> dict:
    """The snapshot as if no case had instantiated or run ``wrapper``."""
    out = {}
    for case, cov in snapshot.items():
        cov = dict(cov)
        for key in ("instantiated", "ran_quant", "ran_as_child"):
            cov[key] = {k: v for k, v in cov[key].items() if k != wrapper}
        if cov["root"] == wrapper:
            cov["root"], cov["root_ran"] = None, False
        out[case] = cov
    return out


def test_a_wrapper_no_case_exercises_fails_without_a_reason(snapshot):
    registered, reasons = wc.tico_wrappers(), wc.load_reasons()
    for wrapper in ("QuantSiLU", "QuantLlamaDecoderLayer"):  # child-only / standalone-only
        assert wrapper in wc.exercised(wc.aggregate(snapshot))
        problems = wc.problems(registered, wc.aggregate(_without(snapshot, wrapper)), reasons)
        assert len(problems) == 1 and problems[0].startswith(f"{wrapper}: registered in tico, exercised by no case")


def test_a_newly_registered_tico_wrapper_fails_until_a_case_or_reason_covers_it(snapshot, monkeypatch):
    """Inject a class into tico's real registry: the enumeration picks it up and the check fails."""
    from tico.quantization.wrapq.wrappers import registry
    from tico.quantization.wrapq.wrappers.quant_module_base import QuantModuleBase

    class FakeFloat(torch.nn.Module):
        pass

    QuantFakeNew = type("QuantFakeNew", (QuantModuleBase,), {"__module__": "tico.quantization.wrapq.wrappers.fake"})
    registry.lookup(torch.nn.Linear)
    monkeypatch.setitem(registry._WRAPPERS, FakeFloat, QuantFakeNew)
    reasons = wc.load_reasons()
    problems = wc.problems(wc.tico_wrappers(), wc.aggregate(snapshot), reasons)
    assert len(problems) == 1 and problems[0].startswith("QuantFakeNew: registered in tico, exercised by no case")
    assert (
        wc.problems(
            wc.tico_wrappers(),
            wc.aggregate(snapshot),
            dict(reasons, QuantFakeNew="a fake wrapper injected by this test; nothing builds it"),
        )
        == []
    )


def test_out_of_tree_wrappers_are_not_tico_s(monkeypatch):
    from tico.quantization.wrapq.wrappers import registry
    from tico.quantization.wrapq.wrappers.quant_module_base import QuantModuleBase

    class FakeFloat(torch.nn.Module):
        pass

    QuantElsewhere = type("QuantElsewhere", (QuantModuleBase,), {"__module__": "somebody_elses_package"})
    registry.lookup(torch.nn.Linear)
    monkeypatch.setitem(registry._WRAPPERS, FakeFloat, QuantElsewhere)
    assert "QuantElsewhere" not in wc.tico_wrappers()


def test_stale_reasons_fail(snapshot):
    registered, agg, reasons = wc.tico_wrappers(), wc.aggregate(snapshot), wc.load_reasons()
    exercised = dict(reasons, QuantLinear="claimed unexercised although every Linear case runs it")
    problems = wc.problems(registered, agg, exercised)
    assert len(problems) == 1 and "QuantLinear: a reason is stated" in problems[0] and "nn_linear" in problems[0]
    gone = dict(reasons, QuantNoLongerThere="a wrapper tico registered once but not any more")
    problems = wc.problems(registered, agg, gone)
    assert len(problems) == 1 and "tico no longer registers" in problems[0]
    empty = dict(reasons, QuantConv2d="")
    assert any("is not a reason" in p for p in wc.problems(registered, agg, empty))


def test_instantiated_but_not_run_is_not_exercised():
    """A wrapper whose forward does not run on the evaluation input is not counted."""
    from tico.quantization import convert, prepare
    from tico.quantization.config.ptq import PTQConfig

    class OneOfTwo(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.used, self.unused = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.used(x)

    torch.manual_seed(0)
    model = prepare(OneOfTwo(), PTQConfig(strict_wrap=False), inplace=True)
    model(torch.randn(2, 4))
    model = convert(model, inplace=True)
    ran: set[int] = set()
    model(torch.randn(2, 4))  # outside the recorder: not counted
    assert ran == set()
    with wc.record_forwards(ran):
        model(torch.randn(2, 4))
    cov = wc.measure(model, ran)
    assert cov["instantiated"] == {"QuantLinear": 2} and cov["ran_as_child"] == {"QuantLinear": 1}
    agg = wc.aggregate({"toy": cov, "toy_unused": dict(cov, ran_quant={}, ran_as_child={})})
    assert agg["QuantLinear"]["child"] == ["toy"] and agg["QuantLinear"]["instantiated_only"] == ["toy_unused"]


def test_matrix_run_records_the_map_through_xdist(tmp_path, snapshot):
    """The plugin attaches the measurement to one item per case; the controller merges it from
    two workers into results.json, equal to the snapshot."""
    cases = ("llama_mlp", "qwen3_vl_vision_patch_merger")
    selection = f"({' or '.join(cases)}) and (quant_accuracy or wrapper_registry)"
    env = dict(os.environ, PYTHONPATH=str(wc.ROOT))
    run = preloaded_python.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-n",
            "2",
            "-k",
            selection,
            f"--wrapq-report-dir={tmp_path}",
            "--no-circle-cache",
            "--no-export-cache",
        ],
        cwd=wc.ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    doc = json.loads((tmp_path / "results.json").read_text())
    carriers = [r["nodeid"] for r in doc["results"] if "wrapper_coverage" in r]
    assert len(carriers) == len(cases), carriers
    measured = wc.from_results(doc)
    assert set(measured) == set(cases)
    for case in cases:
        assert {k: v for k, v in measured[case].items() if k != "seconds"} == snapshot[case]


def test_html_report_shows_the_run_s_map():
    from harness.report.html import render_report
    from tests.report_fixture import HOSTILE, record

    cov = {
        "root": "QuantLlamaMLP",
        "root_ran": True,
        "instantiated": {"QuantLinear": 3, "QuantLlamaMLP": 1, HOSTILE: 1},
        "ran_quant": {"QuantLinear": 3, "QuantLlamaMLP": 1},
        "ran_as_child": {"QuantLinear": 3},
    }
    doc = {
        "run": {},
        "results": [record("mlp_case", "quant_accuracy"), record("mlp_case", "wrapper_registry", wrapper_coverage=cov)],
    }
    html = render_report(doc)
    section = html[
        html.index('<details id="wrapper-coverage">') : html.index("</details>", html.index('id="wrapper-coverage"'))
    ]
    assert "<code>QuantLlamaMLP</code>" in section and 'title="mlp_case"' in section
    assert HOSTILE not in html and "&lt;script&gt;" in section  # instantiated, never run: escaped
    assert "children <code>QuantLinear</code>&times;3" in html
