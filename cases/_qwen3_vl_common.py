"""What the Qwen3-VL case files share: the environment they need, TICO's vision and text
configurations per profile, flattened patch samples, Hugging Face's vision RoPE and the
diagnosis of the vision attention's folded logit scale."""

from __future__ import annotations

import torch

from cases import _static_runtime as static
from harness import Sample

QWEN3_VL_REQUIRES = ("transformers.models.qwen3_vl.modeling_qwen3_vl",)

_TINY_VISION = dict(
    hidden_size=64,
    num_heads=4,
    depth=1,
    temporal_patch_size=2,
    patch_size=16,
    out_hidden_size=64,
    spatial_merge_size=2,
    deepstack_visual_indexes=[0],
    num_position_embeddings=64,
)


# TICO's qwen3_vl_4b_dims vision widths with one block ("e2b_dims" in this harness).
_E2B_VISION = dict(
    hidden_size=1024,
    intermediate_size=4096,
    num_heads=16,
    depth=1,
    hidden_act="gelu_pytorch_tanh",
    in_channels=3,
    temporal_patch_size=2,
    patch_size=16,
    out_hidden_size=2560,
    spatial_merge_size=2,
    num_position_embeddings=2304,
    deepstack_visual_indexes=[0],
)
# static_runtime (TICO's qwen3_vl_4b_static_runtime) keeps the qwen3_vl_4b_dims widths; its shapes are the
# deployment's (a 2048-token window, the fixed image grid STATIC_GRID).
_VISION_PROFILES = {"tiny": _TINY_VISION, "e2b_dims": _E2B_VISION, static.PROFILE: _E2B_VISION}
PROFILES = ("tiny", "e2b_dims", static.PROFILE)
STATIC_GRID = static.QWEN3_VL["grid_thw"]


def vision_config(profile: str):
    from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLVisionConfig

    if profile not in _VISION_PROFILES:
        raise ValueError(f"unknown Qwen3-VL vision profile {profile!r}")
    cfg = Qwen3VLVisionConfig(**_VISION_PROFILES[profile])
    cfg._attn_implementation = "eager"
    return cfg


def patch_dim(cfg) -> int:
    return cfg.in_channels * cfg.temporal_patch_size * cfg.patch_size * cfg.patch_size


def vision_sample(cfg, grid: tuple[int, int, int]) -> Sample:
    """Batch-one flattened patches for one image/video of ``grid`` = (t, h, w) patches."""
    t, h, w = grid
    pixels = torch.randn(1, t * h * w, patch_dim(cfg))
    return Sample(args=(pixels, torch.tensor([list(grid)])))


def hf_vision_rope(model: torch.nn.Module, grid_thw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Hugging Face's cos/sin for ``grid_thw`` through whichever API this version has."""
    if hasattr(model, "rot_pos_emb"):
        freqs = model.rot_pos_emb(grid_thw)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()
    from transformers.vision_utils import get_vision_position_ids

    positions = get_vision_position_ids(grid_thw, model.spatial_merge_size)
    probe = torch.zeros(1, dtype=model.rotary_pos_emb.inv_freq.dtype)
    return model.rotary_pos_emb(probe, positions)


FOLDED_SCALE = (
    "QuantQwen3VLVisionAttention folds the 1/sqrt(head_dim) logit scale into the k rows of qkv at "
    "construction, so this observer is declared but never fed nor applied (dead observer)"
)


def text_config(profile: str, max_seq: int = 32):
    """TICO's tiny text config, or its qwen3_vl_4b_dims widths with one layer ("e2b_dims");
    ``max_seq`` is the static window (max_position_embeddings) the wrappers' masks are built for."""
    from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLTextConfig

    if profile == "tiny":
        cfg = Qwen3VLTextConfig(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
            head_dim=32,
            max_position_embeddings=max_seq,
            rope_scaling={"rope_type": "default", "mrope_section": [1, 1, 2]},
        )
    elif profile in ("e2b_dims", static.PROFILE):
        cfg = Qwen3VLTextConfig(
            vocab_size=151_936,
            hidden_size=2560,
            intermediate_size=9728,
            num_hidden_layers=1,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            hidden_act="silu",
            max_position_embeddings=max_seq,
            rms_norm_eps=1e-6,
            attention_bias=False,
            attention_dropout=0.0,
            use_cache=False,
            rope_scaling={
                "rope_type": "default",
                "rope_theta": 5_000_000.0,
                "mrope_section": [24, 20, 20],
                "mrope_interleaved": True,
            },
        )
    else:
        raise ValueError(f"unknown Qwen3-VL text profile {profile!r}")
    cfg._attn_implementation = "eager"
    return cfg
