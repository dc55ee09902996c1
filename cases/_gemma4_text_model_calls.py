"""The Gemma4 text model's call contract (the call_contract check): the options
``QuantGemma4TextModel.forward`` documents, each answered as Hugging Face's Gemma4TextModel answers
it, and the inputs it refuses, each with its own error.

Masks are given in the forms the wrapper normalizes (2-D keep, 3-D and 4-D additive or bool, longer
spans it slices, a mapping per layer type); Hugging Face's eager attention adds a 4-D mask as it is,
so it is handed the additive form of the same truth."""

from __future__ import annotations

import copy

import torch

from cases._gemma4_ple_fusion_calls import fusion_probes
from cases._gemma4_ple_host_calls import ple_stage_probes
from cases._gemma4_text_common import additive_mask, allowed_pairs
from harness import Built, CallProbe, unwrap


def _hidden(out) -> list[torch.Tensor]:
    return [out.last_hidden_state]


def text_model_probes(built: Built, *, seq: int, sliding_window: int) -> list[CallProbe]:
    """Options and refusals on the padded (B=2) sample; with PLE on, the PLE-only ones and those of tico's
    PLE scale fusion (``cases/_gemma4_ple_fusion_calls.py``) and of its export stages and host artifact
    (``cases/_gemma4_ple_host_calls.py``)."""
    cfg = built.facts["config"]
    sample = built.inputs.evaluation["padded"]
    ids, keep = sample.kwargs["input_ids"], sample.kwargs["attention_mask"]
    batch = ids.shape[0]
    full = additive_mask(allowed_pairs(seq, keep=keep))
    mapping = {
        "full_attention": full,
        "sliding_attention": additive_mask(allowed_pairs(seq, window=sliding_window, keep=keep)),
    }
    # positions with a gap of 5 mid-prompt (RoPE sees only differences, so a shift alone would
    # match a wrapper that ignored them for its own 0..S-1)
    positions = (torch.arange(seq) + 5 * (torch.arange(seq) >= seq // 2))[None].expand(batch, -1)

    def same(label, **kwargs):
        """The same keyword call on both modules."""
        return CallProbe(label, lambda m: m(input_ids=ids, **kwargs), reference=lambda hf: hf(input_ids=ids, **kwargs))

    def masked(label, mask, hf_mask=full):
        return CallProbe(
            label,
            lambda m: m(input_ids=ids, attention_mask=mask),
            reference=lambda hf: hf(input_ids=ids, attention_mask=hf_mask),
        )

    def refused(label, refusal, mode="noquant", **kwargs):
        return CallProbe(label, lambda m: m(**kwargs), refusal=refusal, mode=mode)

    def too_long(m):
        return m(input_ids=torch.zeros(1, unwrap(m).static_max_seq + 1, dtype=torch.long))

    probes = [
        same("position_ids (B, S)", attention_mask=keep, position_ids=positions),
        CallProbe(
            "position_ids rank 1",
            lambda m: m(input_ids=ids, attention_mask=keep, position_ids=positions[0]),
            reference=lambda hf: hf(input_ids=ids, attention_mask=keep, position_ids=positions),
        ),
        CallProbe(
            "output_hidden_states",
            lambda m: m(input_ids=ids, attention_mask=keep, output_hidden_states=True),
            reference=lambda hf: hf(input_ids=ids, attention_mask=keep, output_hidden_states=True),
            pick=lambda out: list(out.hidden_states),
        ),
        CallProbe(
            "return_dict=False with the cache",
            lambda m: m(input_ids=ids, attention_mask=keep, return_dict=False, use_cache=True),
            reference=lambda hf: hf(input_ids=ids, attention_mask=keep, return_dict=False, use_cache=True),
            pick=lambda out: [out[0], *(t for layer in out[1].layers for t in (layer.keys, layer.values))],
        ),
        CallProbe(
            "return_dict=False with hidden states and attentions",
            lambda m: m(
                input_ids=ids, attention_mask=keep, return_dict=False, output_hidden_states=True, output_attentions=True
            ),
            reference=lambda hf: hf(input_ids=ids, attention_mask=keep, return_dict=False, output_hidden_states=True),
            pick=lambda out: [out[0], *out[1]],
        ),
        CallProbe(
            "return_shared_kv_states",
            lambda m: m(input_ids=ids, attention_mask=keep, return_shared_kv_states=True).last_hidden_state,
            reference=lambda hf: hf(input_ids=ids, attention_mask=keep).last_hidden_state,
            pick=lambda out: [out],
        ),
        CallProbe(
            "inputs_embeds",
            lambda m: m(inputs_embeds=_embeddings(built, ids), attention_mask=keep),
            reference=lambda hf: hf(inputs_embeds=hf.embed_tokens(ids), attention_mask=keep),
            pick=_hidden,
        ),
        masked("4-D additive mask", full),
        masked("3-D additive mask", full[:, 0]),
        masked("4-D bool keep mask", full == 0),
        masked("4-D mask over more keys (sliced)", torch.cat([full, torch.zeros(batch, 1, seq, 3)], -1)),
        masked("4-D mask with more query rows (last rows kept)", torch.cat([torch.zeros(batch, 1, 3, seq), full], -2)),
        masked("a mask per layer type", mapping, hf_mask=mapping),
        CallProbe(
            "shared_kv_states=None",
            lambda m: m(input_ids=ids, attention_mask=keep, shared_kv_states=None),
            reference=lambda hf: hf(input_ids=ids, attention_mask=keep),
            pick=_hidden,
        ),
        refused(
            "input_ids and inputs_embeds",
            "ValueError: .*exactly one of",
            input_ids=ids,
            inputs_embeds=_embeddings(built, ids),
        ),
        refused("neither input_ids nor inputs_embeds", "ValueError: .*exactly one of", attention_mask=keep),
        refused("position_ids rank 3", "ValueError: .*rank 1 or 2", input_ids=ids, position_ids=positions[None]),
        refused(
            "position_ids too short", "ValueError: position_ids length", input_ids=ids, position_ids=positions[:, 1:]
        ),
        refused(
            "position_ids of another batch",
            "ValueError: position_ids batch",
            input_ids=ids,
            position_ids=torch.arange(seq)[None].expand(batch + 1, -1),
        ),
        # tico main words its own refusal after the model's capacity, not the static window
        CallProbe(
            "a prompt past static_max_seq",
            too_long,
            refusal="ValueError: .*(exceeds static_max_seq|eager context exceeds max_position_embeddings)",
        ),
        refused(
            "2-D mask of another batch", "ValueError: 2D attention-mask batch", input_ids=ids, attention_mask=keep[:1]
        ),
        refused(
            "2-D mask of another length",
            "ValueError: 2D attention-mask length",
            input_ids=ids,
            attention_mask=keep[:, 1:],
        ),
        refused("5-D mask", "ValueError: .*rank 3 or 4", input_ids=ids, attention_mask=full[None]),
        refused(
            "4-D mask of another batch",
            "ValueError: Explicit mask batch",
            input_ids=ids,
            attention_mask=full.expand(batch + 1, -1, -1, -1) if batch == 1 else torch.cat([full, full[:1]]),
        ),
        refused("per-head 4-D mask", "ValueError: Per-head", input_ids=ids, attention_mask=torch.cat([full, full], 1)),
        refused(
            "4-D mask shorter than the keys",
            "ValueError: .*shorter than the KV span",
            input_ids=ids,
            attention_mask=full[..., 1:],
        ),
        refused(
            "4-D mask with fewer query rows",
            "ValueError: .*fewer query rows",
            input_ids=ids,
            attention_mask=full[..., 1:, :],
        ),
        refused(
            "a mask mapping without the sliding layers'",
            "KeyError: .*missing layer types",
            input_ids=ids,
            attention_mask={"full_attention": full},
        ),
    ]
    if cfg.hidden_size_per_layer_input:
        probes += fusion_probes(built) + ple_stage_probes(built)
        per_layer = torch.zeros(batch, seq, cfg.num_hidden_layers, cfg.hidden_size_per_layer_input)
        with torch.no_grad():
            per_layer_tokens = built.module.get_per_layer_inputs(ids)
        probes += [
            CallProbe(
                "inputs_embeds without per_layer_inputs (the ids recovered from the embeddings)",
                lambda m: m(inputs_embeds=_embeddings(built, ids), attention_mask=keep),
                reference=lambda hf: hf(inputs_embeds=hf.embed_tokens(ids), attention_mask=keep),
                pick=_hidden,
            ),
            CallProbe(
                "inputs_embeds with the per-layer token inputs",
                lambda m: m(
                    inputs_embeds=_embeddings(built, ids), per_layer_inputs=per_layer_tokens, attention_mask=keep
                ),
                reference=lambda hf: hf(
                    inputs_embeds=hf.embed_tokens(ids), per_layer_inputs=per_layer_tokens, attention_mask=keep
                ),
                pick=_hidden,
            ),
            refused(
                "input_ids with per_layer_inputs",
                "ValueError: .*cannot specify per_layer_inputs",
                input_ids=ids,
                per_layer_inputs=per_layer,
            ),
            refused(
                "inputs_embeds without per_layer_inputs in QUANT mode",
                "ValueError: .*requires explicit per_layer_inputs",
                mode="quant",
                inputs_embeds=_embeddings(built, ids),
            ),
        ]
    else:
        probes.append(
            refused(
                "per_layer_inputs without PLE",
                "ValueError: per_layer_inputs was provided, but PLE is disabled",
                inputs_embeds=_embeddings(built, ids),
                per_layer_inputs=torch.zeros(batch, seq, cfg.num_hidden_layers, 1),
            )
        )
    return probes + _prepare_refusals(built, ids, keep)


def _prepare_refusals(built: Built, ids: torch.Tensor, keep: torch.Tensor) -> list[CallProbe]:
    """What tico's ``prepare`` takes and refuses for the text model: an explicit static capacity
    (``model_args.text.max_seq``) answered as HF answers, a capacity of 0 or past the config's (refused by
    the attention layers, which read the same setting and are built first), a layer type and a sliding
    layer without a window it cannot build templates for."""
    from tico.quantization import prepare
    from tico.quantization.config.ptq import PTQConfig

    def prepared(config_edit=None, **text):
        def call(_m):
            module = copy.deepcopy(built.module)
            if config_edit:
                config_edit(module.config)
            return prepare(module, PTQConfig(model_args={"profile": "reference_eval", "text": text}))

        return call

    capacity = built.module.config.max_position_embeddings
    return [
        CallProbe(
            "model_args.text.max_seq given",
            lambda m: prepared(max_seq=ids.shape[1])(m)(input_ids=ids, attention_mask=keep),
            reference=lambda hf: hf(input_ids=ids, attention_mask=keep),
            pick=_hidden,
        ),
        CallProbe(
            "model_args.text.max_seq 0", prepared(max_seq=0), refusal="ValueError: Gemma4 attention max_seq must be"
        ),
        CallProbe(
            "model_args.text.max_seq past max_position_embeddings",
            prepared(max_seq=capacity + 1),
            refusal="ValueError: Gemma4 attention max_seq exceeds",
        ),
        CallProbe(
            "a layer type tico does not wrap",
            prepared(lambda config: setattr(config, "layer_types", ["chunked_attention"] * config.num_hidden_layers)),
            refusal="ValueError: Unsupported Gemma4 text layer types",
        ),
        CallProbe(
            "sliding layers without a window",
            prepared(lambda config: setattr(config, "sliding_window", 0)),
            refusal="ValueError: Gemma4 sliding_attention requires a positive sliding_window",
        ),
    ]


def _embeddings(built: Built, ids: torch.Tensor) -> torch.Tensor:
    """The scaled embeddings of ``ids``, as Hugging Face's text model makes them."""
    with torch.no_grad():
        return built.module.embed_tokens(ids)
