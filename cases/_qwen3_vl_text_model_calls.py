"""The Qwen3-VL text model's call contract (the call_contract check): the options
``QuantQwen3VLTextModel.forward`` takes (explicit 2-D, 3-D and 4-D position ids, a cache position,
``inputs_embeds``, tuple outputs, decoding on the DynamicCache it returns, a 4-D integer mask), each
answered as Hugging Face's Qwen3VLTextModel answers it, and the inputs it refuses.

The batch is two prompts, the second right-padded, so every query row sees a valid key in both
modules (a left-padded row that sees none is softmaxed differently by design). The wrapper folds
1/sqrt(head_dim) into its keys (``FOLDED_SCALE``), so of the cache it returns only the values are
compared with Hugging Face's; its keys are held to HF's through the decode step that reads them."""

from __future__ import annotations

import copy

import torch

from cases._tico_api import HOST_STATIC_INPUTS, static_inputs_prepared
from harness import Built, CallProbe

PADDED = 3  # right padding of the second prompt


def text_model_probes(built: Built, *, seq: int) -> list[CallProbe]:
    cfg = built.facts["config"]
    generator = torch.Generator().manual_seed(7)
    ids = torch.randint(0, cfg.vocab_size, (2, seq), generator=generator)
    keep = torch.ones(2, seq, dtype=torch.long)
    keep[1, -PADDED:] = 0
    # positions with a gap of 5 mid-prompt: RoPE sees only differences, so a shift alone would
    # match a wrapper that ignored them
    gap = (torch.arange(seq) + 5 * (torch.arange(seq) >= seq // 2))[None].expand(2, -1)
    thw = gap[None].expand(3, -1, -1)
    causal_keep = torch.ones(seq, seq, dtype=torch.bool).tril()[None, None] & keep.bool()[:, None, None, :]

    def same(label, pick=None, **kwargs):
        return CallProbe(
            label,
            lambda m: m(input_ids=ids, **kwargs),
            reference=lambda hf: hf(input_ids=ids, **kwargs),
            **({"pick": pick} if pick else {}),
        )

    def refused(label, refusal, **kwargs):
        return CallProbe(label, lambda m: m(**kwargs), refusal=refusal)

    def decode(module, last_mask):
        """Prefill all but the last token with the cache on, then the last token on that cache."""
        full = torch.ones(2, seq, dtype=torch.long)
        past = module(input_ids=ids[:, :-1], attention_mask=full[:, :-1], use_cache=True).past_key_values
        return module(input_ids=ids[:, -1:], attention_mask=last_mask(full), past_key_values=past, use_cache=True)

    def embeds(module) -> torch.Tensor:
        with torch.no_grad():
            return built.module.embed_tokens(ids)

    return [
        same("position_ids (B, S)", attention_mask=keep, position_ids=gap),
        same("position_ids (3, B, S)", attention_mask=keep, position_ids=thw),
        same("position_ids (4, B, S), text row first", attention_mask=keep, position_ids=torch.cat([gap[None], thw])),
        same("cache_position", attention_mask=keep, cache_position=torch.arange(seq)),
        same(
            "return_dict=False with the cache (hidden states and values)",
            pick=lambda out: [out[0], *(layer.values for layer in out[1].layers)],
            attention_mask=keep,
            use_cache=True,
            return_dict=False,
        ),
        same("return_dict=False without the cache", pick=lambda out: [out[0]], attention_mask=keep, return_dict=False),
        CallProbe(
            "a 4-D integer keep mask",
            lambda m: m(input_ids=ids, attention_mask=causal_keep.long()),
            reference=lambda hf: hf(input_ids=ids, attention_mask=keep),
        ),
        CallProbe(
            "inputs_embeds",
            lambda m: m(inputs_embeds=embeds(m), attention_mask=keep),
            reference=lambda hf: hf(inputs_embeds=embeds(hf), attention_mask=keep),
        ),
        CallProbe(
            "decode on the returned DynamicCache, the mask over every key",
            lambda m: decode(m, lambda full: full),
            reference=lambda hf: decode(hf, lambda full: full),
        ),
        CallProbe(
            "decode on the returned DynamicCache, the mask over the new token only",
            lambda m: decode(m, lambda full: full[:, -1:]),
            reference=lambda hf: decode(hf, lambda full: full),
        ),
        refused(
            "input_ids and inputs_embeds", "ValueError: .*exactly one of", input_ids=ids, inputs_embeds=embeds(None)
        ),
        refused("neither input_ids nor inputs_embeds", "ValueError: .*exactly one of", attention_mask=keep),
        refused(
            "2-D mask of another batch", "ValueError: 2D attention_mask batch", input_ids=ids, attention_mask=keep[:1]
        ),
        refused(
            "2-D mask of another length",
            "ValueError: 2D attention_mask length",
            input_ids=ids,
            attention_mask=keep[:, 1:],
        ),
        refused(
            "4-D mask over fewer keys",
            "ValueError: 4D attention_mask shape",
            input_ids=ids,
            attention_mask=causal_keep[..., 1:],
        ),
        refused(
            "3-D mask", "ValueError: Unsupported attention_mask rank", input_ids=ids, attention_mask=causal_keep[:, 0]
        ),
        *_vision_layout_refusals(built),
    ]


def _vision_layout_refusals(built: Built) -> list[CallProbe]:
    """The static multimodal layout ``model_args.vision`` gives the text model's RoPE templates, each
    inconsistent form refused: when tico's ``prepare`` builds the wrapper (0.3.0), or when the static export
    inputs are prepared from it, the only place tico main reads the layout (api_change
    qwen3-vl-vision-layout-read-at-static-export)."""
    from tico.quantization import convert, prepare
    from tico.quantization.config.ptq import PTQConfig

    layout = {"grid_thw": (1, 8, 8), "visual_start_idx": 1, "spatial_merge_size": 2}
    seq = built.inputs.evaluation["default"].kwargs["input_ids"].shape[-1]

    def prepared(**vision):
        def call(_m):
            wrapped = prepare(copy.deepcopy(built.module), PTQConfig(model_args={"vision": {**layout, **vision}}))
            if not HOST_STATIC_INPUTS:
                return wrapped
            with static_inputs_prepared(convert(wrapped), seq):  # static export runs on the converted model
                return wrapped

        return call

    refused = [
        ("vision.grid_thw as a list", prepared(grid_thw=[1, 8, 8]), "ValueError: vision.grid_thw must be a tuple"),
        (
            "a negative vision.visual_start_idx",
            prepared(visual_start_idx=-1),
            "ValueError: vision.visual_start_idx must",
        ),
        ("vision.spatial_merge_size 0", prepared(spatial_merge_size=0), "ValueError: vision.spatial_merge_size must"),
        ("a grid height under the merge size", prepared(grid_thw=(1, 1, 8)), "ValueError: Invalid grid_thw: height"),
        ("a grid width under the merge size", prepared(grid_thw=(1, 8, 1)), "ValueError: Invalid grid_thw: width"),
    ]
    return [CallProbe(label, call, refusal=refusal) for label, call, refusal in refused]
