"""Fingerprints of Python code as it is in memory, so a cache entry is never served to code that
differs from the code that produced it -- also when that code was patched in memory
(monkeypatch, a conftest fixture, a plugin trying a fix before it is upstreamed).

``reachable_fingerprint(roots)`` walks what the roots can reach, the way a call can:
a function's bytecode, constants, defaults, closure cells and the globals its code names
(module attributes included: ``module.fn`` reads ``fn``); a class's own attributes and bases;
containers' elements. Every project function or class found (from ``tico`` or ``harness``,
or any Python function reached from them, e.g. a patch defined in a test) is hashed by
content; objects of other libraries (torch, numpy, the standard library) are named, not
walked: patching *those* is outside what the key sees. An object the walk cannot describe
makes the fingerprint fail with its path, so a cache refuses to answer rather than guess.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import types
from typing import Any, Iterable

_CODE_DIGESTS: dict[int, tuple[Any, str]] = {}
_PROJECT_PREFIXES = ("tico", "harness")
_SIMPLE = (bool, int, float, complex, str, bytes, type(None))
# Containers larger than this are described by type and size only (registries are far smaller).
_MAX_ITEMS = 4096


class Unfingerprintable(Exception):
    """Something reachable cannot be described exactly; carries where it was found."""


def const_text(value: Any) -> str:
    if isinstance(value, types.CodeType):
        return "code:" + code_digest(value)
    if isinstance(value, frozenset):  # set order follows string hashing, which varies per process
        return "frozenset(" + ",".join(sorted(const_text(v) for v in value)) + ")"
    if isinstance(value, tuple):
        return "(" + ",".join(const_text(v) for v in value) + ")"
    return f"{type(value).__name__}:{value!r}"


def code_digest(code: types.CodeType) -> str:
    """Content of a code object, with its source location (traced programs record it)."""
    cached = _CODE_DIGESTS.get(id(code))
    if cached is not None and cached[0] is code:
        return cached[1]
    parts = [
        code.co_filename,
        code.co_qualname,
        str(code.co_firstlineno),
        code.co_code.hex(),
        code.co_linetable.hex(),
        ",".join(code.co_names),
        ",".join(code.co_varnames),
        ",".join(code.co_freevars),
        ",".join(code.co_cellvars),
        f"{code.co_argcount}/{code.co_posonlyargcount}/{code.co_kwonlyargcount}/{code.co_flags}",
        ";".join(const_text(c) for c in code.co_consts),
    ]
    digest = hashlib.sha256("\x00".join(parts).encode()).hexdigest()
    _CODE_DIGESTS[id(code)] = (code, digest)  # holding the code keeps its id unique
    return digest


def _all_names(code: types.CodeType) -> set[str]:
    """Global and attribute names a code object (and the code nested in it) can read."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _all_names(const)
    return names


def _is_project(obj: Any) -> bool:
    module = getattr(obj, "__module__", None) or getattr(obj, "__name__", None)
    return isinstance(module, str) and module.split(".")[0] in _PROJECT_PREFIXES


def _qualified(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', getattr(obj, '__name__', '?'))}"


def _key_text(key: Any) -> str:
    """A process-independent label for a dict key or set element (no memory addresses)."""
    if isinstance(key, _SIMPLE) or isinstance(key, tuple) and all(isinstance(k, _SIMPLE) for k in key):
        return const_text(key)
    if isinstance(key, enum.Enum):
        return f"enum:{_qualified(type(key))}.{key.name}"
    if callable(key) or isinstance(key, type):
        return (
            f"{type(key).__name__}:{_qualified(key)}:{key}"
            if not isinstance(key, types.FunctionType)
            else f"fn:{_qualified(key)}"
        )
    return f"{type(key).__name__}:{key}" if type(key).__repr__ is not object.__repr__ else type(key).__name__


class _Walk:
    """One fingerprint: each reachable object described once, in a deterministic order."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.seen: set[int] = set()
        self.keep: list[Any] = []  # ids stay unique while the walk holds the objects

    def visit(self, obj: Any, where: str, names: set[str] | None = None) -> None:
        try:
            self._visit(obj, where, names)
        except Unfingerprintable:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure to describe is a refusal, with the place
            raise Unfingerprintable(f"{where}: {type(exc).__name__}: {exc}") from exc

    def _visit(self, obj: Any, where: str, names: set[str] | None) -> None:
        if isinstance(obj, _SIMPLE):
            self.lines.append(f"{where}={const_text(obj)}")
            return
        if isinstance(obj, (enum.Enum,)):
            self.lines.append(f"{where}=enum:{_qualified(type(obj))}.{obj.name}")
            return
        if isinstance(obj, types.ModuleType):
            # A module is reached through code that names some of its attributes. Another
            # library's module is not described: whether its submodules are imported yet
            # depends on what ran before in the process, not on the code.
            if obj.__name__.split(".")[0] in _PROJECT_PREFIXES:
                self.lines.append(f"{where}=module:{obj.__name__}")
                namespace = vars(obj)
                for name in sorted(names or ()):
                    if name in namespace:
                        self.visit(namespace[name], f"{obj.__name__}.{name}")
            return
        if id(obj) in self.seen:
            self.lines.append(f"{where}=seen:{_qualified(obj) if callable(obj) else type(obj).__name__}")
            return
        self.seen.add(id(obj))
        self.keep.append(obj)
        self._describe(obj, where)

    def _describe(self, obj: Any, where: str) -> None:
        if isinstance(obj, types.FunctionType):
            self._function(obj, where)
        elif isinstance(obj, (staticmethod, classmethod)):
            self.visit(obj.__func__, f"{where}.__func__")
        elif isinstance(obj, property):
            for part in ("fget", "fset", "fdel"):
                if getattr(obj, part) is not None:
                    self.visit(getattr(obj, part), f"{where}.{part}")
        elif isinstance(obj, types.MethodType):
            self.visit(obj.__func__, f"{where}.__func__")
            self.lines.append(f"{where}.__self__={type(obj.__self__).__name__}")
        elif isinstance(obj, functools.partial):
            self.visit(obj.func, f"{where}.func")
            self.visit(tuple(obj.args), f"{where}.args")
            self.visit(dict(obj.keywords), f"{where}.keywords")
        elif isinstance(obj, type):
            self._class(obj, where)
        elif isinstance(obj, (list, tuple, set, frozenset)):
            items = list(obj)
            if len(items) > _MAX_ITEMS:
                self.lines.append(f"{where}={type(obj).__name__}[{len(items)}]")
                return
            if isinstance(obj, (set, frozenset)):
                items = sorted(items, key=_key_text)
            self.lines.append(f"{where}={type(obj).__name__}[{len(items)}]")
            for index, item in enumerate(items):
                self.visit(item, f"{where}[{index}]")
        elif isinstance(obj, dict):
            if len(obj) > _MAX_ITEMS:
                self.lines.append(f"{where}=dict[{len(obj)}]")
                return
            self.lines.append(f"{where}=dict")
            # None values are skipped: memo tables record "no entry" as None while a process
            # runs (a lookup with a default reads both the same way).
            labelled = sorted(
                ((_key_text(key), key) for key, value in obj.items() if value is not None), key=lambda pair: pair[0]
            )
            for text, key in labelled:
                self.visit(obj[key], f"{where}[{text}]")
        elif (
            isinstance(obj, (types.BuiltinFunctionType, types.WrapperDescriptorType, types.MethodDescriptorType))
            or callable(obj)
            and not _is_project(obj)
            and not _is_project(type(obj))
        ):
            # C code or another library's callable: named, not walked.
            self.lines.append(f"{where}=external:{_qualified(obj)}")
        elif _is_project(type(obj)):
            # An instance of a project class (a registry entry, a pass object): its class and state.
            self.visit(type(obj), f"{where}.__class__")
            state = getattr(obj, "__dict__", None)
            if state is not None:
                self.visit(dict(state), f"{where}.__dict__")
        else:
            self.lines.append(f"{where}=instance:{_qualified(type(obj))}")

    def _function(self, fn: types.FunctionType, where: str) -> None:
        self.lines.append(f"{where}=fn:{code_digest(fn.__code__)}")
        if fn.__defaults__:
            self.visit(tuple(fn.__defaults__), f"{where}.__defaults__")
        if fn.__kwdefaults__:
            self.visit(dict(fn.__kwdefaults__), f"{where}.__kwdefaults__")
        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
            try:
                content = cell.cell_contents
            except ValueError:  # an empty cell (not yet assigned)
                self.lines.append(f"{where}.<closure {name}>=empty")
                continue
            self.visit(content, f"{where}.<closure {name}>")
        names = _all_names(fn.__code__)
        namespace = fn.__globals__
        for name in sorted(names):
            if name in namespace:
                value = namespace[name]
                self.visit(value, f"{fn.__module__}.{name}", names)

    def _class(self, cls: type, where: str) -> None:
        self.lines.append(f"{where}=class:{_qualified(cls)}")
        if not _is_project(cls):
            return
        for base in cls.__bases__:
            self.visit(base, f"{where}.__base__")
        for name in sorted(vars(cls)):
            if name in (
                "__dict__",
                "__weakref__",
                "__doc__",
                "__module__",
                "__qualname__",
                "__annotations__",
                "__slotnames__",
                "__abstractmethods__",
                "_abc_impl",
            ):  # runtime caches, not code
                continue
            self.visit(vars(cls)[name], f"{_qualified(cls)}.{name}")


def reachable_fingerprint(roots: Iterable[tuple[str, Any]]) -> str:
    """sha256 over everything the named roots can reach. Raises ``Unfingerprintable``."""
    walk = _Walk()
    for label, root in roots:
        walk.visit(root, label)
    return hashlib.sha256("\n".join(walk.lines).encode()).hexdigest()
