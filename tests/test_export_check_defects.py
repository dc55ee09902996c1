"""Seeded defects for the export-fidelity and audit checks: each fails its check with a clear
message, and each check passes on clean tico (see also test_check_defects.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from tico.quantization.wrapq.wrappers.gemma4.quant_vision_encoder import QuantGemma4VisionEncoder

from cases.gemma4 import VISION_ENCODER, VISION_ENCODER_PADDED_CALIB
from cases.qwen3_vl import VISION_MODEL
from tests.helpers import problems_text, run_check, run_clean_check
from tests.pass_defects import serialize_zero_points_off_by_one

EXPORT_CHECKS = ["torch_export", "circle_replay", "qparam_audit", "calibration_coverage"]


@pytest.mark.parametrize("check", EXPORT_CHECKS)
def test_the_defects_case_passes_export_checks_clean(check):
    """The clean side of the seeded defects below (every other case's clean items are the matrix's own)."""
    result = run_clean_check(VISION_ENCODER, check)
    assert result.passed, problems_text(result)


def test_clean_results_carry_the_numbers_reviewers_asked_for():
    replay = run_clean_check(VISION_ENCODER, "circle_replay")
    # The known tico 0.3.0 gap for the Gemma4 encoder: about 3 / 0.5 output quantization steps
    # against torch as exported (part of it the replaced rotate-half qparams, qparam_consistency).
    assert 2.5 < replay.metrics["fake_quantize_as_exported_max_steps"] < 3.5
    assert 0.3 < replay.metrics["fake_quantize_as_exported_mean_steps"] < 0.75
    assert replay.metrics["fake_quantize_max_steps"] <= replay.metrics["fake_quantize_as_exported_max_steps"]
    assert replay.metrics["fake_quantize_as_exported_max_abs_diff"] == pytest.approx(0.126, abs=0.002)
    assert replay.metrics["native_supported"] is False
    assert any(
        "NATIVE replay not applicable: tico's reference runtime does not execute this graph in NATIVE "
        "mode by design" in note
        for note in replay.notes
    )
    audit = run_clean_check(VISION_ENCODER, "qparam_audit")
    assert audit.metrics["quantized_nodes"] > 100 and audit.metrics["missing_qparam"] == 0


def test_native_replay_crash_is_a_failure_not_a_note(monkeypatch):
    """Only the runtime's by-design refusal is not applicable; any other NATIVE exception fails."""
    import harness.export.stages
    from cases.nn import CASES as NN_CASES

    real = harness.export.stages.replay_circle

    def crashing(circle, args, mode):
        if mode == "native":
            raise IndexError("index 7 is out of bounds for axis 0 with size 4")
        return real(circle, args, mode)

    monkeypatch.setattr(harness.export.stages, "replay_circle", crashing)
    case = next(c for c in NN_CASES if c.name == "nn_linear")
    text = problems_text(run_check(case, "circle_replay"))
    assert "NATIVE replay failed: IndexError: index 7 is out of bounds for axis 0 with size 4" in text


def test_qparam_audit_agrees_with_tico_checker():
    """Our walker and tico's check_missing_qparam judge the same captured graph alike."""
    import copy

    from tico.quantization.wrapq.utils.check_missing_qparam import check_missing_qparam
    from tico.utils.convert import convert_exported_module_to_circle

    from harness.export.circle_conversion import _capture_quantized_program
    from harness.pipeline import Pipeline

    pipeline = Pipeline(VISION_ENCODER, "tiny")
    with _capture_quantized_program() as captured:
        convert_exported_module_to_circle(copy.deepcopy(pipeline.exported_program))
    check_missing_qparam(captured["program"], strict=True, ignore_targets=captured["ignored"])  # raises if any
    assert pipeline.circle.audit.missing == []


def test_torch_export_catches_export_only_branch(monkeypatch):
    """A wrapper that takes a different path while being exported (export-only code)."""
    original = QuantGemma4VisionEncoder.forward_export

    def export_only_branch(self, inputs_embeds):
        out = original(self, inputs_embeds)
        return out * 1.01 if torch.compiler.is_exporting() else out

    monkeypatch.setattr(QuantGemma4VisionEncoder, "forward_export", export_only_branch)
    result = run_check(VISION_ENCODER, "torch_export")
    assert "torch.export program vs eager export adapter [default]: not close (atol=0" in problems_text(result)


def test_torch_export_compares_every_output_not_only_the_first(monkeypatch):
    """A wrapper whose second output (sin here, as a decode step's new K/V would be) changes only while
    it is traced: the first output agrees, and the second is named."""
    from wrapq_vision_rotary.quant_vision_rotary_embedding import QuantQwen3VLVisionRotaryEmbedding

    from examples.qwen3_vl_vision_rotary.cases.qwen3_vl_vision_rotary_embedding import CASE as ROTARY

    clean = run_clean_check(ROTARY, "torch_export")
    assert clean.passed and clean.metrics["outputs"] == 2, problems_text(clean)
    original = QuantQwen3VLVisionRotaryEmbedding.forward

    def export_only_second_output(self, x, position_ids):
        cos, sin = original(self, x, position_ids)
        return cos, (sin[..., :1] if torch.compiler.is_exporting() else sin)

    monkeypatch.setattr(QuantQwen3VLVisionRotaryEmbedding, "forward", export_only_second_output)
    result = run_check(ROTARY, "torch_export")
    text = problems_text(result)
    assert "[default], output 1 of 2: shape" in text and "output 0 of 2" not in text, text


def test_circle_replay_catches_serialized_zero_point_off_by_one(monkeypatch):
    serialize_zero_points_off_by_one(monkeypatch)
    result = run_check(VISION_ENCODER, "circle_replay")
    text = problems_text(result)
    assert "Circle FAKE_QUANTIZE mean |diff| in steps" in text and "exceeds threshold 0.1" in text


def test_circle_replay_checks_every_output_not_only_the_first(monkeypatch):
    """A Circle model whose second output (here: sin of the out-of-tree rotary wrapper, as a
    layer's returned K/V would be) drifts is caught, and the output is named."""
    import harness.export.stages as export
    from examples.qwen3_vl_vision_rotary.cases.qwen3_vl_vision_rotary_embedding import CASE as ROTARY

    original = export.replay_circle

    def second_output_off(artifact, args, mode):
        outputs = original(artifact, args, mode)
        return [outputs[0], outputs[1] + 0.05] + list(outputs[2:])

    monkeypatch.setattr(export, "replay_circle", second_output_off)
    result = run_check(ROTARY, "circle_replay")
    text = problems_text(result)
    assert "Circle FAKE_QUANTIZE output 1 max |diff| in steps" in text
    assert "output 0" not in text
    assert result.metrics["circle_outputs"] == 2


def test_qparam_audit_catches_lost_propagation_with_source_lines(monkeypatch):
    """Reproduces the seed PR's situation: structural ops left without qparams."""
    from tico.quantization.passes.propagate_qparam_forward import PropagateQParamForward
    from tico.utils.passes import PassResult

    monkeypatch.setattr(PropagateQParamForward, "call", lambda self, ep: PassResult(False))
    result = run_check(VISION_ENCODER, "qparam_audit")
    assert result.metrics["missing_unexplained"] > 20
    text = problems_text(result)
    assert "node getitem (getitem, 2 users) has no qparam: File" in text
    assert "quant_vision_attention.py" in text and "torch.split(tensor, split_sizes, dim=-1)" in text
    assert result.evidence["by_target"]["aten.permute.default"] >= 1
    # An explicit allowlist with a reason turns those nodes into explained ones.
    allow = {t: "structural op, qparam lost on purpose in this test" for t in result.evidence["by_target"]}
    allowed = run_check(dataclasses.replace(VISION_ENCODER, qparam_allowlist=allow), "qparam_audit")
    assert allowed.passed and allowed.metrics["missing_allowlisted"] == result.metrics["missing_qparam"]


def test_calibration_coverage_catches_observer_never_fed(monkeypatch):
    original = QuantGemma4VisionEncoder._fq

    def skip_sin_in_calib(self, x, obs):
        if obs is self.obs_position_sin and self._mode.name == "CALIB":
            return x
        return original(self, x, obs)

    monkeypatch.setattr(QuantGemma4VisionEncoder, "_fq", skip_sin_in_calib)
    result = run_check(VISION_ENCODER, "calibration_coverage")
    assert "observer obs_position_sin (MinMaxObserver): never fed: observed min/max are not finite" in problems_text(
        result
    )


def test_calibration_coverage_catches_zero_scale(monkeypatch):
    original = QuantGemma4VisionEncoder.freeze_qparams

    def zero_scale(self):
        original(self)
        obs = self.obs_act_in
        obs.load_qparams(torch.zeros_like(obs._cached_scale), obs._cached_zp)

    monkeypatch.setattr(QuantGemma4VisionEncoder, "freeze_qparams", zero_scale)
    result = run_check(VISION_ENCODER, "calibration_coverage")
    assert "observer obs_act_in (MinMaxObserver): scale is zero or negative" in problems_text(result)


def test_calibration_coverage_needs_reasons_for_dead_observers():
    result = run_check(dataclasses.replace(VISION_MODEL, unused_observers={}), "calibration_coverage")
    text = problems_text(result)
    assert "blocks.0.wrapped.attn.wrapped.obs_scaling" in text and "obs_mul_logits_scale" in text


def test_mask_quant_catches_calibration_without_padding():
    """The TICO-like calibration (no padding) turns the -120 fill into 0 in QUANT mode."""
    result = run_check(VISION_ENCODER, "mask_quant")
    text = problems_text(result)
    assert "QUANT mask [dynamic:padded]: fill value -120.0 became 0 after fake-quant" in text
    assert "padding leaks into attention" in text
    clean = run_check(VISION_ENCODER_PADDED_CALIB, "mask_quant")
    assert clean.passed, problems_text(clean)


def test_mask_quant_catches_saturating_observer(monkeypatch):
    """A mask observer whose range stops at -10 (e.g. a clipped percentile) saturates the
    -120 fill: masked keys keep exp(-10) ~ 4.5e-5 of the weight."""
    original = QuantGemma4VisionEncoder.freeze_qparams

    def clipped_range(self):
        original(self)
        obs = self.obs_attention_mask
        obs.load_qparams(torch.tensor([10.0 / 255]), torch.tensor([255], dtype=torch.int))

    monkeypatch.setattr(QuantGemma4VisionEncoder, "freeze_qparams", clipped_range)
    result = run_check(VISION_ENCODER_PADDED_CALIB, "mask_quant")
    text = problems_text(result)
    assert "fill value -120.0 became -10 after fake-quant (observer clamps it)" in text
    assert "a masked key keeps softmax weight" in text


def test_mask_quant_catches_infinite_fill():
    """fill -inf: the mask observer calibrates on -inf, so its qparams and the QUANT mask break."""
    from tico.quantization.config.ptq import PTQConfig

    case = dataclasses.replace(
        VISION_ENCODER_PADDED_CALIB, ptq_config=lambda profile: PTQConfig(attention_mask_fill_value=float("-inf"))
    )
    text = problems_text(run_check(case, "mask_quant"))
    assert "QUANT mask [dynamic:padded]: has" in text and "NaN" in text
    assert "mask [dynamic:padded]: has" in problems_text(run_check(case, "mask_fill"))


class _WhereMask(torch.nn.Module):
    """QuantGemma4TextModel._bounded_additive_mask's pattern: torch.where(mask < 0, fill, 0)."""

    def forward(self, mask: torch.Tensor) -> torch.Tensor:
        return torch.where(mask < 0, torch.full_like(mask, -120.0), torch.zeros_like(mask)) + mask


class _Doubling(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2.0


def test_a_refused_operator_is_named_on_the_stage_line():
    """tico refuses an unsupported operator with one generic line and names it only in its log; the
    harness raises the same error type with the operator names and counts on the first line, so an
    expectation can say which operator it diagnosed (gemma4_text_model: lt.Scalar)."""
    from tico.utils.errors import NotYetSupportedError

    from harness.export.stages import convert_to_circle, export_program

    mask = torch.zeros(1, 1, 4, 4)
    with pytest.raises(NotYetSupportedError, match=r"^NOT SUPPORTED OPERATOR IN GRAPH MODULE: lt\.Scalar x1$"):
        convert_to_circle(export_program(_WhereMask().eval(), (mask,)))
    # clean: a supported graph converts, and the log handler is gone afterwards
    assert convert_to_circle(export_program(_Doubling().eval(), (mask,))).binary
    import logging

    assert not [
        h for h in logging.getLogger("tico.utils.convert").handlers if type(h).__name__ == "_UnsupportedOperatorLog"
    ]


def test_text_model_expectation_names_its_operator():
    """The gemma4_text_model Circle expectation holds only for the diagnosed operator: another
    refused operator (a new breakage) is a problem it does not cover, and the item fails."""
    from cases.gemma4_text import TEXT_MODEL
    from harness.model.expectations import judge

    expected = TEXT_MODEL.expected_failures["circle_replay"]
    line = "stage 'circle_convert' failed: NotYetSupportedError: NOT SUPPORTED OPERATOR IN GRAPH MODULE: {}"
    assert judge(expected, [line.format("lt.Scalar x2")]).expected
    assert not judge(expected, [line.format("lt.Scalar x2, ne.Scalar x1")]).expected
    assert not judge(expected, [line.format("ge.Scalar x2")]).expected


def test_text_model_export_contract_catches_a_static_template_defect(monkeypatch):
    """gemma4_text_model exports under QuantGemma4TextModel's export-mode contract: under
    torch.export (torch.compiler.is_compiling()) its RoPE comes from the static templates, eagerly
    from the rotary module. Seeded defect: the static cosine template read one position late --
    only the traced program changes, and torch_export (eager adapter vs its program) fails.
    Clean, the program matches the eager model exactly."""
    from tico.quantization.wrapq.wrappers.gemma4.quant_text_model import QuantGemma4TextModel

    from cases.gemma4_text import TEXT_MODEL

    clean = run_clean_check(TEXT_MODEL, "torch_export")
    assert clean.passed, problems_text(clean)
    original = QuantGemma4TextModel._make_position_embeddings

    def shifted(self, *, hidden_states, position_ids, past_key_values, use_static_templates):
        tables = original(
            self,
            hidden_states=hidden_states,
            position_ids=position_ids,
            past_key_values=past_key_values,
            use_static_templates=use_static_templates,
        )
        if not use_static_templates:
            return tables
        seq = hidden_states.shape[1]
        late = {}
        for kind, (cos, sin) in tables.items():
            template = getattr(self, f"{kind}_cos_template")[:, 1 : seq + 1, :].expand_as(cos)
            late[kind] = (template.to(cos.dtype), sin)
        return late

    monkeypatch.setattr(QuantGemma4TextModel, "_make_position_embeddings", shifted)
    result = run_check(TEXT_MODEL, "torch_export")
    assert not result.passed, "the shifted static template went unseen"
    assert result.metrics["max_abs_diff"] > 0
