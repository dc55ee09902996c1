"""A Gemma4 shared-KV consumer's KV producer, which tico main requires bound before calibration
(api_change gemma4-shared-kv-bind-cache-source): the consumer fake-quantizes the shared K/V on the storage grid
its producer owns (``cache_storage_observers``), and refuses to run without one.

A case holds the consumer alone, its shared K/V given as ``shared_key_value``, so it does what tico's own
wrapper smoke does for that boundary: a producer wrapper of layer 0 is bound before calibration enables, a
forward pre-hook feeds the sample's shared K/V to the producer's storage observers during calibration, and
they are frozen before ``convert``. tico 0.3.0 has no binding: its consumer observes the shared K/V itself.
"""

from __future__ import annotations

from typing import Any

import torch

from harness import unwrap

_ATTRIBUTE = "_wrapq_kv_producer_boundary"


def binds_cache_source() -> bool:
    from tico.quantization.wrapq.wrappers.gemma4.quant_text_attention import QuantGemma4TextAttention

    return hasattr(QuantGemma4TextAttention, "bind_cache_source")


def consumer_attention(root: torch.nn.Module) -> Any:
    """The QuantGemma4TextAttention of a wrapped attention or decoder layer."""
    module = unwrap(root)
    attention = getattr(module, "self_attn", module)
    return unwrap(attention)


class KvProducerBoundary:
    """Forward pre-hook: in CALIB, the sample's shared K/V feed the producer's storage observers."""

    def __init__(self, observers: tuple[Any, Any]):
        self.observers = observers

    def __call__(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        from tico.quantization.wrapq.mode import Mode

        mode = getattr(consumer_attention(module), "_mode", None)
        shared = kwargs.get("shared_key_value")
        if shared is not None and mode is Mode.CALIB:
            for observer, value in zip(self.observers, shared):
                observer.collect(value.detach())
        elif mode is Mode.QUANT:
            self.freeze()  # a tree frozen by freeze_qparams() leaves the producer, outside it, to its first call

    def freeze(self) -> None:
        """Compute the storage grid from what calibration fed and stop collecting (once)."""
        for observer in self.observers:
            if observer.enabled:
                observer.compute_qparams()
                observer.enabled = False


def bind_producer(wrapped: torch.nn.Module) -> torch.nn.Module:
    """Bind a producer wrapper of layer 0 to the NO_QUANT consumer ``wrapped`` and hook its storage boundary."""
    from tico.quantization.wrapq.wrappers.gemma4.quant_text_attention import QuantGemma4TextAttention
    from transformers.models.gemma4.modeling_gemma4 import Gemma4TextAttention

    attention = consumer_attention(wrapped)
    float_producer = Gemma4TextAttention(attention.config, layer_idx=0).eval()
    producer = QuantGemma4TextAttention(float_producer, qcfg=attention.qcfg).eval()
    attention.bind_cache_source(producer)
    boundary = KvProducerBoundary(attention.cache_storage_observers())
    wrapped.register_forward_pre_hook(boundary, with_kwargs=True)
    object.__setattr__(wrapped, _ATTRIBUTE, boundary)  # not a submodule: outside the wrapper tree
    return wrapped


def prepare_bound(module: torch.nn.Module, cfg: Any) -> torch.nn.Module:
    """tico's ``prepare`` (PTQQuantizer.prepare: wrap, then every quant module into CALIB), split where the
    producer must be bound, with tico's quantizer attached so ``tico.quantization.convert`` takes the model
    (as tico's wrapper smoke does)."""
    from tico.quantization import prepare
    from tico.quantization.public_interface import QUANTIZER_ATTRIBUTE_NAME
    from tico.quantization.wrapq.quantizer import PTQQuantizer
    from tico.quantization.wrapq.wrappers.quant_module_base import QuantModuleBase

    if not binds_cache_source():
        return prepare(module, cfg, inplace=True)
    prepared = wrap_bound(module, cfg)
    for quant in (m for m in prepared.modules() if isinstance(m, QuantModuleBase)):
        quant.enable_calibration()
    setattr(prepared, QUANTIZER_ATTRIBUTE_NAME, PTQQuantizer(cfg))
    return prepared


def freeze_producer(prepared: torch.nn.Module) -> torch.nn.Module:
    """Freeze the producer's storage grid (before ``convert``); a root bound to none is left alone."""
    boundary = prepared.__dict__.get(_ATTRIBUTE)
    if boundary is not None:
        boundary.freeze()
    return prepared


def convert_bound(prepared: torch.nn.Module) -> torch.nn.Module:
    """Freeze the producer's storage grid, then tico's ``convert``."""
    from tico.quantization import convert

    return convert(freeze_producer(prepared), inplace=True)


def wrap_bound(module: torch.nn.Module, cfg: Any) -> torch.nn.Module:
    """The NO_QUANT tree tico builds, bound to a producer where tico asks for one."""
    from tico.quantization.wrapq.wrap_helper import PTQWrapHelper

    wrapped = PTQWrapHelper(strict_wrap=bool(getattr(cfg, "strict_wrap", True))).wrap_supported(module, cfg)
    return bind_producer(wrapped) if binds_cache_source() else wrapped
