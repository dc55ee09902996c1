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


@dataclass
class AuditResult:
    quantized_nodes: int = 0
    float_nodes: int = 0
    integer_nodes: int = 0
    missing: list[dict[str, Any]] = field(default_factory=list)
    # qparam consistency (harness.qparam_consistency): torch fake-quants folded into the
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
            else:
                result.float_nodes += 1
                record(node, "node")
        elif node.op == "output":
            flat, _ = compat.tree_flatten(node.args[0])
            for out in flat:
                if isinstance(out, torch.fx.Node) and not _is_qparam_buffer(out) and _is_tensor_node(out) \
                        and _is_float_tensor(out):
                    if QPARAM_KEY not in out.meta:
                        record(out, "graph output")
    return result
