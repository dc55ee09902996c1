"""Another tico's sources on disk, from the forms ``WRAPQ_TICO`` takes: a checkout or a tree holding
``tico/`` (or the package itself), a wheel file, or a release or nightly version on the package index.

``--select-changed BASE`` diffs the tico under review against these sources. Wheels are unpacked
and versions downloaded once into a cache keyed by the wheel's sha256 or the version, under a lock,
so xdist workers read what the controller fetched. Every form that cannot give a tico package is a
``BaseSourceError`` that says which form was tried and why it failed.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from filelock import FileLock

from harness.tico_facts.tico_diff import package_root

_VERSION = re.compile(r"^[0-9][0-9A-Za-z.+!-]*$")
# Files of a checkout that declare tico's dependencies.
_CHECKOUT_DECLARATIONS = ("setup.py", "setup.cfg", "pyproject.toml")


class BaseSourceError(ValueError):
    """BASE names no tico the harness can read."""


def _unpacked(wheel: Path, target: Path) -> Path:
    with FileLock(str(target) + ".lock"):
        if not (target / "tico" / "__init__.py").is_file():
            staging = Path(tempfile.mkdtemp(prefix=target.name + "-", dir=target.parent))
            try:
                with zipfile.ZipFile(wheel) as archive:
                    archive.extractall(staging)
            except (OSError, zipfile.BadZipFile) as exc:
                raise BaseSourceError(f"{wheel} is no readable wheel: {exc}") from exc
            shutil.rmtree(target, ignore_errors=True)  # a half-written unpack from a killed run
            staging.rename(target)
    return package_root(target)


def _downloaded(version: str, cache: Path) -> Path:
    target = cache / f"version-{version}"
    with FileLock(str(target) + ".download.lock"):
        wheels = sorted((cache / f"wheels-{version}").glob("tico-*.whl"))
        if not wheels:
            command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--pre", "--only-binary=:all:"]
            command += ["--dest", str(cache / f"wheels-{version}"), f"tico=={version}"]
            done = subprocess.run(command, capture_output=True, text=True, timeout=600)
            wheels = sorted((cache / f"wheels-{version}").glob("tico-*.whl"))
            if done.returncode != 0 or not wheels:
                said = (done.stderr.strip().splitlines() or ["no wheel came back"])[-1]
                raise BaseSourceError(f"tico=={version} could not be downloaded from the package index: {said}")
    return _unpacked(wheels[0], target)


def resolve(spec: str, cache: Path) -> Path:
    """The ``tico`` package directory of ``spec``."""
    cache.mkdir(parents=True, exist_ok=True)
    path = Path(spec).expanduser()
    try:
        if path.is_dir():
            return package_root(path.resolve())
        if path.is_file() and path.suffix == ".whl":
            digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
            return _unpacked(path, cache / f"wheel-{digest}")
        if _VERSION.match(spec) and not path.exists():
            return _downloaded(spec, cache)
    except FileNotFoundError as exc:  # unpacked or found, but no tico package in it
        raise BaseSourceError(f"{spec}: {exc}") from None
    raise BaseSourceError(
        f"{spec!r} is neither a directory holding tico, a .whl file nor a version on the package index"
    )


def declarations(package: Path) -> dict[str, str] | None:
    """What declares this tico's dependencies, comparable between two sources of the same form: a
    wheel's or an install's ``Requires-Dist`` lines, or a checkout's setup files by content; None
    where neither is beside the package (a plain tree)."""
    metadata = sorted(package.parent.glob("tico-*.dist-info/METADATA"))
    if len(metadata) == 1:
        lines = [line for line in metadata[0].read_text().splitlines() if line.startswith("Requires-Dist:")]
        return {"Requires-Dist": "\n".join(sorted(lines))}
    found = {
        name: hashlib.sha256((package.parent / name).read_bytes()).hexdigest()
        for name in _CHECKOUT_DECLARATIONS
        if (package.parent / name).is_file()
    }
    found |= {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(package.parent.glob("requirements*.txt"))
    }
    return found or None
