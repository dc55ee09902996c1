"""Gemma4 text helpers shared by the text case modules (``gemma4_text``, ``gemma4_text_attention``,
``gemma4_multimodal``) and the text MLP case in ``gemma4``: the tiny / e2b_dims text configs,
HF RoPE and the sine convention tico's npu_export attention consumes, the true causal /
sliding-window masks, tico's npu_export PTQ config, and why some attention observers are unused.

The leading underscore keeps the plugin from collecting this module as a case file.
"""

from __future__ import annotations

import torch

FILL = -120.0  # tico's default attention_mask_fill_value

# RoPE per layer type, as real Gemma4 E2B uses them (and TICO's smoke).
_ROPE = {
    "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
    "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
}
# TICO's tiny text dims.
_TINY_DIMS = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=2,
    num_key_value_heads=2,
    num_global_key_value_heads=2,
    head_dim=32,
    global_head_dim=32,
    max_position_embeddings=128,
    # the per-layer (PLE) table has a row per token of the vocabulary, as E2B's does (HF's default is E2B's 262144)
    vocab_size_per_layer_input=256,
)
# Real E2B widths (8 query heads, 1 KV head, head_dim 256 sliding / 512 global), short synthetic
# topology, PLE off (TICO's e2b_dims size profile).
_E2B_DIMS = dict(
    vocab_size=262_144,
    hidden_size=1_536,
    intermediate_size=6_144,
    num_attention_heads=8,
    num_key_value_heads=1,
    num_global_key_value_heads=1,
    head_dim=256,
    global_head_dim=512,
    hidden_activation="gelu_pytorch_tanh",
    max_position_embeddings=131_072,
    rms_norm_eps=1e-6,
    sliding_window=512,
    final_logit_softcapping=30.0,
    use_double_wide_mlp=True,
    vocab_size_per_layer_input=262_144,
)
# static_runtime (TICO's e2b_static_runtime) keeps the e2b_dims widths.
E2B_SLIDING_WINDOW = _E2B_DIMS["sliding_window"]
_PROFILE_DIMS = {"tiny": _TINY_DIMS, "e2b_dims": _E2B_DIMS, "static_runtime": _E2B_DIMS}


def text_config(
    profile: str,
    layer_types: tuple[str, ...],
    *,
    k_eq_v: bool = False,
    num_kv_shared_layers: int = 0,
    sliding_window: int | None = None,
    per_layer_input: int = 0,
):
    """A Gemma4 text config for ``profile`` with RoPE parameters keyed by exactly the layer
    types used (HF reads a partial nested mapping as one global RoPE config otherwise).
    ``sliding_window`` overrides the profile's window (TICO's smoke narrows it to 4);
    ``per_layer_input`` is the PLE width (``hidden_size_per_layer_input``; 0 = PLE off, as TICO's
    tiny and e2b_dims smoke)."""
    from transformers.models.gemma4.configuration_gemma4 import Gemma4TextConfig

    if profile not in _PROFILE_DIMS:
        raise ValueError(f"unknown Gemma4 text profile {profile!r}")
    cfg = Gemma4TextConfig(
        **_PROFILE_DIMS[profile],
        num_hidden_layers=len(layer_types),
        layer_types=list(layer_types),
        rope_parameters={t: dict(_ROPE[t]) for t in dict.fromkeys(layer_types)},
        attention_bias=False,
        attention_dropout=0.0,
        use_cache=False,
        enable_moe_block=False,
        attention_k_eq_v=k_eq_v,
        num_kv_shared_layers=num_kv_shared_layers,
        hidden_size_per_layer_input=per_layer_input,
        allow_global_per_layer_attribute_access=True,
    )
    if sliding_window is not None:
        cfg.sliding_window = sliding_window
    cfg._attn_implementation = "eager"
    return cfg


def hf_rope(cfg, layer_type: str, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin for ``positions`` (B, S) from HF's Gemma4TextRotaryEmbedding for one layer type
    (full and sliding layers differ in RoPE type, theta and head dim)."""
    from transformers.models.gemma4.modeling_gemma4 import Gemma4TextRotaryEmbedding

    return Gemma4TextRotaryEmbedding(cfg)(torch.zeros(1), positions, layer_type)


def flip_sin_half(sin: torch.Tensor) -> torch.Tensor:
    """Negate the first half of the last dim: HF sine <-> tico's ``pre_negated_sin`` sine
    (the rotate-half sign moved into the table). The map is its own inverse."""
    first, second = sin.chunk(2, dim=-1)
    return torch.cat((-first, second), dim=-1)


def sin_in_convention(sin: torch.Tensor, convention: str) -> torch.Tensor:
    """HF's sine table in the sine convention a tico Gemma4 text model reports it consumes (the
    map is its own inverse, so it also takes the wrapper's sine back to HF's)."""
    if convention == "hf":
        return sin
    if convention == "pre_negated_sin":
        return flip_sin_half(sin)
    raise ValueError(f"unknown Gemma4 RoPE convention {convention!r}")


def allowed_pairs(
    q_len: int, k_len: int | None = None, *, window: int | None = None, keep: torch.Tensor | None = None
) -> torch.Tensor:
    """(B, q_len, k_len) truth for the last ``q_len`` queries over ``k_len`` keys (default
    ``q_len``): key <= query, query - key < window (sliding), key not padding (``keep`` (B, k_len)
    false); B is 1 without ``keep``."""
    k_len = q_len if k_len is None else k_len
    query = torch.arange(k_len - q_len, k_len)[:, None]
    key = torch.arange(k_len)[None, :]
    allowed = key <= query
    if window is not None:
        allowed = allowed & (query - key < window)
    allowed = allowed[None]
    if keep is not None:
        allowed = allowed & keep.to(torch.bool)[:, None, :]
    return allowed


def additive_mask(allowed: torch.Tensor) -> torch.Tensor:
    """(B, 1, Q, K) additive mask from (B, Q, K) truth: 0 where allowed, FILL elsewhere."""
    return torch.where(allowed, 0.0, FILL)[:, None]


def npu_export_config(profile: str):
    """TICO's decoder-layer / attention smoke profile (tico's default, named explicitly):
    unrolled attention consuming pre-negated sine, the convention the samples are prepared in."""
    from tico.quantization.config.gemma4_attention import get_gemma4_text_attention_options
    from tico.quantization.config.ptq import PTQConfig

    cfg = PTQConfig(model_args={"profile": "npu_export"}, attention_mask_fill_value=FILL)
    if get_gemma4_text_attention_options(cfg).rope != "pre_negated_sin":
        raise RuntimeError("tico's npu_export profile no longer uses pre-negated sine; revisit flip_sin_half")
    return cfg


# Observers tico creates for every Gemma4 text attention but never feeds in these cases, by design.
NEG_UNUSED = (
    "the text attention is fed pre-negated sine tables (tico's npu_export profile, also under its "
    "Gemma4 E2B PTQ config), so it rotates halves without a negation (QuantGemma4TextAttention._rot) "
    "and never feeds this observer"
)
SCALE_UNUSED = (
    "Gemma4 attention scaling is 1.0 (q/k are RMS-normed), so _apply_attention_scale "
    "skips the multiply and never feeds obs_scale"
)
SHARED_KV_UNUSED = (
    "a shared-KV consumer layer has no K/V projection: it takes the producer's rotated "
    "K/V as they are, so the key-rotation and new-K/V observers are never fed"
)
_SHARED_KV_OBSERVERS = ("k_x1", "k_x2", "k_cat", "k_cos", "k_sin", "k_rot", "new_k", "new_v")


def attention_unused(prefix: str = "", *, shared_kv: bool = False) -> dict[str, str]:
    """``unused_observers`` of a Gemma4 text attention under pre-negated sine, its observer paths
    under ``prefix``; a shared-KV consumer also never feeds its key-rotation / new-K/V observers."""
    unused = {f"{prefix}obs_q_neg": NEG_UNUSED, f"{prefix}obs_k_neg": NEG_UNUSED, f"{prefix}obs_scale": SCALE_UNUSED}
    if shared_kv:
        unused.update({f"{prefix}obs_{name}": SHARED_KV_UNUSED for name in _SHARED_KV_OBSERVERS})
    return unused
