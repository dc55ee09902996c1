"""Gemma4 text cases: decoder layers (prefill, sliding prefill, decode, shared-KV consumer),
the scaled word embedding and the whole text model.

TICO's smoke cases feed these layers random cos/sin, all-visible masks (shared-KV) and random
past / shared K/V. Here the inputs are what a Gemma4 text model really feeds them: RoPE from
Hugging Face's Gemma4TextRotaryEmbedding for the layer's type (proportional partial RoPE for
full attention, default RoPE for sliding attention), causal or causal sliding-window additive
masks, a past produced by the HF layer itself into a DynamicCache (decode), and shared K/V
produced by the HF producer layer (shared-KV). The tiny and e2b_dims configs carry no
per-layer input (PLE), as in TICO's smoke, so no PLE input is fed.

The decoder layers run under TICO's ``npu_export`` profile (unrolled attention, sine tables
with their first half pre-negated); HF is given the ordinary sine via ``reference_call``. The
text model runs under ``reference_eval`` as in TICO; it builds its own RoPE tables and causal /
sliding-window masks, which are checked against HF's rotary module and the true patterns. The
prefill decoder-layer mask probes judge the mask the attention builds for itself when a layer gets
none (or a bool keep mask); the decode probes judge a static cache with empty slots masked.
"""

from __future__ import annotations

import functools

import torch

from cases import _gemma4_kv_producer as kv
from cases import _gemma4_ple as ple
from cases import _static_runtime as static
from cases._gemma4_common import GEMMA4_MIN_VERSIONS, GEMMA4_REQUIRES
from cases._gemma4_text_common import (
    E2B_SLIDING_WINDOW,
    FILL,
    SCALE_UNUSED,
    additive_mask,
    allowed_pairs,
    attention_unused,
    flip_sin_half,
    hf_rope,
    npu_export_config,
    sin_in_convention,
    text_config,
)
from cases._gemma4_text_model_calls import text_model_probes
from cases._shared_diagnoses import CIRCLE_CHECKS, MASK_TEMPLATE_PER_LAYER, replaced_qparams
from harness import (
    Built,
    CallContractCapability,
    Case,
    CaseInputs,
    ExportCapability,
    MaskCapability,
    MaskProbe,
    RotaryCapability,
    RotaryTables,
    Sample,
    Sweep,
    expect,
    first_call_kwarg,
    unwrap,
    whole_module_export,
)

SEQ = 8  # prefill length of TICO's decoder-layer and text-model smoke cases
# TICO's decode cache capacity is the same 8 (7 past tokens + the new one); 2048 for both at static_runtime.
SLIDING_WINDOW = 4  # smaller than SEQ, so the window's left edge is masked too


def text_model_config(profile: str):
    """TICO's text-model smoke profile: batched attention, ordinary HF sine."""
    from tico.quantization.config.ptq import PTQConfig

    return PTQConfig(model_args={"profile": "reference_eval"}, attention_mask_fill_value=FILL)


# -- decoder layers ----------------------------------------------------------------------------


STATIC = static.PROFILE


def _seq(profile: str) -> int:
    """Prefill length and decode cache capacity: TICO's 2048-token window at static_runtime."""
    return static.gemma4_max_seq(profile, SEQ)


def _ple(profile: str, ple: int) -> int:
    """PLE width: TICO's E2B contract (256) at static_runtime, ``ple`` (a sweep axis, 0 = off) elsewhere."""
    return static.GEMMA4_PLE_DIM if profile == STATIC else ple


def _layer_sample(hidden, rope, mask, ple: int = 0, **extra) -> Sample:
    """A decoder-layer call as the wrapper takes it: sine in tico's pre-negated convention, and a
    random ``per_layer_input`` (B, S, ple) where PLE is on (the packed PLE slice a model feeds)."""
    cos, sin = rope
    if ple:
        extra["per_layer_input"] = torch.randn(*hidden.shape[:2], ple)
    return Sample(
        kwargs={
            "hidden_states": hidden,
            "position_embeddings": (cos, flip_sin_half(sin)),
            "attention_mask": mask,
            **extra,
        }
    )


def _hf_layer(reference: torch.nn.Module, sample: Sample):
    """The same call into HF: ordinary sine, a fresh ``shared_kv_states`` dict (HF's producer
    layers write into it), shared K/V through that dict, a tuple past through a DynamicCache."""
    from transformers.cache_utils import DynamicCache

    kw = dict(sample.kwargs)
    cos, sin = kw.pop("position_embeddings")
    shared = kw.pop("shared_key_value", None)
    past = kw.pop("past_key_value", None)
    kw.pop("use_cache", None)
    layer_type = reference.self_attn.layer_type
    cache = None
    if past is not None:
        # HF's cache holds only the filled slots: those the mask leaves at 0 (batch 1).
        keep = kw["attention_mask"][0, 0, 0] == 0
        filled = keep[: past[0].shape[2]]
        cache = DynamicCache()
        cache.update(
            past[0][:, :, filled].clone(), past[1][:, :, filled].clone(), layer_idx=reference.self_attn.layer_idx
        )
        kw["attention_mask"] = kw["attention_mask"][..., keep]
    return reference(
        **kw,
        position_embeddings=(cos, flip_sin_half(sin)),
        past_key_values=cache,
        shared_kv_states={} if shared is None else {layer_type: shared},
    )


def _hf_run(layer, hidden: torch.Tensor, rope, mask, ple: int, **kwargs) -> torch.Tensor:
    """A HF layer's own forward (no grad), with a random per_layer_input where PLE is on: how the
    past K/V (decode) and the shared K/V and input (shared-KV consumer) are produced."""
    if ple:
        kwargs["per_layer_input"] = torch.randn(*hidden.shape[:2], ple)
    with torch.no_grad():
        return layer(hidden, position_embeddings=rope, attention_mask=mask, **kwargs)


def build_decoder_layer(
    profile: str, *, layer_types: tuple[str, ...], layer_idx: int, sliding_window: int | None = None, ple: int = 0
) -> Built:
    """One prefill decoder layer of a (sliding, full) config, causal or sliding-window mask. At
    static_runtime: 2048 tokens, the config's own 512-token window, PLE 256, one calibration sample."""
    from transformers.models.gemma4.modeling_gemma4 import Gemma4TextDecoderLayer

    seq, width = _seq(profile), _ple(profile, ple)
    if profile == STATIC and sliding_window is not None:
        sliding_window = E2B_SLIDING_WINDOW  # the config's own window: TICO narrows it only off this profile
    cfg = text_config(profile, layer_types, sliding_window=sliding_window, per_layer_input=width)
    module = Gemma4TextDecoderLayer(cfg, layer_idx=layer_idx)
    layer_type = module.self_attn.layer_type
    window = module.self_attn.sliding_window
    if (window is not None) != (sliding_window is not None) or (window is not None and window != sliding_window):
        raise RuntimeError(f"built a {layer_type} layer with window {window}, wanted {sliding_window}")
    rope = hf_rope(cfg, layer_type, torch.arange(seq)[None])
    mask = additive_mask(allowed_pairs(seq, window=window))
    sample = lambda: _layer_sample(torch.randn(1, seq, cfg.hidden_size), rope, mask, width)  # noqa: E731
    calibration = tuple(sample() for _ in range(static.calibration_count(profile, 3)))
    return Built(
        module,
        CaseInputs(calibration=calibration, evaluation={"default": sample()}),
        facts={"config": cfg, "window": window},
    )


def build_decoder_layer_decode(profile: str, ple: int = 0) -> Built:
    """One new token over a past that the HF layer itself wrote into a DynamicCache during a
    causal prefill (rotated keys, normalized values), in the wrapper's static-cache layout:
    capacity - 1 past slots, the new token's K/V appended. ``default`` is TICO's full cache
    (all past slots filled, all-zero mask); ``partial_cache`` leaves the last 2 past slots empty
    (zero) and the mask blocks them. Capacity: TICO's 8 (2048 at static_runtime)."""
    from transformers.cache_utils import DynamicCache
    from transformers.models.gemma4.modeling_gemma4 import Gemma4TextDecoderLayer

    capacity, width = _seq(profile), _ple(profile, ple)
    cfg = text_config(profile, ("full_attention",), per_layer_input=width)
    module = Gemma4TextDecoderLayer(cfg, layer_idx=0).eval()
    slots = capacity - 1

    def sample(filled: int = slots) -> Sample:
        cache = DynamicCache()
        _hf_run(
            module,
            torch.randn(1, filled, cfg.hidden_size),
            hf_rope(cfg, "full_attention", torch.arange(filled)[None]),
            additive_mask(allowed_pairs(filled)),
            width,
            shared_kv_states={},
            past_key_values=cache,
        )
        empty = slots - filled
        past = tuple(
            torch.nn.functional.pad(t, (0, 0, 0, empty)) for t in (cache.layers[0].keys, cache.layers[0].values)
        )
        mask = torch.zeros(1, 1, 1, capacity)
        mask[..., filled:slots] = FILL
        step_rope = hf_rope(cfg, "full_attention", torch.tensor([[filled]]))
        return _layer_sample(
            torch.randn(1, 1, cfg.hidden_size), step_rope, mask, width, past_key_value=past, use_cache=True
        )

    calibration = tuple(sample() for _ in range(static.calibration_count(profile, 3)))
    evaluation = {"default": sample(), "partial_cache": sample(filled=slots - 2)}
    return Built(module, CaseInputs(calibration=calibration, evaluation=evaluation), facts={"config": cfg})


_EMPTY_SLOTS = (
    "calibrated like TICO's decode smoke, on full caches only (all-zero masks), the attention-mask observer "
    "ends with scale 1 / zero-point 0, so in QUANT the -120 on the 2 empty static-cache slots clamps to 0 "
    "and they keep softmax weight; the partial_cache sample's accuracy is measured (quant_accuracy) but "
    "not gated. Calibrating with one partial-cache step keeps the fill but stretches obs_mask_add over "
    "-120, which coarsens every logit (the shared mask-add observer, see docs/profiles.md)"
)
_EMPTY_SLOTS_PROBLEMS = expect("mask-fill-clamped-by-observer", check="mask_quant", probes=("partial_cache",))


def _decode_masks(root: torch.nn.Module, built: Built) -> list[MaskProbe]:
    """The mask the attention adds to its logits for each decode sample's own mask: every
    filled slot and the new token allowed, the empty static-cache slots blocked."""
    fill = float(unwrap(unwrap(root).self_attn).qcfg.attention_mask_fill_value)
    probes = []
    for name, sample in built.inputs.evaluation.items():
        given = sample.kwargs["attention_mask"]
        used = _attention_built_mask(root, sample, given)
        probes.append(MaskProbe(name, used, torch.ones(1, 1, dtype=torch.bool), fill, allowed=(given[:, 0] == 0)))
    return probes


def build_decoder_layer_shared_kv(profile: str) -> Built:
    """Layer 1 of a (full, full) config whose K/V are shared from layer 0. The HF producer
    layer 0 runs first: its output is the consumer's input and the K/V it stores are the
    shared K/V, as inside a real model."""
    from transformers.models.gemma4.modeling_gemma4 import Gemma4TextDecoderLayer

    seq, width = _seq(profile), _ple(profile, 0)
    cfg = text_config(profile, ("full_attention", "full_attention"), num_kv_shared_layers=1, per_layer_input=width)
    module = Gemma4TextDecoderLayer(cfg, layer_idx=1)
    producer = Gemma4TextDecoderLayer(cfg, layer_idx=0).eval()
    if not module.self_attn.is_kv_shared_layer or not producer.self_attn.store_full_length_kv:
        raise RuntimeError("config did not make layer 1 a shared-KV consumer of layer 0")
    rope = hf_rope(cfg, "full_attention", torch.arange(seq)[None])
    mask = additive_mask(allowed_pairs(seq))

    def sample() -> Sample:
        shared: dict = {}
        hidden = _hf_run(producer, torch.randn(1, seq, cfg.hidden_size), rope, mask, width, shared_kv_states=shared)
        k, v = shared["full_attention"]
        return _layer_sample(hidden.clone(), rope, mask, width, shared_key_value=(k.clone(), v.clone()))

    calibration = tuple(sample() for _ in range(static.calibration_count(profile, 3)))
    return Built(module, CaseInputs(calibration=calibration, evaluation={"default": sample()}), facts={"config": cfg})


def _attention_built_mask(root: torch.nn.Module, sample: Sample, attention_mask) -> torch.Tensor:
    """Run the layer with ``attention_mask`` replaced (None: the attention builds its own from
    its causal template) and return the additive mask the attention then adds to its logits."""
    attention = unwrap(unwrap(root).self_attn)
    built: list[torch.Tensor] = []
    original = attention._build_attention_mask

    def recording(**kwargs):
        built.append(original(**kwargs))
        return built[-1]

    attention._build_attention_mask = recording
    try:
        with torch.no_grad():
            root(**{**sample.kwargs, "attention_mask": attention_mask})
    finally:
        del attention._build_attention_mask
    return built[0]


def _layer_masks(root: torch.nn.Module, built: Built) -> list[MaskProbe]:
    """The mask the attention inside the layer builds when the layer is given no mask, and
    from a bool keep mask with the last 3 keys padding. The truth is the layer's own pattern:
    causal, and inside the window for a sliding layer, never onto a padded key."""
    fill = float(unwrap(unwrap(root).self_attn).qcfg.attention_mask_fill_value)
    sample = built.inputs.evaluation["default"]
    window = built.facts.get("window")
    seq = sample.kwargs["hidden_states"].shape[1]
    keep = torch.ones(1, seq, dtype=torch.bool)
    keep[:, -3:] = False
    valid = torch.ones(1, seq, dtype=torch.bool)
    return [
        MaskProbe(
            "no_mask", _attention_built_mask(root, sample, None), valid, fill, allowed=allowed_pairs(seq, window=window)
        ),
        MaskProbe(
            "bool_keep_padding",
            _attention_built_mask(root, sample, keep),
            valid,
            fill,
            allowed=allowed_pairs(seq, window=window, keep=keep),
        ),
    ]


_LAYER_MASKS = MaskCapability(probes=_layer_masks)

_SLIDING_FALLBACK_FILL = expect(
    "gemma4-sliding-window-ignored", check="mask_fill", probes=("no_mask", "bool_keep_padding")
)
_SLIDING_FALLBACK_QUANT = expect(
    "gemma4-sliding-window-ignored", check="mask_quant", probes=("no_mask", "bool_keep_padding")
)


def _ple_arg(sample: Sample) -> tuple:
    """The adapter's trailing ``per_layer_input`` argument where PLE is on (nothing where it is off)."""
    return (sample.kwargs["per_layer_input"],) if "per_layer_input" in sample.kwargs else ()


def _prefill_export(*, with_shared_kv: bool = False) -> ExportCapability:
    """tico's static prefill adapter (returns hidden plus new K/V, as TICO exports it); with PLE on
    it takes ``per_layer_input`` and the producer's observer (``cases/_gemma4_ple.py``)."""

    def args(s: Sample) -> tuple:
        kw = s.kwargs
        base = (kw["hidden_states"], kw["attention_mask"], kw["position_embeddings"])
        if with_shared_kv:
            return base + (kw.get("per_layer_input"), kw["shared_key_value"])
        return base + _ple_arg(s)

    return ExportCapability(
        adapter=lambda root, sample, built: unwrap(root).as_export_module(
            "prefill", return_kv=True, per_layer_input_observer=ple.boundary_observer(root)
        ),
        args=args,
        unsupported_mode=lambda root, sample, built: unwrap(root).as_export_module("no_such_mode"),
    )


_DECODE_EXPORT = ExportCapability(
    adapter=lambda root, sample, built: unwrap(root).as_export_module(
        "decode", return_kv=True, per_layer_input_observer=ple.boundary_observer(root)
    ),
    args=lambda s: (
        (
            s.kwargs["hidden_states"],
            s.kwargs["attention_mask"],
            s.kwargs["position_embeddings"],
            s.kwargs["past_key_value"],
        )
        + _ple_arg(s)
    ),
    samples=("default", "partial_cache"),
    unsupported_mode=lambda root, sample, built: unwrap(root).as_export_module("no_such_mode"),
)

_ATTN_UNUSED = attention_unused("self_attn.wrapped.")
_SHARED_KV_UNUSED = attention_unused("self_attn.wrapped.", shared_kv=True)

# Fields every Gemma4 text case here shares.
_GEMMA4 = dict(family="gemma4", seed=123, requires=GEMMA4_REQUIRES, min_versions=GEMMA4_MIN_VERSIONS)
_LAYER = dict(
    profiles=("tiny", "e2b_dims", STATIC),
    ptq_config=npu_export_config,
    reference_call=_hf_layer,
    expected_wrapper="QuantGemma4TextDecoderLayer",
    prepare=ple.prepare_with_boundary,
    convert=ple.convert_with_boundary,
    **_GEMMA4,
)

# Per-Layer Embeddings: TICO's tiny and e2b_dims smoke runs the layers with PLE off; E2B deploys them with it on.
_PLE_AXIS = dict(
    axes={"ple": (0, 16)},
    why={
        "ple": "hidden_size_per_layer_input > 0 adds the per-layer gate, projection and norm with their observers "
        "(gemma4/quant_text_decoder_layer.py:113-150, _apply_per_layer_input :182-218) and the export "
        "adapters' per_layer_input boundary observer (gemma4/export_adapters.py:639, :699)"
    },
    # nightly only (the PR gate's cost): the PR gate runs the layers' PLE path through
    # gemma4_ple_scale_fusion_text_model, whose decoder layers take their per-layer inputs
    pr=(),
    nightly="all",
)
_PLE_SWEEP = Sweep(**_PLE_AXIS)
# With PLE on, the decode layer's short calibration clips the PLE product (its calibration, not the wrapper):
# the variant's own measured limits (docs/case-measurements.md#gemma4_text_decoder_layer_decode)
_PLE_DECODE_SWEEP = Sweep(
    **_PLE_AXIS,
    overrides={
        "ple=16": {
            "settings": {
                "quant_accuracy": {"max_peir": 0.26, "max_mean_abs_diff": 0.59, "max_abs_diff": 2.0, "min_sqnr_db": 8.6}
            }
        }
    },
)

# At static_runtime these run TICO's e2b_static_runtime decoder layers: 2048 tokens (prefill length and decode
# cache capacity), the config's own 512-token window, one calibration sample, and Per-Layer Embeddings on
# (hidden_size_per_layer_input 256, TICO's _GEMMA4_E2B_PLE_DIM) with the producer's observer the case owns
# (cases/_gemma4_ple.py), as TICO's smoke does.
DECODER_LAYERS = [
    Case(
        name="gemma4_text_decoder_layer_prefill",
        description="full-attention Gemma4TextDecoderLayer (layer 1 of sliding/full), causal prefill",
        build=functools.partial(build_decoder_layer, layer_types=("sliding_attention", "full_attention"), layer_idx=1),
        sweep=_PLE_SWEEP,
        # Limits: the measured figures with margin; Circle replay exact
        # (docs/case-measurements.md#gemma4_text_decoder_layer_prefill)
        settings={
            "quant_accuracy": {"max_mean_abs_diff": 0.1, "max_abs_diff": 1.0, "max_peir": 0.09, "min_sqnr_db": 20.0},
            "circle_replay": {"max_steps": 1.0, "mean_steps": 0.1},
        },
        unused_observers=_ATTN_UNUSED,
        export=_prefill_export(),
        mask=_LAYER_MASKS,
        expected_failures={"qparam_consistency": replaced_qparams()},
        deployment_shapes={"prefill_seq_len": _seq(STATIC)},
        **_LAYER,
    ),
    Case(
        name="gemma4_text_decoder_layer_sliding_prefill",
        description="sliding-attention Gemma4TextDecoderLayer (window 4 < 8 tokens), sliding-window causal prefill",
        build=functools.partial(
            build_decoder_layer,
            layer_types=("sliding_attention", "full_attention"),
            layer_idx=0,
            sliding_window=SLIDING_WINDOW,
        ),
        # Limits: the measured figures with margin; Circle differs only by the rotate-half qparams tico replaces
        # (docs/case-measurements.md#gemma4_text_decoder_layer_sliding_prefill)
        settings={
            "quant_accuracy": {
                "max_mean_abs_diff": 0.085,
                "max_abs_diff": 0.65,
                "max_peir": 0.065,
                "min_sqnr_db": 21.0,
            },
            "circle_replay": {"max_steps": 1.0, "mean_steps": 0.1},
        },
        unused_observers=_ATTN_UNUSED,
        export=_prefill_export(),
        mask=_LAYER_MASKS,
        expected_failures={
            "mask_fill": _SLIDING_FALLBACK_FILL,
            "mask_quant": _SLIDING_FALLBACK_QUANT,
            "qparam_consistency": replaced_qparams(),
        },
        deployment_shapes={"prefill_seq_len": _seq(STATIC)},
        **_LAYER,
    ),
    Case(
        name="gemma4_text_decoder_layer_decode",
        description="Gemma4TextDecoderLayer single-token decode over a 7-token past (HF: DynamicCache)",
        build=build_decoder_layer_decode,
        sweep=_PLE_DECODE_SWEEP,
        # Limits: the measured figures with margin; with Circle's rounding in the aligned copy circle_replay is
        # the one-flip floor (docs/case-measurements.md#gemma4_text_decoder_layer_decode)
        settings={
            "quant_accuracy": {"max_mean_abs_diff": 0.25, "max_abs_diff": 0.8, "max_peir": 0.1, "min_sqnr_db": 14.0},
            "circle_replay": {"max_steps": 1.0, "mean_steps": 0.1},
        },
        unused_observers=_ATTN_UNUSED,
        export=_DECODE_EXPORT,
        mask=MaskCapability(probes=_decode_masks),
        ungated_samples={"partial_cache": _EMPTY_SLOTS},
        expected_failures={
            "mask_quant": _EMPTY_SLOTS_PROBLEMS,
            "qparam_consistency": replaced_qparams(kv_present=True),
        },
        deployment_shapes={"decode_max_seq": _seq(STATIC)},
        **_LAYER,
    ),
    Case(
        name="gemma4_text_decoder_layer_shared_kv",
        description="shared-KV consumer Gemma4TextDecoderLayer fed its producer layer's output and K/V",
        build=build_decoder_layer_shared_kv,
        # Limits: the measured figures with margin; Circle replay exact
        # (docs/case-measurements.md#gemma4_text_decoder_layer_shared_kv)
        settings={
            "quant_accuracy": {"max_mean_abs_diff": 0.08, "max_abs_diff": 1.0, "max_peir": 0.085, "min_sqnr_db": 24.0},
            "circle_replay": {"max_steps": 1.0, "mean_steps": 0.1},
        },
        unused_observers=_SHARED_KV_UNUSED,
        export=_prefill_export(with_shared_kv=True),
        mask=_LAYER_MASKS,
        expected_failures={"qparam_consistency": replaced_qparams()},
        deployment_shapes={"prefill_seq_len": _seq(STATIC)},
        # the consumer calibrates on its producer's storage grid (tico main binds one), PLE as every layer
        **{
            **_LAYER,
            "wrap": kv.wrap_bound,
            "prepare": functools.partial(ple.prepare_with_boundary, prepare=kv.prepare_bound),
            "convert": lambda prepared: ple.convert_with_boundary(kv.freeze_producer(prepared)),
        },
    ),
]

# -- scaled word embedding ------------------------------------------------------------------------


def build_scaled_word_embedding(profile: str) -> Built:
    """TICO's tiny embedding: 256 x 64, padding_idx 0, embed_scale 0.125, 16-token ids."""
    from transformers.models.gemma4.modeling_gemma4 import Gemma4TextScaledWordEmbedding

    if profile != "tiny":
        raise ValueError(f"unknown Gemma4 scaled-word-embedding profile {profile!r}")
    module = Gemma4TextScaledWordEmbedding(num_embeddings=256, embedding_dim=64, padding_idx=0, embed_scale=0.125)
    sample = lambda: Sample(args=(torch.randint(0, 256, (1, 16)),))  # noqa: E731
    calibration = tuple(sample() for _ in range(8))
    return Built(module, CaseInputs(calibration=calibration, evaluation={"default": sample()}))


EMBEDDING = Case(
    name="gemma4_text_scaled_word_embedding",
    description="Gemma4TextScaledWordEmbedding -> QuantGemma4TextScaledWordEmbedding",
    build=build_scaled_word_embedding,
    expected_wrapper="QuantGemma4TextScaledWordEmbedding",
    # Limits: the measured figures with margin; Circle replay exact
    # (docs/case-measurements.md#gemma4_text_scaled_word_embedding)
    settings={
        "quant_accuracy": {"max_mean_abs_diff": 0.0015, "max_abs_diff": 0.0045, "max_peir": 0.005, "min_sqnr_db": 35.0},
        "circle_replay": {"max_steps": 1.0, "mean_steps": 0.1},
    },
    # as_export_module() returns the wrapper itself whatever the mode name: the module is exported.
    export=whole_module_export(),
    expected_failures={"qparam_consistency": replaced_qparams(rotate_half=False, embedding=True)},
    **_GEMMA4,
)

# -- text model ---------------------------------------------------------------------------------


def build_text_model(profile: str, ple: int = 0) -> Built:
    """TICO's tiny (sliding, full) text model on 8-token ids with an all-ones 2-D mask, plus a
    right-padded batch. The sliding window is 4 (not the default 512) so the wrapper's
    sliding template differs from its causal one on 8 tokens. ``ple``: the PLE width (0 = off)."""
    from transformers.models.gemma4.modeling_gemma4 import Gemma4TextModel

    if profile != "tiny":
        raise ValueError(f"unknown Gemma4 text-model profile {profile!r}")
    cfg = text_config(
        profile, ("sliding_attention", "full_attention"), sliding_window=SLIDING_WINDOW, per_layer_input=ple
    )
    module = Gemma4TextModel(cfg)

    def sample(batch: int = 1, pad: int = 0) -> Sample:
        ids = torch.randint(0, cfg.vocab_size, (batch, SEQ))
        keep = torch.ones(batch, SEQ, dtype=torch.long)
        if pad:
            keep[-1, SEQ - pad :] = 0  # the last row ends in padding
        return Sample(
            kwargs={"input_ids": ids, "attention_mask": keep, "return_dict": True}, valid_tokens=keep.to(torch.bool)
        )

    calibration = tuple(sample() for _ in range(3))
    evaluation = {"default": sample(), "padded": sample(batch=2, pad=3)}
    return Built(module, CaseInputs(calibration=calibration, evaluation=evaluation), facts={"config": cfg})


def _text_model_rotary(wrapped: torch.nn.Module, reference: torch.nn.Module, built: Built) -> list[RotaryTables]:
    """Per layer type: the cos/sin reaching that type's first layer (dynamic path), and the
    static templates the wrapper precomputes for export (all static_max_seq positions), each
    against HF's rotary module. The wrapper's sine is in its own convention; undone here."""
    model = unwrap(wrapped)
    convention = model.rope_convention
    cfg = built.facts["config"]
    sample = built.inputs.evaluation["default"]
    positions = torch.arange(SEQ)[None]
    all_positions = torch.arange(model.static_max_seq)[None]
    tables = []
    for layer_type in dict.fromkeys(cfg.layer_types):
        layer = model.layers[cfg.layer_types.index(layer_type)]
        cos, sin = first_call_kwarg(wrapped, layer, sample.call, "position_embeddings")
        tables.append(
            RotaryTables(
                f"dynamic:{layer_type}",
                (cos, sin_in_convention(sin, convention)),
                reference.rotary_emb(torch.zeros(1), positions, layer_type),
            )
        )
        cos_t = getattr(model, f"{layer_type}_cos_template")
        sin_t = getattr(model, f"{layer_type}_sin_template")
        tables.append(
            RotaryTables(
                f"template:{layer_type}",
                (cos_t, sin_in_convention(sin_t, convention)),
                reference.rotary_emb(torch.zeros(1), all_positions, layer_type),
            )
        )
    return tables


def _text_model_masks(root: torch.nn.Module, built: Built) -> list[MaskProbe]:
    """Per layer type, the additive mask reaching that type's first layer for every
    evaluation sample (2-D keep masks) and with no mask at all; the truth is causal, inside
    the sliding window for sliding layers, and never onto a padded key."""
    model = unwrap(root)
    cfg = built.facts["config"]
    fill = float(model.qcfg.attention_mask_fill_value)
    runs = {name: (s.call, s.kwargs["attention_mask"]) for name, s in built.inputs.evaluation.items()}
    ids = built.inputs.evaluation["default"].kwargs["input_ids"]
    runs["no_mask"] = (lambda m: m(input_ids=ids), torch.ones_like(ids))
    probes = []
    for layer_type in dict.fromkeys(cfg.layer_types):
        layer = model.layers[cfg.layer_types.index(layer_type)]
        window = cfg.sliding_window if layer_type == "sliding_attention" else None
        for name, (run, keep) in runs.items():
            used = first_call_kwarg(root, layer, run, "attention_mask")
            probes.append(
                MaskProbe(
                    f"{layer_type}:{name}",
                    used,
                    keep.to(torch.bool),
                    fill,
                    allowed=allowed_pairs(SEQ, window=window, keep=keep),
                )
            )
    return probes


class TextModelStaticCall(torch.nn.Module):
    """QuantGemma4TextModel under its own export-mode contract: token ids plus the CPU-provided
    additive masks "as a dict keyed by layer type" (quant_text_model.py:511-545; under
    torch.compiler.is_compiling() the wrapper refuses any other mask and takes RoPE from its static
    templates, :287-295, :800-808), prefill without a cache, returning the last hidden state."""

    def __init__(self, root: torch.nn.Module):
        super().__init__()
        self.root = root

    def forward(self, input_ids: torch.Tensor, attention_masks: dict) -> torch.Tensor:
        return self.root(
            input_ids=input_ids, attention_mask=attention_masks, use_cache=False, return_dict=True
        ).last_hidden_state


def _text_model_export_masks(keep: torch.Tensor, k_len: int = SEQ) -> dict[str, torch.Tensor]:
    """The additive masks the CPU runtime hands the text model, per layer type of this config:
    causal (inside the sliding window for sliding layers), padded keys blocked, fill -120."""
    return {
        "full_attention": additive_mask(allowed_pairs(SEQ, k_len, keep=keep[:, -k_len:])),
        "sliding_attention": additive_mask(allowed_pairs(SEQ, k_len, window=SLIDING_WINDOW, keep=keep[:, -k_len:])),
    }


_TEXT_MODEL_EXPORT = ExportCapability(
    adapter=lambda root, sample, built: TextModelStaticCall(root),
    args=lambda s: (s.kwargs["input_ids"], _text_model_export_masks(s.kwargs["attention_mask"])),
    samples=("default", "padded"),
    refuses_calib=False,
    # masks one key shorter than the sequence: "Explicit mask is shorter than the KV span"
    # (QuantGemma4TextModel._normalize_explicit_mask_shape)
    contradicting_args=lambda s, built: (
        s.kwargs["input_ids"],
        _text_model_export_masks(s.kwargs["attention_mask"], k_len=SEQ - 1),
    ),
)

_TEXT_MODEL_CIRCLE = expect("gemma4-text-model-lt-scalar")

# E2B deploys the text model with Per-Layer Embeddings on; TICO's text-model smoke runs it with them off.
# With PLE on, the variant's own measured limits (docs/case-measurements.md#gemma4_text_model)
TEXT_MODEL_PLE_LIMITS = {"max_mean_abs_diff": 0.18, "max_abs_diff": 1.26, "max_peir": 0.186, "min_sqnr_db": 13.0}
_TEXT_MODEL_PLE_SWEEP = Sweep(
    axes={"ple": (0, 16)},
    why={
        "ple": "hidden_size_per_layer_input > 0: the per-layer table lookup, projection, norm and their observers "
        "(QuantGemma4TextModel.get_per_layer_inputs, project_per_layer_inputs) feeding each layer's slice"
    },
    # nightly only: the PR gate runs the same PLE path through gemma4_ple_scale_fusion_text_model
    pr=(),
    overrides={"ple=16": {"settings": {"quant_accuracy": TEXT_MODEL_PLE_LIMITS}}},
)

TEXT_MODEL = Case(
    name="gemma4_text_model",
    description="Gemma4TextModel (sliding + full layer) -> QuantGemma4TextModel: own RoPE tables and masks",
    build=build_text_model,
    sweep=_TEXT_MODEL_PLE_SWEEP,
    ptq_config=text_model_config,
    expected_wrapper="QuantGemma4TextModel",
    # Limits cover the padded sample, whose larger error is token coverage, not padding; the export checks keep
    # their default gates, measured exact (docs/case-measurements.md#gemma4_text_model)
    settings={
        "quant_accuracy": {"max_mean_abs_diff": 0.15, "max_abs_diff": 1.8, "max_peir": 0.32, "min_sqnr_db": 12.0},
    },
    unused_observers={
        "layers.*.wrapped.self_attn.wrapped.obs_scale": SCALE_UNUSED,
        "obs_inputs_embeds": "fed only when the caller passes inputs_embeds; TICO's samples (and these) pass "
        "input_ids, whose embeddings embed_tokens' own observers cover",
    },
    rotary=RotaryCapability(tables=_text_model_rotary),
    mask=MaskCapability(probes=_text_model_masks),
    calls=CallContractCapability(probes=functools.partial(text_model_probes, seq=SEQ, sliding_window=SLIDING_WINDOW)),
    export=_TEXT_MODEL_EXPORT,
    expected_failures={
        "no_side_effects": MASK_TEMPLATE_PER_LAYER,
        **{check: _TEXT_MODEL_CIRCLE for check in CIRCLE_CHECKS},
    },
    **_GEMMA4,
)

CASES = [*DECODER_LAYERS, EMBEDDING, TEXT_MODEL]
