"""Where a PTQConfig override lands, for each way of addressing it that the config accepts.

A user aims an override at one observer by its float module path ("model.layers.1.mlp.down_proj"
and the observer's name). The config takes that path as a nested mapping, as a dot-path key (whole
or down to the module), through ``set_override`` with a dotted string or a tuple, and with a
``QuantSpec`` or a raw kwargs leaf; each wrapper hands its children the scope of their name
(``qcfg.child``), layers by index. A scope bug sends the override to no module, to every layer or
to a sibling while the tiny output stays in limits. The observers' dtypes and qschemes are read
right after wrapping (no calibration needed); a form whose normalized config equals an earlier form's
reuses that wrap, so the forms cost one wrap per distinct config."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

Wrap = Callable[[torch.nn.Module, Any], torch.nn.Module]


@dataclass(frozen=True)
class Target:
    """One observer to override: its path in the wrapped tree, its config address and why chosen."""

    observer: str
    address: tuple[str, ...]
    chosen_as: str


@dataclass
class ScopeReport:
    targets: list[Target] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    observers: int = 0


def observer_settings(root: torch.nn.Module) -> dict[str, tuple[str, str, tuple[str, ...]]]:
    """Every observer of a wrapped tree: path -> (dtype, qscheme, config address)."""
    from tico.quantization.wrapq.observers.base import ObserverBase

    out = {}
    for path, module in root.named_modules():
        if isinstance(module, ObserverBase):
            scope = tuple(part for part in path.split(".")[:-1] if part != "wrapped")
            out[path] = (str(module.dtype), str(getattr(module, "qscheme", None)), scope + (module.name,))
    return out


def _indexed_prefixes(addresses: list[tuple[str, ...]]) -> dict[tuple[str, ...], list[str]]:
    """Address prefixes that end in a module list (``(..., "layers")``) -> the indices seen under them."""
    found: dict[tuple[str, ...], list[str]] = {}
    for address in addresses:
        for i, part in enumerate(address[:-1]):
            if part.isdigit() and i > 0:
                found.setdefault(address[:i], [])
                if part not in found[address[:i]]:
                    found[address[:i]].append(part)
    return found


def choose_targets(settings: dict[str, tuple[str, str, tuple[str, ...]]], max_lists: int = 3) -> list[Target]:
    """One observer addressed by name only (a child module's; else by any path; else the root's own), and the first
    weight observer (else the first observer) of the last layer of each module list, up to ``max_lists``
    lists, those with two layers or more first (where an override could land on every layer), then
    the shallower (a multimodal model has one per tower)."""
    order = list(settings)
    addresses = [settings[p][2] for p in order]
    targets: list[Target] = []
    nested = [p for p in order if len(settings[p][2]) > 1]
    named = [p for p in nested if not any(x.isdigit() for x in settings[p][2])]
    if named or nested:
        first, how = (named[0], "by name") if named else (nested[0], "by path")
        targets.append(Target(first, settings[first][2], how))
    elif order:
        targets.append(Target(order[-1], settings[order[-1]][2], "root observer"))
    lists = sorted(_indexed_prefixes(addresses).items(), key=lambda kv: (len(kv[1]) < 2, len(kv[0]), kv[0]))
    for prefix, indices in lists[:max_lists]:
        last = max(indices, key=int)
        under = [p for p in order if settings[p][2][: len(prefix) + 1] == prefix + (last,)]
        weights = [p for p in under if settings[p][2][-1] == "weight"] or under
        where = f"layer {last} of {len(indices)} in {'.'.join(prefix)}"
        targets.append(Target(weights[0], settings[weights[0]][2], where))
    return targets


def _new_dtype(current: str) -> Any:
    from tico.quantization.wrapq.dtypes import INT16, UINT8

    return UINT8 if current == str(INT16) else INT16


def _with_overrides(cfg: Any, overrides: dict[str, Any]) -> Any:
    """A copy of ``cfg`` built through the dataclass constructor, as a user writes one."""
    return dataclasses.replace(cfg, overrides=overrides)


def _with_leaf(base: dict[str, Any], address: tuple[str, ...], leaf: Any) -> dict[str, Any]:
    """``base`` with ``leaf`` set (replaced, not merged: an existing leaf's qscheme was resolved for
    its old dtype) at ``address``, keeping every other override."""
    out = copy.deepcopy(base)
    node = out
    for part in address[:-1]:
        child = node.get(part)
        node[part] = dict(child) if isinstance(child, dict) else {}
        node = node[part]
    node[address[-1]] = leaf
    return out


def _node(tree: dict[str, Any], address: tuple[str, ...]) -> dict[str, Any]:
    for part in address:
        tree = tree.get(part) if isinstance(tree.get(part), dict) else {}
    return tree


def forms(cfg: Any, address: tuple[str, ...], dtype: Any) -> dict[str, Any]:
    """The same override in every addressing form PTQConfig accepts -> the config it gives."""
    from tico.quantization.config.specs import affine

    spec, raw = affine(dtype), {"dtype": dtype}
    base = copy.deepcopy(dict(cfg.overrides))
    dotted = ".".join(address)
    by_str, by_tuple = copy.deepcopy(cfg), copy.deepcopy(cfg)
    by_str.set_override(dotted, spec)
    by_tuple.set_override(tuple(address), raw)
    out = {
        "nested mapping, kwargs leaf": _with_overrides(cfg, _with_leaf(base, address, raw)),
        "dot-path key, QuantSpec leaf": _with_overrides(cfg, {**base, dotted: spec}),
        "set_override(str), QuantSpec": by_str,
        "set_override(tuple), kwargs": by_tuple,
    }
    if len(address) > 1:
        # a dot-path key replaces the node it names: the module's other overrides go with it, as a user writes it
        module = {**copy.deepcopy(_node(base, address[:-1])), address[-1]: raw}
        out["module dot-path key, nested leaf"] = _with_overrides(cfg, {**base, ".".join(address[:-1]): module})
    return out


def _same_config(a: Any, b: Any) -> bool:
    """Whether two configs are equal field by field (overrides as normalized trees): two forms that
    normalize to the same config wrap alike, so the second reuses the first's wrap. A form whose
    normalization differs (the bug this probe looks for) is wrapped on its own."""
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - a config that cannot be compared is wrapped on its own
        return False


def _moved(before: dict, after: dict) -> list[str]:
    return [p for p in before if p in after and after[p][:2] != before[p][:2]]


def probe(float_module: torch.nn.Module, cfg: Any, wrap: Wrap) -> ScopeReport:
    """Wrap ``float_module`` (copied per form) with ``cfg`` and with one override per target and form;
    each must move exactly its target's dtype."""
    report = ScopeReport()
    before = observer_settings(wrap(copy.deepcopy(float_module), cfg))
    report.observers = len(before)
    report.targets = choose_targets(before)
    for target in report.targets:
        dtype = _new_dtype(before[target.observer][0])
        label = ".".join(target.address)
        wrapped: list[tuple[Any, dict]] = []  # (config, its observers): wrapping is a function of the config
        for form, overridden in forms(cfg, target.address, dtype).items():
            after = next((seen for other, seen in wrapped if _same_config(other, overridden)), None)
            if after is None:
                after = observer_settings(wrap(copy.deepcopy(float_module), overridden))
                wrapped.append((overridden, after))
            moved = [".".join(before[p][2]) for p in _moved(before, after)]
            others = [a for a in moved if a != label]
            report.rows.append(
                {"target": label, "chosen as": target.chosen_as, "form": form, "dtype": str(dtype), "moved": moved}
            )
            if label not in moved or after[target.observer][0] != str(dtype):
                where = f"; it moved {len(others)} other observers instead, e.g. {others[:3]}" if others else ""
                still = after[target.observer][0] if target.observer in after else "gone"
                report.problems.append(f"override {label} -> {dtype} ({form}) did not reach it (still {still}){where}")
            elif others:
                report.problems.append(
                    f"override {label} -> {dtype} ({form}) also moved {len(others)} other observers, e.g. {others[:3]}"
                )
    return report
