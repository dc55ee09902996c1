"""Which observer's fake-quant produced a module's output: found by running a private copy with
every observer instrumented, so no case has to annotate its output observer."""

from __future__ import annotations

import copy
from typing import Any, Callable

import torch


def producing_observers(
    root: torch.nn.Module, outputs: dict[str, Callable[[torch.nn.Module], torch.Tensor]]
) -> dict[str, tuple[str, Any]]:
    """For each named output function: (path in ``root``, observer in the private copy) of the
    observer whose fake-quant returned that tensor. Outputs no observer produced are absent."""
    from tico.quantization.wrapq.observers.base import ObserverBase

    twin = copy.deepcopy(root)
    produced: dict[int, tuple[str, Any]] = {}
    for path, module in twin.named_modules():
        if isinstance(module, ObserverBase):
            original = module.fake_quant

            def recording(x, _orig=original, _where=(path, module)):
                out = _orig(x)
                produced[out.data_ptr()] = _where
                return out

            module.fake_quant = recording
    found = {}
    for name, output_of in outputs.items():
        produced.clear()
        with torch.no_grad():
            out = output_of(twin)
        if out.data_ptr() in produced:
            found[name] = produced[out.data_ptr()]
    return found
