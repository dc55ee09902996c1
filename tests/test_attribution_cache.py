"""A reused attribution is the one a cold run computes, and is never served to a model that
executes differently: a qparam seeded after a warm run, an observer method or the switch that
turns a site off, patched in memory, is a miss and the check's verdict is the cold one; a patch
the attribution never reaches stays a hit."""

from __future__ import annotations

from pathlib import Path

import pytest

from cases.qwen3_vl import CASES as QWEN_CASES
from cases.qwen3_vl_text import CASES as QWEN_TEXT_CASES
from harness.pipeline import Pipeline, RunSettings
from tests.helpers import CHECKS

MLP = next(c for c in QWEN_CASES + QWEN_TEXT_CASES if c.name == "qwen3_vl_text_mlp")
SITE = "wrapped.up_proj.wrapped.obs_act_out"  # an interior activation observer (tests/test_attribution.py)


def _run(cache: Path | None, widen: float | None = None):
    settings = RunSettings(export_cache_dir=cache / "export") if cache else RunSettings()
    pipeline = Pipeline(MLP, "tiny", settings=settings)
    if widen is not None:  # an observer whose min/max came out wide (scale x widen, zero point kept)
        obs = pipeline.quantized.get_submodule(SITE)
        obs.load_qparams(obs._cached_scale * widen, obs._cached_zp)
    return CHECKS["attribution"].run(pipeline)


def _table(result) -> list[tuple]:
    return [(s["path"], s["gain_db"], s["scale"], s["clipped_fraction"]) for s in result.evidence["sites"]]


def test_a_hit_is_the_attribution_a_cold_run_computes(tmp_path):
    cold = _run(None)
    first, warm = _run(tmp_path), _run(tmp_path)
    assert (
        cold.evidence["attribution_cache"],
        first.evidence["attribution_cache"],
        warm.evidence["attribution_cache"],
    ) == ("off", "miss", "hit")
    assert _table(warm) == _table(first) == _table(cold)
    assert warm.metrics == cold.metrics and warm.problems == cold.problems and warm.passed


def test_a_defect_seeded_after_a_warm_run_is_a_miss_and_fails_as_cold(tmp_path):
    assert _run(tmp_path).passed and _run(tmp_path).evidence["attribution_cache"] == "hit"
    seeded, cold = _run(tmp_path, widen=16.0), _run(None, widen=16.0)
    assert seeded.evidence["attribution_cache"] == "miss"
    assert not seeded.passed and seeded.problems == cold.problems
    assert seeded.problems[0].startswith(f"site {SITE} gains ")


def test_an_observer_method_patched_in_memory_is_a_miss(tmp_path, monkeypatch):
    from tico.quantization.wrapq.observers.affine_base import AffineObserverBase

    assert _run(tmp_path).evidence["attribution_cache"] == "miss"
    original = AffineObserverBase.fake_quant

    def coarse(self, x):  # every activation quantized on a 16x wider grid than calibrated
        if not self.fake_quant_enabled or self.channel_axis is not None:
            return original(self, x)
        step = self._cached_scale * 16.0
        return ((x / step).round().clamp(-8, 7)) * step

    monkeypatch.setattr(AffineObserverBase, "fake_quant", coarse)
    patched = _run(tmp_path)
    assert patched.evidence["attribution_cache"] == "miss"
    assert _table(patched) == _table(_run(None))


def test_the_site_switch_patched_in_memory_is_a_miss(tmp_path, monkeypatch):
    from tico.quantization.wrapq.observers.base import ObserverBase

    assert _run(tmp_path).passed
    # A switch that does nothing: no site is ever turned off, every gain reads 0 dB.
    monkeypatch.setattr(ObserverBase, "set_fake_quant_enabled", lambda self, enabled: None)
    patched = _run(tmp_path)
    assert patched.evidence["attribution_cache"] == "miss"
    assert patched.metrics["top_site_gain_db"] == 0.0


def test_a_patch_the_attribution_never_reaches_stays_a_hit(tmp_path, monkeypatch):
    import tico.utils.convert as convert

    assert _run(tmp_path).evidence["attribution_cache"] == "miss"
    monkeypatch.setattr(convert, "convert_exported_module_to_circle", lambda *a, **k: pytest.fail("not reached"))
    assert _run(tmp_path).evidence["attribution_cache"] == "hit"
