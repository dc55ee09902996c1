"""The checks for what tico builds rather than what it outputs: circle_structure (the Circle graph
against its baseline), name_contract (fp_name is the float module's path), circle_call (the Circle
model called by keyword), override_scope (an override lands on exactly its module). Each fails on a
seeded defect with a message naming it and passes on clean tico; tests/test_seeded_tico_regressions.py
seeds the same kinds into a copy of tico."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from cases.cnn import CASES as CNN_CASES
from cases.llama import CASES as LLAMA_CASES
from cases.nn import CASES as NN_CASES
from harness.circle.structure import differences
from harness.golden import structure_store
from harness.pipeline import Pipeline, RunSettings
from harness.primitives.fp_name_audit import audit
from harness.primitives.override_addressing import probe as override_probe
from tests.helpers import CHECKS, problems_text, run_check, run_clean_check

REPO = Path(__file__).resolve().parents[1]
NN_LINEAR = next(c for c in NN_CASES if c.name == "nn_linear")
ATTENTION = next(c for c in LLAMA_CASES if c.name == "llama_attention_prefill")
LLAMA_MLP = next(c for c in LLAMA_CASES if c.name == "llama_mlp")


def _structure_run(
    golden_dir: Path, case=NN_LINEAR, update: str | None = None, base: Path | None = None, group: str | None = None
):
    settings = RunSettings(golden_dir=golden_dir, update_golden=update, base_results=base)
    pipeline = Pipeline(case, "tiny", settings=settings)
    if group is not None:  # as collection sets it (harness/run/items.py): the file, then the group
        pipeline.group = group
    return CHECKS["circle_structure"].run(pipeline)


@pytest.mark.parametrize("check", ["circle_structure", "name_contract", "circle_call", "override_scope"])
@pytest.mark.parametrize("case", [NN_LINEAR, ATTENTION], ids=lambda c: c.name)
def test_clean_tico_passes(case, check):
    result = run_clean_check(case, check)
    assert result.passed, problems_text(result)


def test_a_structure_difference_is_named_by_op_scope_and_count():
    base = json.loads(structure_store.path(REPO / "golden", "llama_attention_prefill", "tiny").read_text())
    current = json.loads(json.dumps(base["structure"]))
    current["ops"]["QuantLlamaAttention"]["BROADCAST_TO"] += 2
    current["inputs"][1]["dtype"] = "float32"
    changes = differences(base["structure"], current)
    assert "BROADCAST_TO 2 -> 4 in QuantLlamaAttention" in changes
    assert "input 1 (position_embeddings_0) dtype uint8 -> float32" in changes
    assert differences(base["structure"], base["structure"]) == []


def test_a_missing_or_damaged_baseline_fails_with_the_command_that_writes_it(tmp_path):
    text = problems_text(_structure_run(tmp_path, group="cases/nn.py::nn_linear[tiny]"))
    command = "./scripts/env.sh pytest 'cases/nn.py::nn_linear::circle_structure[tiny]' --update-golden"
    assert "no structure baseline" in text and command in text
    file = structure_store.path(tmp_path, "nn_linear", "tiny")
    file.parent.mkdir(parents=True)
    file.write_text("{not json")
    assert "is unreadable" in problems_text(_structure_run(tmp_path))


def test_a_changed_baseline_fails_and_a_declared_move_is_a_note(tmp_path):
    shutil.copytree(REPO / "golden" / "structure", tmp_path / "structure")
    file = structure_store.path(tmp_path, "nn_linear", "tiny")
    doc = json.loads(file.read_text())
    doc["structure"]["ops"]["QuantLinear"]["FULLY_CONNECTED"] = 2
    file.write_text(json.dumps(doc))
    assert "FULLY_CONNECTED 2 -> 1 in QuantLinear" in problems_text(_structure_run(tmp_path))
    case = NN_LINEAR.__class__(**{**NN_LINEAR.__dict__, "settings": {"circle_structure": {"may_move": "test"}}})
    moved = _structure_run(tmp_path, case)
    assert moved.passed and any("allowed: test" in note for note in moved.notes)


def test_a_baseline_recorded_on_another_tico_release_is_reported_not_gated(tmp_path, monkeypatch):
    """A committed record gates the release it was recorded on (a checkout or copy of it too); on another release
    the difference is a note naming both, and --baseline (a run of that release) is what gates it."""
    import importlib.metadata

    shutil.copytree(REPO / "golden" / "structure", tmp_path / "structure")
    file = structure_store.path(tmp_path, "nn_linear", "tiny")
    doc = json.loads(file.read_text())
    doc["structure"]["ops"]["QuantLinear"]["FULLY_CONNECTED"] = 2
    file.write_text(json.dumps(doc))
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda d: "9.9.dev1" if d == "tico" else real(d))
    other = _structure_run(tmp_path)
    assert other.passed, problems_text(other)
    note = next(n for n in other.notes if "FULLY_CONNECTED 2 -> 1" in n)
    assert f"recorded on tico {doc['tico']['version']}, this run is tico 9.9.dev1: not gated here" in note


def test_the_rewrite_writes_the_baseline_and_fail_mode_never_passes_a_new_one(tmp_path):
    written = _structure_run(tmp_path, update="fail")
    assert not written.passed and "(new)" in problems_text(written)
    assert _structure_run(tmp_path).passed
    assert _structure_run(tmp_path, update="fail").passed  # unchanged


def test_with_a_baseline_run_the_base_runs_structure_is_the_reference(tmp_path):
    shutil.copytree(REPO / "golden" / "structure", tmp_path / "structure")
    current = _structure_run(tmp_path).evidence["structure"]
    base_structure = json.loads(json.dumps(current))
    base_structure["ops"]["QuantLinear"]["FULLY_CONNECTED"] = 3
    record = {"nodeid": "cases/nn.py::nn_linear::circle_structure[tiny]", "evidence": {"structure": base_structure}}
    base = tmp_path / "base" / "results.json"
    base.parent.mkdir()
    base.write_text(json.dumps({"run": {"run_id": "b"}, "results": [record]}))
    result = _structure_run(tmp_path, base=base)
    assert "against the base run" in problems_text(result) and "FULLY_CONNECTED 3 -> 1" in problems_text(result)
    collected = _structure_run(tmp_path, base=base, group="cases/nn.py::nn_linear[tiny]")
    assert "against the base run" in problems_text(collected), collected.notes


def test_name_audit_names_a_copied_a_layer_local_and_a_missing_name():
    from tico.quantization.config.ptq import PTQConfig
    from tico.quantization.wrapq.wrap_helper import PTQWrapHelper
    from tico.quantization.wrapq.wrappers.ptq_wrapper import PTQWrapper

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Sequential(torch.nn.Linear(4, 4)))

    def wrap(root):
        root[0] = PTQWrapper(root[0], fp_name="1.0")  # copied from a sibling
        root[1][0] = PTQWrapper(root[1][0], fp_name="0.0")  # a name that exists nowhere
        return root

    found = audit(model, wrap)
    text = "\n".join(found.problems)
    assert "fp_name '1.0' (Linear) but it wraps the float module at '0'" in text
    assert "fp_name '0.0' names no module of the float model (its float module is at '1.0')" in text
    clean = audit(torch.nn.Sequential(torch.nn.Linear(4, 4)), lambda m: PTQWrapHelper().wrap_supported(m, PTQConfig()))
    assert clean.problems == [] and clean.wrappers == 1


def test_name_contract_fails_when_a_wrapper_drops_its_childrens_names(monkeypatch):
    import tico.quantization.wrapq.wrappers.llama.quant_mlp as quant_mlp

    monkeypatch.setattr(quant_mlp, "join_name", lambda parent, child: None)
    text = problems_text(run_check(LLAMA_MLP, "name_contract"))
    assert "QuantLinear at wrapped.gate_proj.wrapped has no fp_name though it is nested in a named tree" in text


def test_circle_call_names_an_input_bound_to_anothers_value(monkeypatch):
    from tico.utils import signature

    def bind_in_call_order(self, args, kwargs, check=True):
        return list(signature.flatten_and_convert_args(args)) + list(
            signature.flatten_and_convert_kwargs(kwargs).values()
        )

    monkeypatch.setattr(signature.ModelInputSpec, "bind", bind_in_call_order)
    text = problems_text(run_check(ATTENTION, "circle_call"))
    assert "input 0 'hidden_states' was bound to the value given for 'position_embeddings_0'" in text
    assert "raised CircleRuntimeValidationError (FAKE_QUANTIZE)" in text


def test_circle_call_compares_in_fake_quantize_where_native_execution_is_refused():
    result = run_clean_check(ATTENTION, "circle_call")
    # two call forms through the binding in FAKE_QUANTIZE, and each through CircleModel and infer, whose
    # runtime input lists are compared though NATIVE refuses the graph
    assert result.passed and result.metrics["calls"] == 6, result.notes
    for path in ("CircleModel(...)", "tico.interpreter.infer.infer"):
        assert any(n.startswith(f"{path}: NATIVE execution refused by design") for n in result.notes), result.notes
    assert set(result.evidence["other_runtimes"]) == {"circle-interpreter", "onert"}


def test_circle_call_runs_circle_model_natively_where_the_runtime_can():
    concat = next(c for c in CNN_CASES if c.name == "tico_concat")
    result = run_clean_check(concat, "circle_call")
    assert result.passed, problems_text(result)
    # its keyword call in FAKE_QUANTIZE, then through CircleModel and infer, outputs compared in NATIVE
    assert result.metrics["calls"] == 3 and not any("refused" in n for n in result.notes), result.notes


def _two_layer_model() -> torch.nn.Module:
    layers = torch.nn.ModuleList([torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)])
    return torch.nn.Sequential(layers, torch.nn.Linear(4, 4))


def _wrap_layers(layer_scope):
    """Wrap ``_two_layer_model`` as a model wrapper does, layer ``i`` with the scope ``layer_scope(i)``."""
    from tico.quantization.wrapq.wrappers.ptq_wrapper import PTQWrapper

    def wrap(model, cfg):
        for i in range(2):
            model[0][i] = PTQWrapper(model[0][i], qcfg=cfg.child("0").child(layer_scope(i)), fp_name=f"0.{i}")
        model[1] = PTQWrapper(model[1], qcfg=cfg.child("1"), fp_name="1")
        return model

    return wrap


def test_override_scope_aims_at_the_last_layer_and_passes_where_each_layer_reads_its_index():
    from tico.quantization.config.ptq import PTQConfig

    report = override_probe(_two_layer_model(), PTQConfig(), _wrap_layers(str))
    assert [t.address for t in report.targets] == [("0", "0", "weight"), ("0", "1", "weight")]
    assert report.problems == [] and len(report.rows) == 2 * 5
    assert all(row["moved"] == [row["target"]] for row in report.rows)


def test_override_scope_names_an_override_that_reaches_no_layer_or_every_layer():
    from tico.quantization.config.ptq import PTQConfig

    none = "\n".join(override_probe(_two_layer_model(), PTQConfig(), _wrap_layers(lambda i: "0")).problems)
    assert "override 0.1.weight -> int16 (set_override(tuple), kwargs) did not reach it (still uint8)" in none
    every = "\n".join(override_probe(_two_layer_model(), PTQConfig(), _wrap_layers(lambda i: "1")).problems)
    assert "override 0.1.weight -> int16 (dot-path key, QuantSpec leaf) also moved 1 other observers" in every
    assert "e.g. ['0.0.weight']" in every


def test_override_scope_fails_when_a_wrapper_hands_a_child_its_siblings_scope(monkeypatch):
    from tico.quantization.config.ptq import PTQConfig

    child = PTQConfig.child
    swapped = {"q_proj": "k_proj", "k_proj": "q_proj"}
    monkeypatch.setattr(PTQConfig, "child", lambda self, scope: child(self, swapped.get(scope, scope)))
    result = run_check(ATTENTION, "override_scope")
    text = problems_text(result)
    assert "override q_proj.weight -> int16 (nested mapping, kwargs leaf) did not reach it (still uint8);" in text
    assert "it moved 1 other observers instead, e.g. ['k_proj.weight']" in text
    assert result.metrics["misplaced_overrides"] == 5


def test_circle_call_probes_that_another_batch_and_dtype_are_refused_by_name(monkeypatch):
    clean = run_clean_check(NN_LINEAR, "circle_call")
    assert set(clean.evidence["refusals"]) == {"batch", "dtype"}
    assert "Input 'args_0' has wrong dimension torch.Size([4, 16])" in clean.evidence["refusals"]["batch"]

    from tico.utils import signature

    monkeypatch.setattr(signature.ModelInputSpec, "check_shapes", lambda self, inputs: None)
    text = problems_text(run_check(NN_LINEAR, "circle_call"))
    assert "input 'args_0' in another batch (torch.uint8, shape (4, 16); serialized torch.uint8, (2, 16))" in text
    assert "was bound without complaint" in text
