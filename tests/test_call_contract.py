"""The call_contract check: options a user may pass must give Hugging Face's answer and inputs the
wrapper's contract refuses must be refused with its own error. Seeded tico defects (a guard
dropped, an option ignored) fail it; clean tico passes."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from tico.quantization.wrapq.wrappers.gemma4.quant_text_model import QuantGemma4TextModel

from cases.gemma4_text import TEXT_MODEL
from harness import CallContractCapability, CallProbe
from tests.helpers import problems_text, run_check, run_clean_check


def test_clean_gemma4_text_model_keeps_its_call_contract():
    result = run_clean_check(TEXT_MODEL, "call_contract")
    assert result.passed, problems_text(result)
    assert result.metrics["options_probed"] >= 10 and result.metrics["refusals_probed"] >= 10


def test_a_dropped_guard_fails_the_refusal(monkeypatch):
    """The per-head check removed from the explicit-mask normalization: the (B, 2, S, S) mask is
    no longer refused by the wrapper's own error."""
    original = QuantGemma4TextModel._normalize_explicit_mask_shape

    def without_head_check(mask, *, batch_size, q_len, kv_len):
        return original(mask[:, :1], batch_size=batch_size, q_len=q_len, kv_len=kv_len)

    monkeypatch.setattr(QuantGemma4TextModel, "_normalize_explicit_mask_shape", staticmethod(without_head_check))
    text = problems_text(run_check(TEXT_MODEL, "call_contract"))
    assert "[per-head 4-D mask] the wrapper accepted an input its contract refuses" in text


def test_ignored_position_ids_fail_against_hugging_face(monkeypatch):
    """Caller-supplied position_ids dropped for the wrapper's own template (positions 0..S-1)."""
    original = QuantGemma4TextModel._make_position_ids

    def ignoring(self, *, inputs_embeds, past_key_values, position_ids):
        return original(self, inputs_embeds=inputs_embeds, past_key_values=past_key_values, position_ids=None)

    monkeypatch.setattr(QuantGemma4TextModel, "_make_position_ids", ignoring)
    text = problems_text(run_check(TEXT_MODEL, "call_contract"))
    assert "[position_ids (B, S)] tensor 0: not close" in text
    assert "[position_ids rank 1] tensor 0: not close" in text


def test_a_refusal_with_another_error_fails():
    """A guard whose input now fails deeper down (another error) is not the wrapper's refusal."""
    probe = CallProbe("bad ids", lambda m: m(input_ids=torch.zeros(1, 2, 3)), refusal="ValueError: never raised")
    case = dataclasses.replace(TEXT_MODEL, calls=CallContractCapability(probes=lambda built: [probe]))
    text = problems_text(run_check(case, "call_contract"))
    assert '[bad ids] refused with "RuntimeError: Expected tensor for argument #1' in text


def test_no_probe_fails_and_a_malformed_probe_is_refused():
    case = dataclasses.replace(TEXT_MODEL, calls=CallContractCapability(probes=lambda built: []))
    assert "lists no probe" in problems_text(run_check(case, "call_contract"))
    with pytest.raises(ValueError, match="exactly one of refusal and reference"):
        CallProbe("both", lambda m: m(), refusal="x", reference=lambda hf: hf())
