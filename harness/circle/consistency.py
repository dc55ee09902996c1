"""Does the Circle model quantize every value as torch's fake-quant did?

tico's FoldQuantOps turns each torch fake-quant (a quantize/dequantize pair) into qparams on
the tensor that produced the value, or keeps a Quantize op where a value is re-quantized.
Two things then make Circle quantize a value otherwise than torch:

* later passes overwrite qparams already folded there (tico 0.3.0's PropagateQParamForward
  gives SPLIT outputs, SLICE and NEG their input's qparams; PropagateQParamBackward gives
  CONCATENATION's inputs the output's);
* data-movement operators (SPLIT, SLICE, RESHAPE, TRANSPOSE, CONCATENATION, ...) never
  requantize, in integer backends or in tico's reference runtime, so their value keeps its
  input's quantization whatever qparams their own tensor holds.

Either way torch fake-quantizes one value with qparams Circle does not apply: one tensor, two
sets of qparams, and the torch QUANT output is no longer what the Circle model computes.

``recording_folds`` records, right before FoldQuantOps runs, the qparams each fake-quant
applies, the tensor that will carry them and (``attribute_observers``) the observer that
applied them; ``overwritten_qparams`` compares them with the quantization the value carries
when conversion is done; ``aligned_to_circle`` builds the torch model that quantizes as
Circle does, so a replay gap can be split into this cause and the rest."""

from __future__ import annotations

import math
from typing import Any

import torch

from harness.circle.missing_qparams import VALUE_PRESERVING
from harness.circle.missing_qparams import target_name as _target
from harness.circle.records import SCALE_REL_EQUAL, _same


def _value_inputs(node: torch.fx.Node) -> list[torch.fx.Node] | None:
    """The tensors a data-movement node's value comes from, or None for any other node."""
    if node.op != "call_function":
        return None
    target = _target(node)
    if (
        target == "getitem"
        and isinstance(node.args[0], torch.fx.Node)
        and _target(node.args[0]) == "aten.split_with_sizes.default"
    ):
        return [node.args[0].args[0]]
    if target == "aten.cat.default":
        return [arg for arg in node.args[0] if isinstance(arg, torch.fx.Node)]
    if target == "aten.embedding.default" and isinstance(node.args[0], torch.fx.Node):
        return [node.args[0]]  # GATHER: the rows of the table, as the table is quantized
    if target in VALUE_PRESERVING and isinstance(node.args[0], torch.fx.Node):
        return [node.args[0]]
    return None


MIXED = "mixed"
# the value keeps its input's per-channel quantization (a GATHER of per-row quantized table rows)
PER_CHANNEL = "per_channel"


def _carried(node: torch.fx.Node, qparam_key: str, depth: int = 0) -> tuple[Any, torch.fx.Node] | str | None:
    """(qparams, node that applied them) of the value ``node`` produces in Circle: its own for
    an operator that requantizes, its input's for a data-movement one. ``MIXED`` when the
    inputs of a concatenation carry different quantizations; ``PER_CHANNEL`` when the value keeps
    a per-channel quantization (an embedding's GATHER of its per-row quantized table); None when
    one carries none."""
    sources = _value_inputs(node) if depth < 64 else None
    if not sources:
        return node.meta.get(qparam_key), node
    carried = [_carried(source, qparam_key, depth + 1) for source in sources]
    if any(c == MIXED for c in carried):
        return MIXED
    if any(
        c == PER_CHANNEL
        or (isinstance(c, tuple) and c[0] is not None and c[0].scale is not None and len(c[0].scale) > 1)
        for c in carried
    ):
        return PER_CHANNEL
    if any(c is None or c[0] is None or c[0].scale is None or len(c[0].scale) != 1 for c in carried):
        return None
    first = carried[0]
    if any(not _same(float(first[0].scale[0]), int(first[0].zero_point[0]), c[0]) for c in carried[1:]):
        return MIXED
    return first


# Ops tico's PropagateQParamForward copies qparams through, input to output (SPLIT outputs, SLICE, NEG:
# quantization/passes/propagate_qparam_forward.py ``PropagateQParamForward.call``), and the data-movement
# ops whose output inherits its input's (FoldQuantOps' _inherit_qparam_from_view_chain).
_FORWARD_FROM_INPUT = VALUE_PRESERVING | {"aten.neg.default", "aten.split_with_sizes.default"}


def _input_of(node: torch.fx.Node) -> torch.fx.Node | None:
    """The node a value-preserving / forward-propagated node takes its qparams from, else None."""
    if node.op != "call_function":
        return None
    target = _target(node)
    if target == "getitem" and isinstance(node.args[0], torch.fx.Node):
        return node.args[0] if _target(node.args[0]) == "aten.split_with_sizes.default" else None
    if target in _FORWARD_FROM_INPUT and target != "aten.cat.default" and isinstance(node.args[0], torch.fx.Node):
        return node.args[0]
    return None


def qparam_source(
    node: torch.fx.Node, scale: float, zero_point: int, by_tensor: dict[str, dict[str, Any]], qparam_key: str
) -> str | None:
    """Where the qparams (``scale``, ``zero_point``) a pass gave ``node`` come from, as a named torch
    fake-quant: one applied (with exactly these qparams) to the value ``node`` is computed from,
    through the SPLIT / SLICE / NEG / data-movement chain PropagateQParamForward copies along; or to
    a concatenation ``node`` feeds, directly or through data-movement ops, as PropagateQParamBackward
    copies (propagate_qparam_backward.py ``PropagateQParamBackward.call``). None when they are neither: a
    propagation that produced qparams no torch observer applied there (which aligning torch to them would
    absorb)."""

    def applied_here(candidate: torch.fx.Node) -> dict[str, Any] | None:
        record = by_tensor.get(candidate.name)
        if (
            record is not None
            and candidate is not node
            and math.isclose(record["scale"], scale, rel_tol=SCALE_REL_EQUAL)
            and record["zero_point"] == zero_point
        ):
            return record
        return None

    producer, depth = _input_of(node), 0
    while producer is not None and depth < 64:
        record = applied_here(producer)
        if record is not None:
            return f"{record.get('observer') or record['tensor']} (the fake-quant of {producer.name}, the value "
            "it is computed from)"
        producer, depth = _input_of(producer), depth + 1
    frontier, depth = [node], 0
    while frontier and depth < 16:
        following = []
        for current in frontier:
            for user in current.users:
                if _target(user) == "aten.cat.default":
                    record = applied_here(user)
                    if record is not None and _same(scale, zero_point, user.meta.get(qparam_key)):
                        return f"{record.get('observer') or record['tensor']} (the fake-quant of {user.name}, "
                        "the concatenation it feeds)"
                elif _target(user) in VALUE_PRESERVING:
                    following.append(user)
        frontier, depth = following, depth + 1
    return None


def overwritten_qparams(
    applied: list[dict[str, Any]], program: Any
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The applied fake-quants whose value the Circle model quantizes otherwise, each with the
    qparams it carries there ('circle_scale'/'circle_zero_point', None when its qparams are
    gone) and, for a data-movement op, the node whose quantization it keeps ('circle_source');
    and the applied fake-quants whose node a later pass replaced (not comparable by name)."""
    from tico.serialize.quant_param import QPARAM_KEY

    nodes = {node.name: node for node in program.graph_module.graph.nodes}
    by_tensor = {record["tensor"]: record for record in applied}
    found: list[dict[str, Any]] = []
    vanished: list[dict[str, Any]] = []
    for record in applied:
        node = nodes.get(record["tensor"])
        if node is None:
            # A later pass replaced the node (e.g. LegalizeQuantizedClamp rebuilds clamps): what
            # Circle holds for the value cannot be looked up by name, so it is not compared.
            vanished.append(record)
            continue
        carried = _carried(node, QPARAM_KEY)
        if carried == MIXED:
            found.append(dict(record, circle_scale=None, circle_zero_point=None, circle_source=None, circle_mixed=True))
            continue
        if carried == PER_CHANNEL:
            found.append(
                dict(record, circle_scale=None, circle_zero_point=None, circle_source=None, circle_per_channel=True)
            )
            continue
        qparam, source = (
            carried if carried is not None else (node.meta.get(QPARAM_KEY) if node is not None else None, node)
        )
        if _same(record["scale"], record["zero_point"], qparam):
            continue
        held = qparam is not None and qparam.scale is not None and len(qparam.scale) == 1
        kept_from = source.name if source is not None and source is not node else None
        # The qparams the tensor itself holds (for a data-movement op: what an integer backend reads
        # its values with) and the named torch fake-quant they are; None when they are no such.
        own = node.meta.get(QPARAM_KEY)
        own_held = own is not None and own.scale is not None and len(own.scale) == 1
        found.append(
            dict(
                record,
                circle_scale=float(qparam.scale[0]) if held else None,
                circle_zero_point=int(qparam.zero_point[0]) if held else None,
                circle_source=kept_from,
                held_scale=float(own.scale[0]) if own_held else None,
                held_zero_point=int(own.zero_point[0]) if own_held else None,
                qparam_source=(
                    None
                    if not own_held
                    else f"{record.get('observer') or record['tensor']} (its own fake-quant: "
                    f"the tensor keeps them, its value its input's quantization)"
                    if _same(record["scale"], record["zero_point"], own)
                    else qparam_source(node, float(own.scale[0]), int(own.zero_point[0]), by_tensor, QPARAM_KEY)
                ),
            )
        )
    return found, vanished


def unpinned(record: dict[str, Any]) -> bool:
    """An overwritten record whose tensor holds qparams a pass gave it (the replacement the aligned
    copy applies, or, for a data-movement op, the quantization its value is declared to carry)
    that are no named torch fake-quant's (``qparam_source``)."""
    return (
        record.get("held_scale") is not None
        and not record.get("circle_mixed")
        and not record.get("circle_per_channel")
        and not record.get("qparam_source")
    )


def describe_unpinned(record: dict[str, Any]) -> str:
    return (
        f"tensor {record['tensor']} ({record['line']}, {record.get('observer') or 'observer not identified'}): "
        f"the Circle model holds scale {record['held_scale']:.6g} zp {record['held_zero_point']}, the qparams "
        f"of no fake-quant torch applied to the value it is computed from or to a concatenation it feeds "
        f"(replaced by {record.get('overwritten_by') or 'a later conversion step'}): a propagation of qparams no "
        f"observer chose, which aligning torch to them would absorb"
    )


def describe(record: dict[str, Any]) -> str:
    """One line naming the tensor, where torch quantizes it, and the two sets of qparams."""
    torch_side = f"scale {record['scale']:.6g} zp {record['zero_point']}"
    if record.get("circle_mixed"):
        return (
            f"tensor {record['tensor']} ({record['line']}, {record.get('observer') or 'observer not identified'}): "
            f"torch fake-quantizes it with {torch_side}, the Circle model holds its inputs' quantizations "
            f"unchanged, and they differ (a concatenation does not requantize)"
        )
    if record.get("circle_per_channel"):
        return (
            f"tensor {record['tensor']} ({record['line']}, {record.get('observer') or 'observer not identified'}): "
            f"torch fake-quantizes it with {torch_side}, the Circle model keeps the per-channel quantization "
            f"of the table it gathers from (a data-movement op does not requantize)"
        )
    if record["circle_scale"] is None:
        circle_side = "no qparams (the fake-quant was dropped)"
    else:
        circle_side = f"scale {record['circle_scale']:.6g} zp {record['circle_zero_point']}"
    observer = record.get("observer") or "observer not identified"
    if record.get("circle_source"):
        why = f"a data-movement op, it keeps the quantization of {record['circle_source']}"
    else:
        why = f"replaced by {record.get('overwritten_by') or 'a later conversion step'}"
    return (
        f"tensor {record['tensor']} ({record['line']}, {observer}): torch fake-quantizes it with {torch_side}, "
        f"the Circle model holds {circle_side} ({why})"
    )
