"""tico from 0.4 keeps some fake-quants as their own QUANTIZE op instead of folding their qparams
onto the producer (FoldQuantOps: a producer with other users, an embedding, a producer that
already holds qparams). The consistency and audit checks read the graph as tico left it: the kept
QUANTIZE carries the qparams, and a float value that only reaches QUANTIZE ops is a float boundary,
while a float value that arithmetic reads stays a missing qparam."""

from __future__ import annotations

import operator
from types import SimpleNamespace

import torch
import torch.ao.quantization.fx._decomposed  # noqa: F401 - registers quantized_decomposed ops

from harness.circle.missing_qparams import quantized_before_use
from harness.circle.records import follow_kept_quantizes

Q = torch.ops.quantized_decomposed.quantize_per_tensor.default
KEY = "_quantization_parameters"


def qparam(scale: float, zero_point: int):
    return SimpleNamespace(scale=[scale], zero_point=[zero_point])


def _graph():
    """x (float) -> Q -> linear-ish mul; x also feeds an add read in float (a residual)."""
    g = torch.fx.Graph()
    x = g.placeholder("x")
    q = g.call_function(Q, (x, 0.02, 120, 0, 255, torch.uint8))
    q.meta[KEY] = qparam(0.02, 120)
    mul = g.call_function(operator.mul, (q, 2.0))
    mul.meta[KEY] = qparam(0.04, 120)
    g.output((mul,))
    return g, x, q, mul


def test_a_float_value_read_only_by_quantize_ops_is_a_boundary_and_arithmetic_on_it_is_not():
    g, x, q, mul = _graph()
    assert quantized_before_use(x, KEY)
    residual = g.call_function(operator.add, (x, mul))  # arithmetic reads x in float
    assert not quantized_before_use(x, KEY)
    assert not quantized_before_use(residual, KEY)  # no users at all: not quantized before use


def test_a_kept_quantize_carries_the_qparams_and_the_producer_has_no_float_users():
    g, x, q, mul = _graph()
    records = [
        {"tensor": "x", "quantize": q.name, "scale": 0.02, "zero_point": 120, "float_users": ["add"]},
        {"tensor": "y", "quantize": "gone", "scale": 0.5, "zero_point": 0, "float_users": []},
    ]
    follow_kept_quantizes(records, g, KEY)
    assert records[0]["tensor"] == q.name and records[0]["float_users"] == [] and records[0]["kept_quantize"]
    assert records[1]["tensor"] == "y"  # folded onto its producer, as tico 0.3.0 always does


def test_a_kept_quantize_with_other_qparams_is_not_taken_for_the_carrier():
    g, x, q, mul = _graph()
    records = [{"tensor": "x", "quantize": q.name, "scale": 0.03, "zero_point": 120, "float_users": []}]
    follow_kept_quantizes(records, g, KEY)
    assert records[0]["tensor"] == "x"
