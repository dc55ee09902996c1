"""The harness's own metrics, cross-checked against tico's so neither can drift silently."""

import math

import pytest
import torch

from harness.primitives import metrics


@pytest.mark.parametrize("seed", range(5))
def test_peir_agrees_with_tico(seed):
    from tico.quantization.evaluation.metric import compute_peir

    gen = torch.Generator().manual_seed(seed)
    ref = torch.randn(3, 17, generator=gen) * (seed + 1)
    cand = ref + 0.05 * torch.randn(3, 17, generator=gen)
    assert metrics.peir(ref, cand) == pytest.approx(compute_peir(ref, cand), rel=1e-6)


def test_peir_uses_unit_interval_for_constant_reference():
    ref = torch.full((4,), 2.0)
    assert metrics.peir(ref, ref + 0.25) == pytest.approx(0.25)


def test_peir_known_value():
    ref = torch.tensor([0.0, 1.0, 2.0, 4.0])
    cand = torch.tensor([0.0, 1.5, 2.0, 4.0])
    assert metrics.peir(ref, cand) == pytest.approx(0.5 / 4.0)


def test_sqnr_known_value_and_exact_match():
    ref = torch.tensor([1.0, -1.0, 1.0, -1.0])
    cand = ref + torch.tensor([0.1, -0.1, 0.1, -0.1])
    assert metrics.sqnr_db(ref, cand) == pytest.approx(20.0)  # signal 4, noise 0.04
    assert metrics.sqnr_db(ref, ref) == math.inf


def test_cosine_similarity():
    a = torch.tensor([1.0, 0.0])
    assert metrics.cosine_similarity(a, torch.tensor([0.0, 1.0])) == pytest.approx(0.0)
    assert metrics.cosine_similarity(a, 3 * a) == pytest.approx(1.0)


def test_nan_is_named_not_compared():
    ref = torch.zeros(4)
    cand = torch.tensor([0.0, float("nan"), float("inf"), 0.0])
    with pytest.raises(metrics.NonFiniteError, match="1 NaN and 1 inf of 4"):
        metrics.accuracy_metrics(ref, cand)


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="shape mismatch"):
        metrics.accuracy_metrics(torch.zeros(2, 3), torch.zeros(3, 2))


def test_select_valid_drops_padding():
    t = torch.arange(6.0).reshape(1, 3, 2)
    valid = torch.tensor([[True, False, True]])
    assert metrics.select_valid(t, valid).tolist() == [[0.0, 1.0], [4.0, 5.0]]
