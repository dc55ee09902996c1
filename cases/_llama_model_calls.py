"""The Llama model's call contract (the call_contract check): the options ``QuantLlamaModel.forward``
takes beyond the case's samples (hidden states, attentions, ``inputs_embeds``, a cache position,
tuple output, explicit position ids, the additive (B, S, S) mask its layers read), each answered as
Hugging Face's LlamaModel answers it with the (B, S) padding mask, and the inputs it refuses."""

from __future__ import annotations

import torch

from harness import Built, CallProbe

FILL = -120.0  # tico's default attention_mask_fill_value


def model_probes(built: Built) -> list[CallProbe]:
    """On the case's padded default batch; the wrapper gets its (B, 1, S) keys, HF the (B, S) mask."""
    sample = built.inputs.evaluation["default"]
    ids = sample.kwargs["input_ids"]
    keys = sample.kwargs["attention_mask"]
    keys = keys if keys.dim() == 3 else keys[:, None, :].to(torch.bool)
    hf_mask = keys[:, 0, :].long()
    batch, seq = ids.shape
    allowed = torch.ones(seq, seq, dtype=torch.bool).tril()[None] & keys
    additive = torch.zeros(batch, seq, seq).masked_fill(~allowed, FILL)
    # positions with a gap of 5 mid-prompt (RoPE sees only differences: a shift alone would pass)
    gap = (torch.arange(seq) + 5 * (torch.arange(seq) >= seq // 2))[None].expand(batch, -1)

    def embeds() -> torch.Tensor:
        with torch.no_grad():
            return built.module.embed_tokens(ids)

    def option(label, pick=None, ours=None, **kwargs):
        return CallProbe(
            label,
            lambda m: m(input_ids=ids, attention_mask=keys, use_cache=False, **(ours or kwargs)),
            reference=lambda hf: hf(input_ids=ids, attention_mask=hf_mask, use_cache=False, **kwargs),
            **({"pick": pick} if pick else {}),
        )

    return [
        option("output_hidden_states", pick=lambda out: list(out.hidden_states), output_hidden_states=True),
        option("output_attentions", pick=lambda out: list(out.attentions), output_attentions=True),
        option("return_dict=False", pick=lambda out: [out[0]], return_dict=False),
        option("cache_position", cache_position=torch.arange(seq)),
        option("position_ids with a gap", position_ids=gap),
        CallProbe(
            "inputs_embeds",
            lambda m: m(inputs_embeds=embeds(), attention_mask=keys, use_cache=False),
            reference=lambda hf: hf(inputs_embeds=embeds(), attention_mask=hf_mask, use_cache=False),
        ),
        CallProbe(
            "the additive (B, S, S) mask",
            lambda m: m(input_ids=ids, attention_mask=additive, use_cache=False),
            reference=lambda hf: hf(input_ids=ids, attention_mask=hf_mask, use_cache=False),
        ),
        CallProbe(
            "input_ids and inputs_embeds",
            lambda m: m(input_ids=ids, inputs_embeds=embeds(), attention_mask=keys),
            refusal="ValueError: .*exactly one of",
        ),
    ]
