"""Seeded violations of the wrapper contract: each generic contract check fails with a clear
message, and passes on clean tico."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from tico.quantization.config.ptq import PTQConfig
from tico.quantization.wrapq.mode import Mode
from tico.quantization.wrapq.wrappers.gemma4.quant_vision_encoder import QuantGemma4VisionEncoder

from cases.gemma4 import VISION_ENCODER
from cases.qwen3_vl import VISION_MODEL
from tests.helpers import problems_text, run_check, run_clean_check

CONTRACT_CHECKS = ["wrapper_registry", "lifecycle", "observer_use", "ptq_overrides", "export_contract"]


@pytest.mark.parametrize("check", CONTRACT_CHECKS + ["no_side_effects"])
def test_clean_gemma4_encoder_keeps_the_contract(check):
    result = run_clean_check(VISION_ENCODER, check)
    assert result.passed, problems_text(result)


@pytest.mark.parametrize("check", CONTRACT_CHECKS)
def test_clean_qwen3_vl_vision_keeps_the_contract(check):
    result = run_clean_check(VISION_MODEL, check)
    assert result.passed, problems_text(result)


def test_registry_reports_unwrappable_class(monkeypatch):
    import tico.quantization.wrapq.wrappers.registry as registry
    from transformers.models.gemma4.modeling_gemma4 import Gemma4VisionEncoder

    registry.lookup(torch.nn.Linear)  # load the registry before editing it
    monkeypatch.delitem(registry._WRAPPERS, Gemma4VisionEncoder)
    text = problems_text(run_check(VISION_ENCODER, "wrapper_registry"))
    assert "no quantization wrapper registered for Gemma4VisionEncoder" in text


def test_registry_catches_wrong_expected_wrapper():
    case = dataclasses.replace(VISION_ENCODER, expected_wrapper="QuantGemma4VisionModel")
    text = problems_text(run_check(case, "wrapper_registry"))
    assert "resolves to QuantGemma4VisionEncoder, expected QuantGemma4VisionModel" in text


def test_lifecycle_catches_calibration_not_propagated(monkeypatch):
    def shallow(self):
        self._mode = Mode.CALIB  # forgets its children and its observers

    monkeypatch.setattr(QuantGemma4VisionEncoder, "enable_calibration", shallow)
    text = problems_text(run_check(VISION_ENCODER, "lifecycle"))
    assert "expected every quant module in CALIB, found ['CALIB', 'NO_QUANT']" in text


def test_observer_use_catches_observer_never_fed_and_never_applied(monkeypatch):
    original = QuantGemma4VisionEncoder._fq

    def defective(self, x, obs):
        if obs is self.obs_position_sin and self._mode is Mode.CALIB:
            return x  # never fed
        if obs is self.obs_position_cos and self._mode is Mode.QUANT:
            return x  # calibrated but never applied
        return original(self, x, obs)

    monkeypatch.setattr(QuantGemma4VisionEncoder, "_fq", defective)
    text = problems_text(run_check(VISION_ENCODER, "observer_use"))
    assert "observer obs_position_sin was never fed statistics during calibration (3 calibration samples)" in text
    assert "observer obs_position_cos was calibrated but its fake-quant never ran in QUANT mode" in text


def test_observer_use_enforces_declared_count():
    case = dataclasses.replace(VISION_ENCODER, expected_observer_count=3)
    assert "observers, the case expects 3" in problems_text(run_check(case, "observer_use"))


def test_ptq_overrides_catches_ignored_override(monkeypatch):
    monkeypatch.setattr(PTQConfig, "get_kwargs", lambda self, name: {})
    text = problems_text(run_check(VISION_ENCODER, "ptq_overrides"))
    assert "override encoder_out -> int16 ignored" in text


def test_ptq_overrides_catches_override_leaking_to_other_observers(monkeypatch):
    original = PTQConfig.get_kwargs

    def leaky(self, name):
        kwargs = original(self, name)
        if "encoder_out" in self.overrides and name.startswith("act"):
            kwargs = dict(self.overrides["encoder_out"])  # applied to the wrong observers too
        return kwargs

    monkeypatch.setattr(PTQConfig, "get_kwargs", leaky)
    text = problems_text(run_check(VISION_ENCODER, "ptq_overrides"))
    assert "overriding encoder_out also changed" in text


def test_no_side_effects_finds_qwen_patch_projection_held_twice():
    """A real finding on tico 0.3.0 (a precise expectation in the case): QuantQwen3VLVisionModel
    keeps the float model as .module and its patch embed's linearised copy of the Conv3d weight.
    The folded qkv weights are new tensors by design: reported, not failed."""
    result = run_clean_check(VISION_MODEL, "no_side_effects")
    assert result.problems == [
        "the wrapper tree holds wrapped.patch_embed.wrapped.proj.wrapped.module.weight, a copy of "
        "wrapped.module.patch_embed.proj.weight with the same contents (memory held twice)"
    ]
    assert result.metrics["float_tensors_changed"] == 0 and result.metrics["duplicate_tensors"] == 1
    assert any("qkv" in name for name in result.evidence["parameters_added"])


def test_no_side_effects_catches_a_weight_copy(monkeypatch):
    """A wrapper that keeps a clone of a weight it also holds (the classic 'copy for folding,
    forgot to drop the original' defect)."""
    original = QuantGemma4VisionEncoder.__init__

    def with_copy(self, *args, **kwargs):
        original(self, *args, **kwargs)
        source = next(p for p in self.parameters() if p.numel() >= 64)
        self.kept_copy = torch.nn.Parameter(source.detach().clone())

    monkeypatch.setattr(QuantGemma4VisionEncoder, "__init__", with_copy)
    text = problems_text(run_check(VISION_ENCODER, "no_side_effects"))
    assert "wrapped.kept_copy" in text and "with the same contents (memory held twice)" in text


def test_no_side_effects_passes_new_folded_parameters(monkeypatch):
    """A new parameter with new contents (what folding creates) is reported, not failed."""
    original = QuantGemma4VisionEncoder.__init__

    def with_param(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.learned_scale = torch.nn.Parameter(torch.ones(1))

    monkeypatch.setattr(QuantGemma4VisionEncoder, "__init__", with_param)
    result = run_check(VISION_ENCODER, "no_side_effects")
    assert result.passed and "wrapped.learned_scale" in result.evidence["parameters_added"]


def test_export_contract_catches_export_allowed_in_calib(monkeypatch):
    original = QuantGemma4VisionEncoder.as_export_module

    def no_mode_guard(self, mode="prefill", *, pixel_position_ids):
        saved, self._mode = self._mode, Mode.NO_QUANT if self._mode is Mode.CALIB else self._mode
        try:
            return original(self, mode, pixel_position_ids=pixel_position_ids)
        finally:
            self._mode = saved

    monkeypatch.setattr(QuantGemma4VisionEncoder, "as_export_module", no_mode_guard)
    text = problems_text(run_check(VISION_ENCODER, "export_contract"))
    assert "export adapter was built in CALIB mode" in text


def test_export_contract_catches_unsupported_mode_accepted(monkeypatch):
    original = QuantGemma4VisionEncoder.as_export_module
    monkeypatch.setattr(
        QuantGemma4VisionEncoder,
        "as_export_module",
        lambda self, mode="prefill", *, pixel_position_ids: original(
            self, "prefill", pixel_position_ids=pixel_position_ids
        ),
    )
    assert "asking for an unsupported export mode did not raise" in problems_text(
        run_check(VISION_ENCODER, "export_contract")
    )


def test_export_contract_catches_adapter_swallowing_wrong_inputs(monkeypatch):
    original = QuantGemma4VisionEncoder.forward_export

    def truncating(self, inputs_embeds):
        seq = self.attention_mask_template.shape[-1]
        return original(self, inputs_embeds[:, :seq])  # silently drops extra patches

    monkeypatch.setattr(QuantGemma4VisionEncoder, "forward_export", truncating)
    text = problems_text(run_check(VISION_ENCODER, "export_contract"))
    assert "the export adapter accepted inputs [(1, 9, 32)] that contradict its fixed profile" in text


def _nn_linear(**values):
    from cases.nn import CASES as NN_CASES
    from harness.model.sweep import expand, make_variant

    case = next(c for c in NN_CASES if c.name == "nn_linear")
    return expand(case, make_variant(case.sweep, values)) if values else case


def test_observer_use_reports_a_calibration_forward_that_raises(monkeypatch):
    from tico.quantization.wrapq.wrappers.nn.quant_linear import QuantLinear

    def broken(self, x):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied (2x16 and 8x16)")

    monkeypatch.setattr(QuantLinear, "forward", broken)
    result = run_check(_nn_linear(), "observer_use")
    assert problems_text(result) == (
        "a calibration forward raised RuntimeError: mat1 and mat2 shapes cannot be multiplied (2x16 and 8x16)"
    )


def test_ptq_overrides_flips_an_existing_int16_override_to_uint8():
    """The case's own int16 override of act_out (a symmetric qscheme) flipped to uint8: tico resolves the
    qscheme for uint8 (a symmetric uint8 is refused), and only that observer changes."""
    result = run_check(_nn_linear(policy="act_out_int16"), "ptq_overrides")
    assert result.passed, problems_text(result)
    assert result.evidence["override"] == {"act_out": "uint8"}
