"""On-disk store shared by the Circle and export caches: per key, a payload file and a JSON
manifest that records the payload's sha256. The payload is written first and the manifest
last, each atomically, so a reader finds a whole entry or none; a payload that does not match
its manifest is reported as damaged, never returned; ``lookup`` turns any damage into a noted
miss, the one policy both caches follow."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Callable, TypeVar

from harness.records.results import atomic_write_bytes, atomic_write_text

Decoded = TypeVar("Decoded")


class Uncacheable(Exception):
    """What is to be cached holds something its key cannot describe exactly: the cache is not used."""


class EntryStore:
    """<root>/<key[:2]>/<key><suffix> (payload) + <key>.json (manifest)."""

    def __init__(self, root: Path, suffix: str, label: str):
        self.root = Path(root)
        self.suffix = suffix
        self.label = label

    def _paths(self, key: str) -> tuple[Path, Path]:
        folder = self.root / key[:2]
        return folder / f"{key}{self.suffix}", folder / f"{key}.json"

    def read(self, key: str) -> tuple[bytes, dict[str, Any]] | None:
        """(payload, manifest), or None when there is no entry. Raises when the entry is damaged
        (unreadable, not JSON, or a payload that does not match its recorded sha256)."""
        payload_path, manifest_path = self._paths(key)
        if not manifest_path.exists() or not payload_path.exists():
            return None
        manifest = json.loads(manifest_path.read_text())
        payload = payload_path.read_bytes()
        if hashlib.sha256(payload).hexdigest() != manifest["payload_sha256"]:
            raise ValueError("payload does not match its recorded sha256")
        return payload, manifest

    def lookup(
        self, key: str, decode: Callable[[bytes, dict[str, Any]], Decoded], on_damage: str
    ) -> tuple[Decoded | None, list[str]]:
        """The decoded entry (None on a miss) and notes. A damaged entry -- one ``read`` rejects
        or ``decode`` cannot decode -- is a noted miss, never a wrong answer; ``on_damage``
        says what the caller does instead."""
        try:
            found = self.read(key)
            return (None, []) if found is None else (decode(*found), [])
        except Exception as exc:  # noqa: BLE001 - any damage is a miss
            return None, [f"{self.label} entry {key[:12]} unreadable ({type(exc).__name__}: {exc}); {on_damage}"]

    def write(self, key: str, payload: bytes, manifest: dict[str, Any]) -> None:
        payload_path, manifest_path = self._paths(key)
        atomic_write_bytes(payload_path, payload)
        atomic_write_text(manifest_path, json.dumps(dict(manifest, payload_sha256=hashlib.sha256(payload).hexdigest())))
