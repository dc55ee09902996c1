"""The rotation_handoff check on the SpinQuant cases: clean tico passes (here and under the scalar
kernels), and each seeded broken handoff fails it by name -- an algorithm step left out, a
wrapper that drops or bypasses a rotation module, a rotation never applied."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
import torch
from tico.quantization.algorithm.spinquant import quantizer as spin_quantizer
from tico.quantization.wrapq.wrappers.llama.quant_model import QuantLlamaModel
from tico.quantization.wrapq.wrappers.llama.quant_model_for_causal_lm import QuantLlamaForCausalLM

from cases.spinquant_llama import CASES
from harness.checks.rotation_handoff import _same_up_to_scale
from tests import preloaded_python
from tests.helpers import problems_text, run_check, run_clean_check

SPIN = {case.name: case for case in CASES}
LM = SPIN["spin_llama_for_causal_lm"]
OUTLIERS = SPIN["spin_llama_for_causal_lm_outliers"]
REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", sorted(SPIN))
def test_clean_spinquant_handoff_passes(name):
    result = run_clean_check(SPIN[name], "rotation_handoff")
    assert result.passed, problems_text(result)
    assert result.metrics["computed_tensors"] >= 15  # 2 layers x 7 projections (+ rotation modules)
    assert result.metrics["computed_tensors_used"] == result.metrics["computed_tensors"]
    assert result.metrics["float_rel"] < 1e-5


def test_lm_head_rotation_left_out_fails_float_equivalence_that_noquant_parity_misses(monkeypatch):
    """SpinQuant rotates the embedding side but leaves rotate_lm_head the identity: the wrapper
    wraps that broken model faithfully (noquant_parity passes), only the handoff sees it."""
    monkeypatch.setattr(spin_quantizer, "apply_lm_head_side_rotation", lambda model, r1, norm_scale=None: None)
    assert run_check(LM, "noquant_parity").passed
    result = run_check(LM, "rotation_handoff")
    assert not result.passed
    text = problems_text(result)
    assert "[default] SpinQuant float model vs the original float model: max |diff| / max |original|" in text
    assert result.metrics["float_rel"] > 0.1, result.metrics


def test_wrapper_dropping_rotate_embedding_fails(monkeypatch):
    """QuantLlamaModel that does not wrap the SpinQuant embedding rotation (as for a plain LlamaModel)."""
    original = QuantLlamaModel.__init__

    def dropping(self, model_fp, **kwargs):
        original(self, model_fp, **kwargs)
        self.rotate_embedding = None

    monkeypatch.setattr(QuantLlamaModel, "__init__", dropping)
    result = run_check(LM, "rotation_handoff")
    assert not result.passed
    assert (
        "model.rotate_embedding.weight: the algorithm computed it, and no module of the QUANT wrapper tree holds "
        "a tensor with its contents"
    ) in problems_text(result)
    assert not run_check(LM, "noquant_parity").passed


def test_wrapper_bypassing_rotate_lm_head_fails(monkeypatch):
    """QuantLlamaForCausalLM that keeps the rotate_lm_head wrapper but never calls it."""
    original = QuantLlamaForCausalLM.forward

    def bypassing(self, *args, **kwargs):
        kept, self.rotate_lm_head = self.rotate_lm_head, None
        try:
            return original(self, *args, **kwargs)
        finally:
            self.rotate_lm_head = kept

    monkeypatch.setattr(QuantLlamaForCausalLM, "forward", bypassing)
    result = run_check(LM, "rotation_handoff")
    assert not result.passed
    text = problems_text(result)
    assert "rotate_lm_head.weight: held under wrapped.rotate_lm_head" in text
    assert "which ran no forward on the default sample (the wrapper bypasses it)" in text


def test_rotation_never_applied_fails_the_claimed_gain(monkeypatch):
    """SpinQuant's convert returns the model unrotated (its rotation modules stay identities): the
    float model is still exact, the wrapper uses what it got, and the decoder-layer gain the
    outlier case gates is gone."""
    monkeypatch.setattr(spin_quantizer.SpinQuantQuantizer, "convert", lambda self, model, args=None, kwargs=None: model)
    result = run_check(OUTLIERS, "rotation_handoff")
    assert not result.passed
    assert result.metrics["float_rel"] < 1e-5
    assert abs(result.metrics["claimed_sqnr_gain_db"]) < 0.5, result.metrics
    assert "SQNR gain on the claimed sites only" in problems_text(result)


def test_same_up_to_scale_accepts_a_folded_scale_only():
    weight = torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
    assert _same_up_to_scale(weight.clone(), weight) == 1.0
    assert _same_up_to_scale(weight * 8**-0.5, weight) == pytest.approx(8**-0.5)
    assert _same_up_to_scale(weight.flip(0), weight) is None
    assert _same_up_to_scale(weight + 1e-3, weight) is None


def test_clean_spinquant_cases_pass_under_the_scalar_kernels(tmp_path):
    """Every check of the SpinQuant cases -- the handoff gates, the limits, the goldens -- holds on
    ATEN_CPU_CAPABILITY=default (measured native and scalar)."""
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default", "PYTHONPATH": str(REPO)}
    done = preloaded_python.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-n",
            "0",
            "-p",
            "no:randomly",
            "cases/spinquant_llama.py",
            f"--wrapq-report-dir={tmp_path / 'reports'}",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    last = done.stdout.splitlines()[-1]
    assert re.search(r"\b\d+ (failed|errors?|xpassed)\b", last) is None, last
    assert re.match(r"\d+ passed", last), last
