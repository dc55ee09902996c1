"""The Gemma4 vision attention's call contract (the call_contract check): the mask forms
``QuantGemma4VisionAttention`` documents ("(B, K), (B, Q, K) and (B, 1, Q, K)", keep or additive,
longer preallocated masks sliced, none at all), each answered as Hugging Face's Gemma4VisionAttention
answers the additive (B, 1, S, S) mask of the same truth; RoPE tables of rank 2 and 4 (the ones it
expands) answered as HF's rank-3 ones; and the masks, tables and calls it refuses."""

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

    cos, sin = kwargs["position_embeddings"]

    def tables(label, reshape, refusal=None):
        """The wrapper given the sample's (B, S, H) RoPE tables reshaped; batch one, as rank 2 implies."""
        ours = {**kwargs, **{k: v[:1] for k, v in kwargs.items() if torch.is_tensor(v)}}
        ours["position_embeddings"] = (reshape(cos[:1]), reshape(sin[:1]))
        theirs = {**ours, "position_embeddings": (cos[:1], sin[:1])}
        if refusal:
            return CallProbe(label, lambda m: m(**ours), refusal=refusal)
        return CallProbe(label, lambda m: m(**ours), reference=lambda hf: hf(**theirs), pick=_output)

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
        tables("RoPE tables of rank 2 (S, H)", lambda t: t[0]),
        tables("RoPE tables of rank 4 (B, S, 1, H)", lambda t: t[:, :, None]),
        tables(
            "RoPE tables of rank 5", lambda t: t[:, :, None, None], "RuntimeError: Gemma4 vision RoPE table must have"
        ),
        refused("a complex mask", "RuntimeError: Unsupported attention_mask dtype", additive.to(torch.complex64)),
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
