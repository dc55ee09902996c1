"""What the fairseq case files share (cases/fairseq.py: attention and layers; cases/fairseq_models.py: the
whole encoder and decoder and tico's single-step decoder export): the tiny seeded config, token and state
samples, the observers fairseq's calls leave unfed, the diagnosed findings and the profile's case fields."""

from __future__ import annotations

import torch

from harness import CaseInputs, expect
from harness.model import fairseq_extra

PROFILE = "fairseq"
WIDTH, HEADS, FFN = 32, 4, 64
TGT, SRC, BATCH = 6, 5, 2
VOCAB = 40
FILL = -120.0  # tico's default attention_mask_fill_value (PTQConfig)


def config(normalize_before: bool = False, layers: int = 1):
    from fairseq.models.transformer import TransformerConfig

    cfg = TransformerConfig()
    for side in (cfg.encoder, cfg.decoder):
        side.embed_dim, side.attention_heads, side.ffn_embed_dim = WIDTH, HEADS, FFN
        side.normalize_before, side.layers = normalize_before, layers
    # interpolations ("${decoder.embed_dim}") that only fairseq's hydra config resolution fills in
    cfg.decoder.input_dim = cfg.decoder.output_dim = WIDTH
    cfg.max_source_positions = cfg.max_target_positions = 64
    cfg.dropout = cfg.attention_dropout = cfg.activation_dropout = 0.0
    return cfg


def dictionary():
    from fairseq.data import Dictionary

    vocabulary = Dictionary()
    for i in range(VOCAB):
        vocabulary.add_symbol(f"w{i}")
    return vocabulary


def embedding(vocabulary) -> torch.nn.Embedding:
    return torch.nn.Embedding(len(vocabulary), WIDTH, vocabulary.pad())


def tokens(vocabulary, length: int, padded: bool) -> torch.Tensor:
    """[B, S] token ids past the special symbols; the second row's last two padded (fairseq pads right)."""
    ids = torch.randint(vocabulary.nspecial, len(vocabulary), (BATCH, length))
    if padded:
        ids[1, -2:] = vocabulary.pad()
    return ids


def padding(length: int) -> torch.Tensor:
    """[B, S] bool, True on the padded keys: the second row's last two."""
    mask = torch.zeros(BATCH, length, dtype=torch.bool)
    mask[1, -2:] = True
    return mask


def causal(length: int) -> torch.Tensor:
    return torch.full((length, length), FILL).triu(1)


def states(length: int) -> torch.Tensor:
    return torch.randn(length, BATCH, WIDTH)


def inputs(sample, calibration: int = 4) -> CaseInputs:
    return CaseInputs(
        calibration=tuple(sample() for _ in range(calibration)),
        evaluation={"default": sample()},
    )


NO_MASK = "fairseq calls its attention with no attn_mask here (encoder self attention, encoder-decoder attention)"
NO_ATTN_MASK = {"obs_causal_mask": NO_MASK, "obs_attn_mask_add": NO_MASK}
NO_PADDED_TARGET = "the decoder's self attention gets a padding mask only for padded target tokens; none here"
INCREMENTAL = "the previous self-attention K/V of incremental decoding (forward_external); none here"
DECODER_LAYER_UNUSED = {
    "self_attn.obs_kpm_in": NO_PADDED_TARGET,
    "self_attn.obs_kp_mask_add": NO_PADDED_TARGET,
    "encoder_attn.obs_causal_mask": NO_MASK,
    "encoder_attn.obs_attn_mask_add": NO_MASK,
    "obs_prev_self_k_in": INCREMENTAL,
    "obs_prev_self_v_in": INCREMENTAL,
}

# Diagnosed in tico 0.3.0's wrappers/fairseq/ (findings/tico.toml).
NAMES = expect("fairseq-fp-name-none-prefix")
BOOL_MASK = expect("fairseq-bool-mask-float-constants")
ATTENTION_FINDINGS = {
    "name_contract": NAMES,
    "qparam_audit": BOOL_MASK,
    "attribution": expect("mask-add-shared-observer"),
}
LAYER_FINDINGS = {"name_contract": NAMES, "qparam_audit": BOOL_MASK}


FAIRSEQ = dict(
    family="fairseq",
    profiles=(PROFILE,),
    golden_profiles=(),
    structure_profiles=(),
    seed=321,
    unavailable=fairseq_extra.unavailable_reason,
)
