"""Accuracy metrics, implemented here (not borrowed from tico) so a bug in the system under
test cannot hide a defect. ``tests/test_metrics.py`` cross-checks PEIR against tico's."""

from __future__ import annotations

import math

import torch


class NonFiniteError(ValueError):
    """A tensor holds NaN or inf, so numeric comparison would be meaningless."""


def as_float(t: torch.Tensor) -> torch.Tensor:
    """Detached float64 CPU copy: metrics are computed in double so they do not add error."""
    if t.dtype == torch.bool:
        t = t.to(torch.float32)
    return t.detach().to("cpu", torch.float64)


def nonfinite_summary(t: torch.Tensor) -> str | None:
    """Describe NaN/inf content, or None when every element is finite."""
    t = t.detach()
    if not t.is_floating_point():
        return None
    nan = int(torch.isnan(t).sum())
    inf = int(torch.isinf(t).sum())
    if nan == 0 and inf == 0:
        return None
    return f"{nan} NaN and {inf} inf of {t.numel()} elements"


def peir(reference: torch.Tensor, candidate: torch.Tensor) -> float:
    """Peak error to interval ratio: max|ref - cand| / (max(ref) - min(ref)); interval 1 if 0."""
    ref, cand = as_float(reference), as_float(candidate)
    interval = float(ref.max() - ref.min())
    if interval == 0.0:
        interval = 1.0
    return float((ref - cand).abs().max()) / interval


def sqnr_db(reference: torch.Tensor, candidate: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio in dB; +inf when the candidate is exact."""
    ref, cand = as_float(reference), as_float(candidate)
    noise = float(((ref - cand) ** 2).sum())
    signal = float((ref**2).sum())
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def cosine_similarity(reference: torch.Tensor, candidate: torch.Tensor) -> float:
    ref, cand = as_float(reference).flatten(), as_float(candidate).flatten()
    denom = float(ref.norm() * cand.norm())
    if denom == 0.0:
        return 1.0 if float(ref.norm()) == float(cand.norm()) else 0.0
    return float(ref @ cand) / denom


def accuracy_metrics(reference: torch.Tensor, candidate: torch.Tensor) -> dict[str, float]:
    """The standard accuracy block. Raises NonFiniteError rather than compare NaN as numbers."""
    if reference.shape != candidate.shape:
        raise ValueError(f"shape mismatch: reference {tuple(reference.shape)} vs candidate {tuple(candidate.shape)}")
    for label, tensor in (("reference", reference), ("candidate", candidate)):
        problem = nonfinite_summary(tensor)
        if problem:
            raise NonFiniteError(f"{label} output has {problem}")
    diff = (as_float(reference) - as_float(candidate)).abs()
    return {
        "mean_abs_diff": float(diff.mean()),
        "max_abs_diff": float(diff.max()),
        "peir": peir(reference, candidate),
        "sqnr_db": sqnr_db(reference, candidate),
        "cosine": cosine_similarity(reference, candidate),
    }


def select_valid(t: torch.Tensor, valid_tokens: torch.Tensor | None) -> torch.Tensor:
    """Keep only meaningful positions (valid_tokens over the leading dims); padding dropped."""
    if valid_tokens is None:
        return t
    valid = valid_tokens.to(torch.bool)
    if tuple(t.shape[: valid.dim()]) != tuple(valid.shape):
        raise ValueError(f"valid_tokens shape {tuple(valid.shape)} does not lead output shape {tuple(t.shape)}")
    return t[valid]


def scatter_sample(reference: torch.Tensor, candidate: torch.Tensor, max_points: int = 400) -> list[list[float]]:
    """Evenly spaced (reference, candidate) pairs for a fp-vs-quant plot: deterministic, small."""
    ref, cand = as_float(reference).flatten(), as_float(candidate).flatten()
    n = ref.numel()
    if n == 0:
        return []
    idx = torch.linspace(0, n - 1, steps=min(n, max_points)).round().long().unique()
    return [[float(r), float(c)] for r, c in zip(ref[idx], cand[idx])]


def error_histogram(reference: torch.Tensor, candidate: torch.Tensor, bins: int = 30) -> dict[str, list[float]]:
    """Histogram of signed error (candidate - reference) over every element."""
    err = (as_float(candidate) - as_float(reference)).flatten()
    if err.numel() == 0:
        return {"edges": [], "counts": []}
    lo, hi = float(err.min()), float(err.max())
    if lo == hi:
        lo, hi = lo - 0.5, hi + 0.5
    counts = torch.histc(err, bins=bins, min=lo, max=hi)
    edges = torch.linspace(lo, hi, bins + 1)
    return {"edges": [float(e) for e in edges], "counts": [int(c) for c in counts]}
