"""Which GPTQ quantizers reach which wrapper: the key table between tico's GPTQ and its PTQ stage.

GPTQ keys each quantizer by the float module's path; tico's PTQ stage finds the quantizers on the
prepared tree (``find_gptq_quantizers``: the root and the owners it knows below it) and
``inject_gptq_qparams`` hands each to the wrapper whose ``fp_name`` equals its key. A key that names
no wrapper, quantizers kept where the stage does not look, or a wrapper renamed away from its key
leave GPTQ's grid unused, silently: the weight observer then computes its own qparams and the
tiny output barely moves. The table is computed here from the tree, not taken from tico's counts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class GPTQMatch:
    found_on: str | None  # where the quantizers were read: "float module" or the prepared owner's class
    matched: dict[str, str] = field(default_factory=dict)  # key -> wrapper class
    unused: list[str] = field(default_factory=list)  # keys no wrapper with a weight observer carries
    without_quantizer: list[str] = field(default_factory=list)  # weight-observer wrappers GPTQ left alone
    tico_stats: dict[str, int] | None = None

    def describe(self) -> dict[str, Any]:
        return {
            "found_on": self.found_on,
            "quantizers": len(self.matched) + len(self.unused),
            "matched": len(self.matched),
            "unused": sorted(self.unused),
            "without_quantizer": sorted(self.without_quantizer),
            "table": [{"key": k, "wrapper": v} for k, v in sorted(self.matched.items())],
            "tico_stats": self.tico_stats,
        }


def weight_observer_names(root: torch.nn.Module, weight_obs_name: str = "weight") -> dict[str, str]:
    """fp_name -> wrapper class of every named wrapper with a weight observer (what injection can reach)."""
    from tico.quantization.wrapq.wrappers.quant_module_base import QuantModuleBase

    found = {}
    for module in root.modules():
        if isinstance(module, QuantModuleBase) and module.fp_name and module.get_observer(weight_obs_name) is not None:
            found[module.fp_name] = type(module).__name__
    return found


def match(prepared: torch.nn.Module, quantizers: dict[str, Any] | None, found_on: str | None) -> GPTQMatch:
    """The key table of ``quantizers`` against the prepared tree's named weight observers."""
    names = weight_observer_names(prepared)
    table = GPTQMatch(found_on=found_on)
    for key in quantizers or {}:
        if key in names:
            table.matched[key] = names[key]
        else:
            table.unused.append(key)
    table.without_quantizer = [n for n in names if n not in (quantizers or {})]
    return table


def find_on_prepared(prepared: torch.nn.Module) -> tuple[dict[str, Any] | None, str | None]:
    """The quantizers where tico's PTQ stage looks for them, and the class of their owner."""
    from tico.quantization.recipes.qparams import find_gptq_quantizers

    owner, quantizers = find_gptq_quantizers(prepared)
    return quantizers, (type(owner).__name__ if owner is not None else None)


def problems(table: dict[str, Any], expected_keys: list[str]) -> list[str]:
    """What a recorded table (``GPTQMatch.describe()``) shows wrong: quantizers not found where the
    PTQ stage looks, keys other than GPTQ produced, keys no wrapper carries, tico's count disagreeing."""
    out = []
    if table["found_on"] is None:
        out.append(
            f"tico's PTQ stage finds no GPTQ quantizers on the prepared model (find_gptq_quantizers looks at the "
            f"root and the owners it knows below it), though GPTQ produced {len(expected_keys)}: its recipe stops "
            f"('GPTQ qparam reuse was requested, but no GPTQ quantizers were found')"
        )
        return out
    if table["unused"]:
        out.append(
            f"{len(table['unused'])} of {table['quantizers']} GPTQ quantizers match no wrapper's fp_name, so "
            f"inject_gptq_qparams leaves their grids unused: {table['unused'][:6]}"
        )
    stats = table.get("tico_stats")
    if stats is not None and stats.get("matched") != table["matched"]:
        out.append(f"inject_gptq_qparams reports {stats} but the tree matches {table['matched']} keys")
    return out


def handoff(prepared: torch.nn.Module, quantizers: dict[str, Any] | None, found_on: str | None, facts: dict) -> None:
    """tico's handoff (``inject_gptq_qparams``) of ``quantizers`` into the prepared tree, with the key
    table in ``facts["gptq_match"]``; nothing is injected when none were found (``algorithm_handoff``
    names that, as it names unused keys, rather than stopping every check at the stage)."""
    from tico.quantization.recipes.qparams import inject_gptq_qparams

    table = match(prepared, quantizers, found_on)
    if quantizers:
        table.tico_stats = dict(inject_gptq_qparams(prepared, quantizers))
    facts["gptq_match"] = table.describe()
