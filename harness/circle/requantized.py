"""Values the Circle model requantizes with qparams no torch fake-quant applied: an operator that
requantizes its output (a NEG) given qparams by a propagating pass, where torch applies none."""

from __future__ import annotations

from typing import Any

import torch

from harness.circle.missing_qparams import target_name as _target
from harness.circle.records import _module_path, _same, _wrapper_line

_REQUANTIZING_UNARY = frozenset({"aten.neg.default"})

_QRANGE = {"uint8": (0, 255), "int8": (-128, 127), "int16": (-32768, 32767), "uint4": (0, 15), "int4": (-8, 7)}


def requantized_unapplied(applied: list[dict[str, Any]], program: Any) -> list[dict[str, Any]]:
    """Nodes of the final quantized graph whose Circle operator requantizes its output with
    per-tensor qparams no torch fake-quant applied to that value: each with its op, the call
    index of that op among the program's nodes of the same target (the order torch dispatches
    them in), its qparams and the shape of its value."""
    from tico.serialize.quant_param import QPARAM_KEY

    carriers = {record["tensor"] for record in applied}
    by_tensor = {record["tensor"]: record for record in applied}
    found = []
    counts: dict[str, int] = {}
    call_index: dict[str, int] = {}
    nodes = list(program.graph_module.graph.nodes)
    for node in nodes:
        if node.op == "call_function":
            target = _target(node)
            call_index[node.name] = counts.get(target, 0)
            counts[target] = call_index[node.name] + 1
    for node in nodes:
        if node.op != "call_function":
            continue
        target = _target(node)
        if target not in _REQUANTIZING_UNARY:
            continue
        index = call_index[node.name]
        qparam = node.meta.get(QPARAM_KEY)
        if node.name in carriers or qparam is None or qparam.scale is None or len(qparam.scale) != 1:
            continue
        qmin, qmax = _QRANGE.get(str(qparam.dtype), (None, None))
        if qmin is None:
            continue
        # Where the qparams come from: the concatenation it feeds, as PropagateQParamBackward copies them,
        # and only where they are what torch's fake-quant of that concatenation applied.
        origin = next(
            (
                user.name
                for user in node.users
                if _target(user) == "aten.cat.default"
                and _same(float(qparam.scale[0]), int(qparam.zero_point[0]), user.meta.get(QPARAM_KEY))
                and user.name in by_tensor
                and _same(by_tensor[user.name]["scale"], by_tensor[user.name]["zero_point"], qparam)
            ),
            None,
        )
        found.append(_record(node, target, index, origin, qparam, qmin, qmax))
    # A value torch fake-quantizes for one user only, which FoldQuantOps quantized for all of them
    # (``float_users``): Circle's operator requantizes its output (executor.py
    # ``CircleReferenceRuntime._execute_operator``), and every user reads that. Its qparams must be the
    # ones that fake-quant applied.
    nodes_by_name = {node.name: node for node in nodes}
    for record in applied:
        node = nodes_by_name.get(record["tensor"])
        if not record.get("float_users") or record.get("redundant") or node is None or node.op != "call_function":
            continue
        qparam = node.meta.get(QPARAM_KEY)
        if qparam is None or qparam.scale is None or len(qparam.scale) != 1:
            continue
        qmin, qmax = _QRANGE.get(str(qparam.dtype), (None, None))
        if qmin is None:
            continue
        origin = (
            record.get("observer") or record["tensor"] if _same(record["scale"], record["zero_point"], qparam) else None
        )
        found.append(
            _record(
                node,
                _target(node),
                call_index[node.name],
                origin,
                qparam,
                qmin,
                qmax,
                shared_with=record["float_users"],
                observer=record.get("observer"),
            )
        )
    for record in found:  # how many calls of the op the graph makes: the eager run must make as many
        record["calls"] = counts[record["op"]]
    return found


def _record(node, op: str, call_index: int, origin, qparam, qmin: int, qmax: int, **shared) -> dict[str, Any]:
    """One requantized value: where it is, the qparams Circle holds for it and where they came from."""
    value = node.meta.get("val")
    return {
        "tensor": node.name,
        "op": op,
        "call_index": call_index,
        "qparam_from": origin,
        **shared,
        "scale": float(qparam.scale[0]),
        "zero_point": int(qparam.zero_point[0]),
        "qmin": qmin,
        "qmax": qmax,
        "shape": tuple(value.shape) if isinstance(value, torch.Tensor) else None,
        "line": _wrapper_line(node.meta.get("stack_trace")),
        "module": _module_path(node),
    }


def describe_requantized(record: dict[str, Any]) -> str:
    if record.get("shared_with") is not None:
        origin = (
            f"the qparams of {record['qparam_from']}, which FoldQuantOps folded onto it"
            if record.get("qparam_from")
            else "qparams of no fake-quant torch applied to it"
        )
        return (
            f"tensor {record['tensor']} ({record['line']}, {record['op']}): torch fake-quantizes it only where "
            f"{record.get('observer') or 'one observer'} reads it and {', '.join(record['shared_with'])} read(s) "
            f"it in float; the Circle model quantizes it for every user with scale {record['scale']:.6g} zp "
            f"{record['zero_point']} ({origin})"
        )
    origin = (
        f"the qparams of the concatenation {record['qparam_from']} it feeds"
        if record.get("qparam_from")
        else "qparams of no concatenation it feeds"
    )
    return (
        f"tensor {record['tensor']} ({record['line']}, {record['op']}): torch applies no fake-quant, the "
        f"Circle model requantizes it with scale {record['scale']:.6g} zp {record['zero_point']} "
        f"(range {record['qmin']}..{record['qmax']}; {origin})"
    )
