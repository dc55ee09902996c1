"""fairseq cases: tico's wrappers for fairseq's own Transformer layers, on real fairseq modules
(profile ``fairseq``, nightly; never the default).

tico 0.3.0 registers wrappers (``try_register``) for fairseq's MultiheadAttention, its encoder and
decoder layers and its encoder and decoder; TICO's own tests drive them with dummy modules. Here the
float module is fairseq's (fairseq-fixed 0.12.3.1's sources, ``./scripts/fairseq.sh``), built from a
seeded tiny ``TransformerConfig`` (model width 32, 4 heads, FFN 64, dropout off), and called the way
fairseq's Transformer calls it: time-major ``[T, B, C]`` activations, a boolean key padding mask with
the second row padded, an additive causal mask on the decoder side at tico's fill value (the mask
tico's own decoder wrapper builds, ``buffered_future_mask``), encoder states for cross attention.
Without fairseq every item skips with a reason naming ``./scripts/fairseq.sh run``.
"""

from __future__ import annotations

import torch

from harness import Built, Case, CaseInputs, Sample, expect, whole_module_export
from harness.model import fairseq_extra

PROFILE = "fairseq"
WIDTH, HEADS, FFN = 32, 4, 64
TGT, SRC, BATCH = 6, 5, 2
FILL = -120.0  # tico's default attention_mask_fill_value (PTQConfig)


def _config(normalize_before: bool = False):
    from fairseq.models.transformer import TransformerConfig

    cfg = TransformerConfig()
    for side in (cfg.encoder, cfg.decoder):
        side.embed_dim, side.attention_heads, side.ffn_embed_dim = WIDTH, HEADS, FFN
        side.normalize_before = normalize_before
    cfg.dropout = cfg.attention_dropout = cfg.activation_dropout = 0.0
    return cfg


def _padding(length: int) -> torch.Tensor:
    """[B, S] bool, True on the padded keys: the second row's last two."""
    mask = torch.zeros(BATCH, length, dtype=torch.bool)
    mask[1, -2:] = True
    return mask


def _causal(length: int) -> torch.Tensor:
    return torch.full((length, length), FILL).triu(1)


def _states(length: int) -> torch.Tensor:
    return torch.randn(length, BATCH, WIDTH)


def _self_mha_export_args(sample: Sample) -> tuple:
    """(query, key, value, key_padding_mask) with key and value None, which the wrapper reads as the query:
    one tensor given three times would export as three graph inputs, two with no user."""
    return (sample.args[0], None, None, sample.kwargs["key_padding_mask"])


def _cross_mha_export_args(sample: Sample) -> tuple:
    """(query, key, value, key_padding_mask) with the value its own tensor: fairseq passes the encoder
    states as both, and one tensor given twice exports as two graph inputs, one with no user."""
    query, key, value = sample.args
    return (query, key, value.clone(), sample.kwargs["key_padding_mask"])


def _decoder_layer_export_args(sample: Sample) -> tuple:
    """TransformerDecoderLayerBase's positional call up to self_attn_mask (no incremental state)."""
    kw = sample.kwargs
    return (sample.args[0], kw["encoder_out"], kw["encoder_padding_mask"], None, None, None, kw["self_attn_mask"])


def _inputs(sample, calibration: int = 4) -> CaseInputs:
    return CaseInputs(
        calibration=tuple(sample() for _ in range(calibration)),
        evaluation={"default": sample()},
    )


def build_mha_self(profile: str) -> Built:
    from fairseq.modules import MultiheadAttention

    def sample() -> Sample:  # as fairseq's encoder layer calls it: the states as query, key and value
        x = _states(TGT)
        return Sample(args=(x, x, x), kwargs={"key_padding_mask": _padding(TGT)})

    return Built(MultiheadAttention(WIDTH, HEADS, self_attention=True), _inputs(sample))


def build_mha_cross(profile: str) -> Built:
    from fairseq.modules import MultiheadAttention

    def sample() -> Sample:
        memory = _states(SRC)
        return Sample(args=(_states(TGT), memory, memory), kwargs={"key_padding_mask": _padding(SRC)})

    return Built(MultiheadAttention(WIDTH, HEADS, encoder_decoder_attention=True), _inputs(sample))


def build_encoder_layer(profile: str, normalize_before: bool = False) -> Built:
    from fairseq.modules.transformer_layer import TransformerEncoderLayerBase

    def sample() -> Sample:
        return Sample(args=(_states(SRC), _padding(SRC)))

    return Built(TransformerEncoderLayerBase(_config(normalize_before)), _inputs(sample))


def build_decoder_layer(profile: str, normalize_before: bool = False) -> Built:
    from fairseq.modules.transformer_layer import TransformerDecoderLayerBase

    def sample() -> Sample:
        return Sample(
            args=(_states(TGT),),
            kwargs={
                "encoder_out": _states(SRC),
                "encoder_padding_mask": _padding(SRC),
                "self_attn_mask": _causal(TGT),
            },
        )

    return Built(TransformerDecoderLayerBase(_config(normalize_before)), _inputs(sample))


_NO_MASK = "fairseq calls its attention with no attn_mask here (encoder self attention, encoder-decoder attention)"
_NO_ATTN_MASK = {"obs_causal_mask": _NO_MASK, "obs_attn_mask_add": _NO_MASK}
_NO_PADDED_TARGET = "the decoder's self attention gets a padding mask only for padded target tokens; none here"
_INCREMENTAL = "the previous self-attention K/V of incremental decoding (forward_external); none here"
_DECODER_LAYER_UNUSED = {
    "self_attn.obs_kpm_in": _NO_PADDED_TARGET,
    "self_attn.obs_kp_mask_add": _NO_PADDED_TARGET,
    "encoder_attn.obs_causal_mask": _NO_MASK,
    "encoder_attn.obs_attn_mask_add": _NO_MASK,
    "obs_prev_self_k_in": _INCREMENTAL,
    "obs_prev_self_v_in": _INCREMENTAL,
}
# Limits: `python -m harness limits --case ...` over three kernel selections (native, avx2, default), 1.25x the
# worst; the attention cases' attribution stays at its default, its failure being diagnosed (mask-add finding).
_REPLAY = {"max_steps": 1, "mean_steps": 0.1}
_SETTINGS = {
    "fairseq_mha_self": {
        "circle_replay": _REPLAY,
        "quant_accuracy": {"max_peir": 0.13, "max_mean_abs_diff": 0.042, "max_abs_diff": 0.22, "min_sqnr_db": 15.3},
    },
    "fairseq_mha_cross": {
        "circle_replay": _REPLAY,
        "quant_accuracy": {"max_peir": 0.095, "max_mean_abs_diff": 0.036, "max_abs_diff": 0.19, "min_sqnr_db": 17.2},
    },
    "fairseq_encoder_layer": {
        "attribution": {"max_site_gain_db": 4.1, "min_resolved_levels": 4.5},
        "circle_replay": _REPLAY,
        "quant_accuracy": {"max_peir": 0.059, "max_mean_abs_diff": 0.048, "max_abs_diff": 0.32, "min_sqnr_db": 24.5},
    },
    "fairseq_decoder_layer": {
        "attribution": {"max_site_gain_db": 2.3, "min_resolved_levels": 4.3},
        "circle_replay": _REPLAY,
        "quant_accuracy": {"max_peir": 0.084, "max_mean_abs_diff": 0.065, "max_abs_diff": 0.46, "min_sqnr_db": 21.7},
    },
}
_OBSERVERS = {
    "fairseq_mha_self": 27,
    "fairseq_mha_cross": 27,
    "fairseq_encoder_layer": 62,
    "fairseq_decoder_layer": 105,
}

# Diagnosed in tico 0.3.0's wrappers/fairseq/ (findings/tico.toml).
_NAMES = expect("fairseq-fp-name-none-prefix")
_BOOL_MASK = expect("fairseq-bool-mask-float-constants")
_ATTENTION_FINDINGS = {
    "name_contract": _NAMES,
    "qparam_audit": _BOOL_MASK,
    "attribution": expect("mask-add-shared-observer"),
}
_LAYER_FINDINGS = {"name_contract": _NAMES, "qparam_audit": _BOOL_MASK}

_FAIRSEQ = dict(
    family="fairseq",
    profiles=(PROFILE,),
    golden_profiles=(),
    structure_profiles=(),
    seed=321,
    unavailable=fairseq_extra.unavailable_reason,
)

CASES = [
    Case(
        name="fairseq_mha_self",
        settings=_SETTINGS["fairseq_mha_self"],
        expected_observer_count=_OBSERVERS["fairseq_mha_self"],
        build=build_mha_self,
        description="fairseq MultiheadAttention, self attention with a boolean key padding mask",
        expected_wrapper="QuantFairseqMultiheadAttention",
        export=whole_module_export(_self_mha_export_args),
        unused_observers=_NO_ATTN_MASK,
        expected_failures=_ATTENTION_FINDINGS,
        **_FAIRSEQ,
    ),
    Case(
        name="fairseq_mha_cross",
        settings=_SETTINGS["fairseq_mha_cross"],
        expected_observer_count=_OBSERVERS["fairseq_mha_cross"],
        build=build_mha_cross,
        description="fairseq MultiheadAttention, encoder-decoder attention over padded encoder states",
        expected_wrapper="QuantFairseqMultiheadAttention",
        export=whole_module_export(_cross_mha_export_args),
        unused_observers=_NO_ATTN_MASK,
        expected_failures=_ATTENTION_FINDINGS,
        **_FAIRSEQ,
    ),
    Case(
        name="fairseq_encoder_layer",
        settings=_SETTINGS["fairseq_encoder_layer"],
        expected_observer_count=_OBSERVERS["fairseq_encoder_layer"],
        build=build_encoder_layer,
        description="fairseq TransformerEncoderLayerBase (post-norm), padded batch",
        expected_wrapper="QuantFairseqEncoderLayer",
        export=whole_module_export(),
        unused_observers={f"self_attn.{name}": why for name, why in _NO_ATTN_MASK.items()},
        expected_failures=_LAYER_FINDINGS,
        **_FAIRSEQ,
    ),
    Case(
        name="fairseq_decoder_layer",
        settings=_SETTINGS["fairseq_decoder_layer"],
        expected_observer_count=_OBSERVERS["fairseq_decoder_layer"],
        build=build_decoder_layer,
        description="fairseq TransformerDecoderLayerBase (post-norm): causal self attention, cross attention",
        expected_wrapper="QuantFairseqDecoderLayer",
        export=whole_module_export(_decoder_layer_export_args),
        unused_observers=_DECODER_LAYER_UNUSED,
        expected_failures={
            **_LAYER_FINDINGS,
            "no_side_effects": expect("mask-template-per-layer"),
            "qparam_audit": expect(
                "fairseq-bool-mask-float-constants", "fairseq-decoder-attn-weights-float", check="qparam_audit"
            ),
            "circle_replay": expect("fairseq-decoder-attn-weights-float", check="circle_replay"),
        },
        **_FAIRSEQ,
    ),
]
