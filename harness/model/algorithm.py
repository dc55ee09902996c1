"""A PTQ algorithm (GPTQ, SmoothQuant, ...) run on the float module before wrapq, and what it
hands over.

Users run an algorithm from ``tico.quantization.algorithm`` on the float model, then wrap it
with ``prepare(model, PTQConfig(...))``, hand over what the algorithm computed (GPTQ: its weight
qparams, injected into the wrappers' weight observers; SmoothQuant: nothing, its smoothing
scales are folded into the weights), calibrate and ``convert``. A case states that sequence
here; the pipeline runs it in place of the plain flow, and the ``algorithm_handoff`` and
``algorithm_gain`` checks read the record to prove the handoff and the algorithm's claim.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch


@dataclass(frozen=True)
class WeightGrid:
    """The integer grid an algorithm quantized one weight on: per-output-channel ``scale`` and
    ``zero_point`` (shape (C,)), codes in [0, ``qmax``]."""

    scale: torch.Tensor
    zero_point: torch.Tensor
    qmax: int

    def codes(self, weight: torch.Tensor) -> torch.Tensor:
        """The integer codes of ``weight`` on this grid (round half to even, as torch does)."""
        shape = (-1,) + (1,) * (weight.dim() - 1)
        q = torch.round(weight / self.scale.reshape(shape)) + self.zero_point.reshape(shape)
        return q.clamp(0, self.qmax)

    def dequantize(self, codes: torch.Tensor) -> torch.Tensor:
        shape = (-1,) + (1,) * (codes.dim() - 1)
        return (codes - self.zero_point.reshape(shape)) * self.scale.reshape(shape)


@dataclass
class AlgorithmRecord:
    """What an algorithm produced, by the ``fp_name`` the wrappers give the module holding it.

    ``weights``: every tensor the algorithm changed (or the harness expects it to have changed),
    as it must reach the wrapper tree. ``grids``: for algorithms that quantize weights (GPTQ),
    the grid each weight is on; the wrappers must fake-quantize on it and Circle must hold it.
    ``original_weights`` and ``layer_inputs`` (the float inputs each quantized linear saw during
    the algorithm's calibration, rows x in_features) let ``algorithm_gain`` measure the claim.
    ``float_max_rel_diff``: for an algorithm that claims to leave the float function unchanged
    (SmoothQuant's folding), the transformed float module's max |output change| over max |output|
    on the calibration samples. ``facts``: numbers the run measured (reported as they are)."""

    weights: dict[str, torch.Tensor] = field(default_factory=dict)
    grids: dict[str, WeightGrid] = field(default_factory=dict)
    original_weights: dict[str, torch.Tensor] = field(default_factory=dict)
    layer_inputs: dict[str, torch.Tensor] = field(default_factory=dict)
    float_max_rel_diff: float | None = None
    facts: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class AlgorithmCapability:
    """How a case runs its algorithm before wrapq.

    ``run(module, calibration, call)`` applies the algorithm to the float ``module`` in place
    through tico's public entry points with the case's calibration samples and returns the
    record; ``call(module, sample)`` runs a sample through the float module as the case's
    reference does (its ``reference_call``: HF's own signature, not the wrapper's).
    ``handoff(prepared, module, record)`` runs after ``prepare(module, PTQConfig)`` and before
    calibration: what the user does to hand the algorithm's results to the wrappers (e.g.
    tico's ``inject_gptq_qparams``); None when nothing is handed over (the algorithm only
    changed the float weights). ``claims`` names what the algorithm claims to improve over
    wrapq alone, for ``algorithm_gain``: "layer_reconstruction" (each quantized linear's output
    error on the calibration inputs, GPTQ), "output_sqnr" (the case output's SQNR) and/or
    "float_identity" (the transformed float module computes what the original did)."""

    name: str
    run: Callable[[torch.nn.Module, tuple, Callable[[torch.nn.Module, Any], Any]], AlgorithmRecord]
    handoff: Callable[[torch.nn.Module, torch.nn.Module, AlgorithmRecord], Any] | None = None
    claims: tuple[str, ...] = ()
    description: str = ""

    def __post_init__(self) -> None:
        unknown = set(self.claims) - {"layer_reconstruction", "output_sqnr", "float_identity"}
        if unknown:
            raise ValueError(f"algorithm {self.name!r}: unknown claims {sorted(unknown)}")
        if not callable(self.run) or (self.handoff is not None and not callable(self.handoff)):
            raise TypeError(f"algorithm {self.name!r}: run and handoff must be callables")


def capture_linear_inputs(
    module: torch.nn.Module,
    samples: tuple,
    call: Callable[[torch.nn.Module, Any], Any],
    names: Mapping[str, str] | None = None,
) -> dict[str, torch.Tensor]:
    """The input every ``nn.Linear`` of ``module`` sees when ``call`` runs the samples through it,
    flattened to rows x in_features and keyed by the module's name (or ``names[name]``)."""
    seen: dict[str, list[torch.Tensor]] = {}
    handles = []
    for name, child in module.named_modules():
        if isinstance(child, torch.nn.Linear):
            key = (names or {}).get(name, name)

            def hook(_mod, args, key=key):
                seen.setdefault(key, []).append(args[0].detach().reshape(-1, args[0].shape[-1]).clone())

            handles.append(child.register_forward_pre_hook(hook))
    try:
        with torch.no_grad():
            for sample in samples:
                call(module, sample)
    finally:
        for handle in handles:
            handle.remove()
    return {key: torch.cat(rows) for key, rows in seen.items()}
