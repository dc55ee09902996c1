"""The decode case (cases/llama_model_decode.py): the past layout its export sample hands over, and the
tico defect it found, reproduced with the smallest change that removes it (docs/case-measurements.md)."""

from __future__ import annotations

import copy
from unittest import mock

import pytest
import torch

from cases import llama_model, llama_model_decode


def _calibrated_causal_lm():
    from tico.quantization import convert, prepare
    from tico.quantization.config.ptq import PTQConfig

    torch.manual_seed(0)
    built = llama_model_decode.build_causal_lm_decode("tiny")
    prepared = prepare(copy.deepcopy(built.module), PTQConfig(), inplace=True)
    with torch.no_grad():
        for sample in built.inputs.calibration:
            sample.call(prepared)
    return built, convert(prepared, inplace=True).eval()


def test_the_default_profile_caches_k_with_the_attention_scale_folded_in():
    """Why the export sample scales HF's K by head_dim**-0.5: the wrapper's own prefill caches it so."""
    from tico.quantization import prepare
    from tico.quantization.config.ptq import PTQConfig

    torch.manual_seed(0)
    reference = llama_model.build_causal_lm("tiny").module.eval()
    wrapped = prepare(copy.deepcopy(reference), PTQConfig(), inplace=True).eval()
    ids = torch.randint(0, llama_model.VOCAB, (1, llama_model.WINDOW - 1))
    with torch.no_grad():
        hf = reference(input_ids=ids, use_cache=True).past_key_values.layers
        own = wrapped(input_ids=ids, use_cache=True).past_key_values.layers
    fold = reference.config.head_dim**-0.5
    for hf_layer, own_layer in zip(hf, own, strict=True):
        torch.testing.assert_close(own_layer.keys, hf_layer.keys * fold)
        torch.testing.assert_close(own_layer.values, hf_layer.values)


def test_the_eager_decode_adapter_returns_the_past_it_was_given_as_the_new_kv():
    """llama-decode-delta-eager-returns-past: QuantLlamaForCausalLMDecodeExportAdapter asks for
    cache_output_mode='delta'. QuantLlamaAttention._finalize_cache_output writes the delta into the HF
    Cache only under torch.compiler.is_compiling(); eagerly the Cache keeps the past, and
    QuantLlamaModel.forward returns that Cache. So the eager adapter returns its input past, unchanged,
    as 'new_key_values', while the exported program returns the new token's K/V. Taking the traced
    branch eagerly makes the two agree."""
    built, quantized = _calibrated_causal_lm()
    sample = built.inputs.evaluation["export"]
    args = llama_model_decode.decode_export.args(sample)
    adapter = quantized.wrapped.as_export_module("decode").eval()
    with torch.no_grad():
        logits, eager_kv = adapter(*args)
    past = sample.kwargs["past_key_values"]
    for (k, v), (past_k, past_v) in zip(eager_kv, past, strict=True):
        assert k.shape == past_k.shape == (1, 1, llama_model.WINDOW - 1, 8)
        assert torch.equal(k, past_k) and torch.equal(v, past_v)

    program = torch.export.export(adapter, args)
    with torch.no_grad():
        traced_logits, traced_kv = program.module()(*args)
    torch.testing.assert_close(traced_logits, logits, rtol=0, atol=0)
    assert all(k.shape == v.shape == (1, 1, 1, 8) for k, v in traced_kv)

    with mock.patch("torch.compiler.is_compiling", return_value=True), torch.no_grad():
        fixed_logits, fixed_kv = adapter(*args)
    torch.testing.assert_close(fixed_logits, logits, rtol=0, atol=0)
    for (k, v), (traced_k, traced_v) in zip(fixed_kv, traced_kv, strict=True):
        torch.testing.assert_close(k, traced_k, rtol=0, atol=0)
        torch.testing.assert_close(v, traced_v, rtol=0, atol=0)


def test_generate_on_the_quantized_causal_lm_stops_in_transformers_decode_setup():
    """Why no case calls generate() (docs/tico-coverage.md): QuantLlamaForCausalLM mixes in HF's GenerationMixin
    without being a PreTrainedModel, and on the pinned transformers generate() first asks the model for
    get_experts_implementation, which only PreTrainedModel defines."""
    _, quantized = _calibrated_causal_lm()
    ids = torch.randint(0, llama_model.VOCAB, (1, llama_model_decode.PROMPT))
    with pytest.raises(
        AttributeError, match="'QuantLlamaForCausalLM' object has no attribute 'get_experts_implementation'"
    ):
        quantized.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=2, do_sample=False)
