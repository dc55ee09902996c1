"""What the installed tico's API asks of a case, told by what tico has, never by its version string (a
checkout under review carries no release number). Each flag names the API change it follows
(``[[api_change]]`` in findings/tico.toml); cases branch on it where the two APIs differ."""

from __future__ import annotations

import contextlib
import importlib.util

import torch

from harness import PreparedExport


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


# static-decoder-explicit-mask / full-model-prepared-static-export: static export takes the host's
# attention mask and (cos, sin) explicitly, and a whole model exports inside prepared_static_export.
HOST_STATIC_INPUTS = _has_module("tico.quantization.wrapq.utils.static_export")


def prepared_for_export(adapter: torch.nn.Module, max_seq_len: int) -> torch.nn.Module:
    """A whole-model export adapter as tico's API calls it: on tico main inside
    ``prepared_static_export(model, max_seq_len)`` (api_change full-model-prepared-static-export), which
    installs the model's static mask and RoPE for the call; tico 0.3.0's adapters build them themselves."""
    if not HOST_STATIC_INPUTS:
        return adapter
    from tico.quantization.wrapq.utils.static_export import prepared_static_export

    return PreparedExport(adapter, lambda inner: prepared_static_export(inner, max_seq_len))


def static_inputs_prepared(model: torch.nn.Module, max_seq_len: int):
    """The context tico's export runs in (``prepared_static_export``; nothing on tico 0.3.0, whose wrappers keep
    their static tables as buffers): inside it an eager call reads the static mask and RoPE an export bakes."""
    if not HOST_STATIC_INPUTS:
        return contextlib.nullcontext()
    from tico.quantization.wrapq.utils.static_export import prepared_static_export

    return prepared_static_export(model, max_seq_len)
