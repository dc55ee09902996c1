"""Which fake-quant site the deployed graph does not apply as torch does: the Circle-vs-torch gap
with one site off.

``circle_replay`` measures how far tico's Circle model is from the torch QUANT simulation. When
they differ, the question a wrapper author asks is *where*. On a private copy of the QUANT
export adapter, each fake-quant site is switched off alone (``set_fake_quant_enabled(False)``)
and the adapter's outputs are compared with the Circle replay, in steps of each Circle output's
own scale, as ``circle_replay`` counts them. A site whose removal takes the gap to at most
``closed_steps`` (the one-step floor of rounding arithmetic) lies on the path of the gap: the
Circle graph does not apply it, or one next to it, as torch does (dropped, folded into a
neighbour, applied with other qparams). Several sites can each close it (quantizations in a
chain with equal qparams); all are named.

Cost: a Circle conversion and replay (the pipeline's, shared with the export checks) and one
adapter forward per site; run on request (``python -m harness explain CASE --deployed``).
"""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from harness import compat
from harness.primitives.metrics import as_float

CLOSED_STEPS = 1.0


@dataclass
class DeployedSite:
    path: str
    max_steps_off: float  # the largest gap over the outputs with this site off, in output steps
    mean_steps_off: float


@dataclass
class DeployedAttribution:
    mode: str
    max_steps: float  # as is
    mean_steps: float
    sites: list[DeployedSite]  # ranked by the gap left with the site off, smallest first
    closing: list[str] = field(default_factory=list)  # sites whose removal alone closes the gap
    unscaled_outputs: list[int] = field(default_factory=list)  # outputs with no per-tensor scale (not counted)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _step(scales: list[tuple], index: int) -> float | None:
    """Output ``index``'s per-tensor scale, or None when it has none (not counted in steps)."""
    if index < len(scales) and len(scales[index]) == 1 and scales[index][0] > 0:
        return scales[index][0]
    return None


def _gap(outputs: list[torch.Tensor], circle: list[torch.Tensor], scales: list[tuple]) -> tuple[float, float]:
    worst_max = worst_mean = 0.0
    for index, (out, ref) in enumerate(zip(outputs, circle)):
        step = _step(scales, index)
        if step is None:
            continue
        diff = (as_float(out) - as_float(ref)).abs()
        worst_max = max(worst_max, float(diff.max()) / step)
        worst_mean = max(worst_mean, float(diff.mean()) / step)
    return worst_max, worst_mean


def deployed_attribution(
    pipeline: Any, mode: str = "fake_quantize", closed_steps: float = CLOSED_STEPS
) -> DeployedAttribution:
    """Rank ``pipeline``'s fake-quant sites by the Circle-vs-torch gap left with each one off."""
    from tico.quantization.wrapq.observers.base import ObserverBase

    name = pipeline.export_sample_name
    circle = pipeline.circle_outputs(mode)
    scales = pipeline.circle.output_scales
    args = pipeline.case.export.args(pipeline.sample(name))
    twin = copy.deepcopy(pipeline.export_adapter("quant", name))  # the shared adapter is never touched

    def outputs() -> list[torch.Tensor]:
        with torch.no_grad():
            return [leaf.detach() for leaf in compat.tree_leaves(twin(*args)) if isinstance(leaf, torch.Tensor)]

    base_max, base_mean = _gap(outputs(), circle, scales)
    sites = []
    for path, obs in twin.named_modules():
        if not isinstance(obs, ObserverBase) or not obs.fake_quant_enabled:
            continue
        obs.set_fake_quant_enabled(False)
        try:
            off_max, off_mean = _gap(outputs(), circle, scales)
        finally:
            obs.set_fake_quant_enabled(True)
        sites.append(DeployedSite(path=path, max_steps_off=off_max, mean_steps_off=off_mean))
    sites.sort(key=lambda s: (s.max_steps_off, s.mean_steps_off, s.path))
    closing = (
        [s.path for s in sites if s.max_steps_off <= closed_steps]
        if base_max > closed_steps and math.isfinite(base_max)
        else []
    )
    unscaled = [i for i in range(len(circle)) if _step(scales, i) is None]
    return DeployedAttribution(
        mode=mode, max_steps=base_max, mean_steps=base_mean, sites=sites, closing=closing, unscaled_outputs=unscaled
    )
