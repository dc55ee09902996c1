"""The Gemma4 assistant's other public entry points (the call_contract check): the generation adapter
tico hands to Hugging Face's assisted generation (``Gemma4AssistantGenerationAdapter``, its inputs cast
to the assistant's device and dtype), answered as Hugging Face's assistant answers the same draft step
given in the target's lower precision; and the architecture contract the wrapper checks on construction
(``validate_gemma4_assistant_architecture``): each assistant it cannot run (per-layer embeddings,
layers with their own K/V, other layer types, no window, bad centroid settings) refused with its own
error, and the GQA and layer-type helpers' refusals."""

from __future__ import annotations

import copy

import torch

from harness import Built, CallProbe, unwrap


def _utils():
    from tico.quantization.wrapq.wrappers.gemma4_assistant import utils

    return utils


def _half(value):
    """``value`` as a bfloat16 target hands it over: floating tensors cast, the rest as is."""
    if torch.is_tensor(value):
        return value.to(torch.bfloat16) if value.is_floating_point() else value
    if isinstance(value, tuple):
        return tuple(_half(item) for item in value)
    if isinstance(value, dict):
        return {key: _half(item) for key, item in value.items()}
    return value


def _with(config, **changes):
    """A private copy of ``config`` with ``changes`` set."""
    config = copy.deepcopy(config)
    for key, value in changes.items():
        setattr(config, key, value)
    return config


def architecture_probes(built: Built) -> list[CallProbe]:
    """On the padded draft step; the refusals edit a private copy of the assistant's config."""
    utils = _utils()
    kw = dict(built.inputs.evaluation["padded"].kwargs)
    from_target = {key: _half(value) for key, value in kw.items()}

    def as_float(value):
        return value.float() if torch.is_tensor(value) and value.is_floating_point() else value

    def hf_step(hf):
        """HF's assistant on what the adapter casts the target's inputs to (bfloat16 values, float32 compute)."""
        inputs = {key: _half(value) for key, value in kw.items()}
        inputs = {
            key: {k: tuple(as_float(t) for t in v) for k, v in value.items()}
            if isinstance(value, dict)
            else as_float(value)
            for key, value in inputs.items()
        }
        return hf(**inputs)

    def edited(edit, subject=lambda model: model.config):
        def call(_m):
            model = copy.deepcopy(built.module)
            edit(model.config, model.config.get_text_config())
            return utils.validate_gemma4_assistant_architecture(subject(model))

        return call

    def text(**changes):
        return edited(lambda config, text_config: [setattr(text_config, k, v) for k, v in changes.items()])

    def top(**changes):
        return edited(lambda config, text_config: [setattr(config, k, v) for k, v in changes.items()])

    def own_kv_layer(model):
        model.model.layers[0].self_attn.is_kv_shared_layer = False
        return model

    def no_masked_embedding(model):
        model.masked_embedding = None
        return model

    text_config = built.module.config.get_text_config()
    refused = [
        (
            "an assistant with per-layer embeddings",
            text(hidden_size_per_layer_input=8),
            "requires hidden_size_per_layer_input == 0",
        ),
        (
            "an assistant with a per-layer vocabulary",
            text(vocab_size_per_layer_input=8),
            "requires vocab_size_per_layer_input == 0",
        ),
        ("an assistant layer with its own K/V", text(num_kv_shared_layers=0), "must consume target shared KV states"),
        (
            "an assistant with an unknown layer type",
            text(layer_types=["full_attention", "chunked_attention"]),
            "Unsupported Gemma4 assistant layer types",
        ),
        ("sliding layers without a window", text(sliding_window=0), "require a positive sliding_window"),
        ("ordered embeddings without centroids", top(num_centroids=0), "require num_centroids > 0"),
        (
            "a centroid top-k above the centroids",
            top(centroid_intermediate_top_k=10**6),
            "centroid_intermediate_top_k must be in",
        ),
        (
            "a vocabulary the centroids do not divide",
            top(num_centroids=text_config.vocab_size - 1, centroid_intermediate_top_k=1),
            "require vocab_size to be divisible",
        ),
        (
            "a model whose layer owns its K/V projections",
            edited(lambda c, t: None, own_kv_layer),
            "layer 0 owns its own K/V projections",
        ),
        (
            "ordered embeddings without the masked embedder",
            edited(lambda c, t: None, no_masked_embedding),
            "requires a masked_embedding module",
        ),
    ]
    probes = [
        CallProbe(
            "the generation adapter on the target's bfloat16 inputs",
            lambda m: utils.Gemma4AssistantGenerationAdapter(m)(**from_target),
            reference=hf_step,
            pick=lambda out: [out.logits],
        ),
        CallProbe(
            "the generation adapter on a module that is no assistant",
            lambda m: utils.Gemma4AssistantGenerationAdapter(torch.nn.Linear(2, 2)),
            refusal="TypeError: Gemma4AssistantGenerationAdapter requires a QuantGemma4AssistantForCausalLM",
        ),
        CallProbe(
            "head dim of an unknown layer type",
            lambda m: utils.assistant_layer_type_head_dim(text_config, "chunked_attention"),
            refusal="ValueError: Unsupported Gemma4 assistant layer type",
        ),
        CallProbe(
            "KV heads that do not divide the heads",
            lambda m: utils.assistant_shared_kv_num_heads(_with(text_config, num_key_value_heads=0)),
            refusal="ValueError: Invalid Gemma4 assistant GQA head configuration",
        ),
    ]
    return (
        probes
        + [CallProbe(label, call, refusal=f"ValueError: .*{pattern}") for label, call, pattern in refused]
        + _construction_probes(built, kw)
    )


def _construction_probes(built: Built, kw: dict) -> list[CallProbe]:
    """What tico's prepare and the core's export adapter take and refuse: an untied LM head (answered as HF
    answers), a tie the weights do not keep, a core export of no assistant or of one without ordered
    embeddings, and a PTQWrapper asked for an export module or for a module type no wrapper serves."""
    from tico.quantization import prepare
    from tico.quantization.config.gemma4_assistant_builders import build_gemma4_assistant_ptq_config
    from tico.quantization.wrapq.wrappers.gemma4_assistant.export_adapters import Gemma4AssistantCoreExportAdapter
    from tico.quantization.wrapq.wrappers.ptq_wrapper import PTQWrapper

    def untied(keep_the_flag: bool):
        model = copy.deepcopy(built.module)
        model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
        model.config.tie_word_embeddings = keep_the_flag
        return model

    def prepared(model):
        return prepare(model, build_gemma4_assistant_ptq_config(num_hidden_layers=len(model.model.layers)))

    def without_ordered_embeddings(m):
        unwrap(m).masked_embedding = None
        return Gemma4AssistantCoreExportAdapter(m)

    return [
        CallProbe(
            "an untied LM head (tie_word_embeddings=False)",
            lambda m: prepared(untied(False))(**kw),
            reference=lambda hf: untied(False)(**kw),
            pick=lambda out: [out.logits],
        ),
        CallProbe(
            "tie_word_embeddings=True over two weights",
            lambda m: prepared(untied(True)),
            refusal="ValueError: Gemma4 assistant config declares tie_word_embeddings=True",
        ),
        CallProbe(
            "a core export of no assistant",
            lambda m: Gemma4AssistantCoreExportAdapter(torch.nn.Linear(2, 2)),
            refusal="TypeError: Gemma4 assistant core export requires a QuantGemma4AssistantForCausalLM",
        ),
        CallProbe(
            "a core export without ordered embeddings",
            without_ordered_embeddings,
            refusal="ValueError: Gemma4 assistant core export requires use_ordered_embeddings=True",
            mode="quant",
        ),
        CallProbe(
            "an export module of a wrapper that has none",
            lambda m: (
                m.lm_head.as_export_module("prefill")
                if hasattr(m, "lm_head")
                else m.wrapped.lm_head.as_export_module("prefill")
            ),
            refusal="NotImplementedError: .* does not implement as_export_module",
        ),
        CallProbe(
            "a PTQWrapper around a module no wrapper serves",
            lambda m: PTQWrapper(torch.nn.Bilinear(2, 2, 2)),
            refusal="NotImplementedError: No quant wrapper for Bilinear",
        ),
    ]
