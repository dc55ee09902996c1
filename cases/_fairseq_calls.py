"""The call contract of tico's fairseq encoder and decoder wrappers (the call_contract check): the calls
fairseq's own models, sequence generator and checkpoint loader make beyond a teacher-forced forward, each
answered as fairseq's TransformerEncoderBase / TransformerDecoderBase answers it: every layer's states
(``return_all_hiddens``), precomputed token embeddings, the TorchScript entry, beam search's reordering of
the encoder output and of the incremental state, incremental decoding token by token, the output layer and
normalized probabilities, ``max_positions``."""

from __future__ import annotations

import torch

from harness import Built, CallProbe, unwrap


def _tensors(value) -> list[torch.Tensor]:
    """Every tensor of a fairseq output, in order (nested lists and dicts flattened; bools as floats), but
    the encoder's ``encoder_embedding``, which its own probe compares (finding fairseq-encoder-embedding-unscaled)."""
    if torch.is_tensor(value):
        return [value.float()]
    if isinstance(value, dict):
        return [t for key in sorted(value) if key != "encoder_embedding" for t in _tensors(value[key])]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _tensors(item)]
    if isinstance(value, (int, float)):
        return [torch.tensor(float(value))]
    return []


def encoder_probes(built: Built) -> list[CallProbe]:
    tokens, lengths = built.inputs.evaluation["default"].args
    beams = torch.tensor([1, 0, 1])

    def same(label, call, pick=_tensors):
        return CallProbe(label, lambda m: call(unwrap(m)), reference=lambda hf: call(hf), pick=pick)

    def embedded(encoder):
        with torch.no_grad():
            return built.module.embed_tokens(tokens)

    return [
        same("return_all_hiddens", lambda e: e(tokens, lengths, return_all_hiddens=True)),
        same("precomputed token embeddings", lambda e: e(tokens, lengths, token_embeddings=embedded(e))),
        same("encoder_embedding", lambda e: e(tokens, lengths), pick=lambda out: [out["encoder_embedding"][0]]),
        same("forward_torchscript", lambda e: e.forward_torchscript({"src_tokens": tokens, "src_lengths": lengths})),
        same(
            "reorder_encoder_out for beam search (every layer's states)",
            lambda e: e.reorder_encoder_out(e(tokens, lengths, return_all_hiddens=True), beams),
        ),
        same("reorder_encoder_out of the plain output", lambda e: e.reorder_encoder_out(e(tokens, lengths), beams)),
        same("max_positions", lambda e: e.max_positions()),
        same(
            "upgrade_state_dict_named on an old checkpoint (layer_norms.N renamed)",
            lambda e: e.upgrade_state_dict_named(_old_checkpoint(len(e.layers)), "encoder"),
            pick=lambda state: [torch.tensor([float(key in state) for key in _UPGRADE_KEYS])],
        ),
        same(
            "reorder_encoder_out of an empty encoder output",
            lambda e: e.reorder_encoder_out({key: [] for key in _ENCODER_OUT_KEYS}, beams),
        ),
        *_export_mode_probes(tokens, lengths),
    ]


_ENCODER_OUT_KEYS = (
    "encoder_out",
    "encoder_padding_mask",
    "encoder_embedding",
    "encoder_states",
    "src_tokens",
    "src_lengths",
)
_UPGRADE_KEYS = [
    f"encoder.layers.{i}.{name}.weight"
    for i in range(2)
    for name in ("layer_norms.0", "layer_norms.1", "self_attn_layer_norm", "final_layer_norm")
]


def _old_checkpoint(layers: int) -> dict:
    """A pre-v2 fairseq encoder checkpoint: per-layer norms as layer_norms.0/1, version 1."""
    state = {f"encoder.layers.{i}.layer_norms.{j}.weight": torch.ones(1) for i in range(layers) for j in (0, 1)}
    state["encoder.version"] = torch.tensor([1.0])
    return state


def _export_mode_probes(tokens: torch.Tensor, lengths: torch.Tensor) -> list[CallProbe]:
    """tico's export mode of the encoder (``use_external_inputs``: embedded, padding-zeroed states in,
    a tensor or fairseq's dict out), held to the same encoder's ordinary forward on the token ids."""

    def external(return_type, **kwargs):
        def call(m):
            encoder = unwrap(m)
            pad = tokens.eq(encoder.padding_idx)
            x, _ = encoder.forward_embedding(tokens)
            x = (x * (1 - pad.unsqueeze(-1).type_as(x))).transpose(0, 1)
            encoder.use_external_inputs, encoder.return_type = True, return_type
            return encoder(x, encoder_padding_mask=pad, **kwargs)

        return call

    def ordinary(m):
        return unwrap(m)(tokens, lengths, return_all_hiddens=True)

    return [
        CallProbe(
            "export mode, a tensor out",
            external("tensor"),
            twin=ordinary,
            pick=lambda out: [out] if torch.is_tensor(out) else [out["encoder_out"][0]],
        ),
        CallProbe(
            "export mode, fairseq's dict with every layer's states",
            external("dict", return_all_hiddens=True),
            twin=ordinary,
            pick=lambda out: [out["encoder_out"][0], *out["encoder_states"]],
        ),
    ]


def decoder_probes(built: Built) -> list[CallProbe]:
    sample = built.inputs.evaluation["default"]
    (prev,) = sample.args
    memory = sample.kwargs["encoder_out"]
    steps = prev.shape[1]
    padded_prev = prev.clone()
    padded_prev[1, -2:] = built.module.padding_idx

    def same(label, call, pick=_tensors):
        return CallProbe(label, lambda m: call(unwrap(m)), reference=lambda hf: call(hf), pick=pick)

    def incremental(decoder):
        """Decode token by token with fairseq's incremental state, as its sequence generator does."""
        state: dict = {}
        outs = [decoder(prev[:, : t + 1], encoder_out=memory, incremental_state=state)[0] for t in range(steps)]
        return torch.cat(outs, dim=1)

    def reordered(decoder):
        state: dict = {}
        decoder(prev[:, :2], encoder_out=memory, incremental_state=state)
        order = torch.arange(prev.shape[0]).flip(0)
        decoder.reorder_incremental_state_scripting(state, order)
        reordered_memory = decoder_memory_reorder(memory, order)
        return decoder(prev.index_select(0, order)[:, :3], encoder_out=reordered_memory, incremental_state=state)[0]

    def probabilities(log_probs):
        return lambda d: d.get_normalized_probs(d(prev, encoder_out=memory), log_probs=log_probs)

    return [
        same("full output (logits and extras)", lambda d: d(prev, encoder_out=memory, features_only=False)[0]),
        same("incremental decoding, token by token", incremental),
        same("beam reordering of the incremental state", reordered),
        same("log-probabilities", probabilities(True)),
        same("probabilities", probabilities(False)),
        same("output_layer", lambda d: d.output_layer(d(prev, encoder_out=memory, features_only=True)[0])),
        same(
            "alignment layer and heads",
            lambda d: d(prev, encoder_out=memory, alignment_layer=0, alignment_heads=1, features_only=True),
        ),
        same("max_positions", lambda d: d.max_positions()),
        CallProbe(
            "a right-padded target batch",
            lambda m: unwrap(m)(padded_prev, encoder_out=memory)[0],
            reference=lambda hf: hf(padded_prev, encoder_out=memory)[0],
            pick=lambda out: [out],
            valid_tokens=padded_prev.ne(built.module.padding_idx),
        ),
    ]


def decoder_memory_reorder(memory: dict, order: torch.Tensor) -> dict:
    """The encoder output reordered along the batch as fairseq's encoder does for a beam."""
    return {
        "encoder_out": [memory["encoder_out"][0].index_select(1, order)],
        "encoder_padding_mask": [memory["encoder_padding_mask"][0].index_select(0, order)]
        if memory["encoder_padding_mask"]
        else [],
        "encoder_embedding": [memory["encoder_embedding"][0].index_select(0, order)]
        if memory["encoder_embedding"]
        else [],
        "encoder_states": [],
        "src_tokens": [],
        "src_lengths": [],
    }


def decoder_layer_probes(built: Built) -> list[CallProbe]:
    """On the case's sample (time-major states, a padded source, the causal mask): the calls fairseq's
    decoder makes of a layer during generation, answered as fairseq's TransformerDecoderLayerBase."""
    sample = built.inputs.evaluation["default"]
    (x,) = sample.args
    memory, source_pad = sample.kwargs["encoder_out"], sample.kwargs["encoder_padding_mask"]
    steps, batch, width = x.shape
    heads = built.module.self_attn.num_heads
    generator = torch.Generator().manual_seed(29)
    past = [torch.rand(batch, heads, 3, width // heads, generator=generator) - 0.5 for _ in range(2)]
    cross = [torch.rand(batch, heads, memory.shape[0], width // heads, generator=generator) - 0.5 for _ in range(2)]
    target_pad = torch.zeros(batch, steps, dtype=torch.bool)
    target_pad[1, -2:] = True

    def same(label, call, pick=_tensors, valid=None):
        return CallProbe(label, call, reference=call, pick=pick, valid_tokens=valid)

    def incremental(m):
        state: dict = {}
        outs = [unwrap(m)(x[t : t + 1], memory, source_pad, incremental_state=state)[0] for t in range(steps)]
        return torch.cat(outs, dim=0)

    def given_past(m):
        return unwrap(m)(
            x[-1:], memory, source_pad, incremental_state={}, prev_self_attn_state=[t.clone() for t in past]
        )[0]

    def given_past_with_padding(m):
        """The cached K/V with their key padding mask (a third element, as fairseq's generator hands it)."""
        no_padding = torch.zeros(batch, past[0].shape[2], dtype=torch.bool)
        return unwrap(m)(
            x[-1:],
            memory,
            source_pad,
            incremental_state={},
            prev_self_attn_state=[*(t.clone() for t in past), no_padding],
            prev_attn_state=[*(t.clone() for t in cross), source_pad.clone()],
        )[0]

    def given_cross(m):
        return unwrap(m)(x[-1:], memory, source_pad, incremental_state={}, prev_attn_state=[t.clone() for t in cross])[
            0
        ]

    def external(mask=None):
        """tico's export-only single step: the cached K/V as arguments, the new K/V returned."""
        return lambda m: unwrap(m).forward_external(
            x[-1:],
            encoder_out=memory,
            encoder_padding_mask=source_pad,
            prev_self_k=past[0].clone(),
            prev_self_v=past[1].clone(),
            self_attn_mask=mask,
        )

    def fairseq_step(hf):
        """fairseq's layer on the same step, given the same cached K/V through its incremental state."""
        return hf(x[-1:], memory, source_pad, incremental_state={}, prev_self_attn_state=[t.clone() for t in past])

    history = past[0].shape[2] + 1
    step_masks = [
        ("no step mask", None),
        ("a (1, 1, S) step mask", torch.zeros(1, 1, history)),
        ("a (B, 1, S) step mask", torch.zeros(batch, 1, history)),
        ("a (1, S) step mask", torch.zeros(1, history)),
    ]
    exported = [
        CallProbe(f"export single step, {label}", external(mask), reference=fairseq_step, pick=lambda out: [out[0]])
        for label, mask in step_masks
    ]
    exported.append(
        CallProbe(
            "export single step, a (S, S) mask",
            external(torch.zeros(history, history)),
            refusal="RuntimeError: self_attn_mask must be \\[1,S\\] or \\[B,1,S\\]",
        )
    )
    return exported + [
        same("incremental decoding, token by token", incremental),
        same("a cached self-attention K/V given (prev_self_attn_state)", given_past),
        same("a cached cross-attention K/V given (prev_attn_state)", given_cross),
        same("cached K/V given with their key padding masks", given_past_with_padding),
        same(
            "a target padding mask beside the causal mask",
            lambda m: unwrap(m)(
                x, memory, source_pad, self_attn_mask=sample.kwargs["self_attn_mask"], self_attn_padding_mask=target_pad
            )[0],
            pick=lambda out: [out.transpose(0, 1)],
            valid=~target_pad,
        ),
        same(
            "per-head cross-attention weights",
            lambda m: unwrap(m)(
                x, memory, source_pad, self_attn_mask=sample.kwargs["self_attn_mask"], need_head_weights=True
            )[:2],
        ),
    ]


def self_attention_probes(built: Built) -> list[CallProbe]:
    """The calls fairseq's layers make of MultiheadAttention besides a plain forward, on the case's sample
    (the states as query, key and value, the second row's last keys padded): an additive (T, S) mask, the
    attention weights; the mask ranks tico's attention refuses. (Per-head weights are not compared: fairseq's
    fast path returns them averaged whatever need_head_weights says.)"""
    sample = built.inputs.evaluation["default"]
    x, _, _ = sample.args
    pad = sample.kwargs["key_padding_mask"]
    steps, batch = x.shape[:2]
    causal = torch.full((steps, steps), -120.0).triu(1)

    def attend(**kwargs):
        return lambda m: unwrap(m)(x, x, x, key_padding_mask=pad, **kwargs)

    def same(label, **kwargs):
        return CallProbe(label, attend(**kwargs), reference=attend(**kwargs), pick=lambda out: _tensors(out[0]))

    return [
        same("an additive (T, S) attention mask", attn_mask=causal),
        CallProbe(
            "attention weights (averaged over heads)",
            attend(need_weights=True),
            reference=attend(need_weights=True),
            pick=lambda out: _tensors(out),
        ),
        CallProbe(
            "a 4-D attention mask",
            attend(attn_mask=causal[None, None].expand(batch, 1, steps, steps)),
            refusal="RuntimeError: attn_mask must be \\[T,S\\] or \\[B,T,S\\]",
        ),
        CallProbe(
            "a 4-D key padding mask",
            lambda m: unwrap(m)(x, x, x, key_padding_mask=torch.zeros(batch, 1, steps, steps)),
            refusal="RuntimeError: key_padding_mask must be \\[B,S\\] or \\[B,T,S\\]",
        ),
    ]
