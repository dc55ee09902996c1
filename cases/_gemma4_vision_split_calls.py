"""The call contract of tico's Gemma4 vision export for deployment (``export_gemma4_per_layer``'s
vision stages): the monolithic vision-prefill module (``build_gemma4_vision_prefill_export_module``)
and the split pipeline (``build_gemma4_vision_split_export_bundle``: patch stage, one stage per encoder
layer on shared mask and RoPE inputs, the pooler, the post-projection).

Without quantization both answer as Hugging Face's ``get_image_features``; quantized, the split stages
chained through their boundaries compute what the monolithic module does (the bundle's promise:
directly chainable, no observer recalibrated). Coordinates of the wrong shape, a model without a
vision tower or projection, a stage in a mode it cannot export and post-projection settings it rules
out are refused with their own errors."""

from __future__ import annotations

import torch

from harness import Built, CallProbe, unwrap


def _modules():
    from tico.quantization.wrapq.mode import Mode
    from tico.quantization.wrapq.wrappers.gemma4 import export_adapters, vision_split_export

    return Mode, export_adapters, vision_split_export


def vision_split_probes(built: Built) -> list[CallProbe]:
    """On the image prompt's pixels and patch positions (``default``)."""
    Mode, adapters, split = _modules()
    image = built.inputs.evaluation["default"].kwargs
    pixels, positions = image["pixel_values"], image["image_position_ids"]

    def monolithic(tree, coordinates=positions):
        return adapters.build_gemma4_vision_prefill_export_module(unwrap(tree), pixel_position_ids=coordinates)

    def chained(tree):
        bundle = split.build_gemma4_vision_split_export_bundle(unwrap(tree), pixel_position_ids=positions)
        hidden = bundle.patch_embedder(pixels)
        for stage in bundle.encoder_layers:
            hidden = stage(
                hidden, bundle.attention_mask, bundle.position_embeddings_cos, bundle.position_embeddings_sin
            )
        return bundle.post_projection(bundle.pooler(hidden))

    def hf_features(hf):
        """The soft tokens of the one image, projected to the text width: (tokens, text hidden)."""
        return hf.get_image_features(pixels, positions).pooler_output[0]

    def without(attribute, value=None):
        def call(tree):
            setattr(unwrap(tree), attribute, value)
            return monolithic(tree)

        return call

    def post_projection(**settings):
        def call(_tree):
            arguments = dict(
                mode=Mode.QUANT,
                input_observer=None,
                strip_padding_observer=None,
                last_hidden_state_observer=None,
                num_valid_pool_outputs=4,
                hidden_size=8,
                output_dtype=torch.float32,
                vision_projection=torch.nn.Identity(),
                standardize=False,
            )
            return split.Gemma4VisionPostProjectionExportAdapter(**{**arguments, **settings})

        return call

    def calibration_mode_stage(tree):
        vision = unwrap(unwrap(tree).vision_tower)
        return split.Gemma4VisionPatchStageExportAdapter(
            vision.patch_embedder, mode=Mode.CALIB, output_observer=vision.obs_last_hidden_state
        )

    answers = [
        CallProbe(
            "monolithic vision prefill module (NO_QUANT)",
            lambda m: monolithic(m)(pixels),
            reference=lambda hf: hf_features(hf),
            pick=lambda out: [out],
        ),
        CallProbe(
            "split vision stages chained (NO_QUANT)",
            chained,
            reference=lambda hf: hf_features(hf),
            pick=lambda out: [out],
        ),
        CallProbe(
            "split vision stages chained (QUANT) as the monolithic module",
            chained,
            twin=lambda m: monolithic(m)(pixels),
            pick=lambda out: [out],
            mode="quant",
        ),
    ]
    refused = [
        (
            "patch coordinates without a batch",
            lambda m: monolithic(m, positions[0]),
            "ValueError: .*shape \\(1, num_patches, 2\\)",
        ),
        (
            "three patch coordinates",
            lambda m: monolithic(m, torch.cat([positions, positions[..., :1]], -1)),
            "ValueError: .*two-dimensional patch coordinates",
        ),
        (
            "a model without a vision tower",
            without("vision_tower"),
            "ValueError: Gemma4 vision prefill requires a vision tower",
        ),
        (
            "a vision tower without as_export_module",
            without("vision_tower", torch.nn.Identity()),
            "TypeError: Gemma4 vision tower does not expose as_export_module",
        ),
        (
            "a model without embed_vision",
            without("embed_vision"),
            "ValueError: Gemma4 vision prefill requires embed_vision",
        ),
        (
            "a split stage in CALIB mode",
            calibration_mode_stage,
            "RuntimeError: Gemma4 vision patch stage export requires NO_QUANT or QUANT mode",
        ),
        (
            "a post-projection with no valid pool output",
            post_projection(num_valid_pool_outputs=0),
            "ValueError: num_valid_pool_outputs must be positive",
        ),
        ("a post-projection of width 0", post_projection(hidden_size=0), "ValueError: hidden_size must be positive"),
        (
            "a standardized post-projection without its buffers",
            post_projection(standardize=True),
            "ValueError: Standardized Gemma4 vision export requires",
        ),
    ]
    return answers + [CallProbe(label, call, refusal=refusal) for label, call, refusal in refused]
