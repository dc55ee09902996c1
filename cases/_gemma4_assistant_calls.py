"""The Gemma4 assistant core's call contract (the call_contract check): the draft-step forms
``QuantGemma4AssistantForCausalLM.forward`` documents beyond the case's sample (no padding mask, the
per-layer-type mask mapping of the static path as 3-D, 4-D, bool or additive masks, positions left to
it or given 1-D), each answered as Hugging Face's Gemma4AssistantForCausalLM answers the same step,
and the inputs it and tico's host helpers (``canonicalize_gemma4_assistant_static_inputs``,
``Gemma4AssistantStaticShapeConfig``, the sine-table preparation ``prepare_gemma4_rope_sin``) refuse, each
with its own error; the generation adapter and the
architecture contract are probed in ``cases/_gemma4_assistant_architecture_calls.py``, the host sparse head
and its exported artifact in ``cases/_gemma4_assistant_sparse_calls.py``."""

from __future__ import annotations

import dataclasses

import torch

from cases._gemma4_assistant_architecture_calls import architecture_probes
from cases._gemma4_assistant_sparse_calls import sparse_head_probes
from harness import Built, CallProbe


def _logits(out) -> list[torch.Tensor]:
    return [out.logits]


def assistant_probes(built: Built, *, full_capacity: int, sliding_capacity: int, ptq_config) -> list[CallProbe]:
    """On the padded sample; the host canonicalizer gets the case's capacities and the sine convention
    its PTQ config (``ptq_config(profile)``) gives the attention."""
    from tico.quantization.config.gemma4_attention import get_gemma4_text_attention_options
    from tico.quantization.wrapq.wrappers.gemma4.rope import prepare_gemma4_rope_sin
    from tico.quantization.wrapq.wrappers.gemma4_assistant import static_inputs as host
    from transformers.models.gemma4.modeling_gemma4 import Gemma4TextRotaryEmbedding

    config = built.facts["config"]
    rope = get_gemma4_text_attention_options(ptq_config("tiny")).rope
    kw = dict(built.inputs.evaluation["padded"].kwargs)
    kv = kw["shared_kv_states"]
    full_len = kv["full_attention"][0].shape[2]
    hf_masks = built.module.create_attention_masks(
        torch.zeros(1, 1, config.get_text_config().hidden_size), kw["attention_mask"], kv
    )
    shape = host.Gemma4AssistantStaticShapeConfig(full_kv_length=full_capacity, sliding_kv_length=sliding_capacity)

    def as_hf(label, pick=_logits, **ours):
        """The wrapper given ``ours`` in place of the sample's; HF the sample's own step."""
        return CallProbe(label, lambda m: m(**{**kw, **ours}), reference=lambda hf: hf(**kw), pick=pick)

    def both(label, **changes):
        return CallProbe(
            label, lambda m: m(**{**kw, **changes}), reference=lambda hf: hf(**{**kw, **changes}), pick=_logits
        )

    def refused(label, refusal, **changes):
        return CallProbe(label, lambda m: m(**{**kw, **changes}), refusal=refusal)

    def canonical(label, refusal, shape=shape, **changes):
        args = {
            "inputs_embeds": kw["inputs_embeds"],
            "position_ids": kw["position_ids"],
            "attention_mask": kw["attention_mask"],
            "shared_kv_states": kv,
            "shape": shape,
            "model_or_config": config,
            "rotary_emb": Gemma4TextRotaryEmbedding(config.get_text_config()),
            "rope": rope,
            **changes,
        }
        return CallProbe(label, lambda _m: host.canonicalize_gemma4_assistant_static_inputs(**args), refusal=refusal)

    def sine(label, refusal, table, convention=rope):
        return CallProbe(label, lambda _m: prepare_gemma4_rope_sin(table, convention), refusal=refusal)

    def kv_changed(layer_type, key=None, value=None):
        k, v = kv[layer_type]
        return {**kv, layer_type: (k if key is None else key, v if value is None else value)}

    def shape_with(**fields):
        return dataclasses.replace(shape, **fields)

    def from_args(model_args):
        return CallProbe(
            f"static shape from model_args {model_args!r}",
            lambda _m: host.Gemma4AssistantStaticShapeConfig.from_model_args(model_args),
            refusal="ValueError: .*model_args.assistant",
        )

    full_k = kv["full_attention"][0]
    _, sin = Gemma4TextRotaryEmbedding(config.get_text_config())(full_k, kw["position_ids"], "full_attention")
    return [
        both("no padding mask", attention_mask=None),
        as_hf("a 1-D position", position_ids=kw["position_ids"][0]),
        as_hf("HF's per-layer-type masks, as the static path hands them", attention_mask=dict(hf_masks)),
        as_hf("per-layer-type masks as 3-D", attention_mask={t: m[:, 0] for t, m in hf_masks.items()}),
        as_hf(
            "per-layer-type masks as bool keep masks",
            attention_mask={t: (m == 0) if m.dtype != torch.bool else m for t, m in hf_masks.items()},
        ),
        refused("no shared_kv_states", "ValueError: inputs_embeds and shared_kv_states", shared_kv_states=None),
        refused("output_hidden_states", "NotImplementedError: .*hidden states", output_hidden_states=True),
        refused(
            "shared_kv_states without the sliding layers'",
            "ValueError: shared_kv_states is missing layer types",
            shared_kv_states={"full_attention": kv["full_attention"]},
        ),
        refused(
            "a 5-D mask in the mapping",
            "ValueError: .*rank 3 or 4",
            attention_mask={t: m[None] for t, m in hf_masks.items()},
        ),
        refused(
            "a mask over fewer keys than the shared K/V",
            "ValueError: .*key length does not match",
            attention_mask={t: m[..., 1:] for t, m in hf_masks.items()},
        ),
        canonical("host: no position", "ValueError: .*requires explicit position_ids", position_ids=None),
        canonical(
            "host: two positions",
            "ValueError: position_ids must contain one position",
            position_ids=torch.tensor([[1, 2]]),
        ),
        canonical("host: a negative position", "ValueError: position_ids must be non-negative", position_ids=-1),
        canonical(
            "host: 2-D inputs_embeds", "ValueError: inputs_embeds must be rank 3", inputs_embeds=kw["inputs_embeds"][0]
        ),
        canonical(
            "host: a batch of two",
            "ValueError: inputs_embeds batch size",
            inputs_embeds=kw["inputs_embeds"].expand(2, -1, -1),
        ),
        canonical(
            "host: two query tokens",
            "ValueError: inputs_embeds query length",
            inputs_embeds=kw["inputs_embeds"].expand(-1, 2, -1),
        ),
        canonical(
            "host: no sliding K/V",
            "ValueError: shared_kv_states is missing",
            shared_kv_states={"full_attention": kv["full_attention"]},
        ),
        canonical(
            "host: more K/V than the capacity",
            "ValueError: Full shared KV exceeds the static capacity",
            shape=shape_with(full_kv_length=full_len - 1),
        ),
        canonical(
            "host: a 3-D mask",
            "ValueError: attention_mask must be a 2D padding mask",
            attention_mask=kw["attention_mask"][None],
        ),
        canonical(
            "host: a mask shorter than the K/V",
            "ValueError: attention_mask is shorter",
            attention_mask=kw["attention_mask"][:, 1:],
        ),
        canonical(
            "host: 3-D K", "ValueError: .*must be rank 4", shared_kv_states=kv_changed("full_attention", key=full_k[0])
        ),
        canonical(
            "host: K of batch two",
            "ValueError: .*must have batch size 1",
            shared_kv_states=kv_changed("full_attention", key=full_k.expand(2, -1, -1, -1)),
        ),
        canonical(
            "host: K with another head count",
            "ValueError: .*KV heads, expected",
            shared_kv_states=kv_changed("full_attention", key=torch.cat([full_k, full_k], 1)),
        ),
        canonical(
            "host: K with another head dim",
            "ValueError: .*head dim is",
            shared_kv_states=kv_changed("full_attention", key=full_k[..., :-1]),
        ),
        canonical(
            "host: K and V of different lengths",
            "ValueError: .*key/value lengths differ",
            shared_kv_states=kv_changed("full_attention", key=full_k[:, :, 1:]),
        ),
        canonical("host: a static batch of two", "ValueError: .*batch_size=1 only", shape=shape_with(batch_size=2)),
        canonical("host: a static query of two", "ValueError: .*query_length=1 only", shape=shape_with(query_length=2)),
        canonical(
            "host: no full capacity", "ValueError: full_kv_length must be positive", shape=shape_with(full_kv_length=0)
        ),
        canonical(
            "host: no sliding capacity",
            "ValueError: sliding_kv_length must be positive",
            shape=shape_with(sliding_kv_length=0),
        ),
        canonical(
            "host: a capacity past max_position_embeddings",
            "ValueError: full_kv_length exceeds max_position_embeddings",
            shape=shape_with(full_kv_length=config.get_text_config().max_position_embeddings + 1),
        ),
        canonical(
            "host: a sliding capacity under the window",
            "ValueError: sliding_kv_length is too small",
            shape=shape_with(sliding_kv_length=1),
        ),
        sine("host: a sine table in another convention", "ValueError: Unsupported RoPE convention", sin, "neox"),
        sine("host: a sine table of odd width", "ValueError: .*positive, even last dimension", sin[..., 1:]),
        sine("host: an integer sine table", "TypeError: .*must be floating point", sin.long()),
        from_args({"assistant": "full"}),
        from_args({"assistant": {"full_kv_length": full_capacity}}),
        *architecture_probes(built),
        *sparse_head_probes(built),
    ]
