"""harness.diagnosis.random_twin: portable iid normals and the weight replacement the real-vs-random
contrasts rely on."""

from __future__ import annotations

import pytest
import torch

from harness.diagnosis.random_twin import portable_normal, randomize_weights


def test_portable_normal_is_seeded_and_normal():
    a = portable_normal((200, 300), 0.02, seed=7)
    assert torch.equal(a, portable_normal((200, 300), 0.02, seed=7))
    assert not torch.equal(a, portable_normal((200, 300), 0.02, seed=8))
    assert abs(float(a.mean())) < 5e-4 and float(a.std()) == pytest.approx(0.02, rel=0.02)


def test_randomize_weights_replaces_matrices_once_and_keeps_norms():
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.LayerNorm(4), torch.nn.Linear(4, 10))
    model[2].weight = model[0].weight  # tied, as a language-model head
    norm = model[1].weight.clone()
    assert randomize_weights(model) == ["0.weight"]
    assert model[2].weight is model[0].weight and torch.equal(model[1].weight, norm)
    assert float(model[0].weight.std()) < 0.05


def test_randomize_weights_refuses_a_module_without_matrices():
    with pytest.raises(ValueError, match="no nn.Linear"):
        randomize_weights(torch.nn.LayerNorm(4))
    with pytest.raises(ValueError, match="std must be positive"):
        portable_normal((2,), 0.0, seed=0)
