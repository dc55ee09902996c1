"""The Llama causal LM's generation call contract (the call_contract check): one greedy step the way
HF's ``generate()`` drives a model (the wrapper's ``prepare_inputs_for_generation`` on the cache the prefill returned,
then the forward it prepared), with the past as the DynamicCache or as legacy (K, V) tuples, and beam
search's cache reordering (``_reorder_cache``), each answered as Hugging Face's LlamaForCausalLM and
DynamicCache answer it. One unpadded prompt: a padded one meets two open findings
(``llama-model-2d-padding-mask``, ``llama-model-position-ids-ignored``) that other probes show.
The first generate() step from ``inputs_embeds`` and a step with the caller's positions are prepared
too; the forward's own options (``logits_to_keep`` as a count and as positions, ``labels``,
``return_dict=False``) and the token-embedding and LM-head stages of tico's per-layer export
(``llama/export_adapters.py``; SpinQuant's rotations in them on the spin cases) answer as HF does."""

from __future__ import annotations

import torch

from cases._tico_api import prepared_for_export
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

    def first_step_from_embeds(model):
        inputs = unwrap(model).prepare_inputs_for_generation(ids, inputs_embeds=embeds)
        return model(**inputs)

    def step_at_given_positions(model):
        past = model(input_ids=ids, attention_mask=mask[:, :-1], use_cache=True).past_key_values
        at = torch.tensor([ids.shape[1]])
        inputs = unwrap(model).prepare_inputs_for_generation(
            grown, past_key_values=past, attention_mask=mask, position_ids=at[None], cache_position=at
        )
        return model(**inputs)

    with torch.no_grad():
        embeds = built.module.get_input_embeddings()(ids)
    return [
        CallProbe(
            "a first generate() step from inputs_embeds",
            first_step_from_embeds,
            reference=lambda hf: hf(inputs_embeds=embeds, use_cache=True),
            pick=lambda out: [out.logits],
        ),
        CallProbe(
            "a generate() step at the caller's position_ids and cache_position",
            step_at_given_positions,
            reference=hf_step,
            pick=lambda out: [out.logits],
        ),
        *_forward_option_probes(ids),
        *_stage_probes(built, ids),
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
            lambda m: prepared_for_export(unwrap(m).as_export_module("prefill", return_kv=True), ids.shape[-1])(ids),
            reference=lambda hf: (hf(input_ids=ids).logits, hf_past(hf)),
            pick=lambda out: [out[0], *values(tuple(out[1]))],
        ),
    ]


def _forward_option_probes(ids: torch.Tensor) -> list[CallProbe]:
    """The forward's options besides the case's call, each asked of HF with the same arguments."""
    labels = ids.roll(-1, 1)

    def same(label, pick, **options):
        return CallProbe(
            label, lambda m: m(input_ids=ids, **options), reference=lambda hf: hf(input_ids=ids, **options), pick=pick
        )

    return [
        same("the last token's logits only (logits_to_keep=1)", lambda out: [out.logits], logits_to_keep=1),
        same(
            "the logits of chosen positions (logits_to_keep as a tensor)",
            lambda out: [out.logits],
            logits_to_keep=torch.tensor([0, ids.shape[1] - 2]),
        ),
        same("the loss against labels", lambda out: [out.loss, out.logits], labels=labels),
        same("a tuple answer (return_dict=False)", lambda out: [out[0]], return_dict=False),
    ]


def _stage_probes(built: Built, ids: torch.Tensor) -> list[CallProbe]:
    """tico's token-embedding and LM-head export stages, eager, against the same computation in HF's
    model (the rotation SpinQuant adds after the embedding and before the head included)."""
    from tico.quantization.wrapq.wrappers.llama.export_adapters import (
        LlamaLMHeadExportAdapter,
        LlamaTokenEmbeddingExportAdapter,
    )

    hidden = built.module.config.hidden_size
    state = torch.rand(1, 1, hidden, generator=torch.Generator().manual_seed(5)) - 0.5

    def rotated(module, name, x):
        rotation = getattr(module, name, None)
        return rotation(x) if rotation is not None else x

    return [
        CallProbe(
            "the token-embedding export stage",
            lambda m: LlamaTokenEmbeddingExportAdapter(unwrap(m))(ids),
            reference=lambda hf: rotated(hf.model, "rotate_embedding", hf.model.embed_tokens(ids)),
            pick=lambda out: [out],
        ),
        CallProbe(
            "the LM-head export stage",
            lambda m: LlamaLMHeadExportAdapter(unwrap(m))(state),
            reference=lambda hf: hf.lm_head(rotated(hf, "rotate_lm_head", hf.model.norm(state))),
            pick=lambda out: [out],
        ),
    ]
