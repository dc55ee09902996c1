"""The out-of-tree wrapper example (examples/qwen3_vl_vision_rotary) is validated for real:
its case passes the generic checks on the clean wrapper, and each realistic bug an author
could make in that wrapper fails the check that is meant to catch it."""

from __future__ import annotations

import pytest
import torch
import wrapq_vision_rotary.quant_vision_rotary_embedding as rope_module
from wrapq_vision_rotary import QuantQwen3VLVisionRotaryEmbedding

from examples.qwen3_vl_vision_rotary.cases.qwen3_vl_vision_rotary_embedding import CASE
from tests.helpers import problems_text, run_check, run_clean_check

CLEAN_CHECKS = [
    "noquant_parity",
    "rotary_parity",
    "quant_accuracy",
    "lifecycle",
    "observer_use",
    "calibration_coverage",
    "wrapper_registry",
    "no_side_effects",
    "ptq_overrides",
]


@pytest.mark.parametrize("check", CLEAN_CHECKS)
def test_clean_example_wrapper_passes(check):
    result = run_clean_check(CASE, check)
    assert result.passed, problems_text(result)


def test_clean_example_numbers():
    """The numbers the example's README quotes."""
    rotary = run_clean_check(CASE, "rotary_parity")
    assert max(rotary.metrics.values()) == 0.0  # exact on 4, 16 and 64 patches
    accuracy = run_clean_check(CASE, "quant_accuracy")
    assert accuracy.metrics["max_abs_diff"] == pytest.approx(0.003894, abs=1e-5)
    assert run_clean_check(CASE, "observer_use").metrics["observers"] == 2


# --- defects an author could write -----------------------------------------------------


def test_rotary_parity_catches_frequencies_over_the_full_head_dim(monkeypatch):
    """The old (dim, theta) formula carried over: exponents divided by head_dim instead of
    the per-axis dim, so every frequency but the first is too low."""

    def full_dim(theta, head_dim):
        return 1.0 / (theta ** (torch.arange(0, head_dim // 2, 2, dtype=torch.float32) / head_dim))

    monkeypatch.setattr(rope_module, "axial_inv_freq", full_dim)
    result = run_check(CASE, "rotary_parity")
    assert not result.passed
    text = problems_text(result)
    for label in ("seq_4", "seq_16", "seq_64"):
        assert f"rotary cos [{label}]: not close" in text
        assert f"rotary sin [{label}]: not close" in text


def test_rotary_parity_catches_off_by_one_frequency_index(monkeypatch):
    """Frequency index starting at 1 (odd exponents): a shifted inverse-frequency table."""

    def shifted(theta, head_dim):
        axis_dim = head_dim // 2
        return 1.0 / (theta ** (torch.arange(1, axis_dim + 1, 2, dtype=torch.float32) / axis_dim))

    monkeypatch.setattr(rope_module, "axial_inv_freq", shifted)
    result = run_check(CASE, "rotary_parity")
    assert not result.passed
    assert "rotary cos [seq_16]: not close" in problems_text(result)
    # The same bug moves the float output too: parity against HF fails as well.
    assert not run_check(CASE, "noquant_parity").passed


def test_rotary_parity_catches_height_width_swap(monkeypatch):
    """w angles placed where HF puts h (and h where HF puts w)."""

    def swapped(self, position_ids):
        per_axis = position_ids[..., None].to(torch.float32) * self.inv_freq
        angles = torch.cat([per_axis[:, 1], per_axis[:, 0]], dim=-1)
        return torch.cat([angles, angles], dim=-1)

    monkeypatch.setattr(QuantQwen3VLVisionRotaryEmbedding, "_angles", swapped)
    result = run_check(CASE, "rotary_parity")
    assert not result.passed
    text = problems_text(result)
    assert "rotary cos [seq_16]: not close" in text
    assert "rotary cos [seq_64]: not close" in text


def test_observer_use_catches_sin_left_unquantized(monkeypatch):
    """forward() forgets to fake-quantize sin: its observer is declared but never fed."""

    def sin_not_quantized(self, x, position_ids):
        angles = self._angles(position_ids)
        return self._fq(angles.cos(), self.obs_cos), angles.sin()

    monkeypatch.setattr(QuantQwen3VLVisionRotaryEmbedding, "forward", sin_not_quantized)
    result = run_check(CASE, "observer_use")
    assert not result.passed
    assert "observer obs_sin was never fed statistics during calibration" in problems_text(result)
    coverage = run_check(CASE, "calibration_coverage")
    assert "observer obs_sin (MinMaxObserver): never fed" in problems_text(coverage)


def test_observer_use_catches_dropped_observer(monkeypatch):
    """The sin observer dropped altogether: the declared observer count (2) catches it."""
    original = QuantQwen3VLVisionRotaryEmbedding.__init__

    def cos_only(self, fp_rope, *, qcfg=None, fp_name=None):
        original(self, fp_rope, qcfg=qcfg, fp_name=fp_name)
        del self.obs_sin
        self.obs_sin = None

    def fq_or_pass(self, x, obs):
        return x if obs is None else super(QuantQwen3VLVisionRotaryEmbedding, self)._fq(x, obs)

    monkeypatch.setattr(QuantQwen3VLVisionRotaryEmbedding, "__init__", cos_only)
    monkeypatch.setattr(QuantQwen3VLVisionRotaryEmbedding, "_fq", fq_or_pass)
    monkeypatch.setattr(QuantQwen3VLVisionRotaryEmbedding, "_all_observers", lambda self: (self.obs_cos,))
    result = run_check(CASE, "observer_use")
    assert not result.passed
    assert "wrapper tree holds 1 observers, the case expects 2" in problems_text(result)


def test_quant_accuracy_catches_coarse_cos_scale(monkeypatch):
    """cos observer frozen with a 16x too coarse scale (a 4-bit range in an 8-bit container)."""
    original = QuantQwen3VLVisionRotaryEmbedding.freeze_qparams

    def coarse(self):
        original(self)
        obs = self.obs_cos
        obs.load_qparams(obs._cached_scale * 16, obs._cached_zp)

    monkeypatch.setattr(QuantQwen3VLVisionRotaryEmbedding, "freeze_qparams", coarse)
    result = run_check(CASE, "quant_accuracy")
    assert not result.passed
    assert "[default] max |diff|" in problems_text(result)


def test_wrapper_registry_catches_missing_registration(monkeypatch):
    """The package's decorator never ran (a typo in the try_register path fails silently):
    prepare() would have no wrapper for the class."""
    from tico.quantization.wrapq.wrappers import registry
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionRotaryEmbedding

    registry.lookup(Qwen3VLVisionRotaryEmbedding)  # make sure the registry is initialised
    monkeypatch.delitem(registry._WRAPPERS, Qwen3VLVisionRotaryEmbedding)
    result = run_check(CASE, "wrapper_registry")
    assert not result.passed
    assert "no quantization wrapper registered for Qwen3VLVisionRotaryEmbedding" in problems_text(result)
