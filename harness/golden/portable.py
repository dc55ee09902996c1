"""The portable golden comparator: what may move between CPUs, and what a wrapper defect moves.

Float bits are not portable: another CPU or kernel selection (ATEN_CPU_CAPABILITY, MKL, oneDNN,
thread count) changes float results in the last bits, and in deep quantized graphs one
rounding flip upstream moves the output by whole quantization steps. Comparing bit patterns,
or element-wise in steps, gates on the machine instead of the code. So each golden tensor is
compared by a statistic that is stable across kernel selections for its kind, with limits set
from measurements (``scripts/golden_noise.py``; docs/goldens.md "Portable goldens"):

* float tensors (reference outputs, rotary tables, quantized masks): the largest difference
  relative to the tensor's own magnitude (``float_rel``);
* observer scales: relative difference (``scale_rel``); zero points: exact. Calibration runs
  in float, so qparams move only by rounding noise (at most 1.4e-6 measured) while an observer defect
  moves them by at least one level: 1.5e-5 for int16, 3.9e-3 for uint8;
* quantized outputs (QUANT wrapper and export adapter): how far the output moved from the
  golden in units of its own quantization error against the float reference (``err_ratio``).
  Its limit is per tensor: the largest value measured across kernel selections times
  ``noise_factor`` (golden/noise.json), and never below what ``flip_floor`` rounding flips of
  one step can cause in a tensor of that size.

``compare`` returns, per tensor, the statistics, the limit used and the score (statistic over
limit, worst of them): a score above 1 fails.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


@dataclass(frozen=True)
class GoldenTolerance:
    """Portable golden limits: the golden check's settings (a case overrides them with
    ``settings={"golden": {...}}``; the numbers come from scripts/golden_noise.py, docs/goldens.md
    "Portable goldens").

    float tensors: max |diff| / max |golden| <= ``float_rel`` (measured noise <= 3.4e-6).
    observer scales: relative diff <= ``scale_rel`` (noise <= 1.4e-6; one level in 255 is
    3.9e-3); zero points: |diff| <= ``zero_point_abs``. Quantized outputs: ``err_ratio`` (moved
    rms / own quantization error rms) <= ``noise_factor`` x the largest value measured across
    kernel selections (golden/noise.json), never below what ``flip_floor`` one-step rounding
    flips give, nor below ``err_ratio_min``; ``err_ratio_unmeasured`` when no noise is on record.
    """

    float_rel: float = 1e-4
    scale_rel: float = 5e-6
    zero_point_abs: float = 0.0
    noise_factor: float = 3.0
    flip_floor: float = 1.0
    err_ratio_min: float = 0.0
    err_ratio_unmeasured: float = 0.5


QUANTIZED_PREFIXES = ("quant_output.", "export_output.")
NOISE_FILE = "noise.json"


def kind(key: str) -> str:
    if key.startswith(QUANTIZED_PREFIXES):
        return "quantized"
    if key.startswith("qparams.") and key.endswith(".scale"):
        return "scale"
    if key.startswith("qparams.") and key.endswith(".zp"):
        return "zero_point"
    return "float"


def reference_key(key: str) -> str | None:
    """The float reference a quantized output is judged against (same evaluation sample)."""
    for prefix in QUANTIZED_PREFIXES:
        if key.startswith(prefix):
            return "reference_output." + key[len(prefix) :]
    return None


def _rms(t: torch.Tensor) -> float:
    return float(t.pow(2).mean().sqrt()) if t.numel() else 0.0


def _float_rel(g: torch.Tensor, diff: torch.Tensor) -> float:
    worst = float(diff.max()) if diff.numel() else 0.0
    magnitude = float(g.abs().max()) if g.numel() else 0.0
    return worst / magnitude if magnitude > 0 else (0.0 if worst == 0 else math.inf)


def statistics(
    key: str,
    golden: torch.Tensor,
    current: torch.Tensor,
    *,
    step: float | None = None,
    golden_reference: torch.Tensor | None = None,
) -> dict[str, float]:
    """The statistics of one tensor (same shape and dtype, checked by the caller)."""
    if not golden.is_floating_point():
        changed = float((golden != current).sum())
        if kind(key) == "zero_point":
            moved = float((golden.to(torch.int64) - current.to(torch.int64)).abs().max()) if golden.numel() else 0.0
            return {"changed": changed, "zero_point_abs": moved}
        return {"changed": changed, "int_changed": changed}
    g, c = golden.detach().to(torch.float64), current.detach().to(torch.float64)
    nan_g, nan_c = torch.isnan(g), torch.isnan(c)
    if not torch.equal(nan_g, nan_c):
        return {"nan_pattern": 1.0}
    g, c = g.nan_to_num(0.0), c.nan_to_num(0.0)
    diff = (c - g).abs()
    stats: dict[str, float] = {
        "max_abs_diff": float(diff.max()) if diff.numel() else 0.0,
        "changed": float((diff > 0).sum()),
    }
    which = kind(key)
    own_error = 0.0
    if which == "quantized" and golden_reference is not None and golden_reference.shape == golden.shape:
        own_error = _rms(g - golden_reference.to(torch.float64).nan_to_num(0.0))
    if which == "scale":
        stats["scale_rel"] = float((diff / g.abs().clamp_min(1e-30)).max()) if diff.numel() else 0.0
    elif which == "zero_point":
        stats["zero_point_abs"] = stats["max_abs_diff"]
    elif own_error > 0:
        stats["err_ratio"] = _rms(c - g) / own_error
        stats["own_error_rms"] = own_error
        if step:
            stats["max_steps"] = stats["max_abs_diff"] / step
            # What ``flip_floor`` elements moved by one step each would give.
            stats["flip_ratio"] = step / math.sqrt(g.numel()) / own_error
    else:
        # A float tensor, or a "quantized" output that equals its reference (nothing to scale by).
        stats["float_rel"] = _float_rel(g, diff)
    return stats


def limits_for(
    key: str, stats: dict[str, float], tolerance: GoldenTolerance, measured: dict[str, float] | None
) -> dict[str, float]:
    """The limit each gated statistic of this tensor is held to."""
    limits = {
        "float_rel": tolerance.float_rel,
        "scale_rel": tolerance.scale_rel,
        "zero_point_abs": tolerance.zero_point_abs,
        "int_changed": 0.0,
        "nan_pattern": 0.0,
    }
    if "err_ratio" in stats:
        noise = (measured or {}).get("err_ratio")
        candidates = [tolerance.noise_factor * noise if noise is not None else tolerance.err_ratio_unmeasured]
        if "flip_ratio" in stats:
            candidates.append(math.sqrt(tolerance.flip_floor) * stats["flip_ratio"])
        limits["err_ratio"] = max(max(candidates), tolerance.err_ratio_min)
    return limits


def score(stats: dict[str, float], limits: dict[str, float]) -> tuple[float, str]:
    """Worst statistic over its limit (> 1 fails) and its name."""
    worst, name = 0.0, ""
    for stat, value in stats.items():
        if stat not in limits:
            continue
        limit = limits[stat]
        ratio = (0.0 if value == 0 else math.inf) if limit == 0 else value / limit
        if ratio > worst or not name:
            worst, name = ratio, stat
    return worst, name


def compare(
    golden: dict[str, torch.Tensor],
    current: dict[str, torch.Tensor],
    steps: dict[str, Any],
    tolerance: GoldenTolerance,
    measured: dict[str, dict[str, float]] | None = None,
) -> dict[str, dict[str, Any]]:
    """Per common key: statistics, limits, score and the statistic that gave it."""
    out: dict[str, dict[str, Any]] = {}
    for key in sorted(set(golden) & set(current)):
        g, c = golden[key], current[key]
        if g.shape != c.shape or g.dtype != c.dtype:
            out[key] = {"score": math.inf, "by": "shape/dtype"}
            continue
        ref_key = reference_key(key)
        stats = statistics(key, g, c, step=steps.get(key), golden_reference=golden.get(ref_key) if ref_key else None)
        limits = limits_for(key, stats, tolerance, (measured or {}).get(key))
        s, by = score(stats, limits)
        out[key] = {**stats, "limit": limits.get(by), "score": s, "by": by}
    return out


def load_measured_noise(golden_dir: Path) -> dict[str, Any]:
    """golden/noise.json as written by scripts/golden_noise.py; {} when absent or unreadable
    (the comparator then falls back to the tolerance's unmeasured limits and says so)."""
    path = golden_dir / NOISE_FILE
    try:
        return _read_noise(str(path), path.stat().st_mtime_ns)
    except OSError:
        return {}


@functools.lru_cache(maxsize=8)
def _read_noise(path: str, mtime_ns: int) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) and isinstance(data.get("cases"), dict) else {}
