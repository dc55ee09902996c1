"""Golden files on disk: ``<case>.<profile>.safetensors`` + ``<case>.<profile>.json`` (the
manifest), written atomically under a per-case file lock (tensors first, manifest last),
read back verified against each other (dtype, shape, sha256 per tensor), staged per run and
promoted when the run ends, and listed to find goldens no case defines."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock

from harness.records import rerun
from harness.records.overhead import overhead
from harness.records.results import atomic_write_bytes, atomic_write_text

# 2: portable comparison (input hash without float bits, input sketch, platform record).
MANIFEST_SCHEMA = 2
NOISE_FILE = "noise.json"


class GoldenError(Exception):
    """A golden file is missing, unreadable or inconsistent; the message says what to do."""


def tensor_sha256(t: torch.Tensor) -> str:
    t = t.detach().contiguous().cpu()
    h = hashlib.sha256(str(t.dtype).encode() + str(tuple(t.shape)).encode())
    h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def paths(golden_dir: Path, case: str, profile: str) -> tuple[Path, Path]:
    return golden_dir / f"{case}.{profile}.safetensors", golden_dir / f"{case}.{profile}.json"


def update_command(nodeid: str) -> str:
    return rerun.command(nodeid, extra="--update-golden")


STAGING = ".staged"


def _case_lock(golden_dir: Path, case: str, profile: str) -> FileLock:
    golden_dir.mkdir(parents=True, exist_ok=True)
    return FileLock(str(golden_dir / f".{case}.{profile}.lock"))


def staging_dir(golden_dir: Path, run_id: str) -> Path:
    """Where one run's items stage the goldens it rewrites, until the run ends."""
    return golden_dir / STAGING / run_id


def write_files(
    golden_dir: Path, case: str, profile: str, tensors: dict[str, torch.Tensor], manifest: dict[str, Any]
) -> None:
    from safetensors.torch import save

    tensor_path, manifest_path = paths(golden_dir, case, profile)
    with _case_lock(golden_dir, case, profile):
        with overhead("golden_io"):
            atomic_write_bytes(tensor_path, save(tensors, metadata={"input_hash": manifest["input_hash"]}))
        atomic_write_text(manifest_path, json.dumps(manifest, indent=2, sort_keys=True))


def load(golden_dir: Path, case: str, profile: str, nodeid: str) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Manifest and tensors, verified against each other; GoldenError with the fix otherwise."""
    with overhead("golden_io"):
        return _load(golden_dir, case, profile, nodeid)


def _load(golden_dir: Path, case: str, profile: str, nodeid: str) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    from safetensors.torch import load_file

    tensor_path, manifest_path = paths(golden_dir, case, profile)
    if not tensor_path.exists() and not manifest_path.exists():
        raise GoldenError(f"no golden for {case}[{profile}] in {golden_dir}; create it with: {update_command(nodeid)}")
    if not manifest_path.exists():
        raise GoldenError(f"golden manifest {manifest_path.name} is missing; regenerate with: {update_command(nodeid)}")
    if not tensor_path.exists():
        raise GoldenError(f"golden tensors {tensor_path.name} are missing; regenerate with: {update_command(nodeid)}")
    try:
        manifest = json.loads(manifest_path.read_text())
        if manifest.get("schema") != MANIFEST_SCHEMA or not isinstance(manifest.get("tensors"), dict):
            raise ValueError(f"unsupported manifest schema {manifest.get('schema')!r}")
    except (ValueError, OSError) as exc:
        raise GoldenError(f"golden manifest {manifest_path.name} is unreadable: {exc}") from exc
    try:
        tensors = load_file(str(tensor_path))
    except Exception as exc:  # noqa: BLE001 - safetensors raises several types for bad files
        raise GoldenError(
            f"golden tensors {tensor_path.name} are unreadable ({type(exc).__name__}: {exc}); "
            f"regenerate with: {update_command(nodeid)}"
        ) from exc
    listed, stored = set(manifest["tensors"]), set(tensors)
    if listed != stored:
        raise GoldenError(
            f"golden {tensor_path.name} does not match its manifest: "
            f"missing {sorted(listed - stored)[:5]}, unlisted {sorted(stored - listed)[:5]}"
        )
    for key, entry in manifest["tensors"].items():
        t = tensors[key]
        if str(t.dtype).removeprefix("torch.") != entry["dtype"] or list(t.shape) != entry["shape"]:
            raise GoldenError(
                f"golden tensor {key}: file holds {t.dtype} {list(t.shape)}, "
                f"manifest says {entry['dtype']} {entry['shape']}"
            )
        if tensor_sha256(t) != entry["sha256"]:
            raise GoldenError(
                f"golden tensor {key}: checksum mismatch, the file was modified or corrupted; "
                f"regenerate with: {update_command(nodeid)}"
            )
    return manifest, tensors


def promote(staging: Path, golden_dir: Path) -> list[str]:
    """Move every golden staged in ``staging`` into ``golden_dir`` (tensors first, manifest
    last, atomically, under the case's lock) and remove the staging directory. Returns the
    '<case>.<profile>' names written."""
    if not staging.is_dir():
        return []
    written = []
    for manifest_path in sorted(staging.glob("*.json")):
        stem = manifest_path.name.removesuffix(".json")
        tensor_path = staging / f"{stem}.safetensors"
        if not tensor_path.is_file():
            continue  # a half-staged golden (its item crashed mid-write) is never promoted
        case, _, profile = stem.rpartition(".")
        with _case_lock(golden_dir, case, profile):
            os.replace(tensor_path, golden_dir / tensor_path.name)
            os.replace(manifest_path, golden_dir / manifest_path.name)
        written.append(stem)
    shutil.rmtree(staging, ignore_errors=True)
    try:
        staging.parent.rmdir()  # the last run to finish leaves no staging directory behind
    except OSError:
        pass  # another run is still staging
    return written


def orphans(golden_dir: Path, case_names: set[str]) -> list[str]:
    """'<case>.<profile>' goldens whose case no collected case file defines."""
    if not golden_dir.is_dir():
        return []
    stems = [p.name.removesuffix(".json") for p in sorted(golden_dir.glob("*.json")) if p.name != NOISE_FILE]
    return [stem for stem in stems if stem.rpartition(".")[0] not in case_names]


def golden_set_id(golden_dir: Path) -> str | None:
    """Identity of the committed golden set (hash of every manifest), for merge safety."""
    manifests = sorted(golden_dir.glob("*.json")) if golden_dir.is_dir() else []
    if not manifests:
        return None
    h = hashlib.sha256()
    for path in manifests:
        h.update(path.name.encode() + path.read_bytes())
    return h.hexdigest()[:16]
