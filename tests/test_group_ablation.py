"""harness/diagnosis/group_ablation.py and ``python -m harness explain --off/--only``: a loss two observers
cause together, which leave-one-out attribution reads as 0 dB for each."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

from harness.diagnosis.group_ablation import GroupError, ablate_groups, parse_group, select_sites
from harness.diagnosis.site_attribution import attribute
from tests import preloaded_python

REPO = Path(__file__).resolve().parents[1]
PROBABILITIES = ["*obs_softmax", "*obs_attn_weights"]  # llama's two fake-quants of the attention probabilities


def _attention_pipeline():
    from cases.llama import CASES as LLAMA_CASES
    from harness.pipeline import Pipeline

    case = next(c for c in LLAMA_CASES if c.name == "llama_attention_prefill")
    torch.manual_seed(case.seed)
    return Pipeline(case, "tiny")


def test_two_observers_clipping_one_tensor_read_zero_alone_and_their_loss_together():
    """Seeded defect: both observers of the attention probabilities hold a quarter of their calibrated
    scale (a wrapper calibrating them on a shrunken range), so both clip at ~0.25. Switching either off
    alone leaves the other clipping: leave-one-out sees nothing. The group switched off recovers the loss."""
    pipeline = _attention_pipeline()
    clean_sqnr, _, _ = ablate_groups(pipeline, [PROBABILITIES])
    layer = pipeline.quantized.wrapped
    for obs in (layer.obs_softmax, layer.obs_attn_weights):
        obs.load_qparams(obs._cached_scale * 0.25, obs._cached_zp)
    as_is, _, (alone_softmax, alone_weights, together) = ablate_groups(
        pipeline, [PROBABILITIES[:1], PROBABILITIES[1:], PROBABILITIES]
    )
    assert clean_sqnr - as_is > 3.0, (clean_sqnr, as_is)  # the defect costs accuracy
    assert abs(alone_softmax.gain_db) < 0.5 and abs(alone_weights.gain_db) < 0.5, (alone_softmax, alone_weights)
    assert together.gain_db > 3.0 and together.sites == ["wrapped.obs_softmax", "wrapped.obs_attn_weights"]
    loo = attribute(pipeline, only={"wrapped.obs_softmax", "wrapped.obs_attn_weights"}, with_submodules=False)
    assert all(abs(s.gain_db) < 0.5 for s in loo.sites if s.evaluated), [(s.path, s.gain_db) for s in loo.sites]
    # "only": everything else off, the two clipping observers on -- the defect alone
    _, _, (only,) = ablate_groups(pipeline, [PROBABILITIES], mode="only")
    assert only.sqnr_db < together.sqnr_db


def test_a_pattern_selecting_no_site_is_an_error_not_a_zero_gain():
    paths = ["wrapped.obs_softmax", "wrapped.obs_attn_weights"]
    assert select_sites(paths, ["*softmax"]) == ["wrapped.obs_softmax"]
    with pytest.raises(GroupError, match="'\\*obs_sofmax' select no fake-quant site"):
        select_sites(paths, ["*softmax", "*obs_sofmax"])
    with pytest.raises(GroupError, match="none empty"):
        parse_group("*obs_softmax,")
    with pytest.raises(GroupError, match="mode"):
        ablate_groups(object(), [["*"]], mode="sideways")


def test_explain_prints_the_group_table_and_refuses_an_unmatched_pattern():
    def explain(*args):
        return preloaded_python.run(
            [sys.executable, "-m", "harness", "explain", "llama_attention_prefill", *args],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )

    done = explain("--off", ",".join(PROBABILITIES), "--only", ",".join(PROBABILITIES))
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("llama_attention_prefill [tiny]  sample 'default': SQNR as is"), lines[0]
    assert lines[1].split() == ["group", "switched", "sites", "SQNR", "dB", "gain", "dB", "PEIR"]
    assert [line.split()[:2] for line in lines[3:]] == [
        ["*obs_softmax,*obs_attn_weights", "off"],
        ["*obs_softmax,*obs_attn_weights", "all"],
    ]
    refused = explain("--off", "*obs_sofmax")
    assert refused.returncode == 2 and "select no fake-quant site" in refused.stderr, refused.stderr
