"""Qwen3-VL text-side cases: text attention and decoder layer (prefill and decode), the text
model, and the multimodal model with and without the LM head.

TICO's smoke cases feed these layers random cos/sin and (for attention) no mask; here the
inputs are what a Qwen3-VL model really feeds them: cos/sin from Hugging Face's
Qwen3VLTextRotaryEmbedding on multimodal 3-D (t, h, w) position ids laid out by HF's own
``get_rope_index`` for a prompt with an image span, proper causal masks, and decode compared
with HF running the same past through a DynamicCache. Where a wrapper precomputes RoPE or
builds its own causal mask, those tables and masks are checked against HF / the true pattern.
The vision helpers (grid samples, HF vision RoPE) come from ``cases.qwen3_vl``.
"""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace

import torch

from cases import _static_runtime as static
from cases._qwen3_vl_common import FOLDED_SCALE, QWEN3_VL_REQUIRES, hf_vision_rope, text_config, vision_sample
from cases._qwen3_vl_model_calls import model_probes
from cases._qwen3_vl_text_attention_calls import text_attention_decode_probes
from cases._qwen3_vl_text_model_calls import text_model_probes
from cases._shared_diagnoses import (
    CIRCLE_CHECKS,
    MASK_ADD_GAIN,
    MASK_TEMPLATE_PER_LAYER,
    replaced_qparams,
    vision_and_mask_copies,
)
from cases._tico_api import HOST_STATIC_INPUTS, prepared_for_export, static_inputs_prepared
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
    Sweep,
    expect,
    first_call_kwarg,
    unwrap,
)

FILL = -120.0  # tico's default attention_mask_fill_value
SEQ = 8  # TICO's text prefill length / decode capacity
TEXT_MAX_SEQ = 128  # TICO's max_position_embeddings for the text smoke configs
# Prompt layout for the text-level cases: 2 text tokens, one image of grid (1, 4, 4) patches
# (2 x 2 merged tokens), 2 text tokens -- so t/h/w positions differ inside the image span.
TEXT_GRID = (1, 4, 4)
TEXT_TOKEN_TYPES = (0, 0, 1, 1, 1, 1, 0, 0)
MERGE = 2

# static_runtime (TICO's qwen3_vl_4b_static_runtime): a 2048-token window (max_position_embeddings, the
# prefill length and the decode cache capacity) holding TICO's deployment prompt -- visual_start_idx text
# tokens, then the merged tokens of the fixed image grid, then text to the end of the window -- and one
# calibration sample per full window.
STATIC = static.PROFILE
STATIC_SEQ = static.QWEN3_VL["max_seq"]
_STATIC_LAYOUT = (
    (0,) * static.QWEN3_VL["visual_start_idx"]
    + (1,) * static.QWEN3_VL_VISUAL_TOKENS
    + (0,) * (STATIC_SEQ - static.QWEN3_VL["visual_start_idx"] - static.QWEN3_VL_VISUAL_TOKENS)
)


def _layout(cfg) -> tuple[int, tuple[int, ...], tuple[int, int, int]]:
    """(sequence length, token types, image grid) of the prompt for a text config: the tiny
    8-token layout, or the static_runtime window (recognised by its max_position_embeddings)."""
    if cfg.max_position_embeddings == STATIC_SEQ:
        return STATIC_SEQ, _STATIC_LAYOUT, static.QWEN3_VL["grid_thw"]
    return SEQ, TEXT_TOKEN_TYPES, TEXT_GRID


# -- HF multimodal positions and RoPE ----------------------------------------------------------


def hf_mrope_position_ids(token_types, grids, merge: int = MERGE) -> torch.Tensor:
    """(3, 1, S) position ids from Hugging Face's own ``Qwen3VLModel.get_rope_index`` for a
    prompt whose tokens are text (0) or image (1) with the given image grids; a stand-in
    ``self`` carries only the spatial merge size it reads, so no model is built."""
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLModel

    stub = SimpleNamespace(config=SimpleNamespace(vision_config=SimpleNamespace(spatial_merge_size=merge)))
    stub.get_vision_position_ids = partial(Qwen3VLModel.get_vision_position_ids, stub)
    types = torch.as_tensor(token_types, dtype=torch.long).reshape(1, -1)
    positions, _ = Qwen3VLModel.get_rope_index(
        stub, torch.zeros_like(types), mm_token_type_ids=types, image_grid_thw=torch.tensor([list(g) for g in grids])
    )
    return positions


def hf_text_rope(cfg, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin from Hugging Face's Qwen3VLTextRotaryEmbedding (interleaved mrope) for 3-D ids."""
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding

    return Qwen3VLTextRotaryEmbedding(cfg)(torch.zeros(1, dtype=torch.float32), position_ids)


def _text_cfg(profile: str):
    return text_config(profile, max_seq=STATIC_SEQ if profile == STATIC else TEXT_MAX_SEQ)


def causal_mask(seq: int) -> torch.Tensor:
    """(1, 1, S, S) additive mask: 0 where key <= query, FILL above the diagonal."""
    return torch.full((1, 1, seq, seq), FILL).triu(1)


def _prompt_rope(cfg) -> tuple[torch.Tensor, torch.Tensor]:
    _, types, grid = _layout(cfg)
    return hf_text_rope(cfg, hf_mrope_position_ids(types, [grid]))


def _decode_rope(cfg) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE of the last prompt token (position SEQ-1 of the multimodal layout)."""
    _, types, grid = _layout(cfg)
    positions = hf_mrope_position_ids(types, [grid])[..., -1:]
    return hf_text_rope(cfg, positions)


def _past(cfg) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (1, cfg.num_key_value_heads, _layout(cfg)[0] - 1, cfg.head_dim)
    return torch.randn(shape), torch.randn(shape)


def _dynamic_cache(past: tuple[torch.Tensor, torch.Tensor], attention: torch.nn.Module):
    """The wrapper's static past as HF's DynamicCache holds it. The wrapper's default profile
    folds 1/sqrt(head_dim) into k_norm, so the keys it emits (prefill new_k) and expects back as
    past are HF's keys times ``scaling``: HF gets the same logical past with that factor undone."""
    from transformers.cache_utils import DynamicCache

    cache = DynamicCache()
    cache.update(past[0].clone() / attention.scaling, past[1].clone(), layer_idx=0)
    return cache


# -- text attention -------------------------------------------------------------------------------


def _attention_prefill_sample(cfg) -> Sample:
    seq = _layout(cfg)[0]
    hidden = torch.randn(1, seq, cfg.hidden_size)
    return Sample(args=(hidden, _prompt_rope(cfg)), kwargs={"attention_mask": causal_mask(seq)})


def _attention_decode_sample(cfg) -> Sample:
    """One new token over a (SEQ-1)-token past in the wrapper's static-cache layout."""
    return Sample(
        args=(torch.randn(1, 1, cfg.hidden_size), _decode_rope(cfg)),
        kwargs={"attention_mask": torch.zeros(1, 1, _layout(cfg)[0]), "past_key_values": _past(cfg), "use_cache": True},
    )


def _build_attention(make_sample, profile: str, gqa: bool = False) -> Built:
    """``gqa``: one K/V head for the two query heads (the tiny config has one per query head)."""
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextAttention

    cfg = _text_cfg(profile)
    if gqa:
        cfg.num_key_value_heads = 1
    module = Qwen3VLTextAttention(cfg, layer_idx=0).eval()
    calibration = tuple(make_sample(cfg) for _ in range(1 if profile == STATIC else 3))
    return Built(
        module, CaseInputs(calibration=calibration, evaluation={"default": make_sample(cfg)}), facts={"config": cfg}
    )


def _attention_ptq_config(profile: str, attention: str = "npu_export"):
    """tico's default PTQConfig (the npu_export attention profile: k_norm scale fusion, unrolled heads),
    or the reference_eval profile a user picks for accuracy runs (no fusion, batched heads)."""
    from tico.quantization.config.ptq import PTQConfig

    return PTQConfig() if attention == "npu_export" else PTQConfig(model_args={"profile": attention})


# QuantQwen3VLTextAttention (qwen_vl/quant_text_attention.py) resolves scale fusion and layout from the
# profile (get_qwen3_vl_text_attention_options) and repeats K/V heads in the batched layout when kv_rep != 1.
ATTENTION_SWEEP = Sweep(
    axes={"attention": ("npu_export", "reference_eval"), "gqa": (False, True)},
    why={
        "attention": "scale_fusion 'k_norm' + unrolled layout, or 'none' (runtime scale) + _forward_batched",
        "gqa": "kv_rep = heads // kv_heads: the repeat_interleave of K/V (_forward_batched) and per-group heads",
    },
    pr="each",
    nightly="all",
    overrides={
        "attention=reference_eval": {"unused_observers": {"obs_logits_raw": None, "obs_scale": None}},
        # with one K/V head the shared mask-add observer's site gain stays under the attribution limit
        "gqa=True": {"expected_failures": {"attribution": None}},
    },
)


def _hf_attention_decode(reference: torch.nn.Module, sample: Sample):
    """The same decode step through HF: past in a DynamicCache, mask with its head dim."""
    hidden, rope = sample.args
    return reference(
        hidden,
        position_embeddings=rope,
        attention_mask=sample.kwargs["attention_mask"].unsqueeze(1),
        past_key_values=_dynamic_cache(sample.kwargs["past_key_values"], reference),
    )


def _attention_of(root: torch.nn.Module) -> torch.nn.Module:
    """The QuantQwen3VLTextAttention inside an attention or decoder-layer wrapper."""
    module = unwrap(root)
    return unwrap(module.self_attn) if hasattr(module, "self_attn") else module


def _own_causal_masks(root: torch.nn.Module, built: Built) -> list[MaskProbe]:
    """The causal mask the attention wrapper builds from its template when given no mask, and
    when given a bool padding mask (last 2 keys padding), for a SEQ-token prefill."""
    attn = _attention_of(root)
    fill = float(attn.qcfg.attention_mask_fill_value)
    causal = torch.ones(SEQ, SEQ, dtype=torch.bool).tril()[None]
    keep = torch.ones(1, SEQ, dtype=torch.bool)
    keep[:, -2:] = False
    with torch.no_grad():
        own = attn._build_attention_mask(attention_mask=None, q_len=SEQ, k_len=SEQ, device=torch.device("cpu"))
        padded = attn._build_attention_mask(attention_mask=keep, q_len=SEQ, k_len=SEQ, device=torch.device("cpu"))
    valid = torch.ones(1, SEQ, dtype=torch.bool)
    return [
        MaskProbe("causal_template", own.reshape(1, SEQ, SEQ), valid, fill, allowed=causal),
        MaskProbe("causal_with_padding", padded.reshape(1, SEQ, SEQ), valid, fill, allowed=causal & keep[:, None, :]),
    ]


# -- text decoder layer ---------------------------------------------------------------------------


def _layer_prefill_sample(cfg) -> Sample:
    seq = _layout(cfg)[0]
    return Sample(
        kwargs={
            "hidden_states": torch.randn(1, seq, cfg.hidden_size),
            "position_embeddings": _prompt_rope(cfg),
            "attention_mask": causal_mask(seq),
            "position_ids": torch.arange(seq).unsqueeze(0),
        }
    )


def _layer_decode_sample(cfg) -> Sample:
    seq = _layout(cfg)[0]
    return Sample(
        kwargs={
            "hidden_states": torch.randn(1, 1, cfg.hidden_size),
            "position_embeddings": _decode_rope(cfg),
            "attention_mask": torch.zeros(1, 1, 1, seq),
            "position_ids": torch.full((1, 1), seq - 1, dtype=torch.long),
            "past_key_values": _past(cfg),
            "use_cache": True,
        }
    )


def _build_layer(make_sample, profile: str, calibration: int) -> Built:
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextDecoderLayer

    cfg = _text_cfg(profile)
    module = Qwen3VLTextDecoderLayer(cfg, layer_idx=0).eval()
    samples = tuple(make_sample(cfg) for _ in range(1 if profile == STATIC else calibration))
    return Built(
        module, CaseInputs(calibration=samples, evaluation={"default": make_sample(cfg)}), facts={"config": cfg}
    )


def _hf_layer_decode(reference: torch.nn.Module, sample: Sample):
    kwargs = dict(sample.kwargs)
    kwargs["past_key_values"] = _dynamic_cache(kwargs["past_key_values"], reference.self_attn)
    return reference(**kwargs)


# -- text model -----------------------------------------------------------------------------------


# PTQConfig.attention_mask_fill_value's default: the additive fill the wrapper builds its own masks with.
MASK_FILL = -120.0
# Left padding of the second row in the masked variants, as batched generation pads: with right padding a
# causal model's valid tokens never see the padded keys, so a mask form read wrongly would change nothing.
PADDED_TOKENS = 3


def text_model_mask(keys: torch.Tensor, form: str) -> torch.Tensor:
    """The (B, S) key-validity mask in one of the forms QuantQwen3VLTextModel accepts: 2-D long, bool or
    float padding masks, or the full 4-D (B, 1, S, S) causal-and-padding mask as bool or additive float."""
    if form.endswith("_2d"):
        return keys.to({"long_2d": torch.long, "bool_2d": torch.bool, "float_2d": torch.float32}[form])
    seq = keys.shape[-1]
    allowed = torch.ones(seq, seq, dtype=torch.bool).tril()[None, None] & keys.to(torch.bool)[:, None, None, :]
    if form == "bool_4d":
        return allowed
    if form == "float_4d":
        return torch.zeros(allowed.shape).masked_fill(~allowed, MASK_FILL)
    raise ValueError(f"unknown mask form {form!r}")


def _hf_padding_mask(mask: torch.Tensor) -> torch.Tensor:
    """The (B, S) long padding mask a 2-D or causal-and-padding 4-D mask stands for (the 4-D mask's last
    query row sees every valid key), as HF takes it."""
    if mask.dim() == 4:
        last_row = mask[:, 0, -1, :]
        return (last_row if last_row.dtype == torch.bool else last_row == 0).to(torch.long)
    return (mask != 0).to(torch.long)


def build_text_model(profile: str, mask: str = "none") -> Built:
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextModel

    if profile != "tiny":
        raise ValueError(f"unknown Qwen3-VL text-model profile {profile!r} (TICO runs it at tiny widths only)")
    cfg = _text_cfg(profile)
    module = Qwen3VLTextModel(cfg).eval()
    if mask == "none":
        sample = lambda: Sample(kwargs={"input_ids": torch.randint(0, cfg.vocab_size, (1, SEQ)), "use_cache": False})  # noqa: E731
    else:
        keys = torch.ones(2, SEQ, dtype=torch.long)
        keys[1, :PADDED_TOKENS] = 0
        sample = lambda: Sample(  # noqa: E731
            kwargs={
                "input_ids": torch.randint(0, cfg.vocab_size, (2, SEQ)),
                "attention_mask": text_model_mask(keys, mask),
                "use_cache": False,
            },
            valid_tokens=keys.to(torch.bool),
        )
    return Built(
        module,
        CaseInputs(calibration=tuple(sample() for _ in range(3)), evaluation={"default": sample()}),
        facts={"config": cfg},
    )


def _hf_text_model(reference: torch.nn.Module, sample: Sample):
    """HF takes the padding mask the wrapper's form stands for."""
    kwargs = dict(sample.kwargs)
    if kwargs.get("attention_mask") is not None:
        kwargs["attention_mask"] = _hf_padding_mask(kwargs["attention_mask"])
    return reference(**kwargs)


# QuantQwen3VLTextModel._normalize_attention_mask's forms: 2-D padding masks as long, bool or float, and full
# 4-D masks as bool or additive float (returned as given).
# Every form but the additive float one inverts a bool mask with ~, which Circle conversion refuses
# (findings/tico.toml; tests/test_qwen3_vl_text_mask.py).
_MASK_NOT_CONVERTIBLE = expect("qwen3-vl-text-mask-bitwise-not")
TEXT_MODEL_MASKS = ("long_2d", "bool_2d", "float_2d", "bool_4d", "float_4d")
_PROBES_ON_DECLARED = "its probes do not depend on the sample's mask form: they run once, on the case as declared"

TEXT_MODEL_MASK_SWEEP = Sweep(
    axes={"mask": ("none", *TEXT_MODEL_MASKS)},
    why={"mask": "QuantQwen3VLTextModel._normalize_attention_mask's 2-D dtypes and 4-D forms"},
    pr=("mask=long_2d", "mask=float_4d"),
    nightly="each",
    overrides={
        f"mask={form}": {
            "not_applicable": {"call_contract": _PROBES_ON_DECLARED},
            **(
                {"expected_failures": {check: _MASK_NOT_CONVERTIBLE for check in CIRCLE_CHECKS}}
                if form != "float_4d"
                else {}
            ),
        }
        for form in TEXT_MODEL_MASKS
    },
)


def _text_model_rotary(wrapped: torch.nn.Module, reference: torch.nn.Module, built: Built) -> list[RotaryTables]:
    """Text-only model: the baked cos/sin templates (whole static window) and the cos/sin fed to
    layer 0 in eager and in export mode, against HF's rotary module on text positions."""
    model = unwrap(wrapped)
    cfg = built.facts["config"]
    window = torch.arange(cfg.max_position_embeddings).expand(3, 1, -1)
    sample = built.inputs.evaluation["default"]
    batch = sample.kwargs["input_ids"].shape[0]
    reference_eager = hf_text_rope(cfg, torch.arange(SEQ).expand(3, batch, -1))
    eager = first_call_kwarg(wrapped, model.layers[0], sample.call, "position_embeddings")
    model.force_export = True
    try:
        # tico main's export path reads the tables prepared_static_export installs (0.3.0's, its templates)
        with static_inputs_prepared(model, SEQ):
            exported = first_call_kwarg(wrapped, model.layers[0], sample.call, "position_embeddings")
        if HOST_STATIC_INPUTS:
            whole = Sample(kwargs={"input_ids": torch.zeros(1, cfg.max_position_embeddings, dtype=torch.long)})
            with static_inputs_prepared(model, cfg.max_position_embeddings):
                template = tuple(first_call_kwarg(wrapped, model.layers[0], whole.call, "position_embeddings"))
        else:
            template = (model.cos_template, model.sin_template)
    finally:
        model.force_export = False
    return [
        RotaryTables("template", template, hf_text_rope(cfg, window)),
        RotaryTables("fed_to_layer0:eager", tuple(eager), reference_eager),
        RotaryTables("fed_to_layer0:export", tuple(exported), reference_eager),
    ]


def _text_model_masks(root: torch.nn.Module, built: Built) -> list[MaskProbe]:
    """The causal mask the text model builds and feeds its layers: no mask, and a 2-D padding
    mask whose last 2 tokens are padding."""
    model = unwrap(root)
    fill = float(model.qcfg.attention_mask_fill_value)
    ids = built.inputs.evaluation["default"].kwargs["input_ids"][:1]
    keep = torch.ones(1, SEQ, dtype=torch.long)
    keep[:, -2:] = 0
    causal = torch.ones(SEQ, SEQ, dtype=torch.bool).tril()[None]
    own = first_call_kwarg(root, model.layers[0], lambda m: m(input_ids=ids), "attention_mask")
    padded = first_call_kwarg(root, model.layers[0], lambda m: m(input_ids=ids, attention_mask=keep), "attention_mask")
    valid = torch.ones(1, SEQ, dtype=torch.bool)
    return [
        MaskProbe("causal", own.reshape(1, SEQ, SEQ), valid, fill, allowed=causal),
        MaskProbe(
            "causal_with_padding", padded.reshape(1, SEQ, SEQ), valid, fill, allowed=causal & keep.bool()[:, None, :]
        ),
    ]


# -- multimodal model -----------------------------------------------------------------------------

MM_GRID = (1, 8, 8)  # TICO's image grid for the model cases
MM_SEQ = 50
# A real prompt opens the image span with <vision_start>; the wrapper's own rope index looks
# for it (without it the image is laid out as text). TICO's synthetic prompt puts the image at
# 0 with no such token; here the token sits at 0 and the image span starts at 1.
VISION_START = 997
MM_VISUAL_START = 1


def _tiny_mm_config():
    """TICO's tiny multimodal Qwen3-VL config (2 vision blocks with DeepStack, 2 text layers)."""
    from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLConfig

    cfg = Qwen3VLConfig(
        vision_config={
            "hidden_size": 64,
            "num_heads": 4,
            "depth": 2,
            "temporal_patch_size": 2,
            "patch_size": 16,
            "out_hidden_size": 64,
            "spatial_merge_size": 2,
            "deepstack_visual_indexes": [0, 1],
        },
        text_config={
            "hidden_size": 64,
            "intermediate_size": 256,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "head_dim": 32,
            "num_hidden_layers": 2,
            "attention_bias": False,
            "attention_dropout": 0.0,
            "max_position_embeddings": 1024,
            "vocab_size": 1000,
            "use_cache": False,
            "rope_scaling": {"rope_type": "default", "mrope_section": [1, 1, 2]},
        },
        image_token_id=998,
        video_token_id=999,
        vision_start_token_id=VISION_START,
        vision_end_token_id=VISION_START - 1,
    )
    cfg._attn_implementation = "eager"
    cfg.text_config._attn_implementation = "eager"
    cfg.vision_config._attn_implementation = "eager"
    return cfg


_MM_VISUAL = (MM_GRID[1] // 2) * (MM_GRID[2] // 2)  # merged image tokens (spatial merge 2)


def _mm_token_types(seq: int) -> torch.Tensor:
    types = torch.zeros(seq, dtype=torch.long)
    types[MM_VISUAL_START : MM_VISUAL_START + _MM_VISUAL] = 1
    return types


def _mm_sample(cfg, *, generation: bool) -> Sample:
    """A synthetic image prompt: <vision_start>, the image's merged tokens, random text; with
    the 3-D position ids HF's get_rope_index lays out for it (as a processor-fed pipeline passes
    them; the wrapper's own rope index is checked by rotary_parity)."""
    ids = torch.randint(0, VISION_START - 1, (1, MM_SEQ))
    ids[:, MM_VISUAL_START - 1] = VISION_START
    ids[:, MM_VISUAL_START : MM_VISUAL_START + _MM_VISUAL] = cfg.image_token_id
    kwargs = {
        "input_ids": ids,
        "pixel_values": vision_sample(cfg.vision_config, MM_GRID).args[0],
        "image_grid_thw": torch.tensor([list(MM_GRID)]),
        "position_ids": hf_mrope_position_ids(_mm_token_types(MM_SEQ), [MM_GRID], cfg.vision_config.spatial_merge_size),
        "return_dict": False,
    }
    if generation:
        kwargs["logits_to_keep"] = 0
    return Sample(kwargs=kwargs)


def _mm_ptq_config(profile: str, config: str = "ptq"):
    """The static vision metadata the model wrappers require (grid, visual span start), in a plain
    PTQConfig or (``config="qwen3_vl_builder"``) through tico's whole-model builder, which writes an
    override for every vision block, DeepStack merger and text layer of the model: int16 by default,
    per-channel uint8 weights on the text and vision linears (W8A16)."""
    from tico.quantization.config.ptq import PTQConfig

    model_args = {"vision": {"grid_thw": MM_GRID, "visual_start_idx": MM_VISUAL_START, "spatial_merge_size": 2}}
    if config == "ptq":
        return PTQConfig(model_args=model_args)
    from tico.quantization.config.builders import build_qwen3_vl_ptq_config
    from tico.quantization.config.specs import affine
    from tico.quantization.wrapq.dtypes import UINT8
    from tico.quantization.wrapq.qscheme import QScheme

    return build_qwen3_vl_ptq_config(
        num_vision_blocks=2,
        num_text_layers=2,
        num_deepstack_mergers=2,
        model_args=model_args,
        linear_weight=affine(UINT8, qscheme=QScheme.PER_CHANNEL_ASYMM),
    )


# tico's whole-model config builder (config/builders.py build_qwen3_vl_ptq_config): per-block and
# per-layer overrides the wrappers must each pick up by their module path.
BUILDER_SWEEP = Sweep(
    axes={"config": ("ptq", "qwen3_vl_builder")},
    why={"config": "build_qwen3_vl_ptq_config's per-block, per-merger and per-layer overrides"},
    pr="each",
    nightly="all",
)


def _build_mm(generation: bool, profile: str) -> Built:
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLForConditionalGeneration, Qwen3VLModel

    if profile != "tiny":
        raise ValueError(f"unknown Qwen3-VL model profile {profile!r} (TICO runs it at tiny widths only)")
    cfg = _tiny_mm_config()
    module = (Qwen3VLForConditionalGeneration if generation else Qwen3VLModel)(cfg).eval()
    calibration = tuple(_mm_sample(cfg, generation=generation) for _ in range(2))
    default = _mm_sample(cfg, generation=generation)
    return Built(module, CaseInputs(calibration=calibration, evaluation={"default": default}), facts={"config": cfg})


def _hf_mm(reference: torch.nn.Module, sample: Sample):
    """The same call; ``mm_token_type_ids`` added in case HF has to lay out multimodal positions
    itself (it refuses image inputs without them)."""
    kwargs = dict(sample.kwargs)
    kwargs["mm_token_type_ids"] = (kwargs["input_ids"] == reference.config.image_token_id).long()
    return reference(**kwargs)


def _inner_model(root: torch.nn.Module) -> torch.nn.Module:
    """QuantQwen3VLModel, below the for-conditional-generation wrapper when there is one."""
    module = unwrap(root)
    return unwrap(module.model) if hasattr(module, "lm_head") else module


def _hf_inner(reference: torch.nn.Module) -> torch.nn.Module:
    return reference.model if hasattr(reference, "lm_head") else reference


def _mm_rotary(wrapped: torch.nn.Module, reference: torch.nn.Module, built: Built) -> list[RotaryTables]:
    """Text mrope: the language model's baked templates (static window, image span at
    MM_VISUAL_START) and the cos/sin fed to its first layer when the model lays out positions
    itself (position_ids=None: the wrapper's own rope index) vs HF's rotary module on HF's
    ``get_rope_index`` positions; vision: the cos/sin fed to the first vision block vs HF's
    vision RoPE for the image grid. Runs on a copy: the wrapper caches rope_deltas in a buffer."""
    import copy

    wrapped = copy.deepcopy(wrapped)
    model = _inner_model(wrapped)
    text = unwrap(model.language_model)
    cfg = built.facts["config"]
    sample = built.inputs.evaluation["default"]
    own_positions = Sample(kwargs={**sample.kwargs, "position_ids": None})
    window = cfg.text_config.max_position_embeddings
    template_ref = hf_text_rope(cfg.text_config, hf_mrope_position_ids(_mm_token_types(window), [MM_GRID]))
    sample_ref = hf_text_rope(cfg.text_config, hf_mrope_position_ids(_mm_token_types(MM_SEQ), [MM_GRID]))
    fed = first_call_kwarg(wrapped, text.layers[0], own_positions.call, "position_embeddings")
    vision = unwrap(model.visual)
    fed_vision = first_call_kwarg(wrapped, vision.blocks[0], own_positions.call, "position_embeddings")
    if HOST_STATIC_INPUTS:  # tico main: the tables the text model's export preparation installs, over the window
        whole = Sample(kwargs={"input_ids": torch.zeros(1, window, dtype=torch.long)})
        text.force_export = True
        try:
            with static_inputs_prepared(text, window):
                template = tuple(first_call_kwarg(text, text.layers[0], whole.call, "position_embeddings"))
        finally:
            text.force_export = False
    else:
        template = (text.cos_template, text.sin_template)
    return [
        RotaryTables("text_template", template, template_ref),
        RotaryTables("text_fed_to_layer0", tuple(fed), sample_ref),
        RotaryTables(
            "vision_fed_to_block0",
            tuple(fed_vision),
            hf_vision_rope(_hf_inner(reference).visual, sample.kwargs["image_grid_thw"]),
        ),
    ]


def _mm_masks(root: torch.nn.Module, built: Built) -> list[MaskProbe]:
    """The causal mask the language model builds and feeds its first layer for the prompt."""
    text = unwrap(_inner_model(root).language_model)
    fill = float(text.qcfg.attention_mask_fill_value)
    sample = built.inputs.evaluation["default"]
    mask = first_call_kwarg(root, text.layers[0], sample.call, "attention_mask")
    causal = torch.ones(MM_SEQ, MM_SEQ, dtype=torch.bool).tril()[None]
    return [
        MaskProbe(
            "causal", mask.reshape(1, MM_SEQ, MM_SEQ), torch.ones(1, MM_SEQ, dtype=torch.bool), fill, allowed=causal
        )
    ]


def _mm_output(output) -> torch.Tensor:
    """Hidden states (model) or logits (generation), from an output object or a tuple."""
    if isinstance(output, torch.Tensor):
        return output
    for attr in ("logits", "last_hidden_state"):
        if hasattr(output, attr):
            return getattr(output, attr)
    return output[0]


# -- cases ----------------------------------------------------------------------------------------

_COMMON = dict(family="qwen3_vl", seed=123, requires=QWEN3_VL_REQUIRES)
_TEXT_PROFILES = ("tiny", "e2b_dims", STATIC)
_PREFILL_CACHE = "prefill feeds no past key/value: the cache observers are used by the decode path only"
_FUSED_SCALE = (
    "the default (npu_export) attention profile fuses 1/sqrt(head_dim) into the k_norm weight, so the "
    "runtime logit-scale observers are used only with scale_fusion='none'"
)
_ATTN_UNUSED = {"obs_logits_raw": _FUSED_SCALE, "obs_scale": _FUSED_SCALE}
_NO_CALIB_GUARD = expect("export-adapter-accepts-calib")


_NO_PAST = "TICO's text-model input runs without a cache (use_cache=False): no past key/value is fed"
_TEXT_ONLY_UNUSED = {
    "obs_inputs_embeds": "fed only when the caller passes inputs_embeds instead of input_ids",
    "obs_local_this": "DeepStack visual-feature injection: fed only with multimodal deepstack_visual_embeds",
    "deepstack_visual_embeds_*": "DeepStack visual-feature injection: fed only with multimodal deepstack_visual_embeds",
}


_MM_UNUSED = {
    "*attn.wrapped.obs_scaling": FOLDED_SCALE,
    "*attn.wrapped.obs_mul_logits_scale": FOLDED_SCALE,
    "*self_attn.wrapped.obs_logits_raw": _FUSED_SCALE,
    "*self_attn.wrapped.obs_scale": _FUSED_SCALE,
    "*self_attn.wrapped.obs_past_key": "TICO's model input runs without a cache: no past key/value is fed",
    "*self_attn.wrapped.obs_past_value": "TICO's model input runs without a cache: no past key/value is fed",
}


_MM_TENSOR_INPUTS = ("input_ids", "pixel_values", "image_grid_thw", "position_ids")


class _WholeModelCall(torch.nn.Module):
    """What TICO's smoke case exports for the model cases: the whole quantized model called on its
    evaluation inputs (torch.export takes them positionally; the flags stay fixed)."""

    def __init__(self, root: torch.nn.Module, flags: dict):
        super().__init__()
        self.root = root
        self.flags = flags

    def forward(self, *tensors):
        return self.root(**dict(zip(_MM_TENSOR_INPUTS, tensors)), **self.flags)


_MM_EXPORT = ExportCapability(
    adapter=lambda root, sample, built: _WholeModelCall(
        root, {k: v for k, v in sample.kwargs.items() if k not in _MM_TENSOR_INPUTS}
    ),
    args=lambda s: tuple(s.kwargs[k] for k in _MM_TENSOR_INPUTS),
    refuses_calib=False,
)
_MM_EXPORT_FAILS = expect("qwen3-vl-model-export-data-dependent")
_MM_NO_EXPORT = {check: _MM_EXPORT_FAILS for check in ("torch_export", *CIRCLE_CHECKS, "export_contract")}


def _in_layer(observers: dict[str, str]) -> dict[str, str]:
    return {f"self_attn.wrapped.{k}": v for k, v in observers.items()}


def _attention_export(mode: str, args) -> ExportCapability:
    return ExportCapability(
        adapter=lambda root, sample, built: unwrap(root).as_export_module(mode),
        args=args,
        unsupported_mode=lambda root, sample, built: unwrap(root).as_export_module("no_such_mode"),
    )


# Fields the two multimodal cases (model and conditional generation) share: same PTQ config,
# reference call, output, RoPE / mask probes, unused observers and export verdict.
_MM_CASE = dict(
    ptq_config=_mm_ptq_config,
    reference_call=_hf_mm,
    output=_mm_output,
    rotary=RotaryCapability(tables=_mm_rotary),
    mask=MaskCapability(probes=_mm_masks),
    unused_observers=_MM_UNUSED,
    export=_MM_EXPORT,
    **_COMMON,
)

CASES = [
    Case(
        name="qwen3_vl_text_attention_prefill",
        build=partial(_build_attention, _attention_prefill_sample),
        profiles=_TEXT_PROFILES,
        expected_wrapper="QuantQwen3VLTextAttention",
        export=_attention_export("prefill", lambda s: (s.args[0], s.args[1], s.kwargs["attention_mask"])),
        # Circle differs only by the rotate-half qparams tico replaces: circle_replay gates the runtime's rounding,
        # not the gap (docs/case-measurements.md#qwen3_vl_text_attention_prefill)
        settings={
            "quant_accuracy": {"max_mean_abs_diff": 0.02, "max_abs_diff": 0.15, "max_peir": 0.11, "min_sqnr_db": 16.0},
            "circle_replay": {"max_steps": 1.0, "mean_steps": 0.1},
        },
        mask=MaskCapability(probes=_own_causal_masks),
        unused_observers={"obs_past_key": _PREFILL_CACHE, "obs_past_value": _PREFILL_CACHE, **_ATTN_UNUSED},
        expected_failures={
            "export_contract": _NO_CALIB_GUARD,
            "qparam_consistency": replaced_qparams(),
            "attribution": MASK_ADD_GAIN,
        },
        deployment_shapes={"prefill_seq_len": STATIC_SEQ},
        ptq_config=_attention_ptq_config,
        sweep=ATTENTION_SWEEP,
        **_COMMON,
    ),
    Case(
        name="qwen3_vl_text_attention_decode",
        build=partial(_build_attention, _attention_decode_sample),
        profiles=_TEXT_PROFILES,
        expected_wrapper="QuantQwen3VLTextAttention",
        reference_call=_hf_attention_decode,
        calls=CallContractCapability(probes=partial(text_attention_decode_probes, hf_decode=_hf_attention_decode)),
        # Limits: the measured figures with margin; Circle replay of the output exact
        # (docs/case-measurements.md#qwen3_vl_text_attention_decode)
        settings={
            "quant_accuracy": {"max_mean_abs_diff": 0.08, "max_abs_diff": 0.25, "max_peir": 0.12, "min_sqnr_db": 13.0},
            "circle_replay": {"max_steps": 1.0, "mean_steps": 0.1, "extra_max_steps": 1.0, "extra_mean_steps": 0.1},
        },
        unused_observers=_ATTN_UNUSED,
        expected_failures={"export_contract": _NO_CALIB_GUARD, "qparam_consistency": replaced_qparams(kv_present=True)},
        deployment_shapes={"decode_max_seq": STATIC_SEQ},
        export=_attention_export(
            "decode", lambda s: (s.args[0], s.args[1], s.kwargs["attention_mask"], s.kwargs["past_key_values"])
        ),
        **_COMMON,
    ),
    Case(
        name="qwen3_vl_text_decoder_layer_prefill",
        build=lambda profile: _build_layer(_layer_prefill_sample, profile, 5),
        # Limits: the measured figures with margin; Circle replay exact
        # (docs/case-measurements.md#qwen3_vl_text_decoder_layer_prefill)
        settings={
            "quant_accuracy": {"max_mean_abs_diff": 0.025, "max_abs_diff": 0.1, "max_peir": 0.015, "min_sqnr_db": 30.0},
            "circle_replay": {"max_steps": 1.0, "mean_steps": 0.1},
        },
        profiles=_TEXT_PROFILES,
        expected_wrapper="QuantQwen3VLTextDecoderLayer",
        export=ExportCapability(
            adapter=lambda root, sample, built: unwrap(root).as_export_module("prefill"),
            args=lambda s: (s.kwargs["hidden_states"], s.kwargs["attention_mask"], s.kwargs["position_embeddings"]),
            unsupported_mode=lambda root, sample, built: unwrap(root).as_export_module("no_such_mode"),
        ),
        mask=MaskCapability(probes=_own_causal_masks),
        unused_observers=_in_layer({"obs_past_key": _PREFILL_CACHE, "obs_past_value": _PREFILL_CACHE, **_ATTN_UNUSED}),
        expected_failures={"export_contract": _NO_CALIB_GUARD, "qparam_consistency": replaced_qparams()},
        deployment_shapes={"prefill_seq_len": STATIC_SEQ},
        **_COMMON,
    ),
    Case(
        name="qwen3_vl_text_decoder_layer_decode",
        build=lambda profile: _build_layer(_layer_decode_sample, profile, 3),
        profiles=_TEXT_PROFILES,
        expected_wrapper="QuantQwen3VLTextDecoderLayer",
        reference_call=_hf_layer_decode,
        # Limits: the measured figures with margin; Circle replay of the output exact
        # (docs/case-measurements.md#qwen3_vl_text_decoder_layer_decode)
        settings={
            "quant_accuracy": {"max_mean_abs_diff": 0.08, "max_abs_diff": 1.1, "max_peir": 0.18, "min_sqnr_db": 16.0},
            "circle_replay": {"max_steps": 1.0, "mean_steps": 0.1},
        },
        unused_observers=_in_layer(_ATTN_UNUSED),
        expected_failures={"export_contract": _NO_CALIB_GUARD, "qparam_consistency": replaced_qparams(kv_present=True)},
        deployment_shapes={"decode_max_seq": STATIC_SEQ},
        export=ExportCapability(
            adapter=lambda root, sample, built: unwrap(root).as_export_module("decode"),
            args=lambda s: (
                s.kwargs["hidden_states"],
                s.kwargs["attention_mask"],
                s.kwargs["position_embeddings"],
                s.kwargs["past_key_values"],
            ),
            unsupported_mode=lambda root, sample, built: unwrap(root).as_export_module("no_such_mode"),
        ),
        **_COMMON,
    ),
    Case(
        name="qwen3_vl_text_model",
        build=build_text_model,
        reference_call=_hf_text_model,
        sweep=TEXT_MODEL_MASK_SWEEP,
        expected_wrapper="QuantQwen3VLTextModel",
        # the masked variants export the mask as an input too
        export=ExportCapability(
            adapter=lambda root, sample, built: prepared_for_export(root, sample.kwargs["input_ids"].shape[-1]),
            args=lambda s: (
                (s.kwargs["input_ids"],) + ((s.kwargs["attention_mask"],) if "attention_mask" in s.kwargs else ())
            ),
            refuses_calib=False,
        ),
        # Limits: the measured figures with margin; Circle's GATHER keeps the table's per-row quantization, and
        # aligned to that circle_replay is the one-flip floor (docs/case-measurements.md#qwen3_vl_text_model)
        settings={
            "quant_accuracy": {"max_mean_abs_diff": 0.085, "max_abs_diff": 0.55, "max_peir": 0.1, "min_sqnr_db": 18.0},
            "circle_replay": {"max_steps": 1.0, "mean_steps": 0.1},
        },
        rotary=RotaryCapability(tables=_text_model_rotary),
        mask=MaskCapability(probes=_text_model_masks),
        calls=CallContractCapability(probes=partial(text_model_probes, seq=SEQ)),
        unused_observers={
            **_TEXT_ONLY_UNUSED,
            **{f"layers.*.wrapped.{k}": v for k, v in _in_layer(_ATTN_UNUSED).items()},
            "layers.*.wrapped.self_attn.wrapped.obs_past_key": _NO_PAST,
            "layers.*.wrapped.self_attn.wrapped.obs_past_value": _NO_PAST,
        },
        expected_failures={
            "no_side_effects": MASK_TEMPLATE_PER_LAYER,
            "qparam_consistency": replaced_qparams(embedding=True),
        },
        **_COMMON,
    ),
    Case(
        name="qwen3_vl_model",
        build=partial(_build_mm, False),
        # Limits: the measured figures with margin (docs/case-measurements.md#qwen3_vl_model)
        settings={
            "quant_accuracy": {"max_mean_abs_diff": 0.085, "max_abs_diff": 0.65, "max_peir": 0.1, "min_sqnr_db": 18.0},
            # every layer it holds is attributed site by site in its own case, so few sites here keep the check
            # cheap (docs/case-measurements.md#qwen3-vl-multimodal-attribution-budget)
            "attribution": {"max_sites": 16},
        },
        expected_wrapper="QuantQwen3VLModel",
        calls=CallContractCapability(probes=partial(model_probes, text_token_limit=VISION_START - 1)),
        expected_failures={"no_side_effects": vision_and_mask_copies(), **_MM_NO_EXPORT},
        **_MM_CASE,
    ),
    Case(
        name="qwen3_vl_for_conditional_generation",
        build=partial(_build_mm, True),
        # Limits: the measured figures with margin (docs/case-measurements.md#qwen3_vl_for_conditional_generation)
        settings={
            "quant_accuracy": {
                "max_mean_abs_diff": 0.014,
                "max_abs_diff": 0.11,
                "max_peir": 0.085,
                "min_sqnr_db": 18.0,
            },
            # every layer it holds is attributed site by site in its own case, so few sites here keep the check
            # cheap (docs/case-measurements.md#qwen3-vl-multimodal-attribution-budget)
            "attribution": {"max_sites": 16},
        },
        expected_wrapper="QuantQwen3VLForConditionalGeneration",
        expected_failures={"no_side_effects": vision_and_mask_copies(), **_MM_NO_EXPORT},
        sweep=BUILDER_SWEEP,
        **_MM_CASE,
    ),
]
