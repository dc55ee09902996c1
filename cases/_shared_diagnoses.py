"""Expectations several case families share, built from tico's findings (findings/tico.toml) by id."""

from __future__ import annotations

from harness import Expected, expect

# The checks that read the Circle model: a conversion that fails stops each of them the same way.
CIRCLE_CHECKS = ("circle_call", "circle_replay", "circle_structure", "qparam_audit", "qparam_consistency")
MASK_TEMPLATE_PER_LAYER = expect("mask-template-per-layer")
PRESENT_V_PER_HEAD = expect("present-v-per-head-slice")
MASK_ADD_GAIN = expect("mask-add-shared-observer")


def vision_and_mask_copies() -> Expected:
    """Qwen3-VL model-level wrappers: both the patch-embed copy and the per-layer mask templates."""
    return expect("qwen3-vl-patch-embed-copy", "mask-template-per-layer")


def replaced_qparams(
    rotate_half: bool = True,
    kv_present: bool = False,
    conv3d_slices: bool = False,
    embedding: bool = False,
    llama_residual: bool = False,
) -> Expected:
    """The qparam_consistency expectation for the replacements a case's wrappers diagnose."""
    chosen = [
        finding
        for wanted, finding in (
            (rotate_half, "rotate-half-two-qparams"),
            (kv_present, "kv-present-requantized"),
            (conv3d_slices, "conv3d-slices-requantized"),
            (embedding, "embedding-gather-per-row"),
            (llama_residual, "llama-residual-float-add"),
        )
        if wanted
    ]
    return expect(*chosen, check="qparam_consistency")
