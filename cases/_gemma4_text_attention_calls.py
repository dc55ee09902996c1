"""The Gemma4 text attention's call contract (the call_contract check): the forms
``QuantGemma4TextAttention.forward`` documents beyond the case's sample (keep masks, masks longer than
the step it slices, shared K/V through ``shared_kv_states``, a past as HF's DynamicCache, the cache
output modes), each answered as Hugging Face's Gemma4TextAttention answers the same request, and the
inputs it refuses. The wrapper's sine is in tico's pre-negated convention, HF's ordinary."""

from __future__ import annotations

import torch

from cases._gemma4_text_common import flip_sin_half
from harness import Built, CallProbe


def _output(out) -> list[torch.Tensor]:
    return [out[0]]


def _hf(hf, kw: dict, *, cache=None):
    """HF's call for the wrapper's keyword call ``kw``: ordinary sine, shared K/V under the layer type."""
    cos, sin = kw["position_embeddings"]
    states = {hf.layer_type: kw["shared_key_value"]} if "shared_key_value" in kw else {}
    return hf(kw["hidden_states"], (cos, flip_sin_half(sin)), kw["attention_mask"], states, past_key_values=cache)


def _dynamic_cache(past, layer_idx: int):
    from transformers.cache_utils import DynamicCache

    cache = DynamicCache()
    cache.update(past[0].clone(), past[1].clone(), layer_idx=layer_idx)
    return cache


def text_attention_probes(built: Built) -> list[CallProbe]:
    kw = dict(built.inputs.evaluation["default"].kwargs)
    additive = kw["attention_mask"]  # (1, 1, Q, K)
    batch, _, q_len, k_len = additive.shape
    keep = additive == 0
    hf_cache = None
    if "past_key_value" in kw:
        layer_idx = built.module.layer_idx
        hf_cache = lambda: _dynamic_cache(kw["past_key_value"], layer_idx)  # noqa: E731

    def call(label, *, ours):
        """The wrapper's call with ``ours`` changed; HF's with the sample's mask (a fresh cache each)."""
        wrapper_kwargs = {**kw, **ours}
        return CallProbe(
            label,
            lambda m: m(**wrapper_kwargs),
            reference=lambda hf: _hf(hf, kw, cache=hf_cache() if hf_cache else None),
            pick=_output,
        )

    def refused(label, refusal, **changes):
        return CallProbe(label, lambda m: m(**{**kw, **changes}), refusal=refusal)

    probes = [
        call("(B, 1, Q, K) bool keep mask", ours={"attention_mask": keep}),
        call("(B, Q, K) keep mask", ours={"attention_mask": keep[:, 0]}),
        call(
            "keep mask over more keys (sliced)",
            ours={"attention_mask": torch.cat([keep, torch.ones(batch, 1, q_len, 2, dtype=torch.bool)], -1)},
        ),
        call(
            "keep mask with more query rows (last rows kept)",
            ours={"attention_mask": torch.cat([torch.ones(batch, 1, 2, k_len, dtype=torch.bool), keep], -2)},
        ),
        call("cache_output_mode='full'", ours={"use_cache": True, "cache_output_mode": "full"}),
        refused("a 5-D keep mask", "RuntimeError: .*rank", attention_mask=keep[None]),
        refused(
            "a per-head keep mask", "RuntimeError: Per-head attention masks", attention_mask=torch.cat([keep, keep], 1)
        ),
        refused(
            "a keep mask over fewer keys",
            "RuntimeError: attention_mask key length is shorter",
            attention_mask=keep[..., 1:],
        ),
        refused(
            "an unknown cache_output_mode",
            "ValueError: Unsupported cache_output_mode",
            use_cache=True,
            cache_output_mode="all",
        ),
    ]
    cos, sin = kw["position_embeddings"]
    if batch == 1:  # a rank-2 table implies one sequence
        probes.append(call("RoPE tables of rank 2 (S, H)", ours={"position_embeddings": (cos[0], sin[0])}))
    probes += [
        call("RoPE tables of rank 4 (B, S, 1, H)", ours={"position_embeddings": (cos[:, :, None], sin[:, :, None])}),
        refused(
            "RoPE tables of rank 5",
            "RuntimeError: RoPE table must have rank 2, 3, or 4",
            position_embeddings=(cos[:, :, None, None], sin[:, :, None, None]),
        ),
        refused(
            "a complex mask",
            "RuntimeError: Unsupported attention_mask dtype",
            attention_mask=additive.to(torch.complex64),
        ),
    ]
    if q_len > 2:
        probes.append(
            refused(
                "a keep mask with too few query rows",
                "RuntimeError: attention_mask query length",
                attention_mask=keep[..., :2, :],
            )
        )
    if hf_cache is not None:
        probes.append(
            CallProbe(
                "past as HF's DynamicCache, the updated cache out",
                lambda m: m(**{**kw, "past_key_value": hf_cache(), "use_cache": True, "cache_output_mode": "present"}),
                reference=lambda hf: _hf(hf, kw, cache=hf_cache()),
                pick=_output,
            )
        )
    if "shared_key_value" in kw:
        shared = kw["shared_key_value"]
        ours = {k: v for k, v in kw.items() if k != "shared_key_value"}
        layer_type = built.module.layer_type
        probes += [
            CallProbe(
                "shared K/V through shared_kv_states",
                lambda m: m(**ours, shared_kv_states={layer_type: shared}),
                reference=lambda hf: _hf(hf, kw),
                pick=_output,
            ),
            CallProbe(
                "shared_kv_states without this layer type",
                lambda m: m(**ours, shared_kv_states={"other_attention": shared}),
                refusal="RuntimeError: Gemma4 shared-KV attention requires",
            ),
        ]
    return probes
