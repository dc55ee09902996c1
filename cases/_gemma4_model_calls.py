"""The Gemma4 model and head wrappers' call contract (the call_contract check). The heads
(``QuantGemma4ForConditionalGeneration``, ``QuantGemma4ForCausalLM``) take ``logits_to_keep`` as a count
or as positions and ``labels`` for HF's loss, each answered as Hugging Face's head answers it;
``QuantGemma4Model`` takes ``inputs_embeds`` for a text prompt and refuses placeholder tokens without
their pixels, ids with embeddings, and ids with per-layer inputs; its vision tower's deployment exports
(monolithic and split) are probed in ``cases/_gemma4_vision_split_calls.py``."""

from __future__ import annotations

import torch

from cases._gemma4_vision_split_calls import vision_split_probes
from harness import Built, CallProbe


def _same(label, kwargs, pick) -> CallProbe:
    return CallProbe(label, lambda m: m(**kwargs), reference=lambda hf: hf(**kwargs), pick=pick)


def head_probes(built: Built) -> list[CallProbe]:
    """On the text prompt (``padded`` has one; both head cases have ``default`` text or image)."""
    kwargs = dict(built.inputs.evaluation["padded"].kwargs)
    ids = kwargs["input_ids"]
    return [
        _same("logits_to_keep=1", {**kwargs, "logits_to_keep": 1}, lambda out: [out.logits]),
        _same(
            "logits_to_keep as positions", {**kwargs, "logits_to_keep": torch.tensor([0, 5])}, lambda out: [out.logits]
        ),
        _same("labels (HF's loss)", {**kwargs, "labels": ids}, lambda out: [out.loss, out.logits]),
    ]


def model_probes(built: Built) -> list[CallProbe]:
    image = built.inputs.evaluation["default"].kwargs
    text_ids = built.inputs.evaluation["text"].kwargs["input_ids"]
    config = built.module.config
    video_ids = image["input_ids"].masked_fill(image["input_ids"] == config.image_token_id, config.video_token_id)

    def embeds() -> torch.Tensor:
        with torch.no_grad():
            return built.module.get_input_embeddings()(text_ids)

    def refused(label, refusal, **kwargs):
        return CallProbe(label, lambda m: m(**kwargs), refusal=refusal)

    return [
        CallProbe(
            "a text prompt as inputs_embeds",
            lambda m: m(inputs_embeds=embeds()),
            reference=lambda hf: hf(inputs_embeds=embeds()),
            pick=lambda out: [out.last_hidden_state],
        ),
        refused(
            "image placeholders without pixel_values",
            "ValueError: pixel_values must be provided",
            input_ids=image["input_ids"],
        ),
        refused(
            "video placeholders without videos", "ValueError: pixel_values_videos must be provided", input_ids=video_ids
        ),
        refused(
            "input_ids and inputs_embeds", "ValueError: .*exactly one of", input_ids=text_ids, inputs_embeds=embeds()
        ),
        refused(
            "input_ids with per_layer_inputs",
            "ValueError: .*cannot specify per_layer_inputs",
            input_ids=text_ids,
            per_layer_inputs=torch.zeros(*text_ids.shape, 1, 1),
        ),
        *vision_split_probes(built),
    ]
