"""The Qwen3-VL multimodal model's call contract (the call_contract check): the calls
``QuantQwen3VLModel.forward`` takes besides an image prompt with HF's positions (text-only prompts,
padded and as ``inputs_embeds``, a video in the image's place, an image with the wrapper laying out
its own positions under a padding mask), each answered as Hugging Face's Qwen3VLModel answers it,
and the inputs it refuses. HF lays out multimodal positions only from ``mm_token_type_ids``
(1 image, 2 video), so it is given them; the wrapper finds the spans from the token ids. tico's fixed-span
fusion adapters for deployment are probed on the same prompt (``cases/_qwen3_vl_fusion_calls.py``)."""

from __future__ import annotations

import copy

import torch

from cases._qwen3_vl_fusion_calls import fusion_probes
from harness import Built, CallProbe

TEXT_SEQ = 12
PADDED = 3  # right padding of the second text prompt


def _hidden(out) -> list[torch.Tensor]:
    return [out[0] if isinstance(out, tuple) else out.last_hidden_state]


def model_probes(built: Built, *, text_token_limit: int) -> list[CallProbe]:
    cfg = built.facts["config"]
    image = dict(built.inputs.evaluation["default"].kwargs)
    image.pop("logits_to_keep", None)
    image["position_ids"] = None  # the wrapper's own rope index
    image_types = (image["input_ids"] == cfg.image_token_id).long()
    video_ids = image["input_ids"].masked_fill(image_types.bool(), cfg.video_token_id)
    video = {
        "input_ids": video_ids,
        "pixel_values_videos": image["pixel_values"],
        "video_grid_thw": image["image_grid_thw"],
        "return_dict": False,
    }
    ids = torch.randint(0, text_token_limit, (2, TEXT_SEQ), generator=torch.Generator().manual_seed(11))
    keep = torch.ones(2, TEXT_SEQ, dtype=torch.long)
    keep[1, -PADDED:] = 0

    def embeds(module) -> torch.Tensor:
        with torch.no_grad():
            return built.module.get_input_embeddings()(ids)

    def same(label, kwargs, hf_extra, valid=None):
        return CallProbe(
            label,
            lambda m: m(**kwargs),
            reference=lambda hf: hf(**kwargs, **hf_extra),
            pick=_hidden,
            valid_tokens=valid,
        )

    return [
        same("a text-only prompt", {"input_ids": ids}, {}),
        same("a padded text-only batch", {"input_ids": ids, "attention_mask": keep}, {}, valid=keep.bool()),
        CallProbe(
            "a padded text-only batch as inputs_embeds",
            lambda m: m(inputs_embeds=embeds(m), attention_mask=keep),
            reference=lambda hf: hf(inputs_embeds=embeds(hf), attention_mask=keep),
            pick=_hidden,
            valid_tokens=keep.bool(),
        ),
        same("a video in the image's place, own positions", video, {"mm_token_type_ids": 2 * image_types}),
        same(
            "an image prompt under a padding mask, own positions",
            {**image, "attention_mask": torch.ones_like(image["input_ids"])},
            {"mm_token_type_ids": image_types},
        ),
        CallProbe(
            "input_ids and inputs_embeds",
            lambda m: m(input_ids=ids, inputs_embeds=embeds(m)),
            refusal="ValueError: .*exactly one of",
        ),
        *fusion_probes(built),
        *_generation_probes(built, image, image_types),
    ]


def _generation_probes(built: Built, image: dict, image_types: torch.Tensor) -> list[CallProbe]:
    """Positions given HF's way (``mm_token_type_ids``), one decode step on the image prompt's cache (the
    wrapper's cached rope deltas), and the visual layout ``prepare`` refuses without its start."""
    from tico.quantization import prepare
    from tico.quantization.config.ptq import PTQConfig

    grid = tuple(int(n) for n in image["image_grid_thw"][0])
    step = torch.tensor([[7]])
    seq = image["input_ids"].shape[1]

    def decode(module, **prefill_extra):
        out = module(**image, **prefill_extra, use_cache=True)
        past = out[1] if isinstance(out, tuple) else out.past_key_values
        return module(input_ids=step, past_key_values=past, use_cache=True, cache_position=torch.tensor([seq]))

    def without_start(**vision):
        layout = {"grid_thw": grid, "spatial_merge_size": 2, **vision}
        return lambda _m: prepare(copy.deepcopy(built.module), PTQConfig(model_args={"vision": layout}))

    return [
        CallProbe(
            "an image prompt with mm_token_type_ids (HF's rope index)",
            lambda m: m(**image, mm_token_type_ids=image_types),
            reference=lambda hf: hf(**image, mm_token_type_ids=image_types),
            pick=_hidden,
        ),
        CallProbe(
            "a decode step on the image prompt's cache, own positions",
            decode,
            reference=lambda hf: decode(hf, mm_token_type_ids=image_types),
            pick=_hidden,
        ),
        CallProbe(
            "a vision layout without visual_start_idx",
            without_start(),
            refusal="ValueError: vision.visual_start_idx must be specified",
        ),
        CallProbe(
            "a negative visual_start_idx",
            without_start(visual_start_idx=-1),
            refusal="ValueError: vision.visual_start_idx must be greater than zero",
        ),
    ]
