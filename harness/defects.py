"""Seeded wrapper defects that any case can receive, for measuring what the golden gate must
catch (scripts/golden_noise.py) and for the tests that prove it does.

Each defect mutates a quantized wrapper tree in place, the way a real wrapper bug would leave
it: an output observer whose scale is a little off, a zero point off by one level, a weight
that is never fake-quantized. ``apply`` returns what it changed, or None when the case has
nothing the defect can touch (e.g. no weight observer); the caller reports that as n/a.
"""

from __future__ import annotations

import copy
from typing import Callable

import torch


def _observers(root: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    from tico.quantization.wrapq.observers.base import ObserverBase

    return [(path, m) for path, m in root.named_modules() if isinstance(m, ObserverBase)]


def output_observer_paths(root: torch.nn.Module, output_of: Callable[[torch.nn.Module], torch.Tensor]) -> str | None:
    """Path (in ``root``) of the observer whose fake-quant produced ``output_of(root)``, found by
    running a private copy with every observer instrumented; None when no observer did."""
    twin = copy.deepcopy(root)
    produced: dict[int, str] = {}
    for path, module in _observers(twin):
        original = module.fake_quant

        def recording(x, _orig=original, _path=path):
            out = _orig(x)
            produced[out.data_ptr()] = _path
            return out

        module.fake_quant = recording
    with torch.no_grad():
        out = output_of(twin)
    return produced.get(out.data_ptr())


def _per_tensor(module: torch.nn.Module) -> bool:
    scale = getattr(module, "_cached_scale", None)
    return isinstance(scale, torch.Tensor) and scale.numel() == 1


def _rescale_output(root, output_of, factor: float) -> str | None:
    path = output_observer_paths(root, output_of)
    if path is None:
        return None
    obs = root.get_submodule(path)
    if not _per_tensor(obs):
        return None
    obs.load_qparams(obs._cached_scale * factor, obs._cached_zp)
    return f"{path}: scale x{factor:.5g}"


def output_scale_2pct(root, output_of) -> str | None:
    """The output observer's scale 2% too large (a mis-derived range)."""
    return _rescale_output(root, output_of, 1.02)


def output_scale_one_level(root, output_of) -> str | None:
    """The output observer computed with one quantization level fewer (qmax - 1)."""
    path = output_observer_paths(root, output_of)
    if path is None:
        return None
    obs = root.get_submodule(path)
    if not _per_tensor(obs):
        return None
    levels = obs.dtype.qmax - obs.dtype.qmin
    obs.load_qparams(obs._cached_scale * levels / (levels - 1), obs._cached_zp)
    return f"{path}: {levels - 1} levels instead of {levels}"


def output_zp_off_by_one(root, output_of) -> str | None:
    """The output observer's zero point one level off (a rounding or sign slip)."""
    path = output_observer_paths(root, output_of)
    if path is None:
        return None
    obs = root.get_submodule(path)
    if not _per_tensor(obs):
        return None
    zp = obs._cached_zp
    shifted = zp - 1 if int(zp) >= obs.dtype.qmax else zp + 1
    obs.load_qparams(obs._cached_scale, shifted)
    return f"{path}: zero point {int(zp)} -> {int(shifted)}"


def weight_fake_quant_skipped(root, output_of) -> str | None:
    """One weight's fake-quant is skipped (the float weight is used in QUANT): the first weight
    observer, in module order, whose skip changes the output at all (wrappers that cache their
    quantized weights at convert time, or weights off the sample's path, are passed over)."""
    with torch.no_grad():
        before = output_of(root).clone()
        for path, obs in _observers(root):
            if path.rsplit(".", 1)[-1] != "obs_weight":
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
