"""fairseq cases: tico's wrappers for fairseq's own Transformer, on real fairseq modules (profile
``fairseq``, nightly and ``.ci/run``; never the default).

tico 0.3.0 registers wrappers (``try_register``) for fairseq's MultiheadAttention, its encoder and
decoder layers and its encoder and decoder; TICO's own tests drive them with dummy modules. Here the
float module is fairseq's (fairseq-fixed 0.12.3.1's sources, ``./scripts/fairseq.sh``), built from a
seeded tiny ``TransformerConfig`` (model width 32, 4 heads, FFN 64, dropout off), and called the way
fairseq's Transformer calls it: time-major ``[T, B, C]`` activations, a boolean key padding mask with
the second row padded, an additive causal mask on the decoder side at tico's fill value (the mask
tico's own decoder wrapper builds, ``buffered_future_mask``), encoder states for cross attention; the
whole encoder and decoder (two layers each) take token ids, the encoder a right-padded batch. The layer
cases sweep fairseq's pre-norm order (``normalize_before``); the attention and layer cases are exported
and replayed in Circle. Without fairseq every item skips with a reason naming ``./scripts/fairseq.sh run``."""

from __future__ import annotations

import torch

from harness import Built, Case, CaseInputs, Sample, Sweep, expect, whole_module_export
from harness.model import fairseq_extra

PROFILE = "fairseq"
WIDTH, HEADS, FFN = 32, 4, 64
TGT, SRC, BATCH = 6, 5, 2
VOCAB = 40
FILL = -120.0  # tico's default attention_mask_fill_value (PTQConfig)


def _config(normalize_before: bool = False, layers: int = 1):
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


def _dictionary():
    from fairseq.data import Dictionary

    dictionary = Dictionary()
    for i in range(VOCAB):
        dictionary.add_symbol(f"w{i}")
    return dictionary


def _tokens(dictionary, length: int, padded: bool) -> torch.Tensor:
    """[B, S] token ids past the special symbols; the second row's last two padded (fairseq pads right)."""
    tokens = torch.randint(dictionary.nspecial, len(dictionary), (BATCH, length))
    if padded:
        tokens[1, -2:] = dictionary.pad()
    return tokens


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
    "fairseq_encoder": {
        "attribution": {"max_site_gain_db": 1.5, "min_resolved_levels": 5.6},
        "quant_accuracy": {"max_peir": 0.093, "max_mean_abs_diff": 0.072, "max_abs_diff": 0.56, "min_sqnr_db": 19.2},
    },
    "fairseq_decoder": {
        "attribution": {"max_site_gain_db": 0.89, "min_resolved_levels": 4.4},
        "quant_accuracy": {"max_peir": 0.039, "max_mean_abs_diff": 0.055, "max_abs_diff": 0.22, "min_sqnr_db": 22.9},
    },
}
_OBSERVERS = {
    "fairseq_encoder": 124,
    "fairseq_decoder": 210,
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


def build_encoder(profile: str) -> Built:
    """fairseq's whole TransformerEncoderBase: scaled token embeddings, sinusoidal positions, two layers;
    called as fairseq's models call it, (src_tokens, src_lengths), on a right-padded batch."""
    from fairseq.models.transformer import TransformerEncoderBase

    dictionary = _dictionary()
    embed = torch.nn.Embedding(len(dictionary), WIDTH, dictionary.pad())
    encoder = TransformerEncoderBase(_config(layers=2), dictionary, embed)

    def sample() -> Sample:
        tokens = _tokens(dictionary, SRC + 2, padded=True)
        return Sample(args=(tokens, tokens.ne(dictionary.pad()).sum(dim=1)))

    return Built(encoder, _inputs(sample))


def build_decoder(profile: str) -> Built:
    """fairseq's whole TransformerDecoderBase (two layers, output projection to the vocabulary) over the
    output of a float encoder of the same config, teacher-forced on whole target sequences."""
    from fairseq.models.transformer import TransformerDecoderBase, TransformerEncoderBase

    dictionary = _dictionary()
    cfg = _config(layers=2)
    encoder = TransformerEncoderBase(cfg, dictionary, torch.nn.Embedding(len(dictionary), WIDTH, dictionary.pad()))
    decoder = TransformerDecoderBase(cfg, dictionary, torch.nn.Embedding(len(dictionary), WIDTH, dictionary.pad()))
    encoder.eval()

    def sample() -> Sample:
        source = _tokens(dictionary, SRC + 2, padded=True)
        with torch.no_grad():
            memory = encoder(source, source.ne(dictionary.pad()).sum(dim=1))
        return Sample(args=(_tokens(dictionary, TGT, padded=False),), kwargs={"encoder_out": memory})

    return Built(decoder, _inputs(sample))


def _layer_sweep(prenorm_expected: dict[str, tuple[str, ...]]) -> Sweep:
    """The layers' other normalization order: fairseq's pre-norm (normalize_before) moves both LayerNorms,
    and leaves the residual sums unquantized (finding fairseq-prenorm-float-residual)."""
    return Sweep(
        axes={"normalize_before": (False, True)},
        why={"normalize_before": "the wrappers branch on it around attention and the FFN (quant_*_layer.py forward)"},
        pr="each",
        nightly="all",
        profiles=(PROFILE,),
        overrides={
            "normalize_before=True": {
                "expected_failures": {check: expect(*ids, check=check) for check, ids in prenorm_expected.items()}
            }
        },
    )


_PRENORM = "fairseq-prenorm-float-residual"
_BOOL = "fairseq-bool-mask-float-constants"
_WEIGHTS = "fairseq-decoder-attn-weights-float"
ENCODER_LAYER_SWEEP = _layer_sweep(
    {
        "qparam_audit": (_BOOL, _PRENORM),
        "qparam_consistency": (_PRENORM,),
        "circle_replay": (_PRENORM,),
        "attribution": ("mask-add-shared-observer",),
    }
)
DECODER_LAYER_SWEEP = _layer_sweep(
    {
        "qparam_audit": (_BOOL, _WEIGHTS, _PRENORM),
        "qparam_consistency": (_PRENORM,),
        "circle_replay": (_WEIGHTS, _PRENORM),
    }
)

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
        sweep=ENCODER_LAYER_SWEEP,
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
        sweep=DECODER_LAYER_SWEEP,
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
    Case(
        name="fairseq_encoder",
        settings=_SETTINGS["fairseq_encoder"],
        expected_observer_count=_OBSERVERS["fairseq_encoder"],
        build=build_encoder,
        description="fairseq TransformerEncoderBase (2 layers, embeddings, positions), right-padded source tokens",
        expected_wrapper="QuantFairseqEncoder",
        unused_observers={f"layers.*.wrapped.self_attn.{name}": why for name, why in _NO_ATTN_MASK.items()},
        expected_failures={"name_contract": _NAMES, "no_side_effects": expect("mask-template-per-layer")},
        **_FAIRSEQ,
    ),
    Case(
        name="fairseq_decoder",
        settings=_SETTINGS["fairseq_decoder"],
        expected_observer_count=_OBSERVERS["fairseq_decoder"],
        build=build_decoder,
        description="fairseq TransformerDecoderBase (2 layers, output projection) over a float encoder's output",
        expected_wrapper="QuantFairseqDecoder",
        unused_observers={f"layers.*.wrapped.{path}": why for path, why in _DECODER_LAYER_UNUSED.items()},
        expected_failures={"name_contract": _NAMES, "no_side_effects": expect("mask-template-per-layer")},
        **_FAIRSEQ,
    ),
]
