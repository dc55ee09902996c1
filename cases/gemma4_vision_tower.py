"""Gemma4 vision-tower cases around the encoder (``cases/gemma4.py``): the patch embedder, the pooler,
and the whole vision model (patch embedder + encoder + pooler + standardization) on pixel patches.

Every case here also runs at TICO's real E2B widths (profile ``e2b_dims``) and at its deployment shapes
(``static_runtime``), as TICO's smoke does for them. Hugging Face and tico are imported inside builders,
so a missing or too-old transformers skips these cases with a reason instead of breaking collection.
"""

from __future__ import annotations

import torch

from cases import _static_runtime as static
from cases._gemma4_common import (
    E2B_PROFILES,
    grid_positions,
    padded_positions,
    static_positions,
    valid_patches,
    vision_config,
    vision_model_sample,
)
from cases._gemma4_static_vision_calls import static_vision_probes
from cases._gemma4_vision_tower_calls import patch_embedder_probes, pooler_probes
from cases._shared_diagnoses import replaced_qparams
from cases.gemma4 import LAYER_PART, STATIC, VisionEncoderSite, static_hidden
from harness import (
    Built,
    CallContractCapability,
    Case,
    CaseInputs,
    ExportCapability,
    MaskCapability,
    ProfileLimits,
    RotaryCapability,
    Sample,
    unwrap,
)


def patch_embedder_config(profile: str):
    """TICO's own tiny patch-embedder config; at real width it is the E2B vision config."""
    from transformers.models.gemma4.configuration_gemma4 import Gemma4VisionConfig

    if profile == "tiny":
        return Gemma4VisionConfig(
            hidden_size=32, patch_size=4, position_embedding_size=8, allow_global_per_layer_attribute_access=True
        )
    return vision_config(profile)


def build_patch_embedder(profile: str) -> Built:
    from transformers.models.gemma4.modeling_gemma4 import Gemma4VisionPatchEmbedder

    cfg = patch_embedder_config(profile)
    module = Gemma4VisionPatchEmbedder(cfg)
    if profile == STATIC:  # pixels in [0, 1), padding slots zero and flagged, as TICO's static smoke
        positions = static_positions()
        padding = ~valid_patches(positions)
        sample = lambda: Sample(
            args=(
                vision_model_sample(cfg, positions, unit_range=True).kwargs["pixel_values"],  # noqa: E731
                positions,
                padding,
            )
        )
        return Built(module, CaseInputs(calibration=(sample(),), evaluation={"default": sample()}))
    patches, patch_dim = 16, 3 * cfg.patch_size**2
    positions = grid_positions(patches, width=8)
    no_padding = torch.zeros(1, patches, dtype=torch.bool)
    sample = lambda: Sample(args=(torch.randn(1, patches, patch_dim), positions, no_padding))  # noqa: E731
    calibration = tuple(sample() for _ in range(3))
    return Built(module, CaseInputs(calibration=calibration, evaluation={"default": sample()}))


def build_pooler(profile: str) -> Built:
    from transformers.models.gemma4.modeling_gemma4 import Gemma4VisionPooler

    cfg = vision_config(profile)
    module = Gemma4VisionPooler(cfg)
    if profile == STATIC:  # 2520 patch slots pooled 3x3 into max_soft_tokens output slots
        positions = static_positions()
        sample = lambda: Sample(
            kwargs={
                "hidden_states": static_hidden(cfg.hidden_size),  # noqa: E731
                "pixel_position_ids": positions,
                "padding_positions": ~valid_patches(positions),
                "output_length": static.GEMMA4["max_soft_tokens"],
            }
        )
        return Built(module, CaseInputs(calibration=(sample(),), evaluation={"default": sample()}))
    seq = 16
    positions = grid_positions(seq, width=8)  # pooled 2x2 -> a 4x1 output grid
    no_padding = torch.zeros(1, seq, dtype=torch.bool)
    sample = lambda: Sample(
        kwargs={
            "hidden_states": torch.randn(1, seq, cfg.hidden_size),  # noqa: E731
            "pixel_position_ids": positions,
            "padding_positions": no_padding,
            "output_length": 4,
        }
    )
    calibration = tuple(sample() for _ in range(3))
    return Built(module, CaseInputs(calibration=calibration, evaluation={"default": sample()}))


TOWER_PARTS = [
    Case(
        name="gemma4_vision_patch_embedder",
        profiles=E2B_PROFILES,
        build=build_patch_embedder,
        expected_wrapper="QuantGemma4VisionPatchEmbedder",
        calls=CallContractCapability(probes=patch_embedder_probes),
        settings={
            "quant_accuracy": {"max_mean_abs_diff": 0.1, "max_peir": 0.15},
            "circle_replay": {"max_steps": 1.0, "mean_steps": 0.1},
        },
        export=ExportCapability(
            adapter=lambda root, sample, built: unwrap(root).as_export_module(
                mode="prefill", pixel_position_ids=sample.args[1], padding_positions=sample.args[2]
            ),
            args=lambda s: (s.args[0],),
        ),
        deployment_shapes={"vision_patch_seq_len": static.GEMMA4_NUM_PATCHES},
        **LAYER_PART,
    ),
    Case(
        name="gemma4_vision_pooler",
        profiles=E2B_PROFILES,
        build=build_pooler,
        expected_wrapper="QuantGemma4VisionPooler",
        calls=CallContractCapability(probes=pooler_probes),
        # Pooled outputs scale with sqrt(width), so mean |d| is gated by SQNR instead
        # (docs/case-measurements.md#gemma4_vision_pooler)
        settings={
            "quant_accuracy": {"max_peir": 0.1, "min_sqnr_db": 28.0},
            "circle_replay": {"max_steps": 1.0, "mean_steps": 0.1},
        },
        export=ExportCapability(
            adapter=lambda root, sample, built: unwrap(root).as_export_module(
                mode="prefill",
                output_length=sample.kwargs["output_length"],
                pixel_position_ids=sample.kwargs["pixel_position_ids"],
            ),
            args=lambda s: (s.kwargs["hidden_states"],),
        ),
        deployment_shapes={
            "vision_patch_seq_len": static.GEMMA4_NUM_PATCHES,
            "vision_pool_output_length": static.GEMMA4["max_soft_tokens"],
        },
        **LAYER_PART,
    ),
]

# -- vision model: patch embedder + encoder + pooler + standardization, on pixel patches -----------


def build_vision_model(profile: str) -> Built:
    """Gemma4VisionModel on TICO's smoke layout: 36 patches on a 6x6 grid, pooled 3x3 into 4 soft
    tokens, 3 calibration samples. A padded sample (a non-square 6x3 image in the same 36 slots,
    18 padding slots) exercises the encoder mask and the pooler's padding strip; a wide 12x3 grid
    probes larger x coordinates."""
    from transformers.models.gemma4.modeling_gemma4 import Gemma4VisionModel

    cfg = vision_config(profile)
    module = Gemma4VisionModel(cfg)
    if profile == STATIC:
        full = vision_model_sample(cfg, static_positions(), unit_range=True)
        inputs = CaseInputs(
            calibration=(vision_model_sample(cfg, static_positions(), unit_range=True),),
            evaluation={"default": full, "padded": full},
        )
        return Built(module, inputs, facts={"rotary_probes": {"default": full}})
    seq = 36
    grid = grid_positions(seq, width=6)
    calibration = tuple(vision_model_sample(cfg, grid) for _ in range(3))
    default = vision_model_sample(cfg, grid)
    padded = vision_model_sample(cfg, padded_positions(18, seq, width=6))
    wide = vision_model_sample(cfg, grid_positions(36, width=12))
    calibration += (vision_model_sample(cfg, padded_positions(27, seq, width=9)),)
    inputs = CaseInputs(calibration=calibration, evaluation={"default": default, "padded": padded})
    return Built(module, inputs, facts={"rotary_probes": {"default": default, "padded": padded, "wide_12x3": wide}})


def _vision_model_adapter(root: torch.nn.Module, sample: Sample, built: Built) -> torch.nn.Module:
    return unwrap(root).as_export_module("prefill", pixel_position_ids=sample.kwargs["pixel_position_ids"])


_VISION_MODEL_SITE = VisionEncoderSite(
    encoder=lambda root: unwrap(unwrap(root).encoder),
    hf_encoder=lambda reference: reference.encoder,
    adapter=_vision_model_adapter,
    adapter_args=lambda sample: (sample.kwargs["pixel_values"],),
    like=lambda sample: sample.kwargs["pixel_values"],
)

_NO_STANDARDIZE = (
    "QuantGemma4VisionModel applies obs_minus_bias only when config.standardize; the E2B vision config does "
    "not standardize, so at this width it is never fed"
)

VISION_MODEL = Case(
    name="gemma4_vision_model",
    build=build_vision_model,
    profiles=E2B_PROFILES,
    expected_wrapper="QuantGemma4VisionModel",
    # the static image layout tico's export recipes and static runtime feed this tower
    calls=CallContractCapability(probes=static_vision_probes),
    # Gated scale-free (the pooled soft tokens grow with the width); noquant_parity's atol allows float32
    # reordering on the large soft tokens at e2b_dims (docs/case-measurements.md#gemma4_vision_model)
    settings={
        "quant_accuracy": {"max_peir": 0.02, "min_sqnr_db": 32.0},
        "circle_replay": {"max_steps": 1.0, "mean_steps": 0.1},
        "noquant_parity": {"atol": 1e-4},
    },
    export=ExportCapability(
        adapter=_vision_model_adapter,
        args=lambda sample: (sample.kwargs["pixel_values"],),
        samples=("default", "padded"),
        unsupported_mode=lambda root, sample, built: unwrap(root).as_export_module(
            "decode", pixel_position_ids=sample.kwargs["pixel_position_ids"]
        ),
        # 9 patch slots more than the baked profile (36 slots on tiny).
        contradicting_args=lambda sample, built: (
            torch.cat([sample.kwargs["pixel_values"]] * 2, dim=1)[:, : sample.kwargs["pixel_values"].shape[1] + 9],
        ),
    ),
    rotary=RotaryCapability(tables=_VISION_MODEL_SITE.rotary),
    mask=MaskCapability(probes=_VISION_MODEL_SITE.masks),
    expected_failures={"qparam_consistency": replaced_qparams()},
    # E2B's vision config, like TICO's e2b_dims and e2b_static_runtime smoke, does not standardize
    profile_limits={
        profile: ProfileLimits(unused_observers={"obs_minus_bias": _NO_STANDARDIZE}) for profile in ("e2b_dims", STATIC)
    },
    deployment_shapes={"vision_patch_seq_len": static.GEMMA4_NUM_PATCHES},
    **LAYER_PART,
)


CASES = [*TOWER_PARTS, VISION_MODEL]
