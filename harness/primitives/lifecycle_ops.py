"""The tico lifecycle operations the pipeline stages and the checks share: seed, wrap in
NO_QUANT, switch the outermost quant modules to calibration or freeze their qparams, and reach
the case-level wrapper inside tico's PTQWrapper shell."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from harness.model.case import Case


def set_seed(seed: int) -> None:
    """Seed every RNG a builder may touch, so reference weights and inputs are reproducible."""
    import random

    random.seed(seed)
    torch.manual_seed(seed)
    np.random.seed(seed % (2**32))


def wrap_noquant(case: Case, module: torch.nn.Module, cfg: Any) -> torch.nn.Module:
    """The wrapper tree in NO_QUANT mode, as tico constructs it (no calibration enabled)."""
    if case.wrap is not None:
        return case.wrap(module, cfg)
    from tico.quantization.wrapq.wrap_helper import PTQWrapHelper

    return PTQWrapHelper(strict_wrap=bool(getattr(cfg, "strict_wrap", True))).wrap_supported(module, cfg)


def top_quant_modules(root: torch.nn.Module) -> list[Any]:
    """The outermost quant modules of a tree (the root itself when it is one)."""
    from tico.quantization.wrapq.wrappers.quant_module_base import QuantModuleBase

    if isinstance(root, QuantModuleBase):
        return [root]
    found, inner = [], set()
    for module in root.modules():
        if isinstance(module, QuantModuleBase) and id(module) not in inner:
            found.append(module)
            inner.update(id(m) for m in module.modules())
    return found


def enable_calibration(root: torch.nn.Module) -> None:
    for module in top_quant_modules(root):
        module.enable_calibration()


def freeze_qparams(root: torch.nn.Module) -> None:
    for module in top_quant_modules(root):
        module.freeze_qparams()


def unwrap(root: torch.nn.Module) -> torch.nn.Module:
    """The case-level wrapper inside tico's PTQWrapper shell (or the module itself)."""
    return getattr(root, "wrapped", root)
