"""Gemma4 multimodal and model-level cases: the vision-to-text embedder, Gemma4Model (vision tower +
text decoder + fusion), Gemma4ForConditionalGeneration and Gemma4ForCausalLM.

The model-level wrappers build the text decoder's causal masks and RoPE tables themselves (from
static templates owned by QuantGemma4TextModel), so besides accuracy these cases compare the
tables reaching the first decoder layer, and the templates, with Hugging Face's rotary module
and with the true causal / padding pattern. Configs and inputs follow TICO's smoke cases of the
same names (one full-attention text layer, one vision layer, 16 tokens).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch

from cases import _static_runtime as static
from cases._gemma4_common import (
    E2B_PROFILES,
    GEMMA4_MIN_VERSIONS,
    GEMMA4_REQUIRES,
    grid_positions,
    vision_config,
    vision_model_sample,
)
from cases._gemma4_fusion_calls import fusion_probes
from cases._gemma4_model_calls import head_probes, model_probes
from cases._gemma4_text_common import additive_mask, allowed_pairs, attention_unused, sin_in_convention
from cases._shared_diagnoses import MASK_TEMPLATE_PER_LAYER, replaced_qparams
from cases.gemma4 import text_config
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
    expect,
    first_call_kwarg,
    unwrap,
)

_COMMON = dict(family="gemma4", seed=123, requires=GEMMA4_REQUIRES, min_versions=GEMMA4_MIN_VERSIONS)

SEQ = 16
# Multimodal placeholder ids of TICO's smoke config; text tokens are drawn below them.
IMAGE_TOKEN, VIDEO_TOKEN, AUDIO_TOKEN = 10, 11, 12
NUM_VISUAL_TOKENS = 4  # 36 patches on a 6x6 grid, pooled 3x3


# -- multimodal embedder (RMSNorm + projection from vision width to text width) ---------------


def build_multimodal_embedder(profile: str) -> Built:
    """Gemma4MultimodalEmbedder between the profile's vision and text widths; 16 soft tokens."""
    from transformers.models.gemma4.modeling_gemma4 import Gemma4MultimodalEmbedder

    vision, text = vision_config(profile), text_config(profile)
    module = Gemma4MultimodalEmbedder(vision, text)
    # static_runtime: the deployment's valid soft tokens (TICO's e2b_static_runtime), one calibration sample
    seq, count = (static.GEMMA4["num_visual_tokens"], 1) if profile == static.PROFILE else (SEQ, 3)
    sample = lambda: Sample(args=(torch.randn(1, seq, vision.hidden_size),))  # noqa: E731
    return Built(
        module, CaseInputs(calibration=tuple(sample() for _ in range(count)), evaluation={"default": sample()})
    )


MULTIMODAL_EMBEDDER = Case(
    name="gemma4_multimodal_embedder",
    build=build_multimodal_embedder,
    profiles=E2B_PROFILES,
    expected_wrapper="QuantGemma4MultimodalEmbedder",
    # Limits: the measured figures with margin; Circle replay exact
    # (docs/case-measurements.md#gemma4_multimodal_embedder)
    settings={
        "quant_accuracy": {"max_mean_abs_diff": 0.009, "max_abs_diff": 0.4, "max_peir": 0.1, "min_sqnr_db": 30.0},
        "circle_replay": {"max_steps": 1.0, "mean_steps": 0.1},
    },
    # as_export_module returns the wrapper itself (it is exportable as is), so it cannot refuse
    # CALIB mode and ignores the mode argument.
    export=ExportCapability(
        adapter=lambda root, sample, built: unwrap(root).as_export_module("prefill"),
        args=lambda sample: sample.args,
        refuses_calib=False,
    ),
    deployment_shapes={"visual_token_seq_len": static.GEMMA4["num_visual_tokens"]},
    **_COMMON,
)


# -- model-level cases: the text decoder's masks and RoPE ----------------------------------------


@dataclasses.dataclass(frozen=True)
class TextDecoderSite:
    """Where a model-level case holds its text decoder: ``text_model(root)`` is the
    QuantGemma4TextModel inside a wrapped tree, ``hf_text_model(reference)`` the HF
    Gemma4TextModel. The text model owns one RoPE table and one mask template per layer type."""

    text_model: Callable[[torch.nn.Module], torch.nn.Module]
    hf_text_model: Callable[[torch.nn.Module], torch.nn.Module]

    def rotary(self, wrapped: torch.nn.Module, reference: torch.nn.Module, built: Built) -> list[RotaryTables]:
        """cos/sin reaching the first decoder layer on every evaluation sample, and the static
        templates over the whole template capacity, vs HF's rotary module for the same
        positions (sine taken into the wrapper's documented convention)."""
        text = self.text_model(wrapped)
        hf_rotary = self.hf_text_model(reference).rotary_emb
        convention = text.rope_convention
        layer_type = text.config.layer_types[0]
        tables = []
        for name, sample in built.inputs.evaluation.items():
            used = first_call_kwarg(wrapped, text.layers[0], sample.call, "position_embeddings")
            positions = torch.arange(used[0].shape[1])[None]
            cos, sin = hf_rotary(used[0], positions, layer_type)
            tables.append(RotaryTables(f"dynamic:{name}", tuple(used), (cos, sin_in_convention(sin, convention))))
        for kind in text.unique_layer_types:
            baked = (getattr(text, f"{kind}_cos_template"), getattr(text, f"{kind}_sin_template"))
            positions = torch.arange(baked[0].shape[1])[None]
            cos, sin = hf_rotary(baked[0], positions, kind)
            tables.append(RotaryTables(f"template:{kind}", baked, (cos, sin_in_convention(sin, convention))))
        return tables

    def masks(self, root: torch.nn.Module, built: Built) -> list[MaskProbe]:
        """The additive mask reaching the first decoder layer on every evaluation sample (causal,
        plus padded keys where the sample has an attention_mask), and each static template."""
        text = self.text_model(root)
        fill = float(text.qcfg.attention_mask_fill_value)
        probes = []
        for name, sample in built.inputs.evaluation.items():
            used = first_call_kwarg(root, text.layers[0], sample.call, "attention_mask")
            key_valid = sample.kwargs.get("attention_mask")
            seq = used.shape[-1]
            rows = torch.ones(1, seq, dtype=torch.bool) if key_valid is None else key_valid.to(torch.bool)
            probes.append(MaskProbe(f"dynamic:{name}", used, rows, fill, allowed=allowed_pairs(seq, keep=key_valid)))
        for kind in text.unique_layer_types:
            if kind != "full_attention":
                raise NotImplementedError(f"no mask truth written for layer type {kind!r}")
            template = getattr(text, f"{kind}_attention_mask_template")
            seq = template.shape[-1]
            probes.append(
                MaskProbe(
                    f"template:{kind}", template, torch.ones(1, seq, dtype=torch.bool), fill, allowed=allowed_pairs(seq)
                )
            )
        return probes


@dataclasses.dataclass(frozen=True)
class PromptSample(Sample):
    """A prompt plus the tensors the static export ABI takes in place of token ids (fused input
    embeddings, per-layer inputs, and one mask and RoPE table per layer type), which the CPU
    runtime prepares in deployment."""

    export_args: tuple = ()


def _prompt(ids: torch.Tensor, keep: torch.Tensor | None = None) -> PromptSample:
    kwargs = {"input_ids": ids} if keep is None else {"input_ids": ids, "attention_mask": keep}
    return PromptSample(kwargs=kwargs, valid_tokens=None if keep is None else keep.bool())


def _text_samples(vocab_high: int) -> tuple[tuple[Sample, ...], dict[str, Sample]]:
    """TICO's smoke inputs (16 token ids, 3 calibration samples) plus a right-padded sample whose
    last 5 tokens are padding (``attention_mask`` 0), compared on its valid tokens only."""
    ids = lambda: torch.randint(0, vocab_high, (1, SEQ))  # noqa: E731
    calibration = tuple(_prompt(ids()) for _ in range(3))
    default = _prompt(ids())
    keep = torch.ones(1, SEQ, dtype=torch.long)
    keep[:, -5:] = 0
    return calibration, {"default": default, "padded": _prompt(ids(), keep)}


def with_export_args(
    sample: PromptSample, hf_model: torch.nn.Module, rope_convention: str, text: torch.nn.Module | None = None
) -> PromptSample:
    """``sample`` with the runtime-side inputs of QuantGemma4Model's static ABI, made the way HF
    makes them for the same prompt: the fused (text + image soft token) embeddings HF's
    Gemma4Model hands its language model (a text-only model, fed token ids: the embeddings of
    those ids), no per-layer inputs (PLE is off), the additive causal (+ padded-key) mask with
    fill -120, and HF RoPE with the sine in the wrapper's convention. ``text``: the HF
    Gemma4TextModel inside ``hf_model`` (default ``hf_model.language_model``)."""
    text = hf_model.language_model if text is None else text
    embeds = first_call_kwarg(hf_model, text, sample.call, "inputs_embeds")
    if embeds is None:
        with torch.no_grad():
            embeds = text.embed_tokens(sample.kwargs["input_ids"])
    embeds = embeds.detach()
    keep = sample.kwargs.get("attention_mask")
    seq = embeds.shape[1]
    positions = torch.arange(seq)[None]
    tables, masks = {}, {}
    with torch.no_grad():
        for kind in sorted(set(text.config.layer_types)):
            if kind != "full_attention":
                raise NotImplementedError(f"no export mask written for layer type {kind!r}")
            cos, sin = text.rotary_emb(embeds, positions, kind)
            tables[kind] = (cos, sin_in_convention(sin, rope_convention))
            masks[kind] = additive_mask(allowed_pairs(seq, keep=keep))
    return dataclasses.replace(sample, export_args=(embeds, None, masks, tables))


def model_config(profile: str, *, softcapping: bool):
    """Gemma4Config of TICO's model smoke cases: one text and one vision layer, no audio."""
    from transformers.models.gemma4.configuration_gemma4 import Gemma4Config

    text = text_config(profile)
    if softcapping:
        text.final_logit_softcapping = 30.0
    return Gemma4Config(
        text_config=text,
        vision_config=vision_config(profile),
        audio_config=None,
        image_token_id=IMAGE_TOKEN,
        video_token_id=VIDEO_TOKEN,
        audio_token_id=AUDIO_TOKEN,
    )


def model_ptq_config(num_vision_layers: int) -> Callable[[str], object]:
    """TICO's Gemma4 E2B PTQ config, as its smoke cases build it (visual tokens at slot 0)."""

    def build(profile: str):
        from tico.quantization.config.gemma4_builders import build_gemma4_e2b_ptq_config

        vision_args = {"vision": {"visual_start_idx": 0, "num_visual_tokens": NUM_VISUAL_TOKENS}}
        return build_gemma4_e2b_ptq_config(
            num_text_layers=1,
            num_vision_layers=num_vision_layers,
            model_args=vision_args if num_vision_layers else None,
        )

    return build


def _image_sample(config) -> PromptSample:
    """An image prompt in TICO's static layout (the PTQ config's visual_start_idx 0,
    num_visual_tokens 4): 4 image placeholders filled with the soft tokens of a 6x6-patch image,
    then 12 text tokens."""
    ids = torch.randint(0, IMAGE_TOKEN, (1, SEQ))
    ids[:, :NUM_VISUAL_TOKENS] = IMAGE_TOKEN
    pixels = vision_model_sample(config.vision_config, grid_positions(36, width=6))
    return PromptSample(
        kwargs={
            "input_ids": ids,
            "pixel_values": pixels.kwargs["pixel_values"],
            "image_position_ids": pixels.kwargs["pixel_position_ids"],
        }
    )


def build_model(profile: str, *, head: bool) -> Built:
    """Gemma4Model (``head=False``) or Gemma4ForConditionalGeneration with softcapping 30.

    TICO's smoke inputs (16 ids below the image placeholder, 3 calibration prompts) are drawn
    first and kept as the "text" sample; an image prompt is the "default" sample, since TICO's
    text-only prompts never reach the vision tower, embedder or fusion (their observers would be
    neither calibrated nor applied, and an image prompt would decode to noise). One more image
    prompt joins calibration; a right-padded prompt exercises the padding mask."""
    from transformers.models.gemma4.modeling_gemma4 import Gemma4ForConditionalGeneration, Gemma4Model

    if profile != "tiny":
        raise ValueError(f"unknown Gemma4 model profile {profile!r}")
    config = model_config(profile, softcapping=head)
    module = (Gemma4ForConditionalGeneration if head else Gemma4Model)(config)
    calibration, text_only = _text_samples(IMAGE_TOKEN)
    evaluation = {"default": _image_sample(config), "text": text_only["default"], "padded": text_only["padded"]}
    calibration += (_image_sample(config),)
    convention = _rope_convention(model_ptq_config(num_vision_layers=1)(profile))
    text = module.model.language_model if head else module.language_model
    evaluation = {name: with_export_args(s, module, convention, text=text) for name, s in evaluation.items()}
    return Built(module, CaseInputs(calibration=calibration, evaluation=evaluation))


def _rope_convention(ptq_config) -> str:
    """The sine convention tico's text attention consumes under this PTQ config."""
    from tico.quantization.config.gemma4_attention import get_gemma4_text_attention_options

    return get_gemma4_text_attention_options(ptq_config).rope


def build_causal_lm(profile: str) -> Built:
    """Gemma4ForCausalLM (text only, softcapping 30) on 16 ids over the whole vocabulary."""
    from transformers.models.gemma4.modeling_gemma4 import Gemma4ForCausalLM

    if profile != "tiny":
        raise ValueError(f"unknown Gemma4 causal-LM profile {profile!r}")
    cfg = text_config(profile)
    cfg.final_logit_softcapping = 30.0
    module = Gemma4ForCausalLM(cfg)
    calibration, evaluation = _text_samples(cfg.vocab_size)
    convention = _rope_convention(model_ptq_config(num_vision_layers=0)(profile))
    evaluation = {name: with_export_args(s, module, convention, text=module.model) for name, s in evaluation.items()}
    return Built(module, CaseInputs(calibration=calibration, evaluation=evaluation))


_CAUSAL_LM_SITE = TextDecoderSite(
    text_model=lambda root: unwrap(unwrap(root).model),
    hf_text_model=lambda reference: reference.model,
)
_MODEL_SITE = TextDecoderSite(
    text_model=lambda root: unwrap(unwrap(root).language_model),
    hf_text_model=lambda reference: reference.language_model,
)
_CONDITIONAL_SITE = TextDecoderSite(
    text_model=lambda root: unwrap(unwrap(unwrap(root).model).language_model),
    hf_text_model=lambda reference: reference.model.language_model,
)

_TEXT_UNUSED = attention_unused("*layers.0.wrapped.self_attn.wrapped.")
_PLE_OFF = (
    "per-layer embeddings are off in this config (hidden_size_per_layer_input=0, as in TICO's smoke), "
    "so there are no per-layer inputs to observe"
)


def smoke_export_module(root: torch.nn.Module, sample: Sample, built: Built) -> torch.nn.Module:
    """What TICO's smoke case exports for the two head models (Gemma4ForConditionalGenerationCase /
    Gemma4ForCausalLMCase.export_module, wrapper_smoke/cases/gemma4.py): the wrapper's
    ``as_export_module(mode="prefill")`` where it has one, else the quantized model itself."""
    wrapped = getattr(root, "wrapped", root)
    if hasattr(wrapped, "as_export_module"):
        return wrapped.as_export_module(mode="prefill")
    return root


# TICO's smoke export_input: the static ABI of Gemma4ModelPrefillExportAdapter, positionally
# (inputs_embeds, per_layer_inputs, attention_masks, position_embeddings); here made by HF for the
# same prompt (with_export_args) rather than randn / zero masks / cos 1, sin 0.
_SMOKE_HEAD_EXPORT = ExportCapability(
    adapter=smoke_export_module,
    args=lambda sample: sample.export_args,
    samples=("default", "text", "padded"),
    refuses_calib=False,
)
_SMOKE_HEAD_CHECKS = (
    "dynamic_vs_export",
    "torch_export",
    "circle_call",
    "circle_replay",
    "circle_structure",
    "qparam_audit",
    "qparam_consistency",
    "export_contract",
)


# Both LM-head wrappers exported as TICO's smoke exports them: one finding on every export check.
_CONDITIONAL_EXPORT_FAILS = {
    check: expect("gemma4-lm-head-no-export-adapter", check=check) for check in _SMOKE_HEAD_CHECKS
}
_CAUSAL_EXPORT_FAILS = _CONDITIONAL_EXPORT_FAILS


MODEL_CASES = [
    Case(
        name="gemma4_model",
        build=lambda profile: build_model(profile, head=False),
        expected_wrapper="QuantGemma4Model",
        ptq_config=model_ptq_config(num_vision_layers=1),
        # circle_replay: the one-flip floor, Circle's kernels modelled in the aligned copy; dynamic_vs_export: the
        # dynamic path fake-quantizes stages the exported graph takes as inputs (docs/case-measurements.md#gemma4_model)
        settings={
            "quant_accuracy": {"max_mean_abs_diff": 0.06, "max_abs_diff": 0.95, "max_peir": 0.17, "min_sqnr_db": 17.0},
            "circle_replay": {"max_steps": 1.0, "mean_steps": 0.1},
            "dynamic_vs_export": {"atol": 0.08},
        },
        export=ExportCapability(
            adapter=lambda root, sample, built: unwrap(root).as_export_module("prefill"),
            args=lambda sample: sample.export_args,
            samples=("default", "text", "padded"),
            unsupported_mode=lambda root, sample, built: unwrap(root).as_export_module("verify"),
            quant_only=(
                "QuantGemma4Model.as_export_module is QUANT-only by its contract (docstring: 'Asserts "
                "that the model is in QUANT mode'; 'Must be in QUANT mode for export')"
            ),
        ),
        rotary=RotaryCapability(tables=_MODEL_SITE.rotary),
        mask=MaskCapability(probes=_MODEL_SITE.masks),
        # the model's own calls, then the fusion helpers that place its soft tokens
        calls=CallContractCapability(probes=lambda built: [*model_probes(built), *fusion_probes(built)]),
        unused_observers={**_TEXT_UNUSED, "obs_per_layer_inputs": _PLE_OFF},
        expected_failures={"no_side_effects": MASK_TEMPLATE_PER_LAYER, "qparam_consistency": replaced_qparams()},
        **_COMMON,
    ),
    Case(
        name="gemma4_for_conditional_generation",
        build=lambda profile: build_model(profile, head=True),
        expected_wrapper="QuantGemma4ForConditionalGeneration",
        ptq_config=model_ptq_config(num_vision_layers=1),
        # Limits: the image prompt's measured figures with margin
        # (docs/case-measurements.md#gemma4_for_conditional_generation)
        settings={
            "quant_accuracy": {
                "max_mean_abs_diff": 0.0012,
                "max_abs_diff": 0.017,
                "max_peir": 0.014,
                "min_sqnr_db": 37.0,
            },
        },
        rotary=RotaryCapability(tables=_CONDITIONAL_SITE.rotary),
        mask=MaskCapability(probes=_CONDITIONAL_SITE.masks),
        calls=CallContractCapability(probes=head_probes),
        export=_SMOKE_HEAD_EXPORT,
        unused_observers={**_TEXT_UNUSED, "model.wrapped.obs_per_layer_inputs": _PLE_OFF},
        expected_failures={"no_side_effects": MASK_TEMPLATE_PER_LAYER, **_CONDITIONAL_EXPORT_FAILS},
        **_COMMON,
    ),
    Case(
        name="gemma4_for_causal_lm",
        build=build_causal_lm,
        expected_wrapper="QuantGemma4ForCausalLM",
        ptq_config=model_ptq_config(num_vision_layers=0),
        # Limits: the measured figures with margin (docs/case-measurements.md#gemma4_for_causal_lm)
        settings={
            "quant_accuracy": {
                "max_mean_abs_diff": 0.0008,
                "max_abs_diff": 0.035,
                "max_peir": 0.03,
                "min_sqnr_db": 35.0,
            },
        },
        rotary=RotaryCapability(tables=_CAUSAL_LM_SITE.rotary),
        mask=MaskCapability(probes=_CAUSAL_LM_SITE.masks),
        calls=CallContractCapability(probes=head_probes),
        export=_SMOKE_HEAD_EXPORT,
        expected_failures={"no_side_effects": MASK_TEMPLATE_PER_LAYER, **_CAUSAL_EXPORT_FAILS},
        unused_observers={
            **_TEXT_UNUSED,
            "model.wrapped.obs_inputs_embeds": (
                "QuantGemma4TextModel observes inputs_embeds only when the caller passes embeddings; "
                "a causal LM is fed token ids, whose embeddings the embedding wrapper quantizes"
            ),
        },
        **_COMMON,
    ),
]

CASES = [MULTIMODAL_EMBEDDER, *MODEL_CASES]
