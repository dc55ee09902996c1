"""The Circle-vs-torch attribution names the fake-quant the deployed graph does not apply: a
seeded export-only drop of one observer's fake-quant (eager keeps it, torch.export and so the
Circle model lose it) is the one site whose removal in torch closes the gap; on clean tico the
gap is already closed (also under torch's scalar kernels)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from cases.qwen3_vl import CASES as QWEN_CASES
from cases.qwen3_vl_text import CASES as QWEN_TEXT_CASES
from harness.diagnosis.deployed_attribution import deployed_attribution
from harness.pipeline import Pipeline
from tests import preloaded_python

REPO = Path(__file__).resolve().parents[1]
MLP = next(c for c in QWEN_CASES + QWEN_TEXT_CASES if c.name == "qwen3_vl_text_mlp")
SITE = "wrapped.up_proj.wrapped.obs_act_out"


def test_clean_mlp_has_no_gap_to_close():
    deployed = deployed_attribution(Pipeline(MLP, "tiny"))
    assert deployed.max_steps <= 1.0 and deployed.closing == []
    assert deployed.sites and not deployed.unscaled_outputs


def _site_dropped_in_export(monkeypatch) -> Pipeline:
    """A pipeline whose SITE fake-quantizes in eager only: an export-only path skips it, so
    torch.export (and so the Circle model) loses that one fake-quant."""
    from tico.quantization.wrapq.observers.affine_base import AffineObserverBase

    original = AffineObserverBase.fake_quant

    def fake_quant(self, x):
        if getattr(self, "_dropped_in_export", False) and torch.compiler.is_compiling():
            return x
        return original(self, x)

    monkeypatch.setattr(AffineObserverBase, "fake_quant", fake_quant)
    pipeline = Pipeline(MLP, "tiny")
    pipeline.quantized.get_submodule(SITE)._dropped_in_export = True
    return pipeline


def test_a_fake_quant_dropped_from_the_exported_graph_is_named(monkeypatch):
    pipeline = _site_dropped_in_export(monkeypatch)
    deployed = deployed_attribution(pipeline)
    assert deployed.max_steps > 1.0
    assert deployed.closing == [SITE], [(s.path, s.max_steps_off) for s in deployed.sites[:4]]
    assert deployed.sites[0].path == SITE and deployed.sites[0].max_steps_off <= 1.0


def test_explain_deployed_on_clean_tico_under_the_scalar_kernels():
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default", "PYTHONPATH": str(REPO)}
    done = preloaded_python.run(
        [sys.executable, "-m", "harness", "explain", "qwen3_vl_text_mlp", "--top", "3", "--deployed"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    assert "Circle (fake_quantize replay) vs torch QUANT on the export sample: max " in out
    assert "site switched off in torch" in out and "closes the gap" not in out


def test_a_failing_replay_says_where_its_gap_runs(monkeypatch):
    """circle_replay computes the attribution on failure only, as evidence beside its verdict."""
    from tests.helpers import CHECKS

    clean = CHECKS["circle_replay"].run(Pipeline(MLP, "tiny"))
    assert clean.passed and "deployed_sites" not in clean.evidence
    pipeline = _site_dropped_in_export(monkeypatch)
    result = CHECKS["circle_replay"].run(pipeline)
    assert not result.passed
    assert any(
        note.startswith(f"where the gap runs: switching off alone in torch any of {SITE} ") for note in result.notes
    ), result.notes
    assert result.evidence["deployed_sites"][0][0] == SITE
