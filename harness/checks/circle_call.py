"""The Circle model called the way users call it: by keyword in an order other than the signature's,
tuple inputs as one keyword (``position_embeddings=(cos, sin)``), and positional-then-keyword, inputs in
their serialized dtypes, through tico's binding of names to inputs (``ModelInputSpec.bind``, as
``CircleModel.__call__`` does): each keyword lands on its own input, and each call's outputs equal the
positional call's bit for bit, in FAKE_QUANTIZE and, where the runtime executes the graph, through
``CircleModel`` in NATIVE. An input at another batch than the graph's static one, or in another dtype
than its serialized one, must be refused by name, never computed. The other replay checks hand the
runtime a positional list."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import torch

from harness import compat
from harness.checks.base import Check, CheckResult, Metric, requires_capability
from harness.checks.circle_replay import NATIVE_BY_DESIGN
from harness.export import stages as export_stages

_INDEXED = re.compile(r"^(?P<base>.+)_(?P<index>\d+)$")


def _keyword_groups(names: list[str], values: list[torch.Tensor]) -> list[tuple[str, Any]]:
    """(keyword, value) as a user passes them: ``x_0, x_1`` -> ``x=(a, b)`` when ``x`` is no input's name."""
    groups: dict[str, list[tuple[int, torch.Tensor]]] = {}
    order: list[str] = []
    for name, value in zip(names, values):
        match = _INDEXED.match(name)
        key = match["base"] if match and match["base"] not in names else name
        if key not in groups:
            order.append(key)
        groups.setdefault(key, []).append((int(match["index"]) if key != name else 0, value))
    keywords = []
    for key in order:
        members = groups[key]
        if key in names:
            keywords.append((key, members[0][1]))
        elif [i for i, _ in members] == list(range(len(members))):
            keywords.append((key, tuple(v for _, v in members)))
        else:  # indices with gaps: keep them flat
            keywords += [(f"{key}_{i}", v) for i, v in members]
    return keywords


def _leaves(output: Any) -> list[np.ndarray]:
    return [np.asarray(o) for o in (output if isinstance(output, list) else [output])]


def _bound_wrongly(spec: Any, kwargs: dict[str, Any], expected: list[torch.Tensor], args: tuple = ()) -> list[str]:
    """Inputs tico's binding hands the wrong value: ``spec.names[i]`` must receive ``expected[i]``."""
    bound = spec.bind(args, kwargs, check=False)
    wrong = []
    for position, (name, value) in enumerate(zip(spec.names, bound)):
        if not (isinstance(value, torch.Tensor) and value is expected[position]):
            given = next((spec.names[j] for j, e in enumerate(expected) if e is value), "another value")
            wrong.append(f"input {position} '{name}' was bound to the value given for '{given}'")
    return wrong


def run(pipeline) -> CheckResult:
    from tico.circle.runtime.executor import CircleReferenceRuntime
    from tico.circle.runtime.kernels.base import ExecutionMode
    from tico.utils.model import CircleModel
    from tico.utils.signature import ModelInputSpec

    result = CheckResult()
    artifact = pipeline.circle
    leaves, _ = compat.tree_flatten(pipeline.case.export.args(pipeline.sample(pipeline.export_sample_name)))
    arrays = [a.detach().cpu().numpy() for a in leaves if isinstance(a, torch.Tensor)]
    inputs = [torch.from_numpy(np.ascontiguousarray(a)) for a in export_stages.quantized_inputs(artifact, arrays)]
    spec = ModelInputSpec(artifact.binary)
    groups = _keyword_groups(spec.names, inputs)
    reversed_kwargs = dict(reversed(groups))
    calls = {f"keyword, order {', '.join(reversed_kwargs)}": ((), reversed_kwargs)}
    if len(groups) > 1:
        first, rest = groups[0], dict(reversed(groups[1:]))
        first_args = first[1] if isinstance(first[1], tuple) else (first[1],)
        calls[f"positional {first[0]}, then keyword {', '.join(rest)}"] = (first_args, rest)
    else:
        result.notes.append("one input: keyword order not exercised")
    result.evidence["inputs"] = spec.names
    result.evidence["calls"] = list(calls)
    for label, (args, kwargs) in calls.items():
        try:
            wrongly = _bound_wrongly(spec, kwargs, inputs, args)
        except Exception as exc:  # noqa: BLE001 - a binding that raises is this check's failure, named
            result.fail(f"call by {label}: binding the inputs raised {type(exc).__name__}: {exc}")
            continue
        for wrong in wrongly:
            result.fail(f"call by {label}: {wrong}")
    _probe_refusals(result, spec, inputs)
    float_of = {id(native): array for native, array in zip(inputs, arrays)}
    runtime = CircleReferenceRuntime(artifact.binary)

    def fake_quantize_call(args: tuple, kwargs: dict) -> list[np.ndarray]:
        """tico's binding with its checks, then the bound inputs' float values in FAKE_QUANTIZE."""
        bound = spec.bind(args, kwargs, check=True)
        floats = [float_of.get(id(value), np.asarray(value)) for value in bound]
        return list(runtime.run(floats, mode=ExecutionMode.FAKE_QUANTIZE).outputs)

    compared = _compare_calls(result, calls, fake_quantize_call(tuple(inputs), {}), fake_quantize_call, "FAKE_QUANTIZE")
    model = CircleModel(artifact.binary)
    try:
        native = _leaves(model(*inputs))
    except Exception as exc:  # noqa: BLE001 - a by-design NATIVE refusal leaves the FAKE_QUANTIZE calls
        cause = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        if not NATIVE_BY_DESIGN.search(cause):
            result.fail(f"the positional call failed: {cause}")
        else:
            result.notes.append(f"NATIVE execution refused by design ({cause}): calls compared in FAKE_QUANTIZE")
    else:
        compared += _compare_calls(result, calls, native, lambda a, k: _leaves(model(*a, **k)), "NATIVE")
    result.metrics["calls"] = compared
    return result


def _probe_refusals(result: CheckResult, spec: Any, inputs: list[torch.Tensor]) -> None:
    """The first input at twice its batch (where the graph's batch is static) and in a dtype other than
    its serialized one: tico's binding with its checks on must refuse each, naming the input."""
    position = next((i for i, x in enumerate(inputs) if isinstance(x, torch.Tensor) and x.dim() >= 1), None)
    if position is None:
        result.notes.append("no tensor input with a batch dimension: batch and dtype refusals not probed")
        return
    name, value = spec.names[position], inputs[position]
    signature = spec.shape_signatures[position]
    probes = {"dtype": value.to(torch.float64 if value.dtype == torch.float32 else torch.float32)}
    if signature is not None and len(signature) and signature[0] == -1:
        result.notes.append(f"input {name!r} has a dynamic batch: a batch refusal is not expected")
    else:
        probes["batch"] = torch.cat([value, value])
    refusals = {}
    for what, replacement in probes.items():
        probe = list(inputs)
        probe[position] = replacement
        try:
            spec.bind(tuple(probe), {}, check=True)
        except (TypeError, ValueError, AssertionError) as exc:
            refusals[what] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            if name not in str(exc):
                result.fail(f"input {name!r} in another {what} was refused without naming it: {exc}")
            continue
        shape, dtype = tuple(replacement.shape), replacement.dtype
        result.fail(
            f"input {name!r} in another {what} ({dtype}, shape {shape}; serialized {value.dtype}, "
            f"{tuple(value.shape)}) was bound without complaint: the runtime would compute on it"
        )
    result.evidence["refusals"] = refusals


def _compare_calls(result: CheckResult, calls: dict, reference: list[np.ndarray], call, mode: str) -> int:
    """Each call's outputs against the positional call's, bit for bit; how many calls ran."""
    ran = 0
    for label, (args, kwargs) in calls.items():
        try:
            outputs = call(args, kwargs)
        except Exception as exc:  # noqa: BLE001 - the call users make must work as the positional one does
            result.fail(f"call by {label} raised {type(exc).__name__} ({mode}): {exc}")
            continue
        ran += 1
        for index, (got, want) in enumerate(zip(outputs, reference)):
            got, want = np.asarray(got), np.asarray(want)
            if got.shape != want.shape or not np.array_equal(got, want):
                same_shape = got.shape == want.shape
                diff = np.abs(got.astype(np.float64) - want.astype(np.float64)).max() if same_shape else "n/a"
                result.fail(
                    f"call by {label}: {mode} output {index} differs from the positional call (max |diff| {diff})"
                )
    return ran


CHECK = Check(
    name="circle_call",
    run=run,
    applies=requires_capability("export"),
    description=__doc__.splitlines()[0],
    metrics=(Metric("calls", better=None, label="Circle calls compared"),),
)
