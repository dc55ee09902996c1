"""What each torch fake-quant applied, recorded while tico converts: the qparams, the tensor that
carries them after FoldQuantOps (its producer, or the QUANTIZE op FoldQuantOps keeps), the wrapper
line and module, the observer that applied them (``attribute_observers``), the qparam-propagating
pass that first overwrote them, and the biases QuantizeBias made integer. harness/circle/consistency.py
compares these records with what the converted Circle model holds."""

from __future__ import annotations

import math
import re
from contextlib import contextmanager
from typing import Any, Iterator

import torch

from harness.circle.missing_qparams import target_name as _target

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
        # FoldQuantOps puts these qparams on the producer itself (fold_quant_ops.py
        # ``FoldQuantOps.call``), so in Circle every other user of the value reads it quantized; in torch
        # the users that are not this fake-quant read it in float (e.g. a residual beside its norm's input
        # observer).
        float_users = (
            []
            if carrier != producer.name
            else sorted(
                user.name
                for user in producer.users
                if user is not q and not (user.op == "call_function" and user.target == q_target)
            )
        )
        records.append(
            {
                "ordinal": ordinal,
                "redundant": redundant,
                "traced_index": _traced_index(q),
                "tensor": carrier,
                "quantize": q.name,
                "float_users": float_users,
                "scale": scale,
                "zero_point": zero_point,
                "qmin": qmin,
                "qmax": qmax,
                "module": _module_path(q),
                "line": _wrapper_line(producer.meta.get("stack_trace") or q.meta.get("stack_trace")),
            }
        )
    return records


def follow_kept_quantizes(records: list[dict[str, Any]], folded: torch.fx.Graph, qparam_key: str) -> None:
    """Where FoldQuantOps kept a fake-quant as its own QUANTIZE op holding its qparams (tico from
    0.4: the producer has other users, is an embedding, or already holds qparams inherited through
    a view chain), that op carries them, and the producer's other users read the value as torch
    does: the record's carrier becomes the QUANTIZE op and it has no float users."""
    nodes = {node.name: node for node in folded.nodes}
    for record in records:
        kept = nodes.get(record.get("quantize", ""))
        if (
            kept is not None
            and record["tensor"] != kept.name
            and _same(record["scale"], record["zero_point"], kept.meta.get(qparam_key))
        ):
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
                if (
                    "overwritten_by" not in record
                    and node is not None
                    and QPARAM_KEY in node.meta
                    and not _same(record["scale"], record["zero_point"], node.meta[QPARAM_KEY])
                ):
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
    (quantization/passes/quantize_bias.py ``QuantizeBias.call``). Circle's FULLY_CONNECTED / CONV_2D add
    that bias dequantized, where torch adds the float one (``circle_bias``)."""
    from tico.quantization.passes import quantize_bias
    from tico.serialize.quant_param import QPARAM_KEY

    recorded: list[dict[str, Any]] = []
    original = quantize_bias.QuantizeBias.call

    def call(self: Any, exported_program: Any) -> Any:
        parameters = exported_program.graph_signature.inputs_to_parameters
        before = {}
        for node in exported_program.graph_module.graph.nodes:
            found = (
                quantize_bias._get_input_weight_bias_for_bias_quantization(node) if node.op == "call_function" else None
            )
            if found is not None and found[2].op == "placeholder" and found[2].name in parameters:
                rule = [found[i].meta.get(QPARAM_KEY) for i in (0, 1)]
                before[node.name] = (
                    found[2],
                    parameters[found[2].name],
                    [None if q is None or q.scale is None else [float(s) for s in q.scale] for q in rule],
                )
        outcome = original(self, exported_program)
        for node in exported_program.graph_module.graph.nodes:
            if node.name not in before or len(node.args) < 3 or node.args[2] is before[node.name][0]:
                continue
            bias = node.args[2]
            qparam = bias.meta.get(QPARAM_KEY)
            value = exported_program.constants.get(bias.name)
            if qparam is None or qparam.scale is None or not isinstance(value, torch.Tensor):
                continue
            recorded.append(
                {
                    "parameter": before[node.name][1],
                    "tensor": node.name,
                    "op": _target(node),
                    "dtype": str(qparam.dtype),
                    "scale": [float(s) for s in qparam.scale],
                    "zero_point": [int(z) for z in qparam.zero_point],
                    "values": [int(v) for v in value.reshape(-1).tolist()],
                    "input_scale": before[node.name][2][0],
                    "weight_scale": before[node.name][2][1],
                    "line": _wrapper_line(node.meta.get("stack_trace")),
                }
            )
        return outcome

    quantize_bias.QuantizeBias.call = call
    try:
        yield recorded
    finally:
        quantize_bias.QuantizeBias.call = original


def bias_off_rule(record: dict[str, Any], float_bias: torch.Tensor) -> str | None:
    """Why an integer bias is not the float one rounded to steps of input scale x weight scale (the
    rule tico states, quantize_bias.py ``QuantizeBias.call``), else None: the only integer bias the
    aligned copy may take over, so a bias written with another scale, rounding or a clamp is not
    absorbed."""
    import numpy as np

    if record.get("input_scale") is None or record.get("weight_scale") is None:
        return "its input or weight holds no qparams"
    expected = (
        np.asarray(record["input_scale"], dtype=np.float32) * np.asarray(record["weight_scale"], dtype=np.float32)
    ).astype(np.float64)
    scale = np.asarray(record["scale"], dtype=np.float64)
    if scale.shape != expected.shape or not np.allclose(scale, expected, rtol=SCALE_REL_EQUAL, atol=0):
        return (
            f"its scale is not input scale x weight scale (max ratio "
            f"{float(np.max(scale / expected)) if scale.shape == expected.shape else float('nan'):.6g})"
        )
    if any(record["zero_point"]):
        return "its zero point is not 0"
    off = bias_steps_off(record, float_bias)
    # tico divides in float32 (quantize_bias.py ``QuantizeBias.call``) and the runtime dequantizes in
    # float32: each is off by up to |q| float32 half-ulps, so a large integer bias (a small input x weight
    # scale) reads a little over the half step on clean tico (0.5145 steps at |q| 1.4e5,
    # gemma4_vision_model static_runtime)
    slack = 2 * float(np.finfo(np.float32).eps) * (np.abs(np.asarray(record["values"], dtype=np.float64)) + 1)
    if (off > 0.5 + 1e-3 + slack).any():
        return (
            f"it is {float(off.max()):.3g} steps from the float bias (more than the half step of rounding "
            f"and float32's error at that integer)"
        )
    return None


def bias_steps_off(record: dict[str, Any], float_bias: torch.Tensor):
    """Per output channel, how far the bias Circle adds (``circle_bias``) is from the float bias, in steps
    of the record's bias scale (a numpy array; scripts/trace_replay.py prints it beside each bias's size)."""
    import numpy as np

    scale = np.asarray(record["scale"], dtype=np.float64)
    return (
        (circle_bias(record).double() - float_bias.detach().double().reshape(-1)).abs() / torch.from_numpy(scale)
    ).numpy()


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
    torch.export produced, in graph order (the order tico's decomposition numbers them in): tico's observers
    pass their ``_cached_scale`` buffer, whose
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
            found.append(
                (
                    fqn.removesuffix("._cached_scale"),
                    float(values[fqn].reshape(-1)[0]),
                    int(values[zp_fqn].reshape(-1)[0]),
                )
            )
        else:
            found.append(
                (
                    None,
                    float(scale) if isinstance(scale, float) else float("nan"),
                    int(zero_point) if isinstance(zero_point, int) else 0,
                )
            )
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
            return (
                f"quantize on tensor {record['tensor']} (scale {record['scale']:.6g} zp {record['zero_point']}) "
                f"does not match fake-quant #{index} torch.export traced (scale {scale:.6g} zp {zero_point})"
            )
    for record in applied:
        record["observer"] = observers[record["traced_index"]][0]
    return None
