"""fairseq cases, attention and layers: tico's wrappers for fairseq's MultiheadAttention and Transformer
layers on real fairseq modules (profile ``fairseq``, nightly and ``.ci/run``; never the default).

tico 0.3.0 registers wrappers (``try_register``) for fairseq's MultiheadAttention, its encoder and
decoder layers and its encoder and decoder; TICO's own tests drive them with dummy modules. Here the
float module is fairseq's (fairseq-fixed 0.12.3.1's sources, ``./scripts/fairseq.sh``), built from a
seeded tiny ``TransformerConfig`` (cases/_fairseq_common.py), and called the way fairseq's Transformer
calls it: time-major ``[T, B, C]`` activations, a boolean key padding mask with the second row padded,
an additive causal mask on the decoder side at tico's fill value (the mask tico's own decoder wrapper
builds, ``buffered_future_mask``), encoder states for cross attention. The layer cases sweep fairseq's
pre-norm order (``normalize_before``); every case here is exported and replayed in Circle. The whole
encoder and decoder and tico's single-step decoder export are in cases/fairseq_models.py. Without
fairseq every item skips with a reason naming ``./scripts/fairseq.sh run``.
"""

from __future__ import annotations

from cases import _fairseq_common as common
from cases._fairseq_calls import decoder_layer_probes, self_attention_probes
from harness import Built, CallContractCapability, Case, Sample, Sweep, expect, whole_module_export


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


def build_mha_self(profile: str) -> Built:
    from fairseq.modules import MultiheadAttention

    def sample() -> Sample:  # as fairseq's encoder layer calls it: the states as query, key and value
        x = common.states(common.TGT)
        return Sample(args=(x, x, x), kwargs={"key_padding_mask": common.padding(common.TGT)})

    return Built(MultiheadAttention(common.WIDTH, common.HEADS, self_attention=True), common.inputs(sample))


def build_mha_cross(profile: str) -> Built:
    from fairseq.modules import MultiheadAttention

    def sample() -> Sample:
        memory = common.states(common.SRC)
        return Sample(
            args=(common.states(common.TGT), memory, memory), kwargs={"key_padding_mask": common.padding(common.SRC)}
        )

    return Built(MultiheadAttention(common.WIDTH, common.HEADS, encoder_decoder_attention=True), common.inputs(sample))


def build_encoder_layer(profile: str, normalize_before: bool = False) -> Built:
    from fairseq.modules.transformer_layer import TransformerEncoderLayerBase

    def sample() -> Sample:
        return Sample(args=(common.states(common.SRC), common.padding(common.SRC)))

    return Built(TransformerEncoderLayerBase(common.config(normalize_before)), common.inputs(sample))


def build_decoder_layer(profile: str, normalize_before: bool = False) -> Built:
    from fairseq.modules.transformer_layer import TransformerDecoderLayerBase

    def sample() -> Sample:
        return Sample(
            args=(common.states(common.TGT),),
            kwargs={
                "encoder_out": common.states(common.SRC),
                "encoder_padding_mask": common.padding(common.SRC),
                "self_attn_mask": common.causal(common.TGT),
            },
        )

    return Built(TransformerDecoderLayerBase(common.config(normalize_before)), common.inputs(sample))


_REPLAY = {"max_steps": 1, "mean_steps": 0.1}


def _layer_sweep(prenorm_expected: dict[str, tuple[str, ...]]) -> Sweep:
    """The layers' other normalization order: fairseq's pre-norm (normalize_before) moves both LayerNorms,
    and leaves the residual sums unquantized (finding fairseq-prenorm-float-residual)."""
    return Sweep(
        axes={"normalize_before": (False, True)},
        why={"normalize_before": "the wrappers branch on it around attention and the FFN (quant_*_layer.py forward)"},
        pr="each",
        nightly="all",
        profiles=(common.PROFILE,),
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
        "call_contract": ("fairseq-external-step-prenorm-residual",),
        "qparam_audit": (_BOOL, _WEIGHTS, _PRENORM),
        "qparam_consistency": (_PRENORM,),
        "circle_replay": (_WEIGHTS, _PRENORM),
    }
)

# Limits: `python -m harness limits --case ...` over three kernel selections (native, avx2, default), 1.25x the
# worst; the attention cases' attribution stays at its default, its failure being diagnosed (mask-add finding).
CASES = [
    Case(
        name="fairseq_mha_self",
        settings={
            "circle_replay": _REPLAY,
            "quant_accuracy": {"max_peir": 0.13, "max_mean_abs_diff": 0.042, "max_abs_diff": 0.22, "min_sqnr_db": 15.3},
        },
        expected_observer_count=27,
        build=build_mha_self,
        description="fairseq MultiheadAttention, self attention with a boolean key padding mask",
        expected_wrapper="QuantFairseqMultiheadAttention",
        calls=CallContractCapability(probes=self_attention_probes),
        export=whole_module_export(_self_mha_export_args),
        unused_observers=common.NO_ATTN_MASK,
        expected_failures={
            **common.ATTENTION_FINDINGS,
            "call_contract": expect("fairseq-attention-weights-averaged-over-batch"),
        },
        **common.FAIRSEQ,
    ),
    Case(
        name="fairseq_mha_cross",
        settings={
            "circle_replay": _REPLAY,
            "quant_accuracy": {
                "max_peir": 0.095,
                "max_mean_abs_diff": 0.036,
                "max_abs_diff": 0.19,
                "min_sqnr_db": 17.2,
            },
        },
        expected_observer_count=27,
        build=build_mha_cross,
        description="fairseq MultiheadAttention, encoder-decoder attention over padded encoder states",
        expected_wrapper="QuantFairseqMultiheadAttention",
        export=whole_module_export(_cross_mha_export_args),
        unused_observers=common.NO_ATTN_MASK,
        expected_failures=common.ATTENTION_FINDINGS,
        **common.FAIRSEQ,
    ),
    Case(
        name="fairseq_encoder_layer",
        settings={
            "attribution": {"max_site_gain_db": 4.1, "min_resolved_levels": 4.5},
            "circle_replay": _REPLAY,
            "quant_accuracy": {
                "max_peir": 0.059,
                "max_mean_abs_diff": 0.048,
                "max_abs_diff": 0.32,
                "min_sqnr_db": 24.5,
            },
        },
        expected_observer_count=62,
        build=build_encoder_layer,
        description="fairseq TransformerEncoderLayerBase (post-norm), padded batch",
        expected_wrapper="QuantFairseqEncoderLayer",
        sweep=ENCODER_LAYER_SWEEP,
        export=whole_module_export(),
        unused_observers={f"self_attn.{name}": why for name, why in common.NO_ATTN_MASK.items()},
        expected_failures=common.LAYER_FINDINGS,
        **common.FAIRSEQ,
    ),
    Case(
        name="fairseq_decoder_layer",
        settings={
            "attribution": {"max_site_gain_db": 2.3, "min_resolved_levels": 4.3},
            "circle_replay": _REPLAY,
            "quant_accuracy": {
                "max_peir": 0.084,
                "max_mean_abs_diff": 0.065,
                "max_abs_diff": 0.46,
                "min_sqnr_db": 21.7,
            },
        },
        expected_observer_count=105,
        build=build_decoder_layer,
        description="fairseq TransformerDecoderLayerBase (post-norm): causal self attention, cross attention",
        expected_wrapper="QuantFairseqDecoderLayer",
        calls=CallContractCapability(probes=decoder_layer_probes),
        sweep=DECODER_LAYER_SWEEP,
        export=whole_module_export(_decoder_layer_export_args),
        unused_observers=common.DECODER_LAYER_UNUSED,
        expected_failures={
            **common.LAYER_FINDINGS,
            "no_side_effects": expect("mask-template-per-layer"),
            "qparam_audit": expect(
                "fairseq-bool-mask-float-constants", "fairseq-decoder-attn-weights-float", check="qparam_audit"
            ),
            "circle_replay": expect("fairseq-decoder-attn-weights-float", check="circle_replay"),
        },
        **common.FAIRSEQ,
    ),
]
