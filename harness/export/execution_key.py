"""The export cache's key: what an export adapter executes, traced eagerly on a copy at dispatch
level (every aten op, its arguments and data flow, the bytes of every tensor no op produced), the
code of every Python function that ran and the globals it names, the module tree, the output, and
the versions and sources that produce what is stored (harness/export/export_reuse.py says what the key can
and cannot see)."""

from __future__ import annotations

import copy
import dataclasses
import enum
import functools
import gc
import hashlib
import importlib.metadata
import json
import sys
from typing import Any

import torch

from harness import compat
from harness.export.circle_cache import _package_source_hash, _tensor_bytes, harness_source_hash
from harness.export.code_fingerprint import code_digest as _code_digest
from harness.export.entry_store import Uncacheable

KEY_SCHEMA = "export-reuse-v1"
# Attributes that hold a hash of other attributes (already keyed), salted per process by
# PYTHONHASHSEED: keyed, they would make every process's key differ. GenerationConfig stores
# hash(to_json_string(...)) to detect later edits (transformers generation/configuration_utils.py).
_PROCESS_SALTED = {("transformers.generation.configuration_utils.GenerationConfig", "_original_object_hash")}
_SIMPLE = (
    bool,
    int,
    float,
    complex,
    str,
    bytes,
    type(None),
    torch.dtype,
    torch.device,
    torch.layout,
    torch.memory_format,
)


def _tensor_digest(tensor: torch.Tensor) -> str:
    t = tensor.detach()
    return f"T({t.dtype},{tuple(t.shape)},{t.stride()})#" + hashlib.sha256(_tensor_bytes(t)).hexdigest()


def _value_text(value: Any, depth: int = 2) -> str:
    """Deterministic text for an attribute or global value; never an object address."""
    if isinstance(value, torch.Tensor):
        return _tensor_digest(value)
    if isinstance(value, _SIMPLE):
        return f"{type(value).__name__}:{value!r}"
    if isinstance(value, enum.Enum):
        return f"enum:{type(value).__qualname__}.{value.name}"
    if isinstance(value, (list, tuple, set, frozenset, dict)) and depth < 0:
        return f"{type(value).__name__}(len={len(value)})"  # deeper containers: their effect shows in the ops
    if isinstance(value, (list, tuple)):
        return f"{type(value).__name__}[" + ",".join(_value_text(v, depth - 1) for v in value) + "]"
    if isinstance(value, (set, frozenset)):
        return f"{type(value).__name__}{{" + ",".join(sorted(_value_text(v, depth - 1) for v in value)) + "}"
    if isinstance(value, dict):
        return (
            "{" + ",".join(f"{_value_text(k, depth - 1)}:{_value_text(v, depth - 1)}" for k, v in value.items()) + "}"
        )
    if isinstance(value, functools.partial):
        parts = (_value_text(value.func, depth), _value_text(value.args, depth), _value_text(value.keywords, depth))
        return f"partial({','.join(parts)})"
    code = getattr(value, "__code__", None)
    if code is not None:  # a Python function or method: its code and the defaults it carries
        return (
            f"fn:{_code_digest(code)}:{_value_text(getattr(value, '__defaults__', None), depth)}"
            f":{_value_text(getattr(value, '__kwdefaults__', None), depth)}"
        )
    if isinstance(value, type):
        return f"type:{value.__module__}.{value.__qualname__}"
    if isinstance(value, type(sys)):
        return f"module:{value.__name__}"
    if callable(value) and hasattr(value, "__qualname__"):  # builtins, C functions, op overloads
        return f"callable:{getattr(value, '__module__', '')}.{value.__qualname__}"
    if isinstance(value, torch.nn.Module):
        return f"nn.Module:{type(value).__module__}.{type(value).__qualname__}"  # walked on its own
    if depth > 0 and dataclasses.is_dataclass(value):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return f"{type(value).__qualname__}" + _value_text(fields, depth - 1)
    if depth > 0 and hasattr(value, "__dict__"):
        kind = f"{type(value).__module__}.{type(value).__qualname__}"
        fields = {k: v for k, v in vars(value).items() if (kind, k) not in _PROCESS_SALTED}
        return kind + _value_text(fields, depth - 1)
    return f"obj:{type(value).__module__}.{type(value).__qualname__}"


def _global_text(value: Any) -> str:
    """A global a function reads. Flags, constants, functions, types and tensors by content;
    other objects and mixed containers by type only: module-level registries and caches grow
    as a process runs, and what they hold reaches the computation through the ops traced."""
    if isinstance(value, (list, tuple, set, frozenset, dict)):
        items = list(value.items()) if isinstance(value, dict) else [(v, None) for v in value]
        if len(items) <= 64 and all(isinstance(x, _SIMPLE + (enum.Enum,)) for pair in items for x in pair):
            return _value_text(value, depth=1)
        return f"{type(value).__name__}(...)"
    by_content = (torch.Tensor, enum.Enum, type, type(sys), functools.partial) + _SIMPLE
    if (
        isinstance(value, by_content)
        or hasattr(value, "__code__")
        or (callable(value) and hasattr(value, "__qualname__"))
    ):
        return _value_text(value, depth=0)
    return f"obj:{type(value).__module__}.{type(value).__qualname__}"


class _OpTrace(compat.torch_dispatch_mode()):
    """Records every dispatched aten op as a node of a data-flow graph."""

    def __init__(self, put: Any) -> None:
        super().__init__()
        self.put = put
        self.labels: dict[int, str] = {}
        self.alive: list[torch.Tensor] = []  # keeps ids unique while tracing
        self.count = 0

    def label(self, tensor: torch.Tensor, produced: bool = False) -> str:
        key = id(tensor)
        if key not in self.labels:
            self.alive.append(tensor)
            if produced:
                self.labels[key] = f"%{len(self.labels)}"
            else:  # read before any op made it: its bytes are part of the computation
                self.labels[key] = f"c{len(self.labels)}"
                self.put("const", f"{self.labels[key]}={_tensor_digest(tensor)}")
        return self.labels[key]

    def describe(self, value: Any, produced: bool = False) -> str:
        if isinstance(value, torch.Tensor):
            return self.label(value, produced) + f":{value.dtype}{tuple(value.shape)}{value.stride()}"
        if isinstance(value, (list, tuple)):
            return "[" + ",".join(self.describe(v, produced) for v in value) + "]"
        if isinstance(value, dict):
            return "{" + ",".join(f"{k}={self.describe(v, produced)}" for k, v in value.items()) + "}"
        if isinstance(value, _SIMPLE) or isinstance(value, (torch.SymInt, torch.SymFloat)):
            return repr(value)
        text = _value_text(value, depth=0)
        if text.startswith("obj:"):
            raise Uncacheable(f"op argument of type {type(value).__name__}")
        return text

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = f"{self.describe(args)}|{self.describe(kwargs)}"
        out = func(*args, **kwargs)
        self.put("op", f"{func}({inputs})->{self.describe(out, produced=True)}")
        self.count += 1
        return out


def _module_tree_text(root: torch.nn.Module, put: Any) -> None:
    types_seen: set[type] = set()
    for name, module in root.named_modules(remove_duplicate=False):
        cls = type(module)
        put("module", f"{name}:{cls.__module__}.{cls.__qualname__}:training={module.training}")
        for key, value in sorted(vars(module).items()):
            if key in ("_parameters", "_buffers", "_modules"):
                continue
            put(f"attr.{name}.{key}", _value_text(value))
        for kind, tensors in (("param", module._parameters), ("buffer", module._buffers)):
            for tname, tensor in tensors.items():
                put(f"{kind}.{name}.{tname}", "None" if tensor is None else _tensor_digest(tensor))
        if cls not in types_seen:  # class-level attributes and methods, patched or not
            types_seen.add(cls)
            for klass in cls.__mro__:
                if klass is torch.nn.Module or klass is object:
                    break
                for key, value in sorted(vars(klass).items()):
                    if key.startswith("__") and key not in ("__call__", "__init__"):
                        continue
                    put(f"class.{klass.__module__}.{klass.__qualname__}.{key}", _value_text(value, depth=0))


@functools.lru_cache(maxsize=None)
def _environment() -> str:
    harness = harness_source_hash(
        "export/export_reuse.py",
        "export/execution_key.py",
        "export/entry_store.py",
        "export/stages.py",
        "export/circle_cache.py",
        "circle/missing_qparams.py",
        "export/failure_replay.py",
    )
    return json.dumps(
        {
            "schema": KEY_SCHEMA,
            "python": sys.version,
            "torch": torch.__version__,
            "tico": importlib.metadata.version("tico"),
            "transformers": importlib.metadata.version("transformers"),
            "tico_source": _package_source_hash("tico"),
            "harness_source": harness,
        },
        sort_keys=True,
    )


def execution_key(adapter: torch.nn.Module, args: tuple, trail: list[str] | None = None) -> str:
    """sha256 of the adapter's execution on ``args`` (see the module docstring for what counts).
    Runs a deep copy, so an adapter that updates state when called is left as it was.
    ``trail`` collects every keyed line (to see why two keys differ). Whatever goes wrong while
    fingerprinting makes the adapter Uncacheable: the cache never fails a case."""
    try:
        return _execution_key(adapter, args, trail)
    except Uncacheable:
        raise
    except Exception as exc:  # noqa: BLE001 - traced instead, with the reason in the evidence
        raise Uncacheable(f"cannot fingerprint the adapter: {type(exc).__name__}: {exc}") from exc


def _execution_key(adapter: torch.nn.Module, args: tuple, trail: list[str] | None) -> str:
    h = hashlib.sha256()

    def put(label: str, text: str) -> None:
        if trail is not None:
            trail.append(f"{label}: {text}")
        payload = text.encode()
        h.update(f"{label}:{len(payload)}:".encode())
        h.update(payload)

    put("env", _environment())
    leaves, spec = compat.tree_flatten(args)
    put("args.spec", str(spec))
    for i, leaf in enumerate(leaves):
        put(f"args.{i}", _value_text(leaf))
    _module_tree_text(adapter, put)

    runner = copy.deepcopy(adapter)
    run_args = copy.deepcopy(args)
    # Twice, keeping the second: a first call in a process also runs one-time lazy setup
    # (op overload caches, lazy imports) that depends on what ran before, not on the adapter.
    _traced_run(runner, run_args, lambda label, text: None)
    output, executed = _traced_run(runner, run_args, put)
    put("output", _value_text(compat.tree_leaves(output)))
    lines = []
    for code, globals_ in executed.values():
        if code.co_filename == __file__:  # this module's own tracing code
            continue
        reads = [f"{n}={_global_text(globals_[n])}" for n in code.co_names if n in globals_]
        lines.append(f"{_code_digest(code)}|{';'.join(reads)}")
    for line in sorted(set(lines)):
        put("code", line)
    return h.hexdigest()


def _traced_run(runner: torch.nn.Module, run_args: tuple, put: Any) -> tuple[Any, dict[int, tuple[Any, dict]]]:
    """One eager call with the op trace feeding ``put`` and every entered Python frame's code
    (with the globals it sees) collected."""
    executed: dict[int, tuple[Any, dict]] = {}

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            code = frame.f_code
            if id(code) not in executed:
                executed[id(code)] = (code, frame.f_globals)

    trace = _OpTrace(put)
    for i, leaf in enumerate(compat.tree_leaves(run_args)):
        if isinstance(leaf, torch.Tensor):
            trace.labels[id(leaf)] = f"in{i}"
            trace.alive.append(leaf)
    previous = sys.getprofile()
    if previous is not None:  # a profiler or debugger is attached: do not take its hook
        raise Uncacheable(f"another profile hook is active ({type(previous).__name__})")
    # The cyclic collector runs when allocation counts say so (they depend on what ran before in
    # the process), and the finalizers it calls (regex's Group.__del__, ...) would enter the
    # trace: off for the run, so only what the adapter itself calls is keyed.
    collecting = gc.isenabled()
    gc.disable()
    try:
        with torch.no_grad(), trace:
            sys.setprofile(profile)
            try:
                output = runner(*run_args)
            finally:
                sys.setprofile(previous)
                if collecting:
                    gc.enable()
    except Uncacheable:
        raise
    except Exception as exc:  # noqa: BLE001 - torch.export will report it properly
        raise Uncacheable(f"the adapter raised while fingerprinting: {type(exc).__name__}: {exc}") from exc
    return output, executed
