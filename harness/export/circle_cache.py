"""Content-addressed on-disk cache for tico's ExportedProgram -> Circle conversion.

Conversion is most of a case's export cost, and on a rerun with nothing changed it produces
the same bytes. The key is computed from the exported program itself -- graph code, every
node's target, arguments and tensor metadata, source locations, every parameter, buffer and
constant byte, the input specs -- plus the torch and tico versions, a hash of tico's
installed source and of the harness code that produces the cached audit. Keying on the
traced graph (not on case names or versions) keeps the cache sound when a wrapper is edited
or monkeypatched: a changed computation traces to a different graph or different tensors.

Anything the hasher does not understand makes the program uncacheable (converted every
time), never a guess. Entries are written atomically; a damaged entry is a miss that gets
rewritten, with a note.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.metadata
import json
import re
from pathlib import Path
from typing import Any

import torch

from harness.circle.missing_qparams import AuditResult
from harness.export.circle_conversion import convert_with_audit
from harness.export.code_fingerprint import Unfingerprintable, reachable_fingerprint
from harness.export.entry_store import EntryStore, Uncacheable
from harness.export.failure_replay import RecordedFailure

KEY_SCHEMA = "circle-cache-v1"
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
# node.meta entries that describe what the node computes or where it came from; others
# (seq_nr, from_node, ...) are bookkeeping that differs between identical traces.
_META_KEYS = ("val", "tensor_meta", "stack_trace", "nn_module_stack")


def _tensor_bytes(tensor: torch.Tensor) -> bytes:
    t = tensor.detach().cpu().contiguous()
    if t.is_quantized or t.layout != torch.strided:
        raise Uncacheable(f"tensor with layout {t.layout} / quantized={t.is_quantized}")
    return t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def _layout_strides(shape: Any, strides: Any) -> tuple:
    """Strides with those of size-1 dims blanked: they never change the memory layout, and
    tracing leaves different values there depending on what ran earlier in the process."""
    return tuple(None if size == 1 else stride for size, stride in zip(tuple(shape), tuple(strides)))


def _describe(value: Any) -> str:
    """A deterministic text for a node argument or metadata value (no object addresses)."""
    if isinstance(value, torch.Tensor):  # FakeTensor in meta["val"]: only its spec matters
        return f"T({value.dtype},{tuple(value.shape)},{_layout_strides(value.shape, value.stride())})"
    if type(value).__name__ == "TensorMetadata" and hasattr(value, "_fields"):
        fields = value._asdict()
        fields["stride"] = _layout_strides(fields["shape"], fields["stride"])
        fields["shape"] = tuple(fields["shape"])
        return "TensorMetadata" + _describe(fields)
    if isinstance(value, torch.fx.Node):
        return f"%{value.name}"
    if isinstance(value, (list, tuple)):
        inner = ",".join(_describe(v) for v in value)
        return f"{type(value).__name__}[{inner}]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{_describe(k)}:{_describe(v)}" for k, v in value.items()) + "}"
    if isinstance(
        value,
        (
            int,
            float,
            bool,
            str,
            type(None),
            torch.dtype,
            torch.device,
            torch.memory_format,
            torch.layout,
            torch.SymInt,
            torch.SymFloat,
            torch.SymBool,
            slice,
        ),
    ):
        return repr(value)
    if isinstance(value, torch._ops.OpOverload) or callable(value):
        return f"{getattr(value, '__module__', '')}.{getattr(value, '__qualname__', str(value))}"
    text = repr(value)
    if _ADDRESS.search(text):
        raise Uncacheable(f"cannot describe {type(value).__name__} deterministically")
    return f"{type(value).__name__}:{text}"


def program_fingerprint(program: Any) -> str:
    """sha256 of everything in an ExportedProgram that conversion could depend on."""
    h = hashlib.sha256()

    def put(label: str, data: bytes | str) -> None:
        payload = data.encode() if isinstance(data, str) else data
        h.update(f"{label}:{len(payload)}:".encode())
        h.update(payload)

    put("code", program.graph_module.code)
    for node in program.graph_module.graph.nodes:
        put("node", f"{node.op}|{node.name}|{_describe(node.target)}|{_describe(node.args)}|{_describe(node.kwargs)}")
        for key in _META_KEYS:
            if key in node.meta:
                value = node.meta[key]
                if key == "nn_module_stack":  # keyed by object ids; the (path, type) values are the content
                    value = list(value.values())
                put(f"meta.{key}", _describe(value))
    put("signature", _ADDRESS.sub("", str(program.graph_signature)))
    put("range_constraints", _describe({str(k): str(v) for k, v in program.range_constraints.items()}))
    for kind, mapping in (("state", program.state_dict), ("constant", program.constants)):
        for name in sorted(mapping):
            value = mapping[name]
            if not isinstance(value, torch.Tensor):
                raise Uncacheable(f"{kind} {name!r} is a {type(value).__name__}, not a tensor")
            put(f"{kind}.{name}", f"{value.dtype}|{tuple(value.shape)}|{type(value).__name__}")
            put(f"{kind}.{name}.bytes", _tensor_bytes(value))
    return h.hexdigest()


@functools.lru_cache(maxsize=None)
def _package_source_hash(package: str) -> str:
    """Hash of a package's installed .py files (catches a patched or rebuilt install)."""
    import importlib

    root = Path(importlib.import_module(package).__file__).parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


@functools.lru_cache(maxsize=None)
def harness_source_hash(*modules: str) -> str:
    """sha256 of the harness modules (paths under the harness package) that compute what a cache
    stores, in the order given."""
    here = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for name in modules:
        h.update((here / name).read_bytes())
    return h.hexdigest()


def _harness_source_hash() -> str:
    """The harness code that produces what is cached (conversion call and audit walker)."""
    return harness_source_hash(
        "export/circle_cache.py",
        "export/entry_store.py",
        "export/stages.py",
        "circle/missing_qparams.py",
        "export/circle_conversion.py",
        "circle/records.py",
        "circle/consistency.py",
        "circle/requantized.py",
        "export/failure_replay.py",
    )


def environment_fingerprint() -> dict[str, str]:
    return {
        "schema": KEY_SCHEMA,
        "torch": torch.__version__,
        "tico": importlib.metadata.version("tico"),
        "tico_source": _package_source_hash("tico"),
        "harness_source": _harness_source_hash(),
    }


def cache_key(program: Any) -> str:
    env = json.dumps(environment_fingerprint(), sort_keys=True)
    return hashlib.sha256(f"{env}\n{program_fingerprint(program)}".encode()).hexdigest()


@dataclasses.dataclass
class CacheEntry:
    binary: bytes
    audit: AuditResult


def conversion_code_fingerprint() -> str:
    """The conversion code as it is in memory now: everything tico's converter and the harness's
    conversion + audit can reach (harness.export.code_fingerprint). A pass, the qparam checker or an
    audit helper patched in memory changes it. Raises ``Uncacheable`` when something reachable
    cannot be described."""
    from tico.utils.convert import convert_exported_module_to_circle

    try:
        return reachable_fingerprint(
            [
                ("tico.utils.convert.convert_exported_module_to_circle", convert_exported_module_to_circle),
                ("harness.export.circle_conversion.convert_with_audit", convert_with_audit),
            ]
        )
    except Unfingerprintable as why:
        raise Uncacheable(f"the conversion code cannot be fingerprinted: {why}") from why


class CircleCache:
    """<key>.circle (the binary) + <key>.json (audit, environment, the binary's sha256).

    Entries are stored under the program key combined with ``conversion_code_fingerprint()``
    taken at each lookup and store, so an entry written by other conversion code -- another
    install or the same install patched in memory -- is never found."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self._store = EntryStore(self.root, ".circle", "circle cache")

    @staticmethod
    def _entry_key(key: str) -> str:
        return hashlib.sha256(f"{key}\n{conversion_code_fingerprint()}".encode()).hexdigest()

    def get(self, key: str) -> tuple[CacheEntry | RecordedFailure | None, list[str]]:
        """The entry -- a conversion, or the failure the same program and code produced -- (None
        on a miss) and notes on what was wrong with a damaged one. Raises ``Uncacheable`` when
        the conversion code cannot be fingerprinted."""
        return self._store.lookup(self._entry_key(key), _decode_entry, "reconverted")

    def put(self, key: str, entry: CacheEntry) -> None:
        self._store.write(
            self._entry_key(key),
            entry.binary,
            {"audit": dataclasses.asdict(entry.audit), "environment": environment_fingerprint()},
        )

    def put_failure(self, key: str, failure: RecordedFailure) -> None:
        """Store a conversion's reproducible failure (harness/export/failure_replay.py) under the key a
        success would have had."""
        self._store.write(
            self._entry_key(key), b"", {"failure": failure.manifest(), "environment": environment_fingerprint()}
        )


def _decode_entry(binary: bytes, meta: dict[str, Any]) -> CacheEntry | RecordedFailure:
    if "failure" in meta:
        return RecordedFailure.from_manifest(meta["failure"])
    return CacheEntry(binary=binary, audit=AuditResult(**meta["audit"]))
