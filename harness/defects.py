"""Seeded wrapper defects that any case can receive, for measuring what the golden gate must
catch (scripts/golden_noise.py) and for the tests that prove it does.

Each defect mutates a quantized wrapper tree in place, the way a real wrapper bug would leave
it: an output observer whose scale is a little off, a zero point off by one level, a weight
that is never fake-quantized. ``apply`` returns what it changed, or None when the case has
nothing the defect can touch (e.g. no weight observer); the caller reports that as n/a.
"""

from __future__ import annotations

from typing import Callable

import torch

from harness.observer_trace import producing_observers


def _output_observer(root, output_of) -> torch.nn.Module | None:
    """The per-tensor observer (in ``root``) whose fake-quant produced the output, or None."""
    found = producing_observers(root, {"out": output_of}).get("out")
    if found is None:
        return None
    obs = root.get_submodule(found[0])
    scale = getattr(obs, "_cached_scale", None)
    return obs if isinstance(scale, torch.Tensor) and scale.numel() == 1 else None


def _rescale(obs, factor: float, what: str) -> str:
    obs.load_qparams(obs._cached_scale * factor, obs._cached_zp)
    return f"{obs.name}: {what}"


def output_scale_2pct(root, output_of) -> str | None:
    """The output observer's scale 2% too large (a mis-derived range)."""
    obs = _output_observer(root, output_of)
    return None if obs is None else _rescale(obs, 1.02, "scale x1.02")


def output_scale_one_level(root, output_of) -> str | None:
    """The output observer computed with one quantization level fewer (qmax - 1)."""
    obs = _output_observer(root, output_of)
    if obs is None:
        return None
    levels = obs.dtype.qmax - obs.dtype.qmin
    return _rescale(obs, levels / (levels - 1), f"{levels - 1} levels instead of {levels}")


def output_zp_off_by_one(root, output_of) -> str | None:
    """The output observer's zero point one level off (a rounding or sign slip)."""
    obs = _output_observer(root, output_of)
    if obs is None:
        return None
    zp = obs._cached_zp
    shifted = zp - 1 if int(zp) >= obs.dtype.qmax else zp + 1
    obs.load_qparams(obs._cached_scale, shifted)
    return f"{obs.name}: zero point {int(zp)} -> {int(shifted)}"


def weight_fake_quant_skipped(root, output_of) -> str | None:
    """One weight's fake-quant is skipped (the float weight is used in QUANT): the first weight
    observer, in module order, whose skip changes the output at all (wrappers that cache their
    quantized weights at convert time, or weights off the sample's path, are passed over)."""
    from tico.quantization.wrapq.observers.base import ObserverBase

    with torch.no_grad():
        before = output_of(root).clone()
        for path, obs in root.named_modules():
            if not isinstance(obs, ObserverBase) or path.rsplit(".", 1)[-1] != "obs_weight":
                continue
            obs.fake_quant = lambda x: x
            if not torch.equal(output_of(root), before):
                return f"{path}: fake_quant skipped"
            del obs.fake_quant
    return None


DEFECTS: dict[str, Callable] = {
    "output_scale_2pct": output_scale_2pct,
    "output_scale_one_level": output_scale_one_level,
    "output_zp_off_by_one": output_zp_off_by_one,
    "weight_fake_quant_skipped": weight_fake_quant_skipped,
}


def apply(name: str, pipeline) -> str | None:
    """Seed defect ``name`` into ``pipeline``'s quantized tree before any output is computed."""
    sample = pipeline.sample("default")
    return DEFECTS[name](pipeline.quantized, lambda root: pipeline.case.output(sample.call(root)))
