"""algorithm_handoff and algorithm_gain fail on a seeded broken handoff or algorithm and pass on
clean tico, under the native and the scalar kernels."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from cases import gemma4_ple_scale_fusion
from cases.algorithms import CASES
from tests import preloaded_python
from tests.helpers import problems_text, run_check

BY_NAME = {case.name: case for case in CASES}
GPTQ_MLP = BY_NAME["llama_gptq_mlp_w4a16"]
SMOOTHQUANT = BY_NAME["llama_smoothquant_decoder_layer_prefill"]
REPO = Path(__file__).resolve().parents[1]


def test_clean_algorithm_checks_pass_under_the_scalar_kernels(tmp_path):
    """Both checks on every algorithm case pass with ATEN_CPU_CAPABILITY=default (scalar kernels,
    where seeded randn takes another path)."""
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
            "cases/algorithms.py",
            "cases/gemma4_ple_scale_fusion.py",
            "-k",
            "algorithm_handoff or algorithm_gain",
            f"--wrapq-report-dir={tmp_path / 'reports'}",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    tiny = [case for case in [*CASES, *gemma4_ple_scale_fusion.CASES] if "tiny" in case.profiles]
    edge = [case for case in tiny if case.sweep is not None]  # their calibration=edge variants run too
    assert done.stdout.splitlines()[-1].startswith(f"{2 * (len(tiny) + len(edge))} passed"), done.stdout[-1000:]


def _recompute_instead_of_lock(monkeypatch):
    """The weight observer takes GPTQ's qparams but does not lock them, so freeze_qparams
    recomputes them from the min/max of the weight it saw: the wrapper ignores GPTQ's grid."""
    from tico.quantization.wrapq.observers.affine_base import AffineObserverBase

    original = AffineObserverBase.load_qparams

    def unlocked(self, scale, zp, *, lock=True):
        original(self, scale, zp, lock=False)

    monkeypatch.setattr(AffineObserverBase, "load_qparams", unlocked)


def test_handoff_catches_a_wrapper_recomputing_gptq_qparams(monkeypatch):
    _recompute_instead_of_lock(monkeypatch)
    result = run_check(GPTQ_MLP, "algorithm_handoff")
    text = problems_text(result)
    assert not result.passed
    assert "the weight observer does not apply the algorithm's qparams" in text
    assert "integer codes other than the algorithm's" in text


def _unfolded_norm(monkeypatch):
    """SmoothQuant scales the linears' weights but leaves the norm's gain undivided: the
    smoothing scales are not folded into the front module."""
    from tico.quantization.algorithm.smoothquant import smooth_quant

    original = smooth_quant.smooth_weights

    def half(front_module, back_modules, activation_max, alpha):
        kept = front_module.weight.detach().clone()
        original(front_module, back_modules, activation_max, alpha)
        with torch.no_grad():
            front_module.weight.copy_(kept)

    monkeypatch.setattr(smooth_quant, "smooth_weights", half)


def test_handoff_catches_smoothing_scales_not_folded_into_the_norm(monkeypatch):
    _unfolded_norm(monkeypatch)
    result = run_check(SMOOTHQUANT, "algorithm_handoff")
    text = problems_text(result)
    assert not result.passed
    assert "input_layernorm: the wrapper's weight is not the algorithm's" in text
    assert "post_attention_layernorm: the wrapper's weight is not the algorithm's" in text


def test_gain_catches_smoothing_that_changes_the_float_model(monkeypatch):
    _unfolded_norm(monkeypatch)
    result = run_check(SMOOTHQUANT, "algorithm_gain")
    assert not result.passed
    assert "transformed float module vs original" in problems_text(result)


def test_gain_catches_gptq_rounding_down(monkeypatch):
    """GPTQ's quantizer flooring instead of rounding: its weights stay on its own grid (the
    handoff is intact) but reconstruct each linear worse than wrapq's round-to-nearest."""
    from tico.quantization.algorithm.gptq import gptq as gptq_module

    def floor_quantize(x, scale, zero, maxq):
        return scale * (torch.clamp(torch.floor(x / scale) + zero, 0, maxq) - zero)

    monkeypatch.setattr(gptq_module, "quantize", floor_quantize)
    gain = run_check(GPTQ_MLP, "algorithm_gain")
    assert not gain.passed
    text = problems_text(gain)
    assert "layer reconstruction gain on the calibration inputs" in text
    assert "output SQNR gain over wrapq alone" in text
    assert run_check(GPTQ_MLP, "algorithm_handoff").passed


def test_a_case_with_a_malformed_algorithm_is_a_definition_error():
    import dataclasses

    import pytest

    from harness import CaseDefinitionError
    from harness.model.algorithm import AlgorithmCapability

    with pytest.raises(CaseDefinitionError, match="field 'algorithm'"):
        dataclasses.replace(GPTQ_MLP, algorithm="gptq")
    with pytest.raises(ValueError, match="unknown claims"):
        AlgorithmCapability(name="gptq", run=lambda module, calibration, call: None, claims=("perplexity",))


def test_handoff_catches_gptq_scales_not_refolded_for_k_proj(monkeypatch):
    """tico's default (npu_export) attention folds 1/sqrt(head_dim) into k_proj's weight, so
    inject_gptq_qparams multiplies GPTQ's k_proj scale by the same factor. Without it the observer
    puts the folded weight on GPTQ's unfolded grid."""
    from tico.quantization.recipes import qparams

    monkeypatch.setattr(qparams, "reused_weight_qparam_scale_multiplier", lambda module: 1.0)
    result = run_check(BY_NAME["llama_gptq_attention_prefill_npu"], "algorithm_handoff")
    text = problems_text(result)
    assert not result.passed
    assert "k_proj: the weight observer does not apply the algorithm's qparams" in text
    assert "q_proj" not in text and "v_proj" not in text and "o_proj" not in text


def test_the_gptq_key_table_matches_every_key_on_clean_tico_and_names_keys_no_wrapper_carries(monkeypatch):
    clean = run_check(GPTQ_MLP, "algorithm_handoff")
    table = clean.evidence["gptq_keys"]
    assert clean.passed and table["found_on"] == "the float module" and table["unused"] == []
    assert [row["key"] for row in table["table"]] == ["down_proj", "gate_proj", "up_proj"]
    assert table["tico_stats"] == {"matched": 3, "missed": 0, "unused": 0}

    import tico.quantization.wrapq.wrappers.llama.quant_mlp as quant_mlp

    # the MLP wrapper prefixes its children's names: GPTQ's keys (the float paths) reach none of them
    monkeypatch.setattr(quant_mlp, "join_name", lambda parent, child: f"mlp.{child}")
    text = problems_text(run_check(GPTQ_MLP, "algorithm_handoff"))
    assert (
        "3 of 3 GPTQ quantizers match no wrapper's fp_name, so inject_gptq_qparams leaves their grids unused: "
        "['down_proj', 'gate_proj', 'up_proj']" in text
    )
