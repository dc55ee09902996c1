"""Every generic check fails on a realistic wrapper defect injected into tico, and passes on
clean tico. A check that cannot fail is a defect of the harness."""

from __future__ import annotations

import pytest
import torch
from tico.quantization.wrapq.wrappers.gemma4.quant_vision_encoder import QuantGemma4VisionEncoder
from tico.quantization.wrapq.wrappers.qwen_vl.quant_vision_model import QuantQwen3VLVisionModel

from cases.gemma4 import VISION_ENCODER
from cases.qwen3_vl import VISION_MODEL
from tests.helpers import problems_text, run_check, run_clean_check

GEMMA_CHECKS = ["noquant_parity", "quant_accuracy", "dynamic_vs_export", "rotary_parity", "mask_fill"]
QWEN_CHECKS = ["noquant_parity", "quant_accuracy", "dynamic_vs_export", "rotary_parity"]


@pytest.mark.parametrize("check", GEMMA_CHECKS)
def test_clean_gemma4_encoder_passes(check):
    result = run_clean_check(VISION_ENCODER, check)
    assert result.passed, problems_text(result)


@pytest.mark.parametrize("check", QWEN_CHECKS)
def test_clean_qwen3_vl_vision_passes(check):
    result = run_clean_check(VISION_MODEL, check)
    assert result.passed, problems_text(result)


# --- defects --------------------------------------------------------------------------


def _swap_xy_gather(monkeypatch):
    """RoPE gathered with x and y swapped (a height/width mix-up)."""
    original = QuantGemma4VisionEncoder._gather_position_embeddings

    def swapped(self, pixel_position_ids, dtype=torch.float32):
        return original(self, pixel_position_ids.flip(-1), dtype=dtype)

    monkeypatch.setattr(QuantGemma4VisionEncoder, "_gather_position_embeddings", swapped)


def test_noquant_parity_catches_swapped_rope_axes(monkeypatch):
    _swap_xy_gather(monkeypatch)
    result = run_check(VISION_ENCODER, "noquant_parity")
    assert not result.passed
    assert "NO_QUANT wrapper vs HF reference [default]: not close" in problems_text(result)


def test_rotary_parity_catches_uniform_shift_that_output_parity_misses(monkeypatch):
    """A +1 shift of every position cancels inside attention, so float parity passes;
    only the direct table comparison sees it."""
    original = QuantGemma4VisionEncoder._register_rope_tables

    def shifted(self):
        original(self)
        self.cos_table = torch.roll(self.cos_table, shifts=-1, dims=0)
        self.sin_table = torch.roll(self.sin_table, shifts=-1, dims=0)

    monkeypatch.setattr(QuantGemma4VisionEncoder, "_register_rope_tables", shifted)
    assert run_check(VISION_ENCODER, "noquant_parity").passed
    result = run_check(VISION_ENCODER, "rotary_parity")
    assert not result.passed
    text = problems_text(result)
    assert "rotary cos [dynamic:default]: not close" in text
    assert "rotary sin [export:padded]: not close" in text


def test_rotary_parity_catches_qwen_height_width_mixup(monkeypatch):
    original = QuantQwen3VLVisionModel._precompute_rope_position_embeddings

    def hw_swapped(merge_size, rope_inv_freq, grid_thw):
        cos, sin = original(merge_size, rope_inv_freq, grid_thw)
        quarter = cos.shape[-1] // 4

        def swap(t):
            h, w, h2, w2 = t.split(quarter, dim=-1)
            return torch.cat((w, h, w2, h2), dim=-1)

        return swap(cos), swap(sin)

    monkeypatch.setattr(QuantQwen3VLVisionModel, "_precompute_rope_position_embeddings", staticmethod(hw_swapped))
    result = run_check(VISION_MODEL, "rotary_parity")
    assert not result.passed
    text = problems_text(result)
    assert "rotary cos [dynamic:grid_1x4x8]: not close" in text
    assert "rotary cos [export:export_grid]: not close" in text


def test_quant_accuracy_catches_coarse_output_scale(monkeypatch):
    """Output observer's scale computed 16x too coarse (a 4-bit range in an 8-bit container)."""
    original = QuantGemma4VisionEncoder.freeze_qparams

    def coarse(self):
        original(self)
        obs = self.obs_encoder_out
        obs.load_qparams(obs._cached_scale * 16, obs._cached_zp)

    monkeypatch.setattr(QuantGemma4VisionEncoder, "freeze_qparams", coarse)
    result = run_check(VISION_ENCODER, "quant_accuracy")
    assert not result.passed
    text = problems_text(result)
    assert "[default] mean |diff|" in text and "exceeds threshold 0.12" in text


def test_quant_accuracy_catches_collapsed_output(monkeypatch):
    """An output zeroed by a broken fake-quant must fail even where mean |diff| is small."""
    original = QuantQwen3VLVisionModel._fq

    def collapse(self, x, obs):
        out = original(self, x, obs)
        return out * 0.0 if obs is self.obs_pos_add and self._mode.name == "QUANT" else out

    monkeypatch.setattr(QuantQwen3VLVisionModel, "_fq", collapse)
    result = run_check(VISION_MODEL, "quant_accuracy")
    assert not result.passed
    assert "SQNR dB" in problems_text(result) or "PEIR" in problems_text(result)


def test_dynamic_vs_export_catches_export_mask_template_without_padding(monkeypatch):
    """Export template differs from the dynamic path: the baked mask forgets padding."""

    def no_padding_mask(self, pixel_position_ids, dtype=torch.float32):
        batch, seq = pixel_position_ids.shape[:2]
        return torch.zeros(batch, 1, seq, seq, dtype=dtype)

    monkeypatch.setattr(QuantGemma4VisionEncoder, "_make_bidirectional_mask", no_padding_mask)
    result = run_check(VISION_ENCODER, "dynamic_vs_export")
    assert not result.passed
    text = problems_text(result)
    assert "NO_QUANT dynamic forward vs export adapter [padded]: not close" in text
    assert "[default]" not in text  # no padding there, so the defect is invisible and must not be flagged


def test_dynamic_vs_export_catches_transposed_export_profile(monkeypatch):
    """The static profile bakes RoPE for a transposed grid: only the export path is wrong."""
    original = QuantGemma4VisionEncoder.as_export_module

    def transposed(self, mode="prefill", *, pixel_position_ids):
        return original(self, mode, pixel_position_ids=pixel_position_ids.flip(-1))

    monkeypatch.setattr(QuantGemma4VisionEncoder, "as_export_module", transposed)
    result = run_check(VISION_ENCODER, "dynamic_vs_export")
    text = problems_text(result)
    for mode in ("NO_QUANT", "QUANT"):
        for sample in ("default", "padded"):
            assert f"{mode} dynamic forward vs export adapter [{sample}]: not close" in text


def test_mask_fill_catches_key_only_padding(monkeypatch):
    """Mask built for padded keys only: padded query rows see valid keys with 0."""

    def key_only(self, pixel_position_ids, dtype=torch.float32):
        valid = (pixel_position_ids[:, :, 0] >= 0).to(dtype)
        fill = float(self.qcfg.attention_mask_fill_value)
        seq = valid.shape[1]
        return ((1.0 - valid)[:, None, None, :] * fill).expand(-1, 1, seq, seq).clone()

    monkeypatch.setattr(QuantGemma4VisionEncoder, "_make_bidirectional_mask", key_only)
    result = run_check(VISION_ENCODER, "mask_fill")
    assert not result.passed
    assert "mask [export:padded]: 15 pairs touching padding are not the fill value -120.0" in problems_text(result)


def test_mask_fill_catches_infinite_fill(monkeypatch):
    original = QuantGemma4VisionEncoder._make_bidirectional_mask

    def inf_fill(self, pixel_position_ids, dtype=torch.float32):
        mask = original(self, pixel_position_ids, dtype=dtype)
        return mask.masked_fill(mask != 0, float("-inf"))

    monkeypatch.setattr(QuantGemma4VisionEncoder, "_make_bidirectional_mask", inf_fill)
    result = run_check(VISION_ENCODER, "mask_fill")
    assert "mask [export:padded]: has 0 NaN and 39 inf of 64 elements; fill values must be finite" in problems_text(
        result
    )
