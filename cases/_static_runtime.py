"""The ``static_runtime`` profile: TICO's deployment shapes (its wrapper smoke's ``*_static_runtime``
size profiles), one harness profile name that each family maps to TICO's shapes.

TICO 0.3.0 defines them in ``tico/quantization/recipes/debug/wrapper_smoke/cases/{llama,gemma4,qwen3_vl}.py``:
the family's real widths with one layer (as its ``*_dims`` profile), batch one, one calibration sample,
and fixed runtime shapes -- a 2048-token static window for every text case, Gemma4's padded vision
input (``e2b_66x36_264``) and Qwen3-VL's fixed image grid. The numbers below are copied from there;
``tests/test_static_runtime_profile.py`` reads TICO's own definitions at run time and fails when they
move, or when the cases carrying this profile are not the ones TICO defines it for.

Nightly only, thresholds only (no goldens): ``pytest --profile static_runtime``.

The leading underscore keeps the plugin from collecting this module as a case file.
"""

from __future__ import annotations

PROFILE = "static_runtime"

# The size-profile name TICO's smoke gives each family's static-runtime shapes.
TICO_PROFILES = {
    "llama": "llama3_2_3b_static_runtime",
    "gemma4": "e2b_static_runtime",
    "qwen3_vl": "qwen3_vl_4b_static_runtime",
}

# TICO's LlamaStaticRuntimeShape (Llama 3.2-3B widths).
LLAMA = {"max_seq": 2048}

# TICO's Gemma4StaticRuntimeShape: the E2B text window and the default static vision profile
# (e2b_66x36_264): a 36 x 66 patch grid padded to max_soft_tokens * kernel**2 patch slots, pooled
# 3 x 3 into 264 visual tokens in 280 soft-token slots.
GEMMA4 = {
    "max_seq": 2048,
    "num_visual_tokens": 264,
    "max_soft_tokens": 280,
    "patch_grid_height": 36,
    "patch_grid_width": 66,
    "pooling_kernel_size": 3,
}
# TICO's _GEMMA4_E2B_PLE_DIM: its static-runtime decoder layers run with Per-Layer Embeddings of this width
# (hidden_size_per_layer_input), the E2B execution contract; every layer call takes a per_layer_input.
GEMMA4_PLE_DIM = 256
GEMMA4_NUM_PATCHES = GEMMA4["max_soft_tokens"] * GEMMA4["pooling_kernel_size"] ** 2  # padded patch slots
GEMMA4_VALID_PATCHES = GEMMA4["patch_grid_height"] * GEMMA4["patch_grid_width"]

# TICO's Qwen3VLStaticRuntimeShape (Qwen3-VL-4B widths).
QWEN3_VL = {
    "max_seq": 2048,
    "grid_thw": (1, 54, 72),
    "visual_capacity": 1000,
    "non_visual_tokens": 14,
    "visual_start_idx": 4,
    "spatial_merge_size": 2,
}
QWEN3_VL_PATCH_TOKENS = QWEN3_VL["grid_thw"][0] * QWEN3_VL["grid_thw"][1] * QWEN3_VL["grid_thw"][2]
QWEN3_VL_VISUAL_TOKENS = (
    QWEN3_VL["grid_thw"][0]
    * (QWEN3_VL["grid_thw"][1] // QWEN3_VL["spatial_merge_size"])
    * (QWEN3_VL["grid_thw"][2] // QWEN3_VL["spatial_merge_size"])
)


def llama_max_seq(profile: str, tiny: int) -> int:
    """The Llama static window (max_position_embeddings): TICO's at static_runtime, ``tiny`` otherwise."""
    return LLAMA["max_seq"] if profile == PROFILE else tiny


def gemma4_max_seq(profile: str, tiny: int) -> int:
    """The Gemma4 text window (prefill length and decode cache capacity): TICO's at static_runtime, ``tiny``
    otherwise."""
    return GEMMA4["max_seq"] if profile == PROFILE else tiny


def calibration_count(profile: str, tiny: int) -> int:
    """Calibration samples per case: TICO's one at static_runtime, ``tiny`` otherwise."""
    return 1 if profile == PROFILE else tiny


# Each case states the shapes it uses at this profile in ``Case.deployment_shapes``, by the name of the
# TICO smoke accessor that gives the same number for TICO's case of that name (the test calls it):
# prefill_seq_len (the prefill length), decode_max_seq (the decode cache capacity), vision_patch_seq_len
# (vision patch slots, padding included), visual_token_seq_len (valid soft tokens),
# vision_pool_output_length (pooler slots), vision_grid (Qwen3-VL grid_thw).
