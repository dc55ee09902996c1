"""The Gemma4 vision attention's call contract (the call_contract check): the mask forms
``QuantGemma4VisionAttention`` documents ("(B, K), (B, Q, K) and (B, 1, Q, K)", keep or additive,
longer preallocated masks sliced, none at all), each answered as Hugging Face's Gemma4VisionAttention
answers the additive (B, 1, S, S) mask of the same truth, and the masks and calls it refuses."""

from __future__ import annotations

import torch

from harness import Built, CallProbe

FILL = -120.0


def _output(out) -> list[torch.Tensor]:
    return [out[0]]


def vision_attention_probes(built: Built) -> list[CallProbe]:
    """On the padded sample: ``keep`` marks its valid patches."""
    sample = built.inputs.evaluation["padded"]
    kwargs = dict(sample.kwargs)
    keep = sample.valid_tokens
    batch, seq = keep.shape
    pairs = keep[:, :, None] & keep[:, None, :]
    additive = kwargs["attention_mask"]  # (B, 1, S, S), FILL on every pair touching padding
    keys_only = torch.where(keep[:, None, None, :], 0.0, FILL).expand(batch, 1, seq, seq)

    def masked(label, mask, hf_mask=additive, valid=None):
        return CallProbe(
            label,
            lambda m: m(**{**kwargs, "attention_mask": mask}),
            reference=lambda hf: hf(**{**kwargs, "attention_mask": hf_mask}),
            pick=_output,
            valid_tokens=valid,
        )

    def refused(label, refusal, mask):
        return CallProbe(label, lambda m: m(**{**kwargs, "attention_mask": mask}), refusal=refusal)

    return [
        masked("no mask", None, hf_mask=None),
        masked("(B, K) keep mask", keep, hf_mask=keys_only, valid=keep),
        masked("(B, Q, K) bool keep mask", pairs),
        masked("(B, 1, Q, K) int64 keep mask", pairs[:, None].long()),
        masked("(B, Q, K) additive mask", additive[:, 0]),
        masked("additive mask over more keys (sliced)", torch.cat([additive, torch.zeros(batch, 1, seq, 2)], -1)),
        masked(
            "additive mask with more query rows (last rows kept)",
            torch.cat([torch.zeros(batch, 1, 2, seq), additive], -2),
        ),
        refused("5-D mask", "RuntimeError: Unsupported attention_mask rank", additive[None]),
        refused("per-head mask", "RuntimeError: Per-head attention masks", torch.cat([additive, additive], 1)),
        refused("mask over fewer keys", "RuntimeError: attention_mask key length is shorter", additive[..., 1:]),
        refused("mask with too few query rows", "RuntimeError: attention_mask query length", additive[..., :2, :]),
        CallProbe(
            "no position_embeddings",
            lambda m: m(kwargs["hidden_states"], attention_mask=additive),
            refusal="RuntimeError: .*requires ``position_embeddings",
        ),
    ]
