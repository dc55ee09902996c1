"""Llama cases: MLP (INT16 policy), attention and decoder layer in prefill mode.

Unlike TICO's smoke cases, the inputs are what a model really feeds these layers: RoPE from
Hugging Face's LlamaRotaryEmbedding (not random cos/sin) and a proper causal additive mask
(TICO's decoder-layer smoke passes an all-True bool mask, which HF eager adds as +1, so its
float reference is not causal). Decode is checked against HF with the past in a DynamicCache;
the decoder-layer decode variant is not covered yet.
"""

from __future__ import annotations

import torch

from harness import (
    Built,
    Case,
    CaseInputs,
    ExportCapability,
    MaskCapability,
    MaskProbe,
    RotaryCapability,
    RotaryTables,
    Sample,
    Thresholds,
    whole_module_export,
)
from harness.capture import first_call_kwarg
from harness.pipeline import unwrap

LLAMA_REQUIRES = ("transformers.models.llama.modeling_llama",)
FILL = -120.0  # tico's default attention_mask_fill_value
MAX_SEQ = 16


def llama_config(profile: str):
    from transformers.models.llama.configuration_llama import LlamaConfig

    if profile != "tiny":
        raise ValueError(f"unknown Llama profile {profile!r}")
    return LlamaConfig(
        hidden_size=16,
        intermediate_size=32,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        max_position_embeddings=MAX_SEQ,
        attention_bias=False,
        attention_dropout=0.0,
        attn_implementation="eager",
    )


def hf_rope(config, batch: int, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin for positions 0..seq-1 from Hugging Face's own rotary module."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    rotary = LlamaRotaryEmbedding(config)
    positions = torch.arange(seq).unsqueeze(0).expand(batch, -1)
    return rotary(torch.zeros(1, dtype=torch.float32), positions)


def causal_mask(batch: int, seq: int) -> torch.Tensor:
    """(B, S, S) additive mask: 0 where key <= query, FILL above the diagonal."""
    allowed = torch.ones(seq, seq, dtype=torch.bool).tril()
    return torch.where(allowed, 0.0, FILL).expand(batch, seq, seq).clone()


def _hf_with_4d_mask(reference: torch.nn.Module, sample: Sample):
    """HF Llama layers take a (B, 1, S, S) mask where the wrappers take (B, S, S)."""
    kwargs = dict(sample.kwargs)
    kwargs["attention_mask"] = kwargs["attention_mask"].unsqueeze(1)
    return reference(*sample.args, **kwargs)


def build_mlp(profile: str) -> Built:
    from transformers.models.llama.modeling_llama import LlamaMLP

    config = llama_config(profile)
    module = LlamaMLP(config)
    sample = lambda: Sample(args=(torch.randn(2, 5, config.hidden_size),))  # noqa: E731
    return Built(module, CaseInputs(calibration=tuple(sample() for _ in range(4)), evaluation={"default": sample()}))


def _int16_config(profile: str):
    from tico.quantization.config.ptq import PTQConfig
    from tico.quantization.config.specs import affine
    from tico.quantization.wrapq.dtypes import INT16
    from tico.quantization.wrapq.qscheme import QScheme

    spec = affine(INT16, qscheme=QScheme.PER_TENSOR_SYMM)
    return PTQConfig(activation=spec, weight=spec)


def _reference_eval_config(profile: str):
    from tico.quantization.config.ptq import PTQConfig

    return PTQConfig(model_args={"profile": "reference_eval"})


def _attention_sample(config, batch: int, seq: int) -> Sample:
    hidden = torch.randn(batch, seq, config.hidden_size)
    return Sample(args=(hidden, hf_rope(config, batch, seq)), kwargs={"attention_mask": causal_mask(batch, seq)})


def build_attention(profile: str) -> Built:
    from transformers.models.llama.modeling_llama import LlamaAttention

    config = llama_config(profile)
    module = LlamaAttention(config, layer_idx=0)
    calibration = tuple(_attention_sample(config, 2, 6) for _ in range(3))
    # The export profile is the full static window (max_position_embeddings), batch 1.
    evaluation = {"default": _attention_sample(config, 2, 6), "export": _attention_sample(config, 1, MAX_SEQ)}
    return Built(module, CaseInputs(calibration=calibration, evaluation=evaluation))


def _layer_sample(config, batch: int, seq: int) -> Sample:
    hidden = torch.randn(batch, seq, config.hidden_size)
    return Sample(args=(hidden,), kwargs={"attention_mask": causal_mask(batch, seq),
                                          "position_embeddings": hf_rope(config, batch, seq)})


def build_decoder_layer(profile: str) -> Built:
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    config = llama_config(profile)
    module = LlamaDecoderLayer(config, layer_idx=0)
    calibration = tuple(_layer_sample(config, 2, MAX_SEQ) for _ in range(3))
    evaluation = {"default": _layer_sample(config, 2, MAX_SEQ), "export": _layer_sample(config, 1, MAX_SEQ)}
    return Built(module, CaseInputs(calibration=calibration, evaluation=evaluation), facts={"config": config})


def _layer_rotary(wrapped: torch.nn.Module, reference: torch.nn.Module, built: Built) -> list[RotaryTables]:
    """The decoder-layer wrapper precomputes RoPE templates for the static window; called
    without position embeddings it feeds them to attention. Compare with HF's rotary module."""
    config = built.facts["config"]
    layer = unwrap(wrapped)
    hidden = built.inputs.evaluation["export"].args[0]
    used = first_call_kwarg(wrapped, layer.self_attn, lambda m: m(hidden), "position_embeddings")
    reference_tables = hf_rope(config, 1, MAX_SEQ)
    return [
        RotaryTables("template", (layer.rope_cos_template, layer.rope_sin_template), reference_tables),
        RotaryTables("fed_to_attention", tuple(used), reference_tables),
    ]


def _layer_masks(root: torch.nn.Module, built: Built) -> list[MaskProbe]:
    """The causal mask the wrapper builds for itself (no mask passed) and from a padded bool
    mask, as it reaches attention."""
    layer = unwrap(root)
    fill = float(layer.qcfg.attention_mask_fill_value)
    hidden = built.inputs.evaluation["export"].args[0]
    causal = torch.ones(MAX_SEQ, MAX_SEQ, dtype=torch.bool).tril()[None]
    own = first_call_kwarg(root, layer.self_attn, lambda m: m(hidden), "attention_mask")
    keep = torch.ones(1, MAX_SEQ, MAX_SEQ, dtype=torch.bool)
    keep[..., -3:] = False  # the last 3 keys are padding
    padded = first_call_kwarg(root, layer.self_attn, lambda m: m(hidden, attention_mask=keep), "attention_mask")
    valid = torch.ones(1, MAX_SEQ, dtype=torch.bool)
    return [
        MaskProbe("causal_template", own.reshape(1, MAX_SEQ, MAX_SEQ), valid, fill, allowed=causal),
        MaskProbe("causal_with_padding", padded.reshape(1, MAX_SEQ, MAX_SEQ), valid, fill, allowed=causal & keep),
    ]


_PREFILL_CACHE = (
    "prefill feeds no past key/value: the cache observers are used by the decode path only"
)
_NO_CALIB_GUARD = (
    "the Llama attention and decoder-layer wrappers build their prefill export adapter in any mode, "
    "CALIB included (the Gemma4 and Qwen3-VL wrappers refuse outside NO_QUANT/QUANT)"
)

def _decode_sample(config) -> Sample:
    """One new token at position MAX_SEQ-1 over a (MAX_SEQ-1)-token past, in the wrapper's
    static-cache layout: past K/V tuples, a (1, 1, MAX_SEQ) additive mask of zeros."""
    kv = lambda: torch.randn(1, config.num_key_value_heads, MAX_SEQ - 1, config.head_dim)  # noqa: E731
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    rope = LlamaRotaryEmbedding(config)(torch.zeros(1), torch.tensor([[MAX_SEQ - 1]]))
    return Sample(
        args=(torch.randn(1, 1, config.hidden_size), rope),
        kwargs={"attention_mask": torch.zeros(1, 1, MAX_SEQ), "past_key_value": (kv(), kv()), "use_cache": True},
    )


def build_attention_decode(profile: str) -> Built:
    from transformers.models.llama.modeling_llama import LlamaAttention

    config = llama_config(profile)
    module = LlamaAttention(config, layer_idx=0)
    calibration = tuple(_decode_sample(config) for _ in range(4))
    return Built(module, CaseInputs(calibration=calibration, evaluation={"default": _decode_sample(config)}))


def _hf_decode(reference: torch.nn.Module, sample: Sample):
    """The same step through HF: the past goes into a DynamicCache, the mask gets its head dim."""
    from transformers.cache_utils import DynamicCache

    cache = DynamicCache()
    past_k, past_v = sample.kwargs["past_key_value"]
    cache.update(past_k.clone(), past_v.clone(), layer_idx=0)
    hidden, rope = sample.args
    return reference(hidden, position_embeddings=rope, attention_mask=sample.kwargs["attention_mask"].unsqueeze(1),
                     past_key_values=cache)


CASES = [
    Case(
        name="llama_mlp",
        family="llama",
        build=build_mlp,
        seed=123,
        requires=LLAMA_REQUIRES,
        ptq_config=_int16_config,
        expected_wrapper="QuantLlamaMLP",
        thresholds=Thresholds(max_mean_abs_diff=1e-3, max_peir=1e-3, circle_max_steps=1.0, circle_mean_steps=0.1),
        export=whole_module_export(),
    ),
    Case(
        name="llama_attention_prefill",
        family="llama",
        build=build_attention,
        seed=0,
        requires=LLAMA_REQUIRES,
        ptq_config=_reference_eval_config,
        expected_wrapper="QuantLlamaAttention",
        reference_call=_hf_with_4d_mask,
        # Circle replay vs torch QUANT: max 3 output steps on tico 0.3.0.
        thresholds=Thresholds(max_mean_abs_diff=0.1, max_peir=0.2, circle_max_steps=3.5, circle_mean_steps=0.5),
        # The prefill adapter supports any length up to the static window, so a shorter
        # input is not a contradiction: no contradicting_args probe.
        export=ExportCapability(
            adapter=lambda root, sample, built: unwrap(root).as_export_module("prefill"),
            args=lambda s: s.args,
            samples=("export",),
            unsupported_mode=lambda root, sample, built: unwrap(root).as_export_module("no_such_mode"),
        ),
        unused_observers={"obs_past_key": _PREFILL_CACHE, "obs_past_value": _PREFILL_CACHE},
        expected_failures={"export_contract": _NO_CALIB_GUARD},
    ),
    Case(
        name="llama_attention_decode",
        family="llama",
        build=build_attention_decode,
        seed=123,
        requires=LLAMA_REQUIRES,
        ptq_config=_reference_eval_config,
        expected_wrapper="QuantLlamaAttention",
        reference_call=_hf_decode,
        # Measured on tico 0.3.0: mean 0.102 / PEIR 0.29 vs HF; Circle replay max 5 / mean 1.44 steps.
        thresholds=Thresholds(max_mean_abs_diff=0.15, max_peir=0.4, circle_max_steps=5.5, circle_mean_steps=1.75),
        export=ExportCapability(
            adapter=lambda root, sample, built: unwrap(root).as_export_module("decode"),
            args=lambda s: (s.args[0], s.args[1], s.kwargs["attention_mask"], s.kwargs["past_key_value"]),
            unsupported_mode=lambda root, sample, built: unwrap(root).as_export_module("no_such_mode"),
        ),
        expected_failures={"export_contract": _NO_CALIB_GUARD},
    ),
    Case(
        name="llama_decoder_layer_prefill",
        family="llama",
        build=build_decoder_layer,
        seed=0,
        requires=LLAMA_REQUIRES,
        ptq_config=_reference_eval_config,
        expected_wrapper="QuantLlamaDecoderLayer",
        reference_call=_hf_with_4d_mask,
        thresholds=Thresholds(max_mean_abs_diff=0.1, max_peir=0.1, circle_max_steps=2.0, circle_mean_steps=0.5),
        export=ExportCapability(
            adapter=lambda root, sample, built: unwrap(root).as_export_module("prefill", return_kv=False),
            args=lambda s: (s.args[0], s.kwargs["attention_mask"], s.kwargs["position_embeddings"]),
            samples=("export",),
            unsupported_mode=lambda root, sample, built: unwrap(root).as_export_module("no_such_mode"),
        ),
        unused_observers={"self_attn.wrapped.obs_past_key": _PREFILL_CACHE,
                          "self_attn.wrapped.obs_past_value": _PREFILL_CACHE},
        expected_failures={"export_contract": _NO_CALIB_GUARD},
        rotary=RotaryCapability(tables=_layer_rotary),
        mask=MaskCapability(probes=_layer_masks),
    ),
]
