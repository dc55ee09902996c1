"""Running a wrapper tree with some fake-quant sites in float, the way tico accepts.

tico 0.3.0 takes ``set_fake_quant_enabled(False)`` at any observer. tico main's Gemma4 cache boundaries refuse
a disabled fake-quant and ask for an explicit IdentityObserver float policy instead (api_change
gemma4-cache-identity-float-policy): there an observer is swapped for an IdentityObserver of the same grid for
the run, and put back after.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

FLOAT_POLICY = "use an explicit IdentityObserver float policy"


def refuses_disabled_fake_quant(exc: BaseException) -> bool:
    return isinstance(exc, ValueError) and FLOAT_POLICY in str(exc)


@contextlib.contextmanager
def identity_observers(root: torch.nn.Module, paths: list[str]) -> Iterator[None]:
    """Each observer at ``paths`` (module paths under ``root``) replaced by an IdentityObserver of its grid."""
    from tico.quantization.wrapq.observers.identity import IdentityObserver

    swapped = []
    try:
        for path in paths:
            parent_path, _, name = path.rpartition(".")
            parent = root.get_submodule(parent_path)
            observer = getattr(parent, name)
            grid = {"dtype": observer.dtype, "qscheme": observer.qscheme, "channel_axis": observer.channel_axis}
            setattr(parent, name, IdentityObserver(name=observer.name, **grid))
            swapped.append((parent, name, observer))
        yield
    finally:
        for parent, name, observer in reversed(swapped):
            setattr(parent, name, observer)
