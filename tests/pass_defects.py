"""Conversion defects the tests seed into tico, shared by the in-process tests and the subprocess
plugin: tico's PropagateQParamForward leaving split_with_sizes' outputs without qparams (a bug
TICO once fixed), and a serializer writing every uint8 zero point one too high."""

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


def serialize_zero_points_off_by_one(monkeypatch: Any) -> None:
    """tico's Circle serializer writes every uint8 zero point one too high (patched for the test)."""
    import tico.serialize.circle_graph as circle_graph

    original = circle_graph.to_circle_qparam

    def off_by_one(qparam: Any) -> Any:
        out = original(qparam)
        if qparam.zero_point is not None and qparam.dtype == "uint8":
            out.zeroPoint = [min(255, z + 1) for z in qparam.zero_point]
        return out

    monkeypatch.setattr(circle_graph, "to_circle_qparam", off_by_one)
