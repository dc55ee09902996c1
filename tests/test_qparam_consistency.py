"""qparam_consistency: one tensor, two qparams. A tensor torch fake-quantizes with qparams that
tico's passes later replace is named (observer, wrapper line, replacing pass); the replay of a
case whose gap that explains is gated against torch aligned to Circle's qparams; clean cases
pass under another kernel selection; an unrelated problem is never swallowed by the diagnosis."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from cases._shared_diagnoses import replaced_qparams
from cases.nn import CASES as NN_CASES
from cases.qwen3_vl_text import CASES as QWEN_TEXT_CASES
from harness.model.expectations import judge
from tests import preloaded_python
from tests.helpers import outcome_counts, problems_text, run_check, run_clean_check

REPO = Path(__file__).resolve().parents[1]
NN_LINEAR = next(case for case in NN_CASES if case.name == "nn_linear")
QWEN_ATTENTION = next(case for case in QWEN_TEXT_CASES if case.name == "qwen3_vl_text_attention_prefill")


def test_clean_leaf_case_holds_every_applied_qparam():
    result = run_clean_check(NN_LINEAR, "qparam_consistency")
    assert result.passed, problems_text(result)
    assert result.metrics["applied_fake_quants"] >= 2 and result.metrics["overwritten_qparams"] == 0


def test_a_pass_that_overwrites_a_linear_output_is_named(monkeypatch):
    """Seeded conversion defect: a forward propagation that also copies a linear's input qparams
    onto its output (the class of bug tico's propagation passes have had), on a clean case."""
    from tico.quantization.passes import propagate_qparam_forward as forward
    from tico.serialize.quant_param import QPARAM_KEY

    original = forward.PropagateQParamForward.call

    def overwriting(self, exported_program):
        outcome = original(self, exported_program)
        for node in exported_program.graph_module.graph.nodes:
            if node.op == "call_function" and node.target == torch.ops.aten.linear.default:
                node.meta[QPARAM_KEY] = node.args[0].meta[QPARAM_KEY]
        return outcome

    monkeypatch.setattr(forward.PropagateQParamForward, "call", overwriting)
    result = run_check(NN_LINEAR, "qparam_consistency")
    assert not result.passed
    text = problems_text(result)
    assert "tensor linear (" in text and "obs_act_out): torch fake-quantizes it with scale" in text, text
    assert "(replaced by PropagateQParamForward)" in text, text


def test_the_rotate_half_diagnosis_explains_the_replay_gap():
    """Reproduction: torch as exported vs Circle differs by whole steps; with only the replaced
    observers set to Circle's qparams, the gap is the runtime's rounding (at most one step)."""
    consistency = run_clean_check(QWEN_ATTENTION, "qparam_consistency")
    named = {record["observer"].rsplit(".", 1)[-1] for record in consistency.evidence["overwritten"]}
    assert named and named <= {
        "obs_q_x1",
        "obs_q_x2",
        "obs_q_neg",
        "obs_q_cat",
        "obs_k_x1",
        "obs_k_x2",
        "obs_k_neg",
        "obs_k_cat",
    }, named
    replay = run_clean_check(QWEN_ATTENTION, "circle_replay")
    assert replay.passed, problems_text(replay)
    assert replay.metrics["fake_quantize_as_exported_max_steps"] >= 3
    assert replay.metrics["fake_quantize_max_steps"] <= 1.0
    assert replay.metrics["aligned_tensors"] == len(consistency.evidence["overwritten"])


def test_an_unrelated_replacement_is_not_swallowed_by_the_diagnosis():
    expected = replaced_qparams()
    rotate = (
        "tensor getitem (tico/x.py:1, wrapped.obs_q_x1): torch fake-quantizes it with scale 0.1 zp 3, "
        "the Circle model holds scale 0.2 zp 4 (replaced by PropagateQParamForward)"
    )
    other = (
        "tensor linear (tico/x.py:2, wrapped.q_proj.wrapped.obs_act_out): torch fake-quantizes it with scale "
        "0.1 zp 3, the Circle model holds scale 0.2 zp 4 (replaced by PropagateQParamForward)"
    )
    assert judge(expected, [rotate]).expected
    verdict = judge(expected, [rotate, other])
    assert not verdict.expected and "obs_act_out" in verdict.message


def test_clean_cases_pass_under_the_scalar_kernels(tmp_path):
    """With the project's caches, as a matrix run has them: calibrated under the scalar kernels, a program's
    bytes (and so its keys) are not the native run's, and in .ci/run the scalar-kernel job converted it."""
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default"}
    selection = "(qparam_consistency or circle_replay) and (nn_linear or nn_conv3d or qwen3_vl_text_attention_prefill)"
    done = preloaded_python.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-n",
            "0",
            "-k",
            selection,
            "--sweep",
            "off",
            f"--wrapq-report-dir={tmp_path / 'reports'}",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-4000:]
    assert outcome_counts(done.stdout) == {"passed": 6, "xfailed": 2}, done.stdout[-1000:]
