"""A conversion-pass defect for the cache-soundness tests, shared by the in-process tests and the
subprocess plugin: tico's PropagateQParamForward leaving split_with_sizes' outputs without
qparams (a bug TICO once fixed)."""

from __future__ import annotations

import operator
from typing import Any, Callable

import torch


def dropping_split_output_qparams(original: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """``PropagateQParamForward.call`` that runs ``original``, then drops the qparams of every
    getitem of a split_with_sizes."""
    from tico.serialize.quant_param import QPARAM_KEY

    def call(self: Any, exported_program: Any) -> Any:
        outcome = original(self, exported_program)
        for node in exported_program.graph_module.graph.nodes:
            source = node.args[0] if node.target is operator.getitem and node.args else None
            if isinstance(source, torch.fx.Node) and source.target == torch.ops.aten.split_with_sizes.default:
                node.meta.pop(QPARAM_KEY, None)
        return outcome

    return call
