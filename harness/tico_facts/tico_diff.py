"""Diff coverage of the tico under review: the lines a change to tico touches, and whether the
matrix ran each (from a ``--tico-coverage`` run's summary). The base is another tico's sources: a
directory holding the ``tico`` package (a checkout, an unpacked wheel, a site-packages) or a wheel."""

from __future__ import annotations

import ast
import difflib
import tempfile
import zipfile
from pathlib import Path
from typing import Any


def package_root(base: Path) -> Path:
    """The ``tico`` package directory in ``base``: the package itself, a directory holding it, or a
    wheel (unpacked into a temporary directory)."""
    if base.is_file() and base.suffix == ".whl":
        target = Path(tempfile.mkdtemp(prefix="tico-base-"))
        with zipfile.ZipFile(base) as wheel:
            wheel.extractall(target)
        base = target
    for candidate in (base, base / "tico"):
        if (candidate / "__init__.py").is_file() and (candidate / "quantization").is_dir():
            return candidate
    raise FileNotFoundError(f"{base} holds no tico package (expected tico/__init__.py and tico/quantization/)")


def _code_lines(source: str) -> set[int]:
    """Lines that carry a statement (what coverage could count), for files the run never imported."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    return {node.lineno for node in ast.walk(tree) if isinstance(node, ast.stmt)}


def changed_lines(base: str, head: str) -> list[int]:
    """1-based lines of ``head`` that are new or changed relative to ``base``."""
    matcher = difflib.SequenceMatcher(None, base.splitlines(), head.splitlines(), autojunk=False)
    lines: list[int] = []
    for tag, _, _, j1, j2 in matcher.get_opcodes():
        if tag in ("replace", "insert"):
            lines.extend(range(j1 + 1, j2 + 1))
    return lines


def diff_coverage(summary: dict[str, Any], base: Path) -> dict[str, Any]:
    """Every executable line the tico under review changed relative to ``base``: run or not."""
    head_root = Path(summary["tico_root"])
    base_root = package_root(base)
    measured = summary["files"]
    touched = ran = 0
    unreached: list[list[Any]] = []
    for path in sorted(head_root.rglob("*.py")):
        relative = path.relative_to(head_root).as_posix()
        old = base_root / relative
        head_text = path.read_text()
        changed = changed_lines(old.read_text() if old.is_file() else "", head_text)
        if not changed:
            continue
        entry = measured.get(relative)
        if entry is not None:
            executable = set(entry["executed_lines"]) | set(entry["missing_lines"])
            executed = set(entry["executed_lines"])
        else:
            executable, executed = _code_lines(head_text), set()
        lines = head_text.splitlines()
        for line in changed:
            if line not in executable:
                continue
            touched += 1
            if line in executed:
                ran += 1
            else:
                unreached.append([relative, line, lines[line - 1].strip()])
    return {"base": str(base_root), "head": str(head_root), "touched": touched, "ran": ran, "unreached": unreached}


def render(result: dict[str, Any], limit: int = 40) -> str:
    lines = [
        f"this change to tico touches {result['touched']} executable line(s); the harness ran {result['ran']}; "
        f"{len(result['unreached'])} no case reaches"
    ]
    per_file: dict[str, int] = {}
    for relative, _, _ in result["unreached"]:
        per_file[relative] = per_file.get(relative, 0) + 1
    if len(per_file) > 1:
        lines.append("unreached lines by file (most first):")
        ranked = sorted(per_file.items(), key=lambda kv: (-kv[1], kv[0]))
        lines += [f"  {count:5d}  {relative}" for relative, count in ranked[:15]]
        if len(ranked) > 15:
            lines.append(f"  ... {len(ranked) - 15} more file(s)")
        lines.append("the first unreached lines:")
    for relative, line, text in result["unreached"][:limit]:
        lines.append(f"  {relative}:{line}  {text[:90]}")
    if len(result["unreached"]) > limit:
        lines.append(f"  ... {len(result['unreached']) - limit} more (--limit N)")
    return "\n".join(lines)
