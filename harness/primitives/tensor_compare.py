"""Tensor comparison with evidence: where two tensors diverge and by how much."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from harness.primitives.metrics import as_float, nonfinite_summary, select_valid


def compare_close(
    label: str,
    expected: torch.Tensor,
    actual: torch.Tensor,
    *,
    atol: float,
    rtol: float,
    valid_tokens: torch.Tensor | None = None,
) -> tuple[dict[str, Any], str | None]:
    """Compare on valid positions. Returns (metrics, problem); problem is None when close.

    Shape, dtype-independent closeness (torch.testing.assert_close) and NaN/inf are each
    reported by name; NaN is never compared as a number.
    """
    if tuple(expected.shape) != tuple(actual.shape):
        return {"shape_expected": list(expected.shape), "shape_actual": list(actual.shape)}, (
            f"{label}: shape {tuple(actual.shape)} != expected {tuple(expected.shape)}"
        )
    expected = select_valid(expected, valid_tokens)
    actual = select_valid(actual, valid_tokens)
    if expected.numel() == 0:
        # Nothing compared is not "close": a comparison that cannot fail must not pass.
        return {"compared_elements": 0}, f"{label}: no valid element to compare (every position is marked invalid)"
    for side, tensor in (("expected", expected), ("actual", actual)):
        problem = nonfinite_summary(tensor)
        if problem:
            return {"nonfinite_" + side: problem}, f"{label}: {side} has {problem}"
    exp64, act64 = as_float(expected), as_float(actual)
    diff = (exp64 - act64).abs()
    metrics: dict[str, Any] = {
        "max_abs_diff": float(diff.max()) if diff.numel() else 0.0,
        "mean_abs_diff": float(diff.mean()) if diff.numel() else 0.0,
        "compared_elements": int(diff.numel()),
    }
    if diff.numel():
        worst = int(diff.argmax())
        metrics["worst_index"] = list(torch.unravel_index(torch.tensor(worst), diff.shape))
        metrics["worst_index"] = [int(i) for i in metrics["worst_index"]]
        metrics["worst_expected"] = float(exp64.flatten()[worst])
        metrics["worst_actual"] = float(act64.flatten()[worst])
    try:
        torch.testing.assert_close(act64, exp64, atol=atol, rtol=rtol, equal_nan=False)
    except AssertionError as exc:
        detail = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        return metrics, f"{label}: not close (atol={atol:g}, rtol={rtol:g}): {detail}"
    return metrics, None


def compare_each(
    label: Callable[[int], str],
    expected: Sequence[torch.Tensor],
    actual: Sequence[torch.Tensor],
    *,
    atol: float,
    rtol: float,
    valid_tokens: torch.Tensor | None = None,
) -> tuple[float, list[str]]:
    """``compare_close`` on each pair of two equally long tensor lists (``label(index)`` names a pair):
    the worst max |diff| over them and every problem found."""
    worst, problems = 0.0, []
    for index, (want, got) in enumerate(zip(expected, actual, strict=True)):
        metrics, problem = compare_close(label(index), want, got, atol=atol, rtol=rtol, valid_tokens=valid_tokens)
        worst = max(worst, metrics.get("max_abs_diff", 0.0))
        if problem:
            problems.append(problem)
    return worst, problems
