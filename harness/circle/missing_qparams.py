"""Missing-qparam audit of an exported graph, written here so it reports what reviewers need
(op, target, users, source stack trace) and stays independent of tico's own checker.

It walks the program tico's quantization passes produced (captured during Circle conversion),
with the same notion of "tensor-producing node" tico uses: call_function and placeholder nodes
whose metadata holds a tensor, plus graph outputs; cached scale/zero-point buffers excluded.
Unlike tico's checker it does not ask integer tensors (token ids, indices) for qparams; it
counts them separately.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from harness import compat

# tico attaches qparams to split_with_sizes' getitem users, not to the split itself.
DEFAULT_IGNORED_TARGETS = ("aten.split_with_sizes.default",)


def target_name(node: torch.fx.Node) -> str:
    """'aten.permute.default' for ATen ops, the function name (e.g. 'getitem') otherwise."""
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    return getattr(target, "__name__", str(target))


def _is_tensor_node(node: torch.fx.Node) -> bool:
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return True
    if isinstance(val, (tuple, list)) and any(isinstance(v, torch.Tensor) for v in val):
        return True
    return "tensor_meta" in node.meta


def _is_float_tensor(node: torch.fx.Node) -> bool:
    """Integer and bool tensors (token ids, indices, masks as bools) need no qparam."""
    val = node.meta.get("val")
    vals = val if isinstance(val, (tuple, list)) else [val]
    tensors = [v for v in vals if isinstance(v, torch.Tensor)]
    return not tensors or any(t.is_floating_point() for t in tensors)


def _is_qparam_buffer(node: torch.fx.Node) -> bool:
    return node.name.endswith("_cached_scale") or node.name.endswith("_cached_zp")


def _source_lines(stack_trace: str | None) -> list[str]:
    """The innermost frame (File ..., line N + its code): the line that created the node."""
    if not stack_trace:
        return []
    lines = [line.strip() for line in stack_trace.splitlines() if line.strip() and set(line.strip()) - set("^~ ")]
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("File "):
            return lines[i : i + 2]
    return lines[-1:]


_QUANTIZE_TARGETS = (
    "quantized_decomposed.quantize_per_tensor.default",
    "quantized_decomposed.quantize_per_channel.default",
)
# Ops that move values without computing: a float value they move is still only moved.
# aten ops that become Circle data-movement operators (RESHAPE, TRANSPOSE, SQUEEZE, EXPAND_DIMS,
# BROADCAST_TO, SLICE/STRIDED_SLICE, GATHER-free SELECT, CONCATENATION, SPLIT): neither integer
# backends nor tico's reference runtime requantize their output (the runtime's
# VALUE_PRESERVING_BUILTIN_NAMES), so the value they produce carries the quantization of their input
# whatever qparams the output tensor holds.
VALUE_PRESERVING = frozenset(
    {
        "aten.reshape.default",
        "aten.view.default",
        "aten.permute.default",
        "aten.transpose.int",
        "aten.squeeze.dim",
        "aten.squeeze.dims",
        "aten.squeeze.default",
        "aten.unsqueeze.default",
        "aten.expand.default",
        "aten.slice.Tensor",
        "aten.select.int",
        "aten.cat.default",
        "aten.clone.default",
    }
)
# Ops that move one value without computing (a GATHER of table rows included): a float value they
# move is still only moved.
_MOVING_TARGETS = (VALUE_PRESERVING - {"aten.cat.default"}) | {"aten.embedding.default"}


def quantized_before_use(node: torch.fx.Node, qparam_key: str, depth: int = 0) -> bool:
    """Whether every use of a float value is an explicit QUANTIZE, directly or after ops that only
    move it: no arithmetic reads it in float. tico from 0.4 keeps a model input, a value with other
    users or a dequantized embedding table float that way (FoldQuantOps keeps the QUANTIZE)."""
    if not node.users or depth > 16:
        return False
    for user in node.users:
        target = target_name(user)
        if target in _QUANTIZE_TARGETS:
            continue
        if (
            target in _MOVING_TARGETS
            and qparam_key not in user.meta
            and quantized_before_use(user, qparam_key, depth + 1)
        ):
            continue
        return False
    return True


@dataclass
class AuditResult:
    quantized_nodes: int = 0
    float_nodes: int = 0
    # float values quantized before any arithmetic reads them (a float boundary, not a gap)
    float_boundary: list[str] = field(default_factory=list)
    integer_nodes: int = 0
    missing: list[dict[str, Any]] = field(default_factory=list)
    # qparam consistency (harness.circle.consistency): torch fake-quants folded into the
    # graph, and those whose tensor ends up holding other qparams.
    applied: list[dict[str, Any]] = field(default_factory=list)
    attribution_refused: str | None = None
    overwritten: list[dict[str, Any]] = field(default_factory=list)
    # applied fake-quants whose node a later pass replaced (not comparable by name)
    replaced_nodes: list[dict[str, Any]] = field(default_factory=list)
    # values Circle requantizes with qparams no torch fake-quant applied (a propagated NEG)
    requantized: list[dict[str, Any]] = field(default_factory=list)
    # fake-quants FoldQuantOps dropped because they re-applied their input's qparams
    redundant: list[dict[str, Any]] = field(default_factory=list)
    # float biases QuantizeBias made integer (input scale x weight scale): Circle adds them dequantized
    quantized_biases: list[dict[str, Any]] = field(default_factory=list)


def audit_exported_program(program: Any, ignored_targets: tuple[str, ...] = DEFAULT_IGNORED_TARGETS) -> AuditResult:
    from tico.serialize.quant_param import QPARAM_KEY

    result = AuditResult()
    graph = program.graph_module.graph
    seen: set[str] = set()

    def record(node: torch.fx.Node, role: str) -> None:
        if node.name in seen:
            return
        seen.add(node.name)
        result.missing.append(
            {
                "name": node.name,
                "op": node.op,
                "target": target_name(node),
                "role": role,
                "users": len(node.users),
                "stack_trace": (node.meta.get("stack_trace") or "").strip(),
                "source": _source_lines(node.meta.get("stack_trace")),
            }
        )

    for node in graph.nodes:
        if node.op in ("call_function", "placeholder"):
            if node.op == "call_function" and target_name(node) in ignored_targets:
                continue
            if _is_qparam_buffer(node) or not _is_tensor_node(node):
                continue
            if not _is_float_tensor(node):
                result.integer_nodes += 1
                continue
            if QPARAM_KEY in node.meta:
                result.quantized_nodes += 1
            elif quantized_before_use(node, QPARAM_KEY):
                result.float_nodes += 1
                result.float_boundary.append(node.name)
            else:
                result.float_nodes += 1
                record(node, "node")
        elif node.op == "output":
            flat, _ = compat.tree_flatten(node.args[0])
            for out in flat:
                if (
                    isinstance(out, torch.fx.Node)
                    and not _is_qparam_buffer(out)
                    and _is_tensor_node(out)
                    and _is_float_tensor(out)
                ):
                    if QPARAM_KEY not in out.meta:
                        record(out, "graph output")
    return result
