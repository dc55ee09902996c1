"""Model-level Llama cases on the tiny profile: ``llama_model`` (LlamaModel, 2 layers) and
``llama_for_causal_lm`` (LlamaForCausalLM, tied head), through ``QuantLlamaModel`` and
``QuantLlamaForCausalLM`` (issue #19 item 3).

Inputs are token ids (``torch.randint``: the same ids under every kernel selection), a batch of
two whose second row is right-padded, so the model builds its own RoPE and its own causal +
padding mask. The wrapper gets the padding mask as (B, 1, S) bool keys, HF its own (B, S) form:
``QuantLlamaModel`` adds a bool mask to its (1, 1, S, S) causal template as given
(``get_attention_mask_for``), so (B, S) broadcasts as a (query, key) matrix (finding
``llama-model-2d-padding-mask``; ``llama_model``'s ``mask=hf_2d`` variant feeds that form).

Export: ``QuantLlamaModel`` has no export mode in tico 0.3.0 (tico's Llama export recipe,
recipes/export/llama.py, exports the token embedding, each decoder layer and the head as separate
programs), so its export checks are n/a; ``QuantLlamaForCausalLM.as_export_module('prefill')``
exports token ids -> logits over the static window, and the causal LM runs every export check.
"""

from __future__ import annotations

import dataclasses

import torch

from cases import llama
from cases._llama_causal_lm_calls import causal_lm_probes
from cases._llama_model_calls import model_probes
from cases._shared_diagnoses import replaced_qparams
from cases._tico_api import HOST_STATIC_INPUTS, prepared_for_export, static_inputs_prepared
from harness import (
    Built,
    CallContractCapability,
    Case,
    CaseInputs,
    ExportCapability,
    LanguageModelCapability,
    MaskCapability,
    MaskProbe,
    RotaryCapability,
    RotaryTables,
    Sample,
    Sweep,
    expect,
    first_call_kwarg,
    unwrap,
)

LAYERS = 2
VOCAB = 64
WINDOW = llama.MAX_SEQ  # max_position_embeddings: the static window
INIT_STD = 0.2
PADDED_LENGTH = 11  # valid tokens of the padded row of the default evaluation batch


def model_config(profile: str):
    """The tiny Llama layer config (cases/llama.py) with 2 layers, a 64-token vocabulary and a tied head."""
    config = llama.llama_config(profile)
    config.num_hidden_layers = LAYERS
    config.vocab_size = VOCAB
    config.tie_word_embeddings = True
    config.pad_token_id = None
    # HF's default init leaves attention uniform under the mask's quantization step, so the logits rank no
    # token; this wider init ranks tokens (docs/case-measurements.md#llama-model-level-cases-the-initializer-range)
    config.initializer_range = INIT_STD
    return config


def model_ptq_config(profile: str, config: str = "ptq"):
    """TICO's default PTQConfig, or (``config="llm_builder"``) tico's LLM builder for the whole model:
    int16 by default with per-layer overrides of every decoder layer, per-channel uint8 weights on
    the layers' linears (W8A16)."""
    from tico.quantization.config.ptq import PTQConfig

    if config == "ptq":
        return PTQConfig()
    from tico.quantization.config.builders import build_llm_ptq_config
    from tico.quantization.config.specs import affine
    from tico.quantization.wrapq.dtypes import UINT8
    from tico.quantization.wrapq.qscheme import QScheme

    return build_llm_ptq_config(
        model_type="llama",
        num_hidden_layers=LAYERS,
        linear_weight=affine(UINT8, qscheme=QScheme.PER_CHANNEL_ASYMM),
    )


# tico's LLM config builder (config/builders.py build_llm_ptq_config): overrides per decoder layer that
# the model wrapper's layers must pick up by their module path.
BUILDER_SWEEP = Sweep(
    axes={"config": ("ptq", "llm_builder")},
    why={"config": "build_llm_ptq_config's per-layer overrides (_build_llama_overrides)"},
    pr="each",
    nightly="all",
)


def token_batch(batch: int, seq: int, valid: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, (B, S) long mask): seeded ids; row b keeps ``valid[b]`` real tokens (right padding)."""
    ids = torch.randint(0, VOCAB, (batch, seq))
    mask = torch.ones(batch, seq, dtype=torch.long)
    for row, length in enumerate(valid or []):
        mask[row, length:] = 0
    return ids, mask


def lm_sample(ids: torch.Tensor, mask2d: torch.Tensor) -> Sample:
    """The wrapper's call: the padding mask as (B, 1, S) bool keys (module docstring)."""
    return Sample(
        kwargs={"input_ids": ids, "attention_mask": mask2d.to(torch.bool)[:, None, :], "use_cache": False},
        valid_tokens=mask2d.to(torch.bool),
    )


def hf_call(reference: torch.nn.Module, sample: Sample):
    """HF gets its own (B, S) padding mask."""
    kwargs = dict(sample.kwargs)
    mask = kwargs["attention_mask"]
    kwargs["attention_mask"] = (mask[:, 0, :] if mask.dim() == 3 else mask).long()
    return reference(**kwargs)


def token_inputs() -> CaseInputs:
    """Calibration: three full batches and one padded; evaluation: a padded batch (default) and
    one full window (export, the deployment profile of the prefill adapter)."""
    calibration = [token_batch(2, WINDOW) for _ in range(3)] + [token_batch(2, WINDOW, [WINDOW, 7])]
    default = token_batch(2, WINDOW, [WINDOW, PADDED_LENGTH])
    export = token_batch(1, WINDOW)
    return CaseInputs(
        calibration=tuple(lm_sample(*pair) for pair in calibration),
        evaluation={"default": lm_sample(*default), "export": lm_sample(*export)},
    )


def _each_sample(inputs: CaseInputs, **changes) -> CaseInputs:
    """The same samples with ``changes(kwargs)`` merged into every sample's kwargs."""

    def changed(s: Sample) -> Sample:
        return dataclasses.replace(s, kwargs={**s.kwargs, **{k: f(s.kwargs) for k, f in changes.items()}})

    return CaseInputs(
        calibration=tuple(changed(s) for s in inputs.calibration),
        evaluation={name: changed(s) for name, s in inputs.evaluation.items()},
    )


def _with_cache(inputs: CaseInputs) -> CaseInputs:
    """The same samples with HF's default use_cache=True: the model builds and returns a DynamicCache."""
    return _each_sample(inputs, use_cache=lambda kwargs: True)


def _with_hf_mask(inputs: CaseInputs) -> CaseInputs:
    """The same samples with the padding mask as HF and its tokenizers give it: (B, S) int64."""
    return _each_sample(inputs, attention_mask=lambda kwargs: kwargs["attention_mask"][:, 0, :].long())


def build_model(profile: str, use_cache: bool = False, mask: str = "keys_3d") -> Built:
    from transformers.models.llama.modeling_llama import LlamaModel

    if mask not in MASK_FORMS:
        raise ValueError(f"unknown mask form {mask!r} (one of {MASK_FORMS})")
    config = model_config(profile)
    module = LlamaModel(config)  # before the inputs: the seeded draws keep their order
    inputs = token_inputs()
    inputs = _with_cache(inputs) if use_cache else inputs
    return Built(module, _with_hf_mask(inputs) if mask == "hf_2d" else inputs, facts={"config": config})


# The padding mask as the case feeds it ((B, 1, S) bool keys, the module docstring) and as HF's tokenizers
# give it ((B, S) int64), which QuantLlamaModel adds to its causal template as given (finding
# llama-model-2d-padding-mask): every check that runs a batch of two stops there.
MASK_FORMS = ("keys_3d", "hf_2d")
_HF_MASK = expect("llama-model-2d-padding-mask")
_RUNS_A_BATCH = (
    "attribution",
    "calibration_coverage",
    "golden",
    "lifecycle",
    "mask_fill",
    "mask_quant",
    "noquant_parity",
    "observer_use",
    "ptq_overrides",
    "quant_accuracy",
    "wrapper_registry",
)

# HF's models default to use_cache=True: QuantLlamaModel then builds a DynamicCache and every layer
# appends its K/V to it (_normalize_past_key_values, the attention's _finalize_cache_output).
_PROBES_ON_DECLARED = (
    "its probes do not depend on the sample's cache or mask form: they run once, on the case as declared"
)
MODEL_SWEEP = Sweep(
    axes={"use_cache": (False, True), "mask": MASK_FORMS},
    why={
        "use_cache": "QuantLlamaModel.forward's cache path: DynamicCache creation, per-layer update, cache output",
        "mask": "QuantLlamaModel.get_attention_mask_for on an int64 mask: turned bool, then added to the causal "
        "template as given",
    },
    # the tokenizer-form mask is a strict xfail on its finding: the nightly keeps it, the PR gate's budget does not
    pr=("use_cache=True",),
    nightly="each",
    overrides={
        # the prefill with a cache feeds the new K/V observers (the past ones stay unused: no past is given)
        "use_cache=True": {
            "unused_observers": {"*.self_attn.wrapped.obs_new_k": None, "*.self_attn.wrapped.obs_new_v": None},
            "not_applicable": {"call_contract": _PROBES_ON_DECLARED},
        },
        "mask=hf_2d": {
            "expected_failures": {check: _HF_MASK for check in _RUNS_A_BATCH},
            "not_applicable": {"call_contract": _PROBES_ON_DECLARED},
        },
    },
)


def build_causal_lm(profile: str) -> Built:
    from transformers.models.llama.modeling_llama import LlamaForCausalLM

    config = model_config(profile)
    module = LlamaForCausalLM(config)
    assert module.lm_head.weight is module.model.embed_tokens.weight, "the tiny causal LM must tie its head"
    return Built(module, token_inputs(), facts={"config": config})


def llama_model_of(root: torch.nn.Module) -> torch.nn.Module:
    """The QuantLlamaModel inside a wrapped LlamaModel or (Spin)LlamaForCausalLM tree."""
    inner = unwrap(root)
    return unwrap(inner.model) if hasattr(inner, "lm_head") else inner


def model_rotary(wrapped: torch.nn.Module, reference: torch.nn.Module, built: Built) -> list[RotaryTables]:
    """The model's RoPE templates and what it feeds its first layer, vs HF's rotary module over
    the static window, in the pre-negated-sin convention of tico's default attention profile."""
    config = built.facts["config"]
    model = llama_model_of(wrapped)
    ids = built.inputs.evaluation["export"].kwargs["input_ids"]
    call = lambda m: m(input_ids=ids, use_cache=False)  # noqa: E731
    used = first_call_kwarg(wrapped, model.layers[0], call, "position_embeddings")
    expected = llama.pre_negate_sin(llama.hf_rope(config, 1, WINDOW))
    if HOST_STATIC_INPUTS:  # tico main keeps no template: the tables prepared_static_export installs for export
        with static_inputs_prepared(model, WINDOW):
            template = tuple(first_call_kwarg(wrapped, model.layers[0], call, "position_embeddings"))
    else:
        template = (model.rope_cos_template, model.rope_sin_template)
    return [RotaryTables("template", template, expected), RotaryTables("fed_to_layer0", tuple(used), expected)]


def model_masks(root: torch.nn.Module, built: Built) -> list[MaskProbe]:
    """The additive mask the model hands its first layer: without a mask (its causal template)
    and from the padded evaluation batch's (B, 1, S) bool mask (causal and padded keys masked)."""
    model = llama_model_of(root)
    fill = float(model.qcfg.attention_mask_fill_value)
    causal = torch.ones(WINDOW, WINDOW, dtype=torch.bool).tril()[None]
    export_ids = built.inputs.evaluation["export"].kwargs["input_ids"]
    own = first_call_kwarg(root, model.layers[0], lambda m: m(input_ids=export_ids, use_cache=False), "attention_mask")
    padded = built.inputs.evaluation["default"]
    keys = padded.kwargs["attention_mask"]  # (B, 1, S) bool
    batch = keys.shape[0]
    fed = first_call_kwarg(root, model.layers[0], lambda m: padded.call(m), "attention_mask")
    return [
        MaskProbe(
            "causal_template",
            own.reshape(1, WINDOW, WINDOW),
            torch.ones(1, WINDOW, dtype=torch.bool),
            fill,
            allowed=causal,
        ),
        MaskProbe(
            "causal_with_padding", fed.reshape(batch, WINDOW, WINDOW), padded.valid_tokens, fill, allowed=causal & keys
        ),
    ]


TEMPLATE_COPIES = expect("llama-templates-per-layer")
_KEY_FOLD = (
    "the default (npu_export) profile folds the attention scale into k_proj: the raw-logit and scale "
    "observers serve the scale_fusion='none' profile only"
)
_NO_CACHE = "the model cases run prefill without a cache (use_cache=False): past and new K/V observers serve decode"
UNUSED_OBSERVERS = {
    "*.self_attn.wrapped.obs_scale": _KEY_FOLD,
    "*.self_attn.wrapped.obs_logits_raw": _KEY_FOLD,
    "*.self_attn.wrapped.obs_past_key": _NO_CACHE,
    "*.self_attn.wrapped.obs_past_value": _NO_CACHE,
    "*.self_attn.wrapped.obs_new_k": _NO_CACHE,
    "*.self_attn.wrapped.obs_new_v": _NO_CACHE,
}
_NO_MODEL_EXPORT = (
    "QuantLlamaModel has no as_export_module or export mode in tico 0.3.0; tico's Llama export recipe "
    "(recipes/export/llama.py) exports the token embedding, each decoder layer and the head as "
    "separate programs, which the layer cases and llama_for_causal_lm cover"
)
EXPORT_CHECKS = (
    "dynamic_vs_export",
    "torch_export",
    "circle_call",
    "circle_replay",
    "circle_structure",
    "qparam_audit",
    "qparam_consistency",
    "export_contract",
)

causal_lm_export = ExportCapability(
    adapter=lambda root, sample, built: prepared_for_export(
        unwrap(root).as_export_module("prefill", return_kv=False), sample.kwargs["input_ids"].shape[-1]
    ),
    args=lambda s: (s.kwargs["input_ids"],),
    samples=("export",),
    unsupported_mode=lambda root, sample, built: unwrap(root).as_export_module("no_such_mode"),
)
CAUSAL_LM_CALIB_ADAPTER = expect("export-adapter-accepts-calib")

CASES = [
    Case(
        name="llama_model",
        family="llama",
        build=build_model,
        seed=0,
        description="LlamaModel, 2 layers: token ids with a padded row, the model's own RoPE and causal + padding mask",
        requires=llama.LLAMA_REQUIRES,
        expected_wrapper="QuantLlamaModel",
        reference_call=hf_call,
        # Limits: the worst measured sample with margin, on both kernel selections
        # (docs/case-measurements.md#llama_model)
        settings={
            "quant_accuracy": {"max_mean_abs_diff": 0.153, "max_abs_diff": 1.05, "max_peir": 0.226, "min_sqnr_db": 13.6}
        },
        rotary=RotaryCapability(tables=model_rotary),
        mask=MaskCapability(probes=model_masks),
        unused_observers=UNUSED_OBSERVERS,
        sweep=MODEL_SWEEP,
        not_applicable={check: _NO_MODEL_EXPORT for check in EXPORT_CHECKS},
        calls=CallContractCapability(probes=model_probes),
        expected_failures={
            "no_side_effects": TEMPLATE_COPIES,
            "call_contract": expect("llama-model-position-ids-ignored"),
        },
    ),
    Case(
        name="llama_for_causal_lm",
        family="llama",
        build=build_causal_lm,
        seed=0,
        description="LlamaForCausalLM, 2 layers, tied head: token ids with a padded row; prefill export to logits",
        requires=llama.LLAMA_REQUIRES,
        expected_wrapper="QuantLlamaForCausalLM",
        calls=CallContractCapability(probes=causal_lm_probes),
        reference_call=hf_call,
        # Limits: the worst measured sample with margin; Circle differs only by the qparams tico replaces, so
        # circle_replay is the one-flip floor (docs/case-measurements.md#llama_for_causal_lm)
        settings={
            "quant_accuracy": {
                "max_mean_abs_diff": 0.107,
                "max_abs_diff": 0.99,
                "max_peir": 0.167,
                "min_sqnr_db": 15.2,
            },
            "lm_quality": {"max_ppl_ratio": 1.25, "min_top1_agreement": 0.6, "max_kl_divergence": 0.0073},
            "circle_replay": {"max_steps": 1.0, "mean_steps": 0.1},
        },
        export=causal_lm_export,
        rotary=RotaryCapability(tables=model_rotary),
        mask=MaskCapability(probes=model_masks),
        language_model=LanguageModelCapability(token_ids=lambda s: s.kwargs["input_ids"]),
        ptq_config=model_ptq_config,
        sweep=BUILDER_SWEEP,
        unused_observers=UNUSED_OBSERVERS,
        expected_failures={
            "no_side_effects": TEMPLATE_COPIES,
            "export_contract": CAUSAL_LM_CALIB_ADAPTER,
            "qparam_consistency": replaced_qparams(embedding=True, llama_residual=True),
            # tico main only (the finding's since): the residual stream is float between layers
            "qparam_audit": expect("llama-decoder-float-residual-stream"),
        },
    ),
]
