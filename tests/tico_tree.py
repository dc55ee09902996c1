"""A modified copy of the installed tico, and the harness run with it imported first, as a TICO
checkout under review is (scripts/env.sh's WRAPQ_TICO=<dir> puts the tree in front the same way)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

from tests import preloaded_python

REPO = Path(__file__).resolve().parents[1]


def installed_tico() -> Path:
    spec = importlib.util.find_spec("tico")
    return Path(list(spec.submodule_search_locations)[0])


def copy_tico(tmp_path: Path, name: str) -> Path:
    """The installed tico at ``tmp_path/name/tico``, its compiled modules included: the copy keeps each
    source's modification time, so a module the test leaves alone is read from its bytecode (CI sets
    PYTHONDONTWRITEBYTECODE: without it every nested run compiled tico again) and an edited one, newer
    than its bytecode, is compiled from the edit."""
    tree = tmp_path / name
    shutil.copytree(installed_tico(), tree / "tico")
    return tree


def edit(tree: Path, relative: str, old: str, new: str) -> None:
    path = tree / "tico" / relative
    text = path.read_text()
    assert text.count(old) == 1, f"{relative}: the edit's anchor must occur once"
    path.write_text(text.replace(old, new))


def run_harness(
    tree: Path | None, tmp_path: Path, *selection: str, caches: bool | Path = False
) -> tuple[int, dict, str]:
    """pytest over ``selection`` (a ``-k`` expression or node ids) with ``tree`` first on the path (None: the
    installed tico); caches off unless ``caches``: True for the project's own (as a user's run has them), a
    directory for caches of the caller's own (a later run of the same tree reads what an earlier one stored);
    (exit code, results.json, output)."""
    name = tree.name if tree is not None else "installed"
    report = tmp_path / f"reports-{name}-{len(list(tmp_path.glob('reports-*')))}"
    env = dict(os.environ)
    if tree is not None:
        env |= {"PYTHONPATH": os.pathsep.join([str(tree), str(REPO)]), "WRAPQ_TICO": str(tree)}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    if isinstance(caches, Path):
        cmd += [f"--circle-cache={caches / 'circle'}", f"--export-cache={caches / 'export'}"]
    elif not caches:
        cmd += ["--no-circle-cache", "--no-export-cache"]
    cmd += [f"--wrapq-report-dir={report}", *selection]
    done = preloaded_python.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1500)
    results = json.loads((report / "results.json").read_text())
    return done.returncode, results, done.stdout + done.stderr
