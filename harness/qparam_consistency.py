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

import copy
import math
import re
from contextlib import contextmanager
from typing import Any, Iterator

import torch

from harness import compat

# A fake-quant's qparams are exact numbers (a float32 scale, an integer zero point), copied
# from the graph; any difference is a different quantization, so the comparison is exact up
# to float64 printing of a float32.
SCALE_REL_EQUAL = 1e-7


def _wrapper_line(stack_trace: str | None) -> str:
    """The innermost frame outside tico's observers: the wrapper line that quantized the value."""
    frames = [line.strip() for line in (stack_trace or "").splitlines() if line.strip().startswith("File ")]
    for frame in reversed(frames):
        if "/wrapq/observers/" not in frame:
            path, _, rest = frame.partition(", line ")
            path = path.removeprefix("File ").strip('"')
            short = path.split("/site-packages/")[-1]
            return f"{short}:{rest.split(',')[0]}"
    return "no stack trace"


def _module_path(node: torch.fx.Node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    return list(stack.values())[-1][0] if stack else ""


def _traced_index(q: torch.fx.Node) -> int | None:
    """Which fake-quant of the torch.export graph this quantize op came from. tico decomposes
    the n-th fake-quant into nodes named quantize_per_tensor_default[_n]; fx keeps that
    origin in ``meta["from_node"]`` through later passes (torch >= 2.6). None when absent."""
    source = None
    origin = q.meta.get("from_node")
    while origin:
        source = origin[-1] if isinstance(origin, (list, tuple)) else origin
        origin = getattr(source, "from_node", None)
    name = getattr(source, "name", None) or ""
    match = re.fullmatch(r"quantize_per_tensor_default(?:_(\d+))?", name)
    return (int(match.group(1)) if match.group(1) else 0) if match else None


def applied_qparams(graph: torch.fx.Graph, with_redundant: bool = False) -> list[dict[str, Any]]:
    """One record per per-tensor fake-quant of the graph FoldQuantOps is about to fold: the
    node that will carry its qparams ('carrier'), the qparams, the wrapper line and module.
    A fake-quant of a value that was just fake-quantized with other qparams is a
    re-quantization, which FoldQuantOps keeps as a Quantize op: its carrier is that op. A
    re-quantization with the very qparams of the value is dropped by FoldQuantOps; with
    ``with_redundant`` it is listed too, flagged ``redundant`` (torch still applies it: once an
    upstream observer is aligned to other qparams it is no longer a no-op in torch)."""
    q_target = torch.ops.quantized_decomposed.quantize_per_tensor.default
    dq_target = torch.ops.quantized_decomposed.dequantize_per_tensor.default
    records = []
    ordinal = -1
    for q in graph.nodes:
        if q.op != "call_function" or q.target != q_target or not isinstance(q.args[0], torch.fx.Node):
            continue
        if not any(user.target == dq_target for user in q.users):
            continue
        ordinal += 1
        scale, zero_point, qmin, qmax = (float(q.args[1]), int(q.args[2]), int(q.args[3]), int(q.args[4]))
        producer = q.args[0]
        carrier = producer.name
        redundant = False
        if producer.op == "call_function" and producer.target == dq_target:
            # The same qparams twice: FoldQuantOps drops it, the Circle model has no trace of it.
            redundant = float(producer.args[1]) == scale and int(producer.args[2]) == zero_point
            carrier = q.name
        if redundant and not with_redundant:
            continue
        # FoldQuantOps puts these qparams on the producer itself (fold_quant_ops.py:206-213), so in
        # Circle every other user of the value reads it quantized; in torch the users that are not
        # this fake-quant read it in float (e.g. a residual beside its norm's input observer).
        float_users = [] if carrier != producer.name else sorted(
            user.name for user in producer.users
            if user is not q and not (user.op == "call_function" and user.target == q_target))
        records.append({"ordinal": ordinal, "redundant": redundant, "traced_index": _traced_index(q), "tensor": carrier,
                        "quantize": q.name,
                        "float_users": float_users, "scale": scale, "zero_point": zero_point, "qmin": qmin, "qmax": qmax,
                        "module": _module_path(q),
                        "line": _wrapper_line(producer.meta.get("stack_trace") or q.meta.get("stack_trace"))})
    return records


def follow_kept_quantizes(records: list[dict[str, Any]], folded: torch.fx.Graph, qparam_key: str) -> None:
    """Where FoldQuantOps kept a fake-quant as its own QUANTIZE op holding its qparams (tico from
    0.4: the producer has other users, is an embedding, or already holds qparams inherited through
    a view chain), that op carries them, and the producer's other users read the value as torch
    does: the record's carrier becomes the QUANTIZE op and it has no float users."""
    nodes = {node.name: node for node in folded.nodes}
    for record in records:
        kept = nodes.get(record.get("quantize", ""))
        if kept is not None and record["tensor"] != kept.name \
                and _same(record["scale"], record["zero_point"], kept.meta.get(qparam_key)):
            record.update(tensor=kept.name, float_users=[], kept_quantize=True)


# tico 0.3.0 passes after FoldQuantOps that copy qparams from one tensor to another.
_PROPAGATING_PASSES = (
    ("tico.quantization.passes.propagate_qparam_forward", "PropagateQParamForward"),
    ("tico.quantization.passes.propagate_qparam_backward", "PropagateQParamBackward"),
)


@contextmanager
def recording_folds() -> Iterator[list[dict[str, Any]]]:
    """Record ``applied_qparams`` (redundant ones included, flagged) of every graph tico's
    FoldQuantOps folds while active, and
    name the qparam-propagating pass after which a record's tensor first holds other qparams
    (``record["overwritten_by"]``)."""
    import importlib

    from tico.quantization.passes.fold_quant_ops import FoldQuantOps
    from tico.serialize.quant_param import QPARAM_KEY

    recorded: list[dict[str, Any]] = []
    originals = [(FoldQuantOps, FoldQuantOps.call)]

    def fold(self: Any, exported_program: Any) -> Any:
        records = applied_qparams(exported_program.graph_module.graph, with_redundant=True)
        outcome = originals[0][1](self, exported_program)
        follow_kept_quantizes(records, exported_program.graph_module.graph, QPARAM_KEY)
        recorded.extend(records)
        return outcome

    def after(original: Any, pass_name: str) -> Any:
        def call(self: Any, exported_program: Any) -> Any:
            outcome = original(self, exported_program)
            nodes = {node.name: node for node in exported_program.graph_module.graph.nodes}
            for record in recorded:
                if record["redundant"]:
                    continue
                node = nodes.get(record["tensor"])
                if "overwritten_by" not in record and node is not None and QPARAM_KEY in node.meta \
                        and not _same(record["scale"], record["zero_point"], node.meta[QPARAM_KEY]):
                    record["overwritten_by"] = pass_name
            return outcome
        return call

    FoldQuantOps.call = fold
    for module_name, class_name in _PROPAGATING_PASSES:
        cls = getattr(importlib.import_module(module_name), class_name)
        originals.append((cls, cls.call))
        cls.call = after(cls.call, class_name)
    try:
        yield recorded
    finally:
        for cls, original in originals:
            cls.call = original


@contextmanager
def recording_biases() -> Iterator[list[dict[str, Any]]]:
    """Record each float bias parameter tico's QuantizeBias replaces with an integer one while
    active: the parameter (its path in the exported module), the op that adds it, and the
    integers and per-channel scales (input scale x weight scale) it wrote
    (quantization/passes/quantize_bias.py:129-132). Circle's FULLY_CONNECTED / CONV_2D add that
    bias dequantized, where torch adds the float one (``circle_bias``)."""
    from tico.quantization.passes import quantize_bias
    from tico.serialize.quant_param import QPARAM_KEY

    recorded: list[dict[str, Any]] = []
    original = quantize_bias.QuantizeBias.call

    def call(self: Any, exported_program: Any) -> Any:
        parameters = exported_program.graph_signature.inputs_to_parameters
        before = {}
        for node in exported_program.graph_module.graph.nodes:
            found = quantize_bias._get_input_weight_bias_for_bias_quantization(node) \
                if node.op == "call_function" else None
            if found is not None and found[2].op == "placeholder" and found[2].name in parameters:
                rule = [found[i].meta.get(QPARAM_KEY) for i in (0, 1)]
                before[node.name] = (found[2], parameters[found[2].name],
                                     [None if q is None or q.scale is None else [float(s) for s in q.scale]
                                      for q in rule])
        outcome = original(self, exported_program)
        for node in exported_program.graph_module.graph.nodes:
            if node.name not in before or len(node.args) < 3 or node.args[2] is before[node.name][0]:
                continue
            bias = node.args[2]
            qparam = bias.meta.get(QPARAM_KEY)
            value = exported_program.constants.get(bias.name)
            if qparam is None or qparam.scale is None or not isinstance(value, torch.Tensor):
                continue
            recorded.append({"parameter": before[node.name][1], "tensor": node.name, "op": _target(node),
                             "dtype": str(qparam.dtype), "scale": [float(s) for s in qparam.scale],
                             "zero_point": [int(z) for z in qparam.zero_point],
                             "values": [int(v) for v in value.reshape(-1).tolist()],
                             "input_scale": before[node.name][2][0], "weight_scale": before[node.name][2][1],
                             "line": _wrapper_line(node.meta.get("stack_trace"))})
        return outcome

    quantize_bias.QuantizeBias.call = call
    try:
        yield recorded
    finally:
        quantize_bias.QuantizeBias.call = original


def bias_off_rule(record: dict[str, Any], float_bias: torch.Tensor) -> str | None:
    """Why an integer bias is not the float one rounded to steps of input scale x weight scale (the
    rule tico states, quantize_bias.py:129-132), else None: the only integer bias the aligned copy
    may take over, so a bias written with another scale, rounding or a clamp is not absorbed."""
    import numpy as np

    if record.get("input_scale") is None or record.get("weight_scale") is None:
        return "its input or weight holds no qparams"
    expected = (np.asarray(record["input_scale"], dtype=np.float32)
                * np.asarray(record["weight_scale"], dtype=np.float32)).astype(np.float64)
    scale = np.asarray(record["scale"], dtype=np.float64)
    if scale.shape != expected.shape or not np.allclose(scale, expected, rtol=SCALE_REL_EQUAL, atol=0):
        return (f"its scale is not input scale x weight scale (max ratio "
                f"{float(np.max(scale / expected)) if scale.shape == expected.shape else float('nan'):.6g})")
    if any(record["zero_point"]):
        return "its zero point is not 0"
    off = bias_steps_off(record, float_bias)
    # tico divides in float32 (quantize_bias.py:130) and the runtime dequantizes in float32: each is off by
    # up to |q| float32 half-ulps, so a large integer bias (a small input x weight scale) reads a little
    # over the half step on clean tico (0.5145 steps at |q| 1.4e5, gemma4_vision_model static_runtime)
    slack = 2 * float(np.finfo(np.float32).eps) * (np.abs(np.asarray(record["values"], dtype=np.float64)) + 1)
    if (off > 0.5 + 1e-3 + slack).any():
        return (f"it is {float(off.max()):.3g} steps from the float bias (more than the half step of rounding "
                f"and float32's error at that integer)")
    return None


def bias_steps_off(record: dict[str, Any], float_bias: torch.Tensor):
    """Per output channel, how far the bias Circle adds (``circle_bias``) is from the float bias, in steps
    of the record's bias scale (a numpy array; scripts/trace_replay.py prints it beside each bias's size)."""
    import numpy as np

    scale = np.asarray(record["scale"], dtype=np.float64)
    return ((circle_bias(record).double() - float_bias.detach().double().reshape(-1)).abs()
            / torch.from_numpy(scale)).numpy()


def circle_bias(record: dict[str, Any]) -> torch.Tensor:
    """The bias Circle's kernel adds for a ``recording_biases`` record: the integers dequantized
    as tico's runtime dequantizes a constant (circle/runtime/quantization.py, dequantize_array:
    ``(float32(q) - zp) * scale`` in float32, per channel)."""
    import numpy as np

    values = np.asarray(record["values"], dtype=np.int64).astype(np.float32)
    scale = np.asarray(record["scale"], dtype=np.float32)
    zero_point = np.asarray(record["zero_point"], dtype=np.float32)
    return torch.from_numpy(((values - zero_point) * scale).astype(np.float32, copy=False))


def _same(scale: float, zero_point: int, qparam: Any) -> bool:
    if qparam is None or qparam.scale is None or len(qparam.scale) != 1:
        return False
    held = float(qparam.scale[0])
    return math.isclose(held, scale, rel_tol=SCALE_REL_EQUAL) and int(qparam.zero_point[0]) == zero_point


# aten ops that become Circle data-movement operators (RESHAPE, TRANSPOSE, SQUEEZE, EXPAND_DIMS,
# BROADCAST_TO, SLICE/STRIDED_SLICE, GATHER-free SELECT, CONCATENATION, SPLIT): neither integer
# backends nor tico's reference runtime requantize their output (circle/runtime/executor.py:350,
# kernels/__init__.py VALUE_PRESERVING_BUILTIN_NAMES), so the value they produce carries the
# quantization of their input whatever qparams the output tensor holds.
_VALUE_PRESERVING = frozenset({
    "aten.reshape.default", "aten.view.default", "aten.permute.default", "aten.transpose.int",
    "aten.squeeze.dim", "aten.squeeze.dims", "aten.squeeze.default", "aten.unsqueeze.default",
    "aten.expand.default", "aten.slice.Tensor", "aten.select.int", "aten.cat.default", "aten.clone.default",
})


def _target(node: torch.fx.Node) -> str:
    target = node.target
    return str(target) if isinstance(target, torch._ops.OpOverload) else getattr(target, "__name__", str(target))


def _value_inputs(node: torch.fx.Node) -> list[torch.fx.Node] | None:
    """The tensors a data-movement node's value comes from, or None for any other node."""
    if node.op != "call_function":
        return None
    target = _target(node)
    if target == "getitem" and isinstance(node.args[0], torch.fx.Node) \
            and _target(node.args[0]) == "aten.split_with_sizes.default":
        return [node.args[0].args[0]]
    if target == "aten.cat.default":
        return [arg for arg in node.args[0] if isinstance(arg, torch.fx.Node)]
    if target == "aten.embedding.default" and isinstance(node.args[0], torch.fx.Node):
        return [node.args[0]]  # GATHER: the rows of the table, as the table is quantized
    if target in _VALUE_PRESERVING and isinstance(node.args[0], torch.fx.Node):
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
    if any(c == PER_CHANNEL or (isinstance(c, tuple) and c[0] is not None and c[0].scale is not None
                                and len(c[0].scale) > 1) for c in carried):
        return PER_CHANNEL
    if any(c is None or c[0] is None or c[0].scale is None or len(c[0].scale) != 1 for c in carried):
        return None
    first = carried[0]
    if any(not _same(float(first[0].scale[0]), int(first[0].zero_point[0]), c[0]) for c in carried[1:]):
        return MIXED
    return first


# Ops tico's PropagateQParamForward copies qparams through, input to output (SPLIT outputs, SLICE,
# NEG: quantization/passes/propagate_qparam_forward.py:108-142), and the data-movement ops whose
# output inherits its input's (FoldQuantOps' _inherit_qparam_from_view_chain).
_FORWARD_FROM_INPUT = _VALUE_PRESERVING | {"aten.neg.default", "aten.split_with_sizes.default"}


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


def qparam_source(node: torch.fx.Node, scale: float, zero_point: int, by_tensor: dict[str, dict[str, Any]],
                  qparam_key: str) -> str | None:
    """Where the qparams (``scale``, ``zero_point``) a pass gave ``node`` come from, as a named torch
    fake-quant: one applied (with exactly these qparams) to the value ``node`` is computed from,
    through the SPLIT / SLICE / NEG / data-movement chain PropagateQParamForward copies along; or to
    a concatenation ``node`` feeds, directly or through data-movement ops, as PropagateQParamBackward
    copies (propagate_qparam_backward.py:73-81). None when they are neither: a propagation that
    produced qparams no torch observer applied there (which aligning torch to them would absorb)."""
    def applied_here(candidate: torch.fx.Node) -> dict[str, Any] | None:
        record = by_tensor.get(candidate.name)
        if record is not None and candidate is not node and math.isclose(record["scale"], scale, rel_tol=SCALE_REL_EQUAL) \
                and record["zero_point"] == zero_point:
            return record
        return None

    producer, depth = _input_of(node), 0
    while producer is not None and depth < 64:
        record = applied_here(producer)
        if record is not None:
            return f"{record.get('observer') or record['tensor']} (the fake-quant of {producer.name}, the value it is computed from)"
        producer, depth = _input_of(producer), depth + 1
    frontier, depth = [node], 0
    while frontier and depth < 16:
        following = []
        for current in frontier:
            for user in current.users:
                if _target(user) == "aten.cat.default":
                    record = applied_here(user)
                    if record is not None and _same(scale, zero_point, user.meta.get(qparam_key)):
                        return f"{record.get('observer') or record['tensor']} (the fake-quant of {user.name}, the concatenation it feeds)"
                elif _target(user) in _VALUE_PRESERVING:
                    following.append(user)
        frontier, depth = following, depth + 1
    return None


def overwritten_qparams(applied: list[dict[str, Any]], program: Any
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
            found.append(dict(record, circle_scale=None, circle_zero_point=None, circle_source=None,
                              circle_per_channel=True))
            continue
        qparam, source = carried if carried is not None else (node.meta.get(QPARAM_KEY) if node is not None else None,
                                                              node)
        if _same(record["scale"], record["zero_point"], qparam):
            continue
        held = qparam is not None and qparam.scale is not None and len(qparam.scale) == 1
        kept_from = source.name if source is not None and source is not node else None
        # The qparams the tensor itself holds (for a data-movement op: what an integer backend reads
        # its values with) and the named torch fake-quant they are; None when they are no such.
        own = node.meta.get(QPARAM_KEY)
        own_held = own is not None and own.scale is not None and len(own.scale) == 1
        found.append(dict(record, circle_scale=float(qparam.scale[0]) if held else None,
                          circle_zero_point=int(qparam.zero_point[0]) if held else None,
                          circle_source=kept_from,
                          held_scale=float(own.scale[0]) if own_held else None,
                          held_zero_point=int(own.zero_point[0]) if own_held else None,
                          qparam_source=(None if not own_held
                                         else f"{record.get('observer') or record['tensor']} (its own fake-quant: "
                                              f"the tensor keeps them, its value its input's quantization)"
                                         if _same(record["scale"], record["zero_point"], own)
                                         else qparam_source(node, float(own.scale[0]), int(own.zero_point[0]),
                                                            by_tensor, QPARAM_KEY))))
    return found, vanished


def unpinned(record: dict[str, Any]) -> bool:
    """An overwritten record whose tensor holds qparams a pass gave it (the replacement the aligned
    copy applies, or, for a data-movement op, the quantization its value is declared to carry)
    that are no named torch fake-quant's (``qparam_source``)."""
    return (record.get("held_scale") is not None and not record.get("circle_mixed")
            and not record.get("circle_per_channel") and not record.get("qparam_source"))


def describe_unpinned(record: dict[str, Any]) -> str:
    return (f"tensor {record['tensor']} ({record['line']}, {record.get('observer') or 'observer not identified'}): "
            f"the Circle model holds scale {record['held_scale']:.6g} zp {record['held_zero_point']}, the qparams "
            f"of no fake-quant torch applied to the value it is computed from or to a concatenation it feeds "
            f"(replaced by {record.get('overwritten_by') or 'a later conversion step'}): a propagation of qparams no "
            f"observer chose, which aligning torch to them would absorb")


def describe(record: dict[str, Any]) -> str:
    """One line naming the tensor, where torch quantizes it, and the two sets of qparams."""
    torch_side = f"scale {record['scale']:.6g} zp {record['zero_point']}"
    if record.get("circle_mixed"):
        return (f"tensor {record['tensor']} ({record['line']}, {record.get('observer') or 'observer not identified'}): "
                f"torch fake-quantizes it with {torch_side}, the Circle model holds its inputs' quantizations "
                f"unchanged, and they differ (a concatenation does not requantize)")
    if record.get("circle_per_channel"):
        return (f"tensor {record['tensor']} ({record['line']}, {record.get('observer') or 'observer not identified'}): "
                f"torch fake-quantizes it with {torch_side}, the Circle model keeps the per-channel quantization "
                f"of the table it gathers from (a data-movement op does not requantize)")
    if record["circle_scale"] is None:
        circle_side = "no qparams (the fake-quant was dropped)"
    else:
        circle_side = f"scale {record['circle_scale']:.6g} zp {record['circle_zero_point']}"
    observer = record.get("observer") or "observer not identified"
    if record.get("circle_source"):
        why = f"a data-movement op, it keeps the quantization of {record['circle_source']}"
    else:
        why = f"replaced by {record.get('overwritten_by') or 'a later conversion step'}"
    return (f"tensor {record['tensor']} ({record['line']}, {observer}): torch fake-quantizes it with {torch_side}, "
            f"the Circle model holds {circle_side} ({why})")


def _live_nodes(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """Nodes the graph output depends on."""
    live: set[torch.fx.Node] = set()
    stack = [node for node in graph.nodes if node.op == "output"]
    while stack:
        node = stack.pop()
        if node in live:
            continue
        live.add(node)
        stack.extend(node.all_input_nodes)
    return live


def observer_fake_quants(program: Any) -> list[tuple[str | None, float, int]]:
    """(observer path, scale, zero point) of every live per-tensor fake-quant of the program
    torch.export produced, in graph order (the order tico's decomposition numbers them in): tico's observers pass their ``_cached_scale`` buffer, whose
    name is the observer's path. Read before tico decomposes the graph (the buffers become
    numbers then)."""
    signature = program.graph_signature
    names = {**signature.inputs_to_buffers, **signature.inputs_to_lifted_tensor_constants}
    values = {**dict(program.named_buffers()), **program.constants}
    live = _live_nodes(program.graph_module.graph)
    found = []
    for node in program.graph_module.graph.nodes:
        if node.op != "call_function" or "fake_quantize_per_tensor_affine" not in str(node.target):
            continue
        if node not in live:
            continue  # dead code (e.g. attention weights the export does not return): tico drops it first
        scale, zero_point = node.args[1], node.args[2]
        while isinstance(scale, torch.fx.Node) and scale.op == "call_function":
            scale = scale.args[0]
        while isinstance(zero_point, torch.fx.Node) and zero_point.op == "call_function":
            zero_point = zero_point.args[0]
        fqn = names.get(scale.name) if isinstance(scale, torch.fx.Node) else None
        zp_fqn = names.get(zero_point.name) if isinstance(zero_point, torch.fx.Node) else None
        if fqn in values and zp_fqn in values:
            found.append((fqn.removesuffix("._cached_scale"), float(values[fqn].reshape(-1)[0]),
                          int(values[zp_fqn].reshape(-1)[0])))
        else:
            found.append((None, float(scale) if isinstance(scale, float) else float("nan"),
                          int(zero_point) if isinstance(zero_point, int) else 0))
    return found


def attribute_observers(applied: list[dict[str, Any]], observers: list[tuple[str | None, float, int]]) -> str | None:
    """Name each applied record's observer (``record["observer"]``) from the fake-quant it was
    traced from, checked by its qparams. Returns why attribution was refused (then no record
    names an observer), else None."""
    for record in applied:
        index = record["traced_index"]
        if index is None or index >= len(observers):
            return f"quantize on tensor {record['tensor']} has no traceable origin among {len(observers)} fake-quants"
        path, scale, zero_point = observers[index]
        if not (math.isclose(scale, record["scale"], rel_tol=SCALE_REL_EQUAL) and zero_point == record["zero_point"]):
            return (f"quantize on tensor {record['tensor']} (scale {record['scale']:.6g} zp {record['zero_point']}) "
                    f"does not match fake-quant #{index} torch.export traced (scale {scale:.6g} zp {zero_point})")
    for record in applied:
        record["observer"] = observers[record["traced_index"]][0]
    return None


def aligned_to_circle(root: torch.nn.Module, applied: list[dict[str, Any]], overwritten: list[dict[str, Any]],
                      requantized: list[dict[str, Any]] = (), redundant: list[dict[str, Any]] = (),
                      circle_rounding: bool = True, circle_kernels: bool | frozenset[str] = True,
                      inputs: list | None = None, biases: list[dict[str, Any]] = ()
                      ) -> tuple[torch.nn.Module | None, list[str]]:
    """A private copy of ``root`` whose observers apply the qparams the Circle model holds for
    each overwritten tensor (a dropped fake-quant, or one on a data-movement op, which Circle
    never requantizes, is switched off), and which fake-quantizes each ``requantized`` value
    (``requantized_unapplied``) as Circle requantizes it, whose ``redundant`` fake-quants
    (dropped by FoldQuantOps) are off, and whose per-tensor fake-quants round as Circle's runtime
    does (``circle_fake_quant``; ``circle_rounding``) and whose ops with a Circle kernel of other
    arithmetic compute as that kernel (``_CIRCLE_KERNELS``; ``circle_kernels``: all, none, or the
    Circle operators named) -- the two switches exist for the reproduction tests: the smallest change that
    makes torch quantize what Circle quantizes. None, with the reasons, when an overwritten
    tensor's observer is unknown, or an observer also quantizes a tensor Circle holds as torch
    does (changing it would change that tensor too), or would need two replacements. ``inputs``
    (the Circle inputs' quantization, ``CircleArtifact.input_quantization``): each quantized graph
    input is fake-quantized on entry, as Circle's runtime does (circle/runtime/executor.py:236-237),
    so every user of it reads it quantized, not only its observer. ``biases`` (``recording_biases``):
    each bias parameter QuantizeBias made integer holds the value Circle's kernel adds
    (``circle_bias``) instead of the float one."""
    why = [f"tensor {record['tensor']}: its observer is not known" for record in overwritten
           if not record.get("observer")]
    parameters = dict(root.named_parameters(remove_duplicate=False))
    bias_values: dict[str, torch.Tensor] = {}
    for record in biases:
        value = circle_bias(record)
        held = parameters.get(record["parameter"])
        if held is None or held.shape != value.shape:
            why.append(f"bias {record['parameter']} of {record['tensor']}: no parameter of that shape in the module")
        elif bias_off_rule(record, held) is not None:
            why.append(f"bias {record['parameter']} of {record['tensor']} ({record['line']}): the Circle model's integer "
                       f"bias is not the rounded float bias: {bias_off_rule(record, held)}")
        elif record["parameter"] in bias_values and not torch.equal(bias_values[record["parameter"]], value):
            why.append(f"bias {record['parameter']} is quantized with two scales (one parameter, two integer biases)")
        else:
            bias_values[record["parameter"]] = value
    changed = {(record["ordinal"]) for record in overwritten}
    wanted: dict[str, tuple] = {}
    for record in overwritten:
        if not record.get("observer"):
            continue
        # A data-movement op applies no quantization in Circle: its value is its input's.
        keeps_input = record.get("circle_source") or record.get("circle_mixed") or record.get("circle_per_channel")
        target = (None, None) if keeps_input else (record["circle_scale"], record["circle_zero_point"])
        if wanted.setdefault(record["observer"], target) != target:
            why.append(f"observer {record['observer']} would need two replacements ({wanted[record['observer']]} "
                       f"and {target})")
    # Only a replacement whose qparams are those of a named torch fake-quant is applied (qparam_source).
    why += [f"tensor {record['tensor']}: Circle holds scale {record['held_scale']:.6g} zp "
            f"{record['held_zero_point']}, the qparams of no fake-quant torch applied to its input or to a "
            f"concatenation it feeds" for record in overwritten if unpinned(record)]
    # Only a requantization whose qparams come from where the diagnosis says (the concatenation
    # it feeds, PropagateQParamBackward) is modelled; any other would be absorbed unexplained.
    why += [f"tensor {record['tensor']} ({record['op']}): Circle requantizes it with scale {record['scale']:.6g} zp "
            f"{record['zero_point']}, " + ("qparams of no fake-quant torch applied to it" if record.get("shared_with")
                                           is not None else "qparams of no concatenation it feeds")
            + " (not what the diagnosis explains)"
            for record in requantized if not record.get("qparam_from")]
    for record in applied:
        if record["ordinal"] not in changed and record.get("observer") in wanted:
            why.append(f"observer {record['observer']} also quantizes tensor {record['tensor']}, which the Circle "
                       f"model holds with the same qparams")
    # A fake-quant FoldQuantOps dropped (it re-applied its input's qparams) is absent from the
    # Circle model: off in the copy, unless its observer also applies a kept fake-quant.
    kept = {record.get("observer") for record in applied}
    dropped = {record["observer"] for record in redundant if record.get("observer") and record["observer"] not in kept
               and record["observer"] not in wanted}
    if why:
        return None, why
    twin = copy.deepcopy(root)
    twin_parameters = dict(twin.named_parameters(remove_duplicate=False))
    with torch.no_grad():
        for path, value in bias_values.items():
            twin_parameters[path].copy_(value)
    for path in sorted(dropped):
        twin.get_submodule(path).fake_quant_enabled = False
    if circle_rounding:
        _quantizes_as_circle(twin, {record["observer"] for record in applied if record.get("observer")})
    for path, (scale, zero_point) in wanted.items():
        observer = twin.get_submodule(path)
        if scale is None:
            observer.fake_quant_enabled = False
            continue
        observer._cached_scale = torch.full_like(observer._cached_scale, scale)
        observer._cached_zp = torch.full_like(observer._cached_zp, zero_point)
    return _Requantizing(twin, list(requantized), circle_kernels, inputs, circle_rounding), []


# Elementwise aten ops whose Circle kernel requantizes its output to the qparams its tensor holds
# (tico's runtime requantizes every operator outside VALUE_PRESERVING_BUILTIN_NAMES and
# QUANTIZE/DEQUANTIZE: circle/runtime/executor.py:349-353). torch applies no fake-quant where the
# wrapper applies none; a propagation pass can still give such a node qparams (PropagateQParamBackward
# gives a concatenation's inputs its output's, propagate_qparam_backward.py:73-81), and then Circle
# quantizes a value torch keeps in float.
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
        value = node.meta.get("val")
        # Where the qparams come from: the concatenation it feeds, as PropagateQParamBackward copies them,
        # and only where they are what torch's fake-quant of that concatenation applied.
        origin = next((user.name for user in node.users if _target(user) == "aten.cat.default"
                       and _same(float(qparam.scale[0]), int(qparam.zero_point[0]), user.meta.get(QPARAM_KEY))
                       and user.name in by_tensor
                       and _same(by_tensor[user.name]["scale"], by_tensor[user.name]["zero_point"], qparam)), None)
        found.append({"tensor": node.name, "op": target, "call_index": index, "qparam_from": origin,
                      "scale": float(qparam.scale[0]),
                      "zero_point": int(qparam.zero_point[0]), "qmin": qmin, "qmax": qmax,
                      "shape": tuple(value.shape) if isinstance(value, torch.Tensor) else None,
                      "line": _wrapper_line(node.meta.get("stack_trace")), "module": _module_path(node)})
    # A value torch fake-quantizes for one user only, which FoldQuantOps quantized for all of them
    # (``float_users``): Circle's operator requantizes its output (executor.py:349-364), and every
    # user reads that. Its qparams must be the ones that fake-quant applied.
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
        value = node.meta.get("val")
        origin = record.get("observer") or record["tensor"] if _same(record["scale"], record["zero_point"], qparam) else None
        found.append({"tensor": node.name, "op": _target(node), "call_index": call_index[node.name], "qparam_from": origin,
                      "shared_with": record["float_users"], "observer": record.get("observer"),
                      "scale": float(qparam.scale[0]), "zero_point": int(qparam.zero_point[0]), "qmin": qmin, "qmax": qmax,
                      "shape": tuple(value.shape) if isinstance(value, torch.Tensor) else None,
                      "line": _wrapper_line(node.meta.get("stack_trace")), "module": _module_path(node)})
    for record in found:  # how many calls of the op the graph makes: the eager run must make as many
        record["calls"] = counts[record["op"]]
    return found


def describe_requantized(record: dict[str, Any]) -> str:
    if record.get("shared_with") is not None:
        origin = (f"the qparams of {record['qparam_from']}, which FoldQuantOps folded onto it" if record.get("qparam_from")
                  else "qparams of no fake-quant torch applied to it")
        return (f"tensor {record['tensor']} ({record['line']}, {record['op']}): torch fake-quantizes it only where "
                f"{record.get('observer') or 'one observer'} reads it and {', '.join(record['shared_with'])} read(s) "
                f"it in float; the Circle model quantizes it for every user with scale {record['scale']:.6g} zp "
                f"{record['zero_point']} ({origin})")
    origin = (f"the qparams of the concatenation {record['qparam_from']} it feeds" if record.get("qparam_from")
              else "qparams of no concatenation it feeds")
    return (f"tensor {record['tensor']} ({record['line']}, {record['op']}): torch applies no fake-quant, the "
            f"Circle model requantizes it with scale {record['scale']:.6g} zp {record['zero_point']} "
            f"(range {record['qmin']}..{record['qmax']}; {origin})")


def circle_fake_quant(x: torch.Tensor, scale: float | torch.Tensor, zero_point: int | torch.Tensor, qmin: int, qmax: int
                      ) -> torch.Tensor:
    """Fake-quantize as tico's Circle runtime does (circle/runtime/quantization.py, quantize_array:
    ``round_half_away_from_zero(value / scale) + zero_point``, clipped, then ``(q - zp) * scale``, in
    float32). torch's fake_quantize_per_tensor_affine computes ``nearbyint(x * (1 / scale))``
    instead: a tie goes to the even level, and the reciprocal moves a value lying exactly on a
    tie (e.g. a calibrated minimum, ``-127.5`` steps from the zero point) off it, so the two land on
    adjacent levels there."""
    scale = torch.as_tensor(scale, dtype=torch.float32).reshape(())
    zero_point = torch.as_tensor(zero_point, dtype=torch.float32).reshape(())
    value = x.to(torch.float32) / scale
    rounded = torch.where(value >= 0, torch.floor(value + 0.5), torch.ceil(value - 0.5))
    return ((torch.clamp(rounded + zero_point, qmin, qmax) - zero_point) * scale).to(x.dtype)


# > 0 while an observer of the aligned copy fake-quantizes: the ops it dispatches are no graph op.
_IN_FAKE_QUANT = [0]


def _circle_observer_fake_quant(observer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    if not observer.fake_quant_enabled:
        return x
    _IN_FAKE_QUANT[0] += 1
    try:
        return circle_fake_quant(x, observer._cached_scale, observer._cached_zp, observer.dtype.qmin,
                                 observer.dtype.qmax)
    finally:
        _IN_FAKE_QUANT[0] -= 1


def _quantizes_as_circle(twin: torch.nn.Module, runtime_observers: set[str]) -> int:
    """Give Circle's quantize arithmetic to every per-tensor observer of ``twin`` whose fake-quant
    Circle's runtime applies (``runtime_observers``: those of the activation fake-quants
    FoldQuantOps folds into qparams); how many. An observer of a constant (a weight) is left as
    it is: tico quantizes a constant once, at conversion, with torch's own arithmetic."""
    import types

    count = 0
    runtime = {id(twin.get_submodule(path)) for path in runtime_observers}
    for module in twin.modules():
        if id(module) not in runtime:
            continue
        scale = getattr(module, "_cached_scale", None)
        if isinstance(scale, torch.Tensor) and scale.numel() == 1 and getattr(module, "channel_axis", None) is None \
                and hasattr(module, "fake_quant") and hasattr(module, "dtype"):
            module.fake_quant = types.MethodType(_circle_observer_fake_quant, module)
            count += 1
    return count


def _circle_rms_norm(hidden_states: torch.Tensor, weight: torch.Tensor, eps: float = 1e-06) -> torch.Tensor:
    """RMS_NORM as tico's Circle runtime computes it (circle/runtime/kernels/nn.py:628-632): in
    float64, ``gamma * (x / sqrt(mean(x * x) + eps))``, cast back. tico's torch op
    circle_custom::rms_norm (utils/register_custom_op.py:1078-1082) computes in float32,
    ``weight * (x * rsqrt(mean(x ** 2) + eps))``: the results differ in the last bits, and a value
    near a rounding boundary of the following fake-quant lands on the adjacent level."""
    source = hidden_states.to(torch.float64)
    rms = torch.sqrt((source * source).mean(-1, keepdim=True) + eps)
    return (weight.to(torch.float64) * (source / rms)).to(hidden_states.dtype)


def _circle_mm(lhs: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    """FULLY_CONNECTED as tico's Circle runtime computes it (circle/runtime/kernels/nn.py:428-429):
    ``np.matmul(value.reshape(-1, input_size), weights.T)`` in float32, numpy's BLAS. torch's linear
    reaches aten.mm (the input flattened to 2-D, the weight transposed, as there) and computes it
    with torch's own GEMM kernel, which sums in another order: the results differ in the last
    bits, and a value near a rounding boundary of the following fake-quant lands on the adjacent
    level. ``rhs`` is the transposed weight; the product is taken as the kernel takes it."""
    import numpy as np

    weights = np.ascontiguousarray(rhs.detach().numpy().T)
    value = np.ascontiguousarray(lhs.detach().numpy())
    return torch.from_numpy(np.matmul(value, weights.T).astype(np.float32, copy=False))


def _circle_addmm(bias: torch.Tensor, lhs: torch.Tensor, rhs: torch.Tensor, *, beta: float = 1,
                  alpha: float = 1) -> torch.Tensor:
    """FULLY_CONNECTED with a bias (circle/runtime/kernels/nn.py:428-431): the product as
    ``_circle_mm``, then the bias added in float32 (torch's addmm accumulates it in the GEMM)."""
    import numpy as np

    if beta != 1 or alpha != 1:
        raise RuntimeError(f"aten.addmm with beta {beta} / alpha {alpha} is no FULLY_CONNECTED")
    product = _circle_mm(lhs, rhs).numpy()
    return torch.from_numpy((product + bias.detach().numpy().reshape(1, -1)).astype(np.float32, copy=False))


def _circle_softmax(value: torch.Tensor, dim: int, half_to_float: bool = False) -> torch.Tensor:
    """SOFTMAX as tico's Circle runtime computes it (circle/runtime/kernels/reduction.py:149-159): numpy
    float32 over the last axis, ``exp(x - max) / sum(exp(x - max))``. torch's softmax uses its own
    vectorized exp and summation order; the results differ in the last bits, and over a long row
    (gemma4_vision_encoder_layer at static_runtime: 2520 keys) a probability near a rounding boundary
    of the softmax fake-quant lands on the adjacent level."""
    import numpy as np

    if half_to_float:
        raise RuntimeError("aten._softmax with half_to_float is no SOFTMAX of a float32 graph")
    # contiguous, as the runtime's input is: numpy's pairwise summation follows the memory layout
    array = np.ascontiguousarray(np.moveaxis(value.detach().numpy(), dim, -1))
    shifted = (array - np.max(array, axis=-1, keepdims=True)) * array.dtype.type(1.0)
    exponent = np.exp(shifted)
    out = (exponent / np.sum(exponent, axis=-1, keepdims=True)).astype(array.dtype)
    return torch.from_numpy(np.ascontiguousarray(np.moveaxis(out, -1, dim)))


def _circle_bmm(lhs: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    """BATCH_MATMUL as tico's Circle runtime computes it (circle/runtime/kernels/nn.py:442-468):
    ``np.matmul(lhs, rhs)`` in float32. torch's bmm sums in another order (its own GEMM); over a long
    contraction (Gemma4's 512-wide global heads at static_runtime) a logit near a rounding boundary of
    ``obs_logits_raw`` lands on the adjacent level."""
    import numpy as np

    out = np.matmul(lhs.detach().numpy(), rhs.detach().numpy())
    return torch.from_numpy(np.ascontiguousarray(out).astype(np.float32, copy=False))


def _circle_gelu(value: torch.Tensor, *, approximate: str = "none") -> torch.Tensor:
    """GELU as tico's Circle runtime computes it (circle/runtime/kernels/elementwise.py:160-174): in
    float64, the tanh form ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`` or the exact one with
    ``math.erf`` per element, cast back. torch computes GELU in float32 with its own vectorized tanh /
    erf: the last bits differ, and a value near a rounding boundary of the following fake-quant lands
    on the adjacent level."""
    import math

    import numpy as np

    x = value.detach().numpy().astype(np.float64)
    if approximate == "tanh":
        result = 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * np.power(x, 3))))
    elif approximate == "none":
        result = 0.5 * x * (1.0 + np.vectorize(math.erf, otypes=[np.float64])(x / math.sqrt(2.0)))
    else:
        raise RuntimeError(f"aten.gelu with approximate={approximate!r} is no Circle GELU")
    return torch.from_numpy(result.astype(value.detach().numpy().dtype))


# torch ops the aligned copy computes with the arithmetic of the Circle kernel they become, by
# Circle operator.
_CIRCLE_KERNELS = {
    "RMS_NORM": {"circle_custom.rms_norm.default": _circle_rms_norm},
    "FULLY_CONNECTED": {"aten.mm.default": _circle_mm, "aten.addmm.default": _circle_addmm},
    "SOFTMAX": {"aten._softmax.default": _circle_softmax},
    "GELU": {"aten.gelu.default": _circle_gelu},
    "BATCH_MATMUL": {"aten.bmm.default": _circle_bmm},
}


def _kernels(chosen: bool | frozenset[str]) -> dict[str, Any]:
    """The torch op -> Circle kernel map for ``chosen`` (True: all, False: none, else those named)."""
    names = set(_CIRCLE_KERNELS) if chosen is True else set() if chosen is False else set(chosen)
    unknown = names - set(_CIRCLE_KERNELS)
    if unknown:
        raise ValueError(f"no Circle kernel is modelled for {sorted(unknown)}")
    return {op: fn for name in sorted(names) for op, fn in _CIRCLE_KERNELS[name].items()}


class _Requantizing(torch.nn.Module):
    """Runs ``inner`` as the Circle runtime computes: ops with a Circle kernel of other arithmetic
    (``_CIRCLE_KERNELS``) computed that way, and the outputs of the listed op calls fake-quantized
    as Circle requantizes them. Refuses (RuntimeError) when the eager run calls an op another
    number of times than the graph, or a call's value has another shape: then the calls cannot
    be matched to the nodes."""

    def __init__(self, inner: torch.nn.Module, requantized: list[dict[str, Any]], kernels: bool | frozenset[str] = True,
                 inputs: list | None = None, rounding: bool = True):
        super().__init__()
        self.inner = inner
        self.requantized = requantized
        self.kernels = _kernels(kernels)
        self.inputs = list(inputs or [])
        self.rounding = rounding

    def _quantized_inputs(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """The call's tensor leaves (the Circle inputs, in order) fake-quantized with the qparams the
        Circle input holds, as the runtime quantizes a quantized graph input on entry."""
        import numpy as np

        if not self.inputs:
            return args, kwargs
        leaves, spec = compat.tree_flatten((args, kwargs))
        position = 0
        for index, leaf in enumerate(leaves):
            if not isinstance(leaf, torch.Tensor):
                continue
            quant = self.inputs[position] if position < len(self.inputs) else None
            position += 1
            if quant is None or len(quant[0]) != 1:
                continue
            info = np.iinfo(np.dtype(quant[2]))
            if self.rounding:
                leaves[index] = circle_fake_quant(leaf, quant[0][0], quant[1][0], int(info.min), int(info.max))
            else:  # torch's arithmetic, for the reproduction of the rounding diagnosis
                leaves[index] = torch.fake_quantize_per_tensor_affine(leaf, float(quant[0][0]), int(quant[1][0]),
                                                                      int(info.min), int(info.max))
        return compat.tree_unflatten(leaves, spec)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        by_call = {(record["op"], record["call_index"]): record for record in self.requantized}
        expected = {record["op"]: record["calls"] for record in self.requantized}
        kernels = self.kernels
        seen: dict[str, int] = {}

        class Mode(compat.torch_dispatch_mode()):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                name = str(func)
                if _IN_FAKE_QUANT[0]:
                    return func(*args, **(kwargs or {}))
                if name in kernels:
                    return kernels[name](*args, **(kwargs or {}))
                out = func(*args, **(kwargs or {}))
                if name not in expected:
                    return out
                index = seen.get(name, 0)
                seen[name] = index + 1
                record = by_call.get((name, index))
                if record is None:
                    return out
                # tuple() on both sides: a record read back from the Circle cache holds a JSON list
                if record["shape"] is not None and tuple(out.shape) != tuple(record["shape"]):
                    raise RuntimeError(f"call {index} of {name} has shape {tuple(out.shape)}, the graph's "
                                       f"{record['tensor']} {record['shape']}")
                return circle_fake_quant(out, record["scale"], record["zero_point"], record["qmin"], record["qmax"])

        args, kwargs = self._quantized_inputs(args, kwargs)
        with Mode():
            outcome = self.inner(*args, **kwargs)
        if seen != expected:
            raise RuntimeError(f"the eager run called {seen}, the graph {expected}")
        return outcome
