"""What a Circle model is built of, as a compact description that survives CPUs and tico's node
renumbering: operators per producing wrapper, tensor kinds by dtype and qparams, the ops that
produce float activations (float islands), and the interface. Most regressions a tico change
brings alter what is built (an op per head, a requantize, a float island) while a tiny output
stays within its limits; comparing this description with a base names the change.

Qparam values and tensor numbering are left out on purpose: values are float bits (not portable),
numbering moves with any unrelated edit. A tensor's scope is the wrapper class tico writes before
``::`` in its name (``...QuantLlamaAttention::add_1`` -> ``QuantLlamaAttention``)."""

from __future__ import annotations

from collections import Counter
from typing import Any

FORMAT = 1
GRAPH_SCOPE = "(graph)"


def _scope(name: str) -> str:
    if "::" not in name:
        return GRAPH_SCOPE
    return name.split("::", 1)[0].rsplit(".", 1)[-1] or GRAPH_SCOPE


def _has_qparams(tensor: Any) -> bool:
    return tensor.quantization is not None and tensor.is_quantized


def _kind(tensor: Any) -> str:
    """'<dtype> q' for a tensor carrying qparams, '<dtype>' otherwise; 'const' prefix for weights."""
    label = str(tensor.dtype) + (" q" if _has_qparams(tensor) else "")
    return ("const " if tensor.is_constant else "") + label


def _interface(program: Any, indices: tuple[int, ...], by_name: bool) -> list[dict[str, Any]]:
    described = []
    for index in indices:
        tensor = program.tensor(index)
        # an input's name is how users bind it; an output's is a node number, so its producer stands in
        described.append(
            {
                "name": tensor.name.split("::")[-1] if by_name else _scope(tensor.name),
                "shape": list(tensor.shape),
                "dtype": str(tensor.dtype),
                "qparams": _has_qparams(tensor),
            }
        )
    return described


def describe(binary: bytes) -> dict[str, Any]:
    """The structure of a Circle model (its first subgraph) as JSON-ready data."""
    from tico.circle.runtime.program import CircleProgram

    program = CircleProgram.from_bytes(binary)
    ops: dict[str, Counter] = {}
    float_ops: dict[str, Counter] = {}
    for operator in program.operators:
        outputs = [program.tensor(i) for i in operator.outputs if i >= 0]
        scope = _scope(outputs[0].name) if outputs else GRAPH_SCOPE
        ops.setdefault(scope, Counter())[operator.name] += 1
        if any(str(t.dtype).startswith("float") and not t.is_quantized for t in outputs):
            float_ops.setdefault(scope, Counter())[operator.name] += 1
    tensors = Counter(_kind(program.tensor(i)) for i in range(len(program.tensors)))
    return {
        "format": FORMAT,
        "subgraphs": program.subgraph_count,
        "operators": sum(sum(c.values()) for c in ops.values()),
        "ops": {scope: dict(sorted(counts.items())) for scope, counts in sorted(ops.items())},
        "float_ops": {scope: dict(sorted(counts.items())) for scope, counts in sorted(float_ops.items())},
        "tensors": dict(sorted(tensors.items())),
        "inputs": _interface(program, tuple(program.inputs), by_name=True),
        "outputs": _interface(program, tuple(program.outputs), by_name=False),
    }


def _count_changes(label: str, base: dict[str, dict[str, int]], current: dict[str, dict[str, int]]) -> list[str]:
    changes = []
    for scope in sorted(set(base) | set(current)):
        was, now = base.get(scope, {}), current.get(scope, {})
        for op in sorted(set(was) | set(now)):
            if was.get(op, 0) != now.get(op, 0):
                changes.append(f"{label}{op} {was.get(op, 0)} -> {now.get(op, 0)} in {scope}")
    return changes


def _interface_changes(label: str, base: list[dict], current: list[dict]) -> list[str]:
    if len(base) != len(current):
        return [
            f"{label}s {len(base)} -> {len(current)}: {[t['name'] for t in base]} -> {[t['name'] for t in current]}"
        ]
    changes = []
    for position, (was, now) in enumerate(zip(base, current)):
        for key in ("name", "shape", "dtype", "qparams"):
            if was.get(key) != now.get(key):
                changes.append(f"{label} {position} ({was.get('name')}) {key} {was.get(key)} -> {now.get(key)}")
    return changes


def differences(base: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Every way ``current`` differs from ``base``, each named: which op, how many, in which wrapper;
    which tensor kind; which input or output and which of its properties."""
    if base.get("format") != current.get("format"):
        return [f"structure format {base.get('format')} -> {current.get('format')}: rewrite the baseline"]
    changes = []
    if base.get("subgraphs") != current.get("subgraphs"):
        changes.append(f"subgraphs {base.get('subgraphs')} -> {current.get('subgraphs')}")
    changes += _count_changes("", base.get("ops", {}), current.get("ops", {}))
    changes += _count_changes("float-producing ", base.get("float_ops", {}), current.get("float_ops", {}))
    was, now = base.get("tensors", {}), current.get("tensors", {})
    for kind in sorted(set(was) | set(now)):
        if was.get(kind, 0) != now.get(kind, 0):
            changes.append(f"tensors of kind '{kind}' {was.get(kind, 0)} -> {now.get(kind, 0)}")
    changes += _interface_changes("input", base.get("inputs", []), current.get("inputs", []))
    changes += _interface_changes("output", base.get("outputs", []), current.get("outputs", []))
    return changes
