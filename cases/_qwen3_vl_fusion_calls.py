"""The call contract of tico's fixed-span Qwen3-VL fusion adapters (``Qwen3VLVisualEmbeddingFusionAdapter``
of its static runtime, ``Qwen3VLDeepstackFusionExportAdapter`` of ``export_qwen3_vl_per_layer``): on the
image prompt, whose image tokens are one span from its first visual position, they place the image
embeddings and add each DeepStack feature as Hugging Face's Qwen3VLModel does with its placeholder mask
(``masked_scatter``, ``_deepstack_process``); a negative start, tensors of the wrong rank or width and a
span past the sequence are refused with their own errors."""

from __future__ import annotations

import torch

from harness import Built, CallProbe


def _adapters():
    from tico.quantization.wrapq.wrappers.qwen_vl import export_adapters

    return export_adapters


def fusion_probes(built: Built) -> list[CallProbe]:
    adapters = _adapters()
    cfg = built.facts["config"]
    ids = built.inputs.evaluation["default"].kwargs["input_ids"]
    span = (ids[0] == cfg.image_token_id).nonzero().flatten()
    start, count = int(span[0]), len(span)
    hidden = cfg.text_config.hidden_size
    generator = torch.Generator().manual_seed(17)
    image_embeds = torch.rand(count, hidden, generator=generator) - 0.5
    states = torch.rand(1, ids.shape[1], hidden, generator=generator) - 0.5
    with torch.no_grad():
        embeds = built.module.get_input_embeddings()(ids)

    def placed(hf):
        mask, _ = hf.get_placeholder_mask(ids, inputs_embeds=embeds, image_features=image_embeds)
        return embeds.masked_scatter(mask, image_embeds)

    def fusion(tensors=(embeds, image_embeds), first=start):
        return lambda _m: adapters.Qwen3VLVisualEmbeddingFusionAdapter(first)(*tensors)

    def deepstack(tensors=(states, image_embeds), first=start):
        return lambda _m: adapters.Qwen3VLDeepstackFusionExportAdapter(visual_start_idx=first)(*tensors)

    refused = [
        ("fusion from a negative start", fusion(first=-1), "ValueError: visual_start_idx must be non-negative"),
        ("fusion of 2-D embeddings", fusion((embeds[0], image_embeds)), "RuntimeError: inputs_embeds must have shape"),
        (
            "fusion of 3-D image embeddings",
            fusion((embeds, image_embeds[None])),
            "RuntimeError: image_embeds must have shape",
        ),
        ("fusion past the sequence", fusion(first=ids.shape[1] - 1), "RuntimeError: The visual embedding span exceeds"),
        ("DeepStack from a negative start", deepstack(first=-1), "ValueError: visual_start_idx must be non-negative"),
        (
            "DeepStack on a batch of two",
            deepstack((states.expand(2, -1, -1), image_embeds)),
            "RuntimeError: hidden_states must have shape `\\(1, S, H\\)`",
        ),
        (
            "DeepStack of 3-D features",
            deepstack((states, image_embeds[None])),
            "RuntimeError: visual_embeds must have shape",
        ),
        (
            "DeepStack features of another width",
            deepstack((states, image_embeds[:, 1:])),
            "RuntimeError: visual_embeds hidden size does not match",
        ),
        ("DeepStack past the sequence", deepstack(first=ids.shape[1] - 1), "RuntimeError: The DeepStack span exceeds"),
    ]
    return [
        CallProbe(
            "image embeddings placed at the fixed span",
            fusion(),
            reference=placed,
            pick=lambda out: [out],
        ),
        CallProbe(
            "a DeepStack feature added at the fixed span",
            deepstack(),
            reference=lambda hf: hf.language_model._deepstack_process(states, ids == cfg.image_token_id, image_embeds),
            pick=lambda out: [out],
        ),
        *(CallProbe(label, call, refusal=refusal) for label, call, refusal in refused),
    ]
