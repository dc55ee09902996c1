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


# -- qparam_consistency: torch fake-quantizes a value with qparams tico's passes later replace ---
_REPLACED = r"\): torch fake-quantizes it with scale \S+ zp -?\d+, the Circle model holds scale \S+ zp -?\d+ "
_KEPT = r"a data-movement op, it keeps the quantization of \S+"
_FORWARD = ("tico 0.3.0's PropagateQParamForward gives SPLIT outputs (getitem of split_with_sizes), SLICE and NEG "
            "their input's qparams whenever the dtypes agree, replacing qparams already folded there "
            "(quantization/passes/propagate_qparam_forward.py:108-142)")
_BACKWARD = ("PropagateQParamBackward gives CONCATENATION's inputs the output's qparams "
             "(quantization/passes/propagate_qparam_backward.py:73-81)")

ROTATE_HALF_PATTERN = (r"\.obs_[qk]_(x1|x2|neg)" + _REPLACED + r"\((replaced by PropagateQParam(Forward|Backward)|"
                       + _KEPT + r")\)$")
# The concatenation [-x2, x1] itself: its inputs keep different quantizations in Circle.
ROTATE_HALF_CAT_PATTERN = (r"\.obs_[qk]_cat\): torch fake-quantizes it with scale \S+ zp -?\d+, the Circle model holds "
                           r"its inputs' quantizations unchanged, and they differ \(a concatenation does not requantize\)$")
# hf-convention rotate-half negates x2 without a fake-quant (llama/quant_attention.py:251); the NEG gets the
# concatenation's qparams from PropagateQParamBackward and Circle's NEG kernel requantizes to them.
ROTATE_HALF_NEG_PATTERN = (r"^tensor neg(_\d+)? \(tico/quantization/wrapq/wrappers/llama/quant_attention\.py:251, "
                           r"aten\.neg\.default\): torch applies no fake-quant, the Circle model requantizes it with "
                           r"scale \S+ zp -?\d+ \(range -?\d+\.\.\d+; the qparams of the concatenation cat(_\d+)? it feeds\)$")
ROTATE_HALF_REASON = (
    "rotate-half fake-quantizes the two halves of q/k with their own observers after torch.chunk "
    "(obs_q_x1/x2, obs_k_x1/x2; e.g. llama/quant_attention.py:246-248, qwen_vl/quant_text_attention.py:192) "
    "and -x2 with obs_*_neg before concatenating (obs_*_cat); " + _FORWARD + ", and " + _BACKWARD + "; and "
    "SPLIT and CONCATENATION never requantize, so the halves keep the quantization of the tensor they were "
    "split from and the concatenation holds a mix: one value is quantized with two sets of qparams; where the "
    "wrapper negates x2 without a fake-quant (Llama's hf RoPE, llama/quant_attention.py:251) the NEG holds the "
    "concatenation's qparams and Circle's NEG requantizes to them (NEG is not value-preserving in tico's runtime, "
    "circle/runtime/executor.py:349-353), where torch applies none"
)
KV_PRESENT_PATTERN = (r"\.(obs_new_[kv]|obs_k_rot|(v_proj|v_norm)\.wrapped\.obs_act_out)" + _REPLACED
                      + r"\((replaced by PropagateQParamBackward|" + _KEPT + r")\)$")
KV_PRESENT_REASON = (
    "in decode, the new K/V are fake-quantized with their own observers (obs_k_rot / obs_new_k, the v "
    "projection's or v_norm's output observer / obs_new_v; llama/quant_attention.py:277 and 918) and then "
    "concatenated with the past K/V into the present K/V, quantized with the present observers; "
    + _BACKWARD + ", so in Circle the new K/V carry the present K/V's qparams"
)
# The unrolled (npu_export) Llama attention with more than one KV head: each head's new V reaches the present-V
# concatenation through a SLICE that PropagateQParamBackward does not cross.
PRESENT_V_PER_HEAD_PATTERN = (r"\.obs_present_value\): torch fake-quantizes it with scale \S+ zp -?\d+, the Circle model "
                              r"holds its inputs' quantizations unchanged, and they differ \(a concatenation does not "
                              r"requantize\)$")
PRESENT_V_PER_HEAD_REASON = (
    "with more than one KV head the default (npu_export) profile's unrolled attention (config/llama_attention.py:70-73) "
    "takes each head's new V as v[:, :, kv_i, :] of the v projection's output (llama/quant_attention.py:798) and "
    "concatenates it with that head's past V under obs_present_value (:650-652); tico lowers the selection to SLICE + "
    "RESHAPE (passes/lower_to_slice.py, LowerSelectCopyToSlice), and PropagateQParamBackward copies the "
    "concatenation's qparams back through RESHAPE and PERMUTE only (quantization/passes/propagate_qparam_backward.py:"
    "82-88, no SLICE rule), so the SLICE's output takes the present-V qparams while its input keeps the v projection's "
    "obs_act_out qparams; SLICE and CONCATENATION never requantize (circle/runtime/kernels/__init__.py:38-61), so "
    "Circle's concatenation holds the new V in the v projection's quantization beside the past V in the present-V "
    "one. With one KV head no SLICE is left and the reshape rule reaches the v projection (the new-K/V replacement "
    "above); the batched layout (reference_eval, llama_attention_decode*) concatenates all heads at once. A SLICE "
    "rule in PropagateQParamBackward removes it (tests/test_present_v_per_head.py)"
)
CONV3D_SLICES_PATTERN = r"\.input_slice_k\d+" + _REPLACED + r"\((replaced by PropagateQParamForward|" + _KEPT + r")\)$"
CONV3D_SLICES_REASON = (
    "QuantConv3dDecomposed fake-quantizes each temporal input slice with its own observer "
    "(_input_slice_obs[k], nn/quant_conv3d_decomposed.py:249); " + _FORWARD + ", so each SLICE holds the "
    "padded input's qparams in Circle"
)
EMBEDDING_GATHER_PATTERN = (r"\.(act_out_obs|obs_embedding)\): torch fake-quantizes it with scale \S+ zp -?\d+, the "
                            r"Circle model keeps the per-channel quantization of the table it gathers from "
                            r"\(a data-movement op does not requantize\)$")
EMBEDDING_GATHER_REASON = (
    "the embedding wrappers fake-quantize the table per row (weight observer PER_CHANNEL_ASYMM, channel_axis=0: "
    "nn/quant_embedding.py:40-44, gemma4/quant_text_scaled_word_embedding.py:51-52) and the gathered rows once "
    "more per tensor (act_out_obs, nn/quant_embedding.py:70; obs_embedding, "
    "gemma4/quant_text_scaled_word_embedding.py); the embedding becomes a GATHER, which tico's runtime never "
    "requantizes (GATHER in VALUE_PRESERVING_BUILTIN_NAMES, circle/runtime/kernels/__init__.py:38-61), so in "
    "Circle the rows keep the table's per-row quantization and the per-tensor fake-quant is not applied"
)


# QuantLlamaDecoderLayer: the attention residual sum has no fake-quant of its own; the norm's input observer
# quantizes it for the norm only, and FoldQuantOps puts those qparams on the ADD, so Circle's last ADD reads it
# quantized.
LLAMA_RESIDUAL_PATTERN = (r"^tensor add(_\d+)? \(tico/quantization/wrapq/wrappers/llama/quant_decoder_layer\.py:359, "
                          r"aten\.add\.Tensor\): torch fake-quantizes it only where (\S+\.)?post_attention_layernorm\."
                          r"wrapped\.obs_act_in reads it and add(_\d+)? read\(s\) it in float; the Circle model quantizes "
                          r"it for every user with scale \S+ zp -?\d+ \(the qparams of (\S+\.)?post_attention_layernorm\."
                          r"wrapped\.obs_act_in, which FoldQuantOps folded onto it\)$")
LLAMA_RESIDUAL_REASON = (
    "QuantLlamaDecoderLayer adds the attention output to the residual with no fake-quant of the sum "
    "(llama/quant_decoder_layer.py:359; the MLP residual sum has one, obs_mlp_residual_out, :364) and feeds the sum "
    "to post_attention_layernorm, whose input observer quantizes it for the norm only; FoldQuantOps attaches those "
    "qparams to the ADD itself (quantization/passes/fold_quant_ops.py:206-213, 'dq.replace_all_uses_with(op)'), so "
    "in Circle the MLP residual ADD reads the sum quantized where torch adds it in float: a tensor has one "
    "quantization in the deployed model, and the wrapper's simulation leaves this one out"
)


def replaced_qparams(rotate_half: bool = True, kv_present: bool = False, conv3d_slices: bool = False,
                     embedding: bool = False, llama_residual: bool = False) -> Expected:
    """The qparam_consistency expectation for the replacements a case's wrappers diagnose."""
    rotate = f"({ROTATE_HALF_PATTERN})|({ROTATE_HALF_CAT_PATTERN})|({ROTATE_HALF_NEG_PATTERN})"
    parts = [(rotate_half, ROTATE_HALF_REASON, rotate), (kv_present, KV_PRESENT_REASON, KV_PRESENT_PATTERN),
             (conv3d_slices, CONV3D_SLICES_REASON, CONV3D_SLICES_PATTERN),
             (embedding, EMBEDDING_GATHER_REASON, EMBEDDING_GATHER_PATTERN),
             (llama_residual, LLAMA_RESIDUAL_REASON, LLAMA_RESIDUAL_PATTERN)]
    chosen = [(reason, pattern) for wanted, reason, pattern in parts if wanted]
    return Expected("; ".join(reason for reason, _ in chosen), problems=tuple(pattern for _, pattern in chosen))


def with_expected(cases: list, expectations: dict[str, dict[str, Expected]]) -> list:
    """``cases`` with more expected failures merged in by case name; a name that matches no case
    is a definition error (an expectation never silently goes stale)."""
    import dataclasses

    names = {case.name for case in cases}
    unknown = sorted(set(expectations) - names)
    if unknown:
        raise ValueError(f"expectations for unknown case(s): {unknown}")
    return [dataclasses.replace(case, expected_failures={**case.expected_failures, **expectations[case.name]})
            if case.name in expectations else case for case in cases]


# -- attribution: one interior fake-quant site costs more than the limit -------------------------
MASK_ADD_GAIN = Expected(
    "the attention wrappers add the logits and the additive mask (fill: PTQConfig.attention_mask_fill_value, "
    "-120 by default, config/ptq.py:243) and fake-quantize the sum with one observer, obs_mask_add "
    "(qwen_vl/quant_text_attention.py:167, applied at :629 and :695; llama/quant_attention.py:210, :858, :980; "
    "gemma4/quant_text_attention.py:158, :613, :667), per-tensor uint8 by default (config/ptq.py:205-207, "
    "observers/base.py:41-42); its range is set by the fill, so its step is many times the logit step (obs_logits) and "
    "the valid logits get only the few of its 256 levels their own range spans; the measured gain, step and steps "
    "are the run's",
    problems=(r"^site (\S+\.)?obs_mask_add gains ",),
)
