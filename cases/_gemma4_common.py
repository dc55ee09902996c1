"""What the Gemma4 case files share: the environment they need, TICO's vision-tower
configurations per profile, patch-grid positions and the pixel samples the vision tower takes."""

from __future__ import annotations

import torch

from cases import _static_runtime as static
from harness import Sample

GEMMA4_REQUIRES = ("transformers.models.gemma4.modeling_gemma4",)
GEMMA4_MIN_VERSIONS = {"transformers": "5.9"}

# TICO's tiny smoke configuration for the Gemma4 vision tower (1 layer, GQA 4:2, head_dim 8).
_TINY_VISION = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    attention_dropout=0.0,
    max_position_embeddings=128,
    rms_norm_eps=1e-6,
    use_clipped_linears=False,
    rope_parameters={"rope_type": "default", "rope_theta": 100.0},
    standardize=True,
    allow_global_per_layer_attribute_access=True,
)


# TICO's "e2b_dims" widths for the vision tower (real Gemma4 E2B projections, patch and
# position-table sizes), kept to one encoder layer so a case stays a module-level test.
_E2B_VISION = dict(
    hidden_size=768,
    intermediate_size=3072,
    num_hidden_layers=1,
    num_attention_heads=12,
    num_key_value_heads=12,
    head_dim=64,
    hidden_activation="gelu_pytorch_tanh",
    attention_bias=False,
    attention_dropout=0.0,
    max_position_embeddings=131_072,
    rms_norm_eps=1e-6,
    pooling_kernel_size=3,
    patch_size=16,
    position_embedding_size=10_240,
    use_clipped_linears=True,
    rope_parameters={"rope_type": "default", "rope_theta": 100.0},
    standardize=False,
    allow_global_per_layer_attribute_access=True,
)

# static_runtime (TICO's e2b_static_runtime) keeps the e2b_dims widths; its shapes are the deployment's.
_VISION_PROFILES = {"tiny": _TINY_VISION, "e2b_dims": _E2B_VISION, static.PROFILE: _E2B_VISION}

# Cases whose builders accept TICO's real-width profiles (its _GEMMA4_E2B_DIMS_SUPPORTED_CASES, all of
# which but k_eq_v are in its _GEMMA4_E2B_STATIC_RUNTIME_SUPPORTED_CASES too).
E2B_PROFILES = ("tiny", "e2b_dims", static.PROFILE)


def vision_config(profile: str):
    from transformers.models.gemma4.configuration_gemma4 import Gemma4VisionConfig

    if profile not in _VISION_PROFILES:
        raise ValueError(f"unknown Gemma4 vision profile {profile!r}")
    cfg = Gemma4VisionConfig(**_VISION_PROFILES[profile])
    cfg._attn_implementation = "eager"
    return cfg


def grid_positions(count: int, width: int) -> torch.Tensor:
    """(1, count, 2) patch coordinates (x, y), row-major over a grid ``width`` wide."""
    idx = torch.arange(count)
    return torch.stack((idx % width, idx // width), dim=-1).unsqueeze(0).long()


def padded_positions(valid: int, total: int, width: int) -> torch.Tensor:
    """``valid`` patches on a grid, the rest marked padding with position (-1, -1)."""
    pos = torch.full((1, total, 2), -1, dtype=torch.long)
    pos[:, :valid] = grid_positions(valid, width)
    return pos


def static_positions() -> torch.Tensor:
    """TICO's static vision input layout (e2b_66x36_264): a row-major 36 x 66 patch grid, then
    (-1, -1) padding up to max_soft_tokens * kernel**2 patch slots."""
    return padded_positions(
        static.GEMMA4_VALID_PATCHES, static.GEMMA4_NUM_PATCHES, width=static.GEMMA4["patch_grid_width"]
    )


def valid_patches(positions: torch.Tensor) -> torch.Tensor:
    """Patch slots that hold an image patch (padding slots carry position (-1, -1))."""
    return positions[..., 0] >= 0


def vision_model_sample(cfg, positions: torch.Tensor, *, unit_range: bool = False) -> Sample:
    """Flattened pixel patches as the image processor hands them over: padding slots, marked
    (-1, -1) in ``positions``, are zero. The output is the stripped (tokens, hidden) matrix of
    valid soft tokens only, so no ``valid_tokens`` mask applies to it. ``unit_range``: pixels in
    [0, 1), as TICO's static-runtime smoke draws them (a processed image), instead of normals."""
    draw = torch.rand if unit_range else torch.randn
    pixels = draw(1, positions.shape[1], 3 * cfg.patch_size**2)
    pixels = pixels.masked_fill(~valid_patches(positions).unsqueeze(-1), 0.0)
    return Sample(kwargs={"pixel_values": pixels, "pixel_position_ids": positions, "return_dict": True})
