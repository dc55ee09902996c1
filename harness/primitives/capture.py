"""Capture what a wrapper actually feeds one of its submodules (e.g. the RoPE tables and mask
that reach the first attention layer), so checks judge the tensors in use, not a re-derivation."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import torch


@contextmanager
def capture_calls(module: torch.nn.Module) -> Iterator[list[tuple[tuple, dict[str, Any]]]]:
    """Record (args, kwargs) of every call to ``module`` inside the block."""
    calls: list[tuple[tuple, dict[str, Any]]] = []

    def hook(_mod: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        calls.append((args, dict(kwargs)))

    handle = module.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield calls
    finally:
        handle.remove()


def first_call_kwarg(module: torch.nn.Module, submodule: torch.nn.Module, run: Any, key: str) -> Any:
    """Run ``run(module)`` and return keyword ``key`` of the first call into ``submodule``."""
    with capture_calls(submodule) as calls, torch.no_grad():
        run(module)
    if not calls:
        raise RuntimeError(f"{type(submodule).__name__} was never called")
    args, kwargs = calls[0]
    if key not in kwargs:
        raise KeyError(f"first call into {type(submodule).__name__} had no keyword {key!r}; got {sorted(kwargs)}")
    return kwargs[key]
