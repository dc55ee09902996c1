"""The Circle model called the way users call it: by keyword in an order other than the signature's,
tuple inputs as one keyword (``position_embeddings=(cos, sin)``), and positional-then-keyword, inputs in
their serialized dtypes. Through tico's binding of names to inputs (``ModelInputSpec.bind``): each keyword
lands on its own input, and each call's outputs equal the positional call's bit for bit in FAKE_QUANTIZE.
Through the path users call, ``CircleModel(...)(...)`` and ``tico.interpreter.infer.infer(...)``: the inputs
tico's runtime receives are the positional call's, in order and bit for bit, and so are the outputs where
the runtime executes the graph (NATIVE); where it refuses by design, every call form meets the same refusal.
Each other runtime tico offers (``CircleModel(runtime=...)``) is called too, or said to be absent here.
An input at another batch than the graph's static one, or in another dtype than its serialized one, must
be refused by name, never computed. The other replay checks hand the runtime a positional list."""

from __future__ import annotations

import re
from typing import Any
from unittest import mock

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
    compared += _users_path(result, artifact.binary, calls, inputs)
    result.metrics["calls"] = compared
    return result


def _cause(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def _users_path(result: CheckResult, binary: bytes, calls: dict, inputs: list[torch.Tensor]) -> int:
    """Each call through ``CircleModel.__call__`` and ``tico.interpreter.infer.infer``, as users make it: what
    tico's reference runtime was handed (seen by a spy on ``CircleReferenceRuntime.run`` that calls the real
    one) and what came back, against the positional call; how many calls were compared."""
    from tico.circle.runtime import CircleReferenceRuntime
    from tico.interpreter.infer import infer
    from tico.utils.model import CircleModel

    def call(entry, args: tuple, kwargs: dict) -> tuple[list[list[np.ndarray]], Any]:
        with mock.patch.object(CircleReferenceRuntime, "run", autospec=True, side_effect=real_run) as spy:
            try:
                outcome: Any = _leaves(entry(*args, **kwargs))
            except Exception as exc:  # noqa: BLE001 - compared with the positional call's refusal below
                outcome = exc
        received = [[np.array(x) for x in c.args[1]] for c in spy.call_args_list]
        return received, outcome

    real_run = CircleReferenceRuntime.run
    entries = {
        "CircleModel(...)": CircleModel(binary),
        "tico.interpreter.infer.infer": lambda *a, **k: infer(binary, *a, **k),
    }
    compared = 0
    for path, entry in entries.items():
        want_inputs, want = call(entry, tuple(inputs), {})
        if isinstance(want, Exception) and not NATIVE_BY_DESIGN.search(_cause(want)):
            result.fail(f"{path}: the positional call failed: {_cause(want)}")
            continue
        if isinstance(want, Exception):
            result.notes.append(f"{path}: NATIVE execution refused by design ({_cause(want)}): inputs compared")
        for label, (args, kwargs) in calls.items():
            got_inputs, got = call(entry, args, kwargs)
            compared += 1
            where = f"{path} called by {label}"
            if len(got_inputs) != len(want_inputs) or any(
                len(g) != len(w) or any(a.dtype != b.dtype or not np.array_equal(a, b) for a, b in zip(g, w))
                for g, w in zip(got_inputs, want_inputs)
            ):
                result.fail(f"{where}: tico's runtime received other inputs than from the positional call")
            if isinstance(want, Exception) or isinstance(got, Exception):
                if not (isinstance(want, Exception) and isinstance(got, Exception) and _cause(got) == _cause(want)):
                    shown = _cause(got) if isinstance(got, Exception) else "outputs"
                    wanted = _cause(want) if isinstance(want, Exception) else "outputs"
                    result.fail(f"{where}: {shown}, where the positional call gave {wanted}")
                continue
            for index, (a, b) in enumerate(zip(got, want)):
                if a.shape != b.shape or not np.array_equal(a, b):
                    result.fail(f"{where}: NATIVE output {index} differs from the positional call")
    _other_runtimes(result, binary, inputs)
    return compared


def _other_runtimes(result: CheckResult, binary: bytes, inputs: list[torch.Tensor]) -> None:
    """Each runtime ``CircleModel`` offers besides the reference one, called positionally: run, or said absent
    (an optional runtime tico never picks by itself: ONE's luci-interpreter library, the onert package)."""
    from tico.interpreter import backends
    from tico.utils.model import CircleModel

    others = [name for name in getattr(backends, "RUNTIME_CHOICES", ()) if name != backends.DEFAULT_RUNTIME]
    states = {}
    for name in others:
        try:
            CircleModel(binary, runtime=name)(*inputs)
        except (RuntimeError, ImportError) as exc:
            states[name] = f"not run here: {_cause(exc)}"
        else:
            states[name] = "ran"
    result.evidence["other_runtimes"] = states


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
