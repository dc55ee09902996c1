"""The call_contract check: options a user may pass must give Hugging Face's answer and inputs the
wrapper's contract refuses must be refused with its own error. Seeded tico defects (a guard
dropped, an option ignored, a stage that loses what it should keep) fail it; clean tico passes."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from tico.quantization.wrapq.wrappers.gemma4.ple_embedding_host import Gemma4PLEEmbeddingHostTable
from tico.quantization.wrapq.wrappers.gemma4.quant_text_model import QuantGemma4TextModel
from tico.quantization.wrapq.wrappers.gemma4.vision_split_export import Gemma4VisionEncoderLayerExportAdapter

from cases._gemma4_assistant_architecture_calls import architecture_probes
from cases._gemma4_ple_host_calls import ple_stage_probes
from cases._gemma4_vision_split_calls import vision_split_probes
from cases._qwen3_vl_fusion_calls import fusion_probes as qwen_fusion_probes
from cases.gemma4_assistant import CASES as ASSISTANT_CASES
from cases.gemma4_multimodal import MODEL_CASES
from cases.gemma4_text import TEXT_MODEL
from cases.gemma4_vision_tower import CASES as GEMMA4_TOWER_CASES
from cases.llama_model import CASES as LLAMA_MODEL_CASES
from cases.qwen3_vl_text import CASES as QWEN3_VL_TEXT_CASES
from cases.spinquant_llama import CASES as SPIN_CASES
from harness import CallContractCapability, CallProbe
from harness.model.sweep import expand, make_variant
from tests.helpers import problems_text, run_check, run_clean_check


def test_clean_gemma4_text_model_keeps_its_call_contract():
    result = run_clean_check(TEXT_MODEL, "call_contract")
    assert result.passed, problems_text(result)
    assert result.metrics["options_probed"] >= 10 and result.metrics["refusals_probed"] >= 10


def test_a_dropped_guard_fails_the_refusal(monkeypatch):
    """The per-head check removed from the explicit-mask normalization: the (B, 2, S, S) mask is
    no longer refused by the wrapper's own error."""
    original = QuantGemma4TextModel._normalize_explicit_mask_shape

    def without_head_check(mask, *, batch_size, q_len, kv_len):
        return original(mask[:, :1], batch_size=batch_size, q_len=q_len, kv_len=kv_len)

    monkeypatch.setattr(QuantGemma4TextModel, "_normalize_explicit_mask_shape", staticmethod(without_head_check))
    text = problems_text(run_check(TEXT_MODEL, "call_contract"))
    assert "[per-head 4-D mask] the wrapper accepted an input its contract refuses" in text


def test_ignored_position_ids_fail_against_hugging_face(monkeypatch):
    """Caller-supplied position_ids dropped for the wrapper's own template (positions 0..S-1)."""
    original = QuantGemma4TextModel._make_position_ids

    def ignoring(self, *, inputs_embeds, past_key_values, position_ids):
        return original(self, inputs_embeds=inputs_embeds, past_key_values=past_key_values, position_ids=None)

    monkeypatch.setattr(QuantGemma4TextModel, "_make_position_ids", ignoring)
    text = problems_text(run_check(TEXT_MODEL, "call_contract"))
    assert "[position_ids (B, S)] tensor 0: not close" in text
    assert "[position_ids rank 1] tensor 0: not close" in text


def test_a_refusal_with_another_error_fails():
    """A guard whose input now fails deeper down (another error) is not the wrapper's refusal."""
    probe = CallProbe("bad ids", lambda m: m(input_ids=torch.zeros(1, 2, 3)), refusal="ValueError: never raised")
    case = dataclasses.replace(TEXT_MODEL, calls=CallContractCapability(probes=lambda built: [probe]))
    text = problems_text(run_check(case, "call_contract"))
    assert '[bad ids] refused with "RuntimeError: Expected tensor for argument #1' in text


def test_no_probe_fails_and_a_malformed_probe_is_refused():
    case = dataclasses.replace(TEXT_MODEL, calls=CallContractCapability(probes=lambda built: []))
    assert "lists no probe" in problems_text(run_check(case, "call_contract"))
    with pytest.raises(ValueError, match="exactly one of refusal, reference and twin"):
        CallProbe("both", lambda m: m(), refusal="x", reference=lambda hf: hf())
    with pytest.raises(ValueError, match="exactly one of refusal, reference and twin"):
        CallProbe("twin and reference", lambda m: m(), twin=lambda m: m(), reference=lambda hf: hf())


GEMMA4_MODEL = {case.name: case for case in MODEL_CASES}["gemma4_model"]
ASSISTANT_CORE = {case.name: case for case in ASSISTANT_CASES}["gemma4_assistant_core"]
QWEN3_VL_MODEL = {case.name: case for case in QWEN3_VL_TEXT_CASES}["qwen3_vl_model"]
LLAMA_FOR_CAUSAL_LM = {case.name: case for case in LLAMA_MODEL_CASES}["llama_for_causal_lm"]
SPIN_LLAMA_FOR_CAUSAL_LM = {case.name: case for case in SPIN_CASES}["spin_llama_for_causal_lm"]
GEMMA4_VISION_POOLER = {case.name: case for case in GEMMA4_TOWER_CASES}["gemma4_vision_pooler"]


def _ple_stages_case():
    """The text model's PLE variant with only the PLE export-stage probes (the twin probes among them)."""
    case = expand(TEXT_MODEL, make_variant(TEXT_MODEL.sweep, {"ple": 16}))
    return dataclasses.replace(case, calls=CallContractCapability(probes=ple_stage_probes))


def test_clean_ple_stages_agree_with_hugging_face_and_their_twins():
    result = run_check(_ple_stages_case(), "call_contract")
    assert result.passed, problems_text(result)
    assert result.metrics == {"options_probed": 9, "refusals_probed": 12}


def test_a_host_table_that_reads_every_artifact_as_fused_fails(monkeypatch):
    """The loader takes schema 1 for the fused schema 2 and skips the embed_scale multiply (the contract
    the schema bump exists to keep apart): the saved QUANT table no longer replays the export stage, and
    the float one no longer answers as Hugging Face."""
    original = Gemma4PLEEmbeddingHostTable.__init__

    def as_fused(self, artifact):
        original(self, artifact)
        self.embed_scale_fused = True

    monkeypatch.setattr(Gemma4PLEEmbeddingHostTable, "__init__", as_fused)
    text = problems_text(run_check(_ple_stages_case(), "call_contract"))
    assert "[PLE host table saved and loaded replays the QUANT stage] tensor 0: not close" in text
    assert "[PLE host table, float artifact] tensor 0: not close" in text
    assert "[PLE embedding stage (NO_QUANT)]" not in text


def test_split_vision_stages_that_bind_rope_as_sin_cos_fail(monkeypatch):
    """One split encoder-layer stage hands its shared RoPE inputs to the layer as (sin, cos): the chained
    stages no longer answer as HF's image features nor as the monolithic module they split."""
    original = Gemma4VisionEncoderLayerExportAdapter.forward
    monkeypatch.setattr(
        Gemma4VisionEncoderLayerExportAdapter,
        "forward",
        lambda self, h, mask, cos, sin: original(self, h, mask, sin, cos),
    )
    case = dataclasses.replace(GEMMA4_MODEL, calls=CallContractCapability(probes=vision_split_probes))
    text = problems_text(run_check(case, "call_contract"))
    assert "[split vision stages chained (NO_QUANT)] tensor 0: not close" in text
    assert "[split vision stages chained (QUANT) as the monolithic module] tensor 0: not close" in text
    assert "[monolithic vision prefill module (NO_QUANT)]" not in text


def test_a_twin_that_raises_is_a_malformed_probe():
    probe = CallProbe("broken twin", lambda m: torch.zeros(1), twin=lambda m: m.no_such_method(), pick=lambda t: [t])
    case = dataclasses.replace(TEXT_MODEL, calls=CallContractCapability(probes=lambda built: [probe]))
    assert "[broken twin] the reference call raised" in problems_text(run_check(case, "call_contract"))


def test_a_deepstack_stage_one_token_late_fails(monkeypatch):
    """The DeepStack export stage counts the vision-start token into its span (start + 1): its residual
    lands one position late, unlike HF's placeholder-mask add; the embedding fusion is untouched."""
    from tico.quantization.wrapq.wrappers.qwen_vl.export_adapters import Qwen3VLDeepstackFusionExportAdapter

    original = Qwen3VLDeepstackFusionExportAdapter.__init__

    def one_late(self, *, visual_start_idx):
        original(self, visual_start_idx=visual_start_idx + 1)

    monkeypatch.setattr(Qwen3VLDeepstackFusionExportAdapter, "__init__", one_late)
    case = dataclasses.replace(QWEN3_VL_MODEL, calls=CallContractCapability(probes=qwen_fusion_probes))
    text = problems_text(run_check(case, "call_contract"))
    assert "[a DeepStack feature added at the fixed span] tensor 0: not close" in text
    assert "[image embeddings placed at the fixed span]" not in text


def test_a_generation_adapter_that_moves_but_does_not_cast_fails(monkeypatch):
    """The assisted-generation adapter moves the target's tensors to the assistant's device but keeps
    their bfloat16 (the cast it exists for): the float32 assistant can no longer take the draft step
    HF's assistant takes on the same values; the architecture refusals are untouched."""
    from tico.quantization.wrapq.wrappers.gemma4_assistant.utils import Gemma4AssistantGenerationAdapter

    original = Gemma4AssistantGenerationAdapter._cast_to_assistant
    monkeypatch.setattr(
        Gemma4AssistantGenerationAdapter,
        "_cast_to_assistant",
        lambda self, value: value.to(device=self.assistant.device) if torch.is_tensor(value) else original(self, value),
    )
    case = dataclasses.replace(ASSISTANT_CORE, calls=CallContractCapability(probes=architecture_probes))
    text = problems_text(run_check(case, "call_contract"))
    assert "[the generation adapter on the target's bfloat16 inputs]" in text
    assert "[an assistant with per-layer embeddings]" not in text


def test_an_lm_head_stage_that_loses_spinquants_rotation_fails(monkeypatch):
    """The staged LM head looks for SpinQuant's ``rotate_lm_head`` on the inner model (where the embedding's
    rotation lives) and finds none: on the rotated model its logits leave HF's; the token-embedding stage, the
    forward's options and plain Llama (nothing to rotate) are untouched."""
    from tico.quantization.wrapq.wrappers.llama.export_adapters import LlamaLMHeadExportAdapter

    original = LlamaLMHeadExportAdapter.__init__

    def looking_on_the_inner_model(self, qmodel):
        original(self, qmodel)
        self.rotate_lm_head = getattr(qmodel.model.wrapped, "rotate_lm_head", None)

    monkeypatch.setattr(LlamaLMHeadExportAdapter, "__init__", looking_on_the_inner_model)
    text = problems_text(run_check(SPIN_LLAMA_FOR_CAUSAL_LM, "call_contract"))
    assert "[the LM-head export stage] tensor 0: not close" in text
    assert "[the token-embedding export stage]" not in text and "[the loss against labels]" not in text
    assert run_check(LLAMA_FOR_CAUSAL_LM, "call_contract").passed


def test_a_pooler_export_that_no_longer_bakes_the_padding_fails(monkeypatch):
    """The pooler's export matrix stops zeroing the padding slots' columns: the padding slots' hidden states
    are averaged into the pooled outputs, which leave HF's (HF drops them with the padding mask); the eager
    pooler's own refusal is untouched."""
    from tico.quantization.wrapq.wrappers.gemma4.quant_vision_pooler import QuantGemma4VisionPooler

    def unbaked(cls, *, seq_len, output_length, pixel_position_ids):
        weights, valid = cls._build_pool_weights(
            seq_len=seq_len, output_length=output_length, pixel_position_ids=pixel_position_ids
        )
        return weights, int(valid[0].sum())

    monkeypatch.setattr(QuantGemma4VisionPooler, "_build_export_pool_weights", classmethod(unbaked))
    text = problems_text(run_check(GEMMA4_VISION_POOLER, "call_contract"))
    assert "[the export module on a padded layout, padding baked into the pooling] tensor 0: not close" in text
    assert "[more outputs than patches]" not in text
