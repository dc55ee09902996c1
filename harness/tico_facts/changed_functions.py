"""What a change to tico touches, named the way a per-item coverage map names what an item runs.

A pull request's diff is hunks of lines; a map of what each item executes must survive line shifts
and other tico versions, so both speak in functions: a file under the tico package and the function's
qualified name (``QuantLinear.forward``, ``outer.inner``), never a line number. A hunk inside a
function (its decorators and ``def`` line included) changes that function, on the side it was
removed from and on the side it was added to. A hunk outside every function (imports, module-level
statements, a class body between methods, a registry list) cannot be narrowed to one: it is a
module-level change, and so are a new and a removed Python file. Any other file (a schema, a wheel's
metadata, a pinned requirement) is outside what a function map can answer. Issue 48's selection
reads these: functions select the items whose map holds them; everything else falls back wider.
"""

from __future__ import annotations

import ast
import difflib
from dataclasses import dataclass, field
from pathlib import Path

from harness.tico_facts import changed_lines

FUNCTION = "function"
MODULE = "module-level"
NEW_FILE = "new file"
REMOVED_FILE = "removed file"
NON_PYTHON = "non-Python file"
DEPENDENCIES = "dependency declarations"
# Files a build or an install writes that no change under review consists of.
_IGNORED_PARTS = ("__pycache__",)


@dataclass(frozen=True, order=True)
class Change:
    """One thing a change touches: ``file`` relative to the tico package; ``name`` the function's
    qualified name for a FUNCTION change, "" otherwise; ``lines`` the BASE anchors (the first statements
    of the blocks holding the change) a run must have run to reach it (``changed_lines``), None where
    they cannot narrow it (the whole function), empty where no line of the function changed."""

    file: str
    kind: str
    name: str = ""
    lines: frozenset[int] | None = field(default=None, compare=False)

    def label(self) -> str:
        return f"{self.file}: {self.name}" if self.kind == FUNCTION else f"{self.file}: {self.kind}"


def functions(source: str) -> list[tuple[str, int, int]]:
    """(qualified name, first line, last line) of every function and method in ``source``, nested ones
    included, the first line being the first decorator's; an unparsable file has none."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    found: list[tuple[str, int, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                    found.append((name, first, child.end_lineno or child.lineno))
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return found


def _innermost(spans: list[tuple[str, int, int]], line: int) -> str | None:
    holding = [(last - first, name) for name, first, last in spans if first <= line <= last]
    return min(holding)[1] if holding else None


def _touched_lines(base: list[str], head: list[str]) -> tuple[set[int], set[int], set[int], dict[int, int]]:
    """1-based lines removed or replaced in ``base``, added or replaced in ``head``, the base lines on
    either side of a pure insertion (code added between two statements of a function changes that
    function even when no base line changed), and each head line the diff leaves equal with its base line."""
    removed: set[int] = set()
    added: set[int] = set()
    beside: set[int] = set()
    equal: dict[int, int] = {}
    matcher = difflib.SequenceMatcher(None, base, head, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            equal.update({j + 1: i + 1 for i, j in zip(range(i1, i2), range(j1, j2))})
            continue
        removed.update(range(i1 + 1, i2 + 1))
        added.update(range(j1 + 1, j2 + 1))
        if tag == "insert":
            beside.update(line for line in (i1, i1 + 1) if 1 <= line <= len(base))
    return removed, added, beside, equal


def file_changes(relative: str, base: str, head: str) -> set[Change]:
    """The functions a change of one Python file touches, and its module level where a changed line
    of code lies outside every function (a blank or comment line there changes nothing), unless that
    code only adds names to BASE's imports (then the functions reading them are the change)."""
    removed, added, beside, equal = _touched_lines(base.splitlines(), head.splitlines())
    named: set[str] = set()
    inside: tuple[dict[int, str], dict[int, str]] = ({}, {})
    module_lines: tuple[set[int], set[int]] = (set(), set())
    spans = (functions(base), functions(head))
    for side, (source, lines, neighbours) in enumerate(((base, removed, beside), (head, added, set()))):
        text = source.splitlines()
        for line in lines | neighbours:
            name = _innermost(spans[side], line)
            if name is not None:
                named.add(name)
                if line in lines:
                    inside[side][line] = name
            elif line in lines and changed_lines.is_code(text, line):
                module_lines[side].add(line)
    touched: set[Change] = set()
    if any(module_lines):
        reads = changed_lines.added_import_reads(base, head, module_lines)
        if reads is None:
            touched.add(Change(relative, MODULE))
        else:
            for side, found in enumerate(reads):
                for line in found:
                    name = _innermost(spans[side], line)
                    if name is not None:
                        named.add(name)
                        inside[side][line] = name
    narrowed = changed_lines.anchors(base, head, equal, *inside)
    for name in named | narrowed.keys():
        touched.add(Change(relative, FUNCTION, name, narrowed.get(name, frozenset())))
    return touched


def changes(base_root: Path, head_root: Path) -> list[Change]:
    """Everything a change from the ``base_root`` tico package to ``head_root``'s touches, sorted."""

    def files(root: Path) -> dict[str, Path]:
        return {
            p.relative_to(root).as_posix(): p
            for p in root.rglob("*")
            if p.is_file() and not any(part in _IGNORED_PARTS for part in p.relative_to(root).parts)
        }

    base, head = files(base_root), files(head_root)
    found: set[Change] = set()
    for relative in sorted(set(base) | set(head)):
        if relative not in head:
            found.add(Change(relative, REMOVED_FILE if relative.endswith(".py") else NON_PYTHON))
        elif relative not in base:
            found.add(Change(relative, NEW_FILE if relative.endswith(".py") else NON_PYTHON))
        elif base[relative].read_bytes() != head[relative].read_bytes():
            if relative.endswith(".py"):
                found |= file_changes(relative, base[relative].read_text(), head[relative].read_text())
            else:
                found.add(Change(relative, NON_PYTHON))
    return sorted(found)
