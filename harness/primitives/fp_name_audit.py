"""Whether every wrapper's ``fp_name`` is the path of the float module it wraps.

tico keys what one stage hands the next by ``fp_name``: GPTQ quantizers (``inject_gptq_qparams``
looks each wrapper's name up in them), qparams loaded from a file, per-module results. A name
that is layer-local, shifted by a prefix, or copied from a sibling makes those lookups match
nothing or the wrong module, silently; the tiny output does not move. The float tree is walked
before wrapping (module identity -> path), so a wrapper holding module ``M`` must carry ``M``'s path."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch


@dataclass
class NameAudit:
    wrappers: int = 0
    named: int = 0
    rows: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _held_float_paths(wrapper: Any, paths: dict[int, str], lookup: Callable[[type], Any]) -> list[str]:
    """Paths of the float modules ``wrapper`` holds directly that tico's registry maps to its class."""
    held = []
    for child in wrapper._modules.values():
        if child is not None and id(child) in paths and lookup(type(child)) is type(wrapper):
            held.append(paths[id(child)])
    return held


def audit(float_module: torch.nn.Module, wrap: Callable[[torch.nn.Module], torch.nn.Module]) -> NameAudit:
    """Wrap ``float_module`` (consumed) with ``wrap`` and compare every wrapper's fp_name with the
    float tree: it must name an existing module, the one the wrapper holds where it holds one, and
    no two wrappers may share a name."""
    from tico.quantization.wrapq.wrappers.ptq_wrapper import PTQWrapper
    from tico.quantization.wrapq.wrappers.quant_module_base import QuantModuleBase
    from tico.quantization.wrapq.wrappers.registry import lookup

    paths = {id(m): name for name, m in float_module.named_modules()}
    classes = {name: type(m).__name__ for name, m in float_module.named_modules()}
    tree = wrap(float_module)
    result = NameAudit()
    owners: dict[str, str] = {}
    nested: set[int] = set()  # wrappers below another (non-shell) wrapper: their names are joined, never None
    for module in tree.modules():
        if isinstance(module, QuantModuleBase) and not isinstance(module, PTQWrapper):
            nested.update(id(m) for m in module.modules() if m is not module)
    for wrapper_path, module in tree.named_modules():
        # a PTQWrapper is a transparent shell: the wrapper inside carries the name
        if not isinstance(module, QuantModuleBase) or isinstance(module, PTQWrapper):
            continue
        result.wrappers += 1
        name, where = module.fp_name, wrapper_path or "(root)"
        held = _held_float_paths(module, paths, lookup)
        result.rows.append({"wrapper": where, "class": type(module).__name__, "fp_name": name, "holds": held})
        if name is None:
            if id(module) in nested:
                result.problems.append(
                    f"{type(module).__name__} at {where} has no fp_name though it is nested in a named tree: "
                    f"what an algorithm keys by name cannot reach it"
                )
            elif held and held[0] != "":
                result.notes.append(f"{type(module).__name__} at {where} was wrapped without a name (by the case)")
            continue
        result.named += 1
        if name not in classes:
            result.problems.append(
                f"{type(module).__name__} at {where}: fp_name {name!r} names no module of the float model "
                f"(its float module is at {held[0]!r})"
                if held
                else f"{type(module).__name__} at {where}: fp_name {name!r} names no module of the float model"
            )
        elif held and name not in held:
            result.problems.append(
                f"{type(module).__name__} at {where}: fp_name {name!r} ({classes[name]}) but it wraps the float "
                f"module at {held[0]!r}"
            )
        if name in owners:
            result.problems.append(f"fp_name {name!r} is carried by two wrappers: {owners[name]} and {where}")
        owners[name] = where
    return result
