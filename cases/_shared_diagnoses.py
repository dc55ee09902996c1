"""Diagnosed wrapper behaviours that several case families share, as precise expectations."""

from __future__ import annotations

from harness import Expected

MASK_TEMPLATE_PER_LAYER = Expected(
    "every tico attention wrapper registers its own causal_mask_template buffer (max_seq x max_seq float: "
    "llama/quant_attention.py:236, qwen_vl/quant_text_attention.py:188, gemma4/quant_text_attention.py:169) "
    "although the enclosing decoder layer or model registers the same template (llama/quant_decoder_layer.py:133, "
    "llama/quant_model.py:137, qwen_vl/quant_text_model.py:119, the Gemma4 text model's "
    "full_attention_attention_mask_template): the same mask is held once more per layer",
    problems=(r"^the wrapper tree holds \S*causal_mask_template, a copy of \S*(causal_mask_template|"
              r"attention_mask_template) with the same contents",),
)

QWEN3_VL_PATCH_EMBED_COPY = (
    r"^the wrapper tree holds \S*patch_embed\.wrapped\.proj\.wrapped\.module\.weight, a copy of "
    r"\S*module\.(model\.)?(visual\.)?patch_embed\.proj\.weight with the same contents"
)
QWEN3_VL_PATCH_EMBED_REASON = (
    "QuantQwen3VLVisionModel keeps the float vision model as self.module (qwen_vl/quant_vision_model.py:54), "
    "and its patch-embed wrapper linearises the Conv3d into a new Linear whose weight is a reshaped copy of the "
    "Conv3d weight (qwen_vl/quant_vision_patch_embed.py:127): the projection weight is held twice"
)


def vision_and_mask_copies() -> Expected:
    """Qwen3-VL model-level wrappers: both the patch-embed copy and the per-layer mask templates."""
    return Expected(QWEN3_VL_PATCH_EMBED_REASON + "; " + MASK_TEMPLATE_PER_LAYER.reason,
                    problems=(QWEN3_VL_PATCH_EMBED_COPY,) + MASK_TEMPLATE_PER_LAYER.problems)
