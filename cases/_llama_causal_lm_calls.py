"""The Llama causal LM's generation call contract (the call_contract check): one greedy step the way
HF's ``generate()`` drives a model (the wrapper's ``prepare_inputs_for_generation`` on the cache the prefill returned,
then the forward it prepared), with the past as the DynamicCache or as legacy (K, V) tuples, and beam
search's cache reordering (``_reorder_cache``), each answered as Hugging Face's LlamaForCausalLM and
DynamicCache answer it. One unpadded prompt: a padded one meets two open findings
(``llama-model-2d-padding-mask``, ``llama-model-position-ids-ignored``) that other probes show."""

from __future__ import annotations

import torch

from harness import Built, CallProbe, unwrap


def _legacy(cache) -> tuple:
    return tuple((layer.keys, layer.values) for layer in cache.layers)


def _dynamic(legacy):
    from transformers.cache_utils import DynamicCache

    cache = DynamicCache()
    for index, (k, v) in enumerate(legacy):
        cache.update(k.clone(), v.clone(), layer_idx=index)
    return cache


def causal_lm_probes(built: Built) -> list[CallProbe]:
    # a prompt one token short of the static window, so the step fills it
    ids = built.inputs.evaluation["default"].kwargs["input_ids"][:1, :-1]
    next_token = torch.tensor([[3]])
    grown = torch.cat([ids, next_token], 1)
    mask = torch.ones_like(grown)
    beams = torch.tensor([0, 0])

    def step(model, legacy: bool):
        past = model(input_ids=ids, attention_mask=mask[:, :-1], use_cache=True).past_key_values
        if legacy:
            past = _legacy(past)
        inputs = unwrap(model).prepare_inputs_for_generation(grown, past_key_values=past, attention_mask=mask)
        return model(**inputs)

    def hf_step(hf):
        past = hf(input_ids=ids, use_cache=True).past_key_values
        return hf(input_ids=next_token, past_key_values=past, attention_mask=mask, use_cache=True)

    def hf_past(hf):
        return _legacy(hf.model(input_ids=ids, use_cache=True).past_key_values)

    def values(cache_or_tuple):
        """The reordered V of each layer (the wrapper caches K in its own RoPE layout)."""
        layers = cache_or_tuple if isinstance(cache_or_tuple, tuple) else _legacy(cache_or_tuple)
        return [v for _, v in layers]

    def reorder_cache_object(m):
        """HF 5's Cache.reorder_cache reorders in place (and returns None, which _reorder_cache passes on)."""
        cache = _dynamic(_legacy(m(input_ids=ids, use_cache=True).past_key_values))
        type(unwrap(m))._reorder_cache(cache, beams)
        return cache

    def hf_reorder(hf):
        cache = _dynamic(hf_past(hf))
        cache.reorder_cache(beams)
        return cache

    return [
        CallProbe(
            "a generate() step on the DynamicCache",
            lambda m: step(m, legacy=False),
            reference=hf_step,
            pick=lambda out: [out.logits],
        ),
        CallProbe(
            "a generate() step on legacy (K, V) tuples",
            lambda m: step(m, legacy=True),
            reference=hf_step,
            pick=lambda out: [out.logits],
        ),
        CallProbe(
            "beam reordering of legacy (K, V) tuples",
            lambda m: type(unwrap(m))._reorder_cache(_legacy(m(input_ids=ids, use_cache=True).past_key_values), beams),
            reference=hf_reorder,
            pick=values,
        ),
        CallProbe("beam reordering of a DynamicCache", reorder_cache_object, reference=hf_reorder, pick=values),
        CallProbe(
            "the prefill export module with return_kv=True (logits and each layer's V)",
            lambda m: unwrap(m).as_export_module("prefill", return_kv=True)(ids),
            reference=lambda hf: (hf(input_ids=ids).logits, hf_past(hf)),
            pick=lambda out: [out[0], *values(tuple(out[1]))],
        ),
    ]
