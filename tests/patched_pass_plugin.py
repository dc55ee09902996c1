"""pytest plugin (``-p tests.patched_pass_plugin``) that patches tico's PropagateQParamForward in
memory so split_with_sizes' outputs get no qparams (a bug TICO once fixed), for subprocess runs
that must show a warm cache reports it exactly as a cold run (tests/test_cache_soundness.py)."""

from __future__ import annotations

import operator

import torch
from tico.quantization.passes import propagate_qparam_forward as _forward
from tico.serialize.quant_param import QPARAM_KEY

_original = _forward.PropagateQParamForward.call


def _dropping(self, exported_program):
    outcome = _original(self, exported_program)
    for node in exported_program.graph_module.graph.nodes:
        source = node.args[0] if node.target is operator.getitem and node.args else None
        if isinstance(source, torch.fx.Node) and source.target == torch.ops.aten.split_with_sizes.default:
            node.meta.pop(QPARAM_KEY, None)
    return outcome


_forward.PropagateQParamForward.call = _dropping
