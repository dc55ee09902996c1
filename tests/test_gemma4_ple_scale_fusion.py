"""The Gemma4 PLE scale fusion case (tico's Gemma4 recipe load step before wrapq): its checks fail on a
seeded fusion defect and see the fused tree, not the unfused reference."""

from __future__ import annotations

import dataclasses

import torch

from cases.gemma4_ple_scale_fusion import CASES, PLE_WIDTH
from harness.pipeline import Pipeline
from tests.helpers import problems_text, run_check

FUSION = CASES[0]
_TABLE = "embed_tokens_per_layer"


def _fold_without_swapping_the_class(monkeypatch):
    """The fusion scales the table in place but leaves HF's scaled embedding in the model (the
    replacement is the source module itself): the lookup multiplies by embed_scale once more."""
    from tico.quantization.wrapq.wrappers.gemma4 import embedding_scale_fusion

    class TheSourceItself(embedding_scale_fusion.FusedGemma4PLEEmbedding):
        def __new__(cls, source):
            return source

    monkeypatch.setattr(embedding_scale_fusion, "FusedGemma4PLEEmbedding", TheSourceItself)


def _swap_in_an_unscaled_copy(monkeypatch):
    """The fused module ends up holding a copy of the table taken before the scale was applied: the model
    looks up the unscaled weight and no longer multiplies (the scale is lost)."""
    from tico.quantization.wrapq.wrappers.gemma4 import embedding_scale_fusion

    original = embedding_scale_fusion.fuse_gemma4_ple_embedding_scale

    def fuse_from_a_copy(model):
        unscaled = {name: m.weight.detach().clone() for name, m in model.named_modules() if name.endswith(_TABLE)}
        fused = original(model)
        for name in fused:
            model.get_submodule(name).weight = torch.nn.Parameter(unscaled[name], requires_grad=False)
        return fused

    monkeypatch.setattr(embedding_scale_fusion, "fuse_gemma4_ple_embedding_scale", fuse_from_a_copy)


def test_the_case_runs_tico_s_fusion_on_a_ple_model_and_keeps_the_reference_unfused():
    from tico.quantization.wrapq.wrappers.gemma4.embedding_scale_fusion import FusedGemma4PLEEmbedding

    pipeline = Pipeline(FUSION, "tiny")
    assert pipeline.built.module.config.hidden_size_per_layer_input == PLE_WIDTH
    fused = pipeline.float_module.get_submodule(_TABLE)
    reference = pipeline.built.module.get_submodule(_TABLE)
    assert isinstance(fused, FusedGemma4PLEEmbedding) and not isinstance(reference, FusedGemma4PLEEmbedding)
    assert float(reference.embed_scale) == PLE_WIDTH**0.5
    torch.testing.assert_close(fused.weight, reference.weight * reference.embed_scale, rtol=0, atol=0)
    assert pipeline.algorithm_record.facts["fused_modules"] == [_TABLE]


def test_gain_and_accuracy_catch_a_fusion_that_applies_the_scale_twice(monkeypatch):
    _fold_without_swapping_the_class(monkeypatch)
    gain = run_check(FUSION, "algorithm_gain")
    assert not gain.passed
    assert "transformed float module vs original" in problems_text(gain)
    assert not run_check(FUSION, "quant_accuracy").passed


def test_gain_catches_a_fusion_that_loses_the_scale(monkeypatch):
    """algorithm_handoff reads a uniform factor as a fold the wrapper may make (the Llama attention scale in
    k_proj), so it reports this one (1/embed_scale) rather than failing; the float-identity claim fails."""
    _swap_in_an_unscaled_copy(monkeypatch)
    handoff = run_check(FUSION, "algorithm_handoff")
    assert any("folded by 0.25" in note for note in handoff.notes), handoff.notes
    gain = run_check(FUSION, "algorithm_gain")
    assert not gain.passed
    assert "transformed float module vs original" in problems_text(gain)


def test_observer_use_sees_the_fused_tree_the_case_quantizes():
    """The fused table's wrapper collects the identity embed_scale and never applies it; observer_use
    reports that (the case explains it) because it wraps the algorithm's output, not the reference."""
    assert run_check(FUSION, "observer_use").passed
    unexplained = dataclasses.replace(
        FUSION,
        unused_observers={k: v for k, v in FUSION.unused_observers.items() if not k.startswith(_TABLE)},
    )
    result = run_check(unexplained, "observer_use")
    assert not result.passed
    assert f"observer {_TABLE}.wrapped.obs_embed_scale was calibrated but its fake-quant never ran" in (
        problems_text(result)
    )
