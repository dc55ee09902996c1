"""Reuse of a case's torch.export results across runs, keyed by what its export adapter executes.

Strict torch.export (dynamo) is most of a rerun's cost once Circle conversions come from the
cache, and it reruns even when nothing changed because the Circle key is computed from the
traced program. This cache skips it when the adapter executes exactly as it did when the
program was traced (the limits of that are stated at the end). The key is an execution trace of the export
adapter on the export
inputs, run eagerly on a copy (milliseconds, where strict export takes seconds):

- every aten op dispatched, with its arguments and the data flow between ops (a traced graph
  at dispatch level) and the bytes of every tensor an op reads that no op produced (inputs,
  parameters, buffers, qparams, constants);
- the code of every Python function that ran (bytecode, constants, names, source locations)
  and the simple values of the globals each one names;
- the module tree: types, modes, hooks, every parameter and buffer byte, simple attributes,
  and the simple attributes and methods of each module class;
- the output bytes, the torch / tico / transformers versions, a hash of tico's installed source
  and of the harness code that computes what is stored.

Editing or monkeypatching anything the forward runs -- a wrapper method on the class or the
instance, a helper it calls, a flag it reads, a weight, a qparam, an input shape -- changes
the key. What is stored is only what the export checks read from the program: its output on
the export inputs, its graph facts, and its Circle cache key (the Circle cache itself stays
keyed by the traced program). Anything the key cannot describe exactly makes the adapter
uncacheable: it is exported every time.

Limits: a change that alters no executed Python code, no global it names, no module attribute,
no dispatched op, argument or byte and no output, yet changes what dynamo traces (say, a
closure variable read only on a branch the ops do not reveal) is not seen. Runs that must rule
that out pass ``--no-export-cache``, which traces every program.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch

from harness import compat
from harness.export.entry_store import EntryStore, Uncacheable
from harness.export.execution_key import _environment
from harness.export.failure_replay import RecordedFailure

# Ops torch.export inserts when a graph depends on input *values*, not just shapes.
VALUE_GUARD_TARGETS = ("_assert_scalar", "sym_constrain_range", "_local_scalar_dense", "_assert_async")


@dataclasses.dataclass
class ExportRecord:
    """What the export checks take from a traced program (fresh or reused)."""

    output_leaves: list[torch.Tensor]
    output_spec: str  # compat.treespec_dumps (torch's pytree) of the program's output
    graph_nodes: int
    value_guards: list[str]
    symbolic_shapes: list[str]
    circle_key: str | None
    # "hit" (reused, no trace), "miss" (traced and stored), "off" (no export cache: traced),
    # "uncacheable: ..." or "not stored: ..." (traced; the reason says why nothing was reused)
    status: str = "off"
    notes: list[str] = dataclasses.field(default_factory=list)

    def output(self) -> Any:
        spec = compat.treespec_loads(self.output_spec)
        return compat.tree_unflatten(self.output_leaves, spec)


def record_from_program(program: Any, args: tuple, circle_key: str | None) -> ExportRecord:
    """Run the traced program on the export inputs and read the facts the checks need."""
    with torch.no_grad():
        output = program.module()(*args)
    leaves, spec = compat.tree_flatten(output)
    guards = [
        n.name
        for n in program.graph.nodes
        if n.op == "call_function" and any(g in str(n.target) for g in VALUE_GUARD_TARGETS)
    ]
    return ExportRecord(
        output_leaves=[leaf.detach() if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves],
        output_spec=compat.treespec_dumps(spec),
        graph_nodes=len(program.graph.nodes),
        value_guards=guards,
        symbolic_shapes=[str(s) for s in (program.range_constraints or {})],
        circle_key=circle_key,
    )


# -- the store ------------------------------------------------------------------------------
def _decode_record(data: bytes, meta: dict[str, Any]) -> ExportRecord | RecordedFailure:
    """The record ExportCache.put wrote (output tensors by leaf index, other leaves inline), or
    the failure ExportCache.put_failure wrote."""
    from safetensors.torch import load

    if "failure" in meta:
        return RecordedFailure.from_manifest(meta["failure"])
    tensors = load(data)
    leaves = [tensors[f"leaf{i}"] if kind == "tensor" else value for i, (kind, value) in enumerate(meta["leaves"])]
    return ExportRecord(
        output_leaves=leaves,
        output_spec=meta["output_spec"],
        graph_nodes=int(meta["graph_nodes"]),
        value_guards=list(meta["value_guards"]),
        symbolic_shapes=list(meta["symbolic_shapes"]),
        circle_key=meta["circle_key"],
    )


class ExportCache:
    """<key>.safetensors (the program's output tensors) + <key>.json (facts, Circle key, sha256)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self._store = EntryStore(self.root, ".safetensors", "export cache")

    def get(self, key: str) -> tuple[ExportRecord | RecordedFailure | None, list[str]]:
        """The record -- or the failure the same execution produced -- (None on a miss) and notes
        on what was wrong with a damaged entry."""
        return self._store.lookup(key, _decode_record, "traced again")

    def put_failure(self, key: str, failure: RecordedFailure) -> None:
        """Store torch.export's reproducible failure for this execution (harness/export/failure_replay.py)."""
        self._store.write(key, b"", {"failure": failure.manifest(), "environment": json.loads(_environment())})

    def put(self, key: str, record: ExportRecord) -> None:
        from safetensors.torch import save

        tensors: dict[str, torch.Tensor] = {}
        leaves: list[tuple[str, Any]] = []
        for i, leaf in enumerate(record.output_leaves):
            if isinstance(leaf, torch.Tensor):
                tensors[f"leaf{i}"] = leaf.detach().contiguous()
                leaves.append(("tensor", None))
            elif isinstance(leaf, (bool, int, float, str, type(None))):
                leaves.append(("value", leaf))
            else:
                raise Uncacheable(f"program output leaf of type {type(leaf).__name__}")
        self._store.write(
            key,
            save(tensors),
            {
                "leaves": leaves,
                "output_spec": record.output_spec,
                "graph_nodes": record.graph_nodes,
                "value_guards": record.value_guards,
                "symbolic_shapes": record.symbolic_shapes,
                "circle_key": record.circle_key,
                "environment": json.loads(_environment()),
            },
        )
