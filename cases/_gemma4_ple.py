"""Gemma4 Per-Layer Embeddings (PLE) for a standalone decoder-layer case: the producer's observer.

With PLE on (``hidden_size_per_layer_input`` > 0) every Gemma4 decoder layer takes an external
``per_layer_input``; in a model it is a slice of the packed PLE tensor that
``QuantGemma4TextModel`` quantizes once with its ``obs_per_layer_inputs`` (tico 0.3.0,
``gemma4/quant_model.py:125``), so the layer wrapper has no observer of its own for it. A case that
builds one layer has no text model, so it owns that producer-side observer, as TICO's wrapper smoke
does (``wrapper_smoke/cases/gemma4.py``, ``Gemma4TextDecoderLayerBaseCase``): made by the layer
wrapper's own factory (``_make_obs("per_layer_inputs")``), fed in CALIB, frozen before ``convert``,
applied to ``per_layer_input`` in QUANT, and handed to ``as_export_module(...,
per_layer_input_observer=...)``, whose adapter fake-quantizes the graph input with it
(``gemma4/export_adapters.py``, ``_apply_export_boundary_observer``).

The observer stays outside the wrapper tree (a forward pre-hook on the prepared root, and the same
object as a plain attribute of that root, as tico keeps its quantizer on the model between prepare
and convert), so the tree's observer audits see the layer exactly as tico builds it. A deep copy of
the root copies hook and attribute together.

The leading underscore keeps the plugin from collecting this module as a case file.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from harness.primitives.lifecycle_ops import unwrap

_ATTRIBUTE = "_wrapq_per_layer_input_boundary"


class PerLayerInputBoundary:
    """Forward pre-hook standing in for the text model's ``obs_per_layer_inputs``."""

    def __init__(self, observer: Any):
        self.observer = observer

    def __call__(self, module: torch.nn.Module, args: tuple, kwargs: dict):
        from tico.quantization.wrapq.mode import Mode

        value = kwargs.get("per_layer_input")
        if value is None:
            return None
        mode = getattr(unwrap(module), "_mode", Mode.NO_QUANT)
        if mode is Mode.CALIB:
            self.observer.collect(value.detach())
        elif mode is Mode.QUANT:
            return args, {**kwargs, "per_layer_input": self.observer.fake_quant(value)}
        return None

    def freeze(self) -> None:
        """Compute the qparams from what calibration fed and stop collecting (before convert)."""
        self.observer.compute_qparams()
        self.observer.enabled = False


def ple_width(root: torch.nn.Module) -> int:
    """The layer wrapper's PLE width (0: PLE off)."""
    return int(getattr(unwrap(root), "hidden_size_per_layer_input", 0) or 0)


def boundary_observer(root: torch.nn.Module) -> Any | None:
    """The producer-side PLE observer of a prepared or converted root (None with PLE off, and for the
    NO_QUANT tree, whose adapter applies no observer)."""
    from tico.quantization.wrapq.mode import Mode

    boundary = root.__dict__.get(_ATTRIBUTE)
    if boundary is None and ple_width(root) > 0 and getattr(unwrap(root), "_mode", Mode.NO_QUANT) is not Mode.NO_QUANT:
        raise RuntimeError(
            "PLE is on but the calibrated root carries no per_layer_input observer: it was not "
            "prepared through cases._gemma4_ple.prepare_with_boundary"
        )
    return None if boundary is None else boundary.observer


def prepare_with_boundary(module: torch.nn.Module, cfg: Any, prepare: Any = None) -> torch.nn.Module:
    """tico's public ``prepare`` (or ``prepare(module, cfg)`` given), then the PLE producer observer where the
    layer has PLE on."""
    if prepare is None:
        from tico.quantization import prepare as tico_prepare

        prepare = functools.partial(tico_prepare, inplace=True)
    prepared = prepare(module, cfg)
    if ple_width(prepared) > 0:
        observer = unwrap(prepared)._make_obs("per_layer_inputs")
        observer.reset()
        observer.enabled = True
        boundary = PerLayerInputBoundary(observer)
        prepared.register_forward_pre_hook(boundary, with_kwargs=True)
        object.__setattr__(prepared, _ATTRIBUTE, boundary)  # not a submodule: outside the wrapper tree
    return prepared


def convert_with_boundary(prepared: torch.nn.Module) -> torch.nn.Module:
    """Freeze the PLE producer observer (if any), then tico's public ``convert``."""
    from tico.quantization import convert

    boundary = prepared.__dict__.get(_ATTRIBUTE)
    if boundary is not None:
        boundary.freeze()
    return convert(prepared, inplace=True)
