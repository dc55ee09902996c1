"""The house rules hold: the import-linter contracts in pyproject.toml (no import cycle, the engine
never imports the cases, the layers) and ruff's lint and format."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_import_contracts_are_kept():
    result = _run(str(BIN / "lint-imports"))
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def test_ruff_lint_is_clean():
    result = _run(str(BIN / "ruff"), "check", ".")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def test_ruff_format_is_clean():
    result = _run(str(BIN / "ruff"), "format", "--check", ".")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def test_no_harness_module_is_over_400_lines():
    sizes = {p.relative_to(ROOT).as_posix(): len(p.read_text().splitlines()) for p in (ROOT / "harness").rglob("*.py")}
    assert {name: n for name, n in sizes.items() if n > 400} == {}


def test_the_module_table_is_current():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import module_table
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    assert module_table.current() == module_table.table(), (
        "run: ./scripts/env.sh python scripts/module_table.py --write"
    )


def _function_level_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import of a harness module written inside a function or class."""
    tree = ast.parse(path.read_text())
    nested = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for inner in ast.walk(node):
                if isinstance(inner, ast.ImportFrom) and (inner.module or "").startswith("harness"):
                    nested.append((inner.lineno, inner.module))
                elif isinstance(inner, ast.Import) and any(a.name.startswith("harness") for a in inner.names):
                    nested.append((inner.lineno, inner.names[0].name))
    return sorted(set(nested))


def test_harness_imports_are_at_the_top_unless_a_comment_says_why_not():
    """No import cycle needs dodging (the contracts above): an import of a harness module inside a
    function says on its line why it is deferred (``# deferred: ...``)."""
    unexplained = []
    for path in (ROOT / "harness").rglob("*.py"):
        lines = path.read_text().splitlines()
        for lineno, module in _function_level_imports(path):
            if "# deferred:" not in lines[lineno - 1]:
                unexplained.append(f"{path.relative_to(ROOT)}:{lineno} {module}")
    assert unexplained == []


def test_only_the_commands_define_main_and_no_two_modules_share_a_name():
    mains = sorted(
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "harness").rglob("*.py")
        if any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in ast.parse(p.read_text()).body)
    )
    assert [m for m in mains if not m.startswith("harness/commands/") and m != "harness/__main__.py"] == []
    names: dict[str, list[str]] = {}
    for p in (ROOT / "harness").rglob("*.py"):
        if p.name != "__init__.py" and p.parent.name not in ("checks", "commands"):
            names.setdefault(p.stem, []).append(p.relative_to(ROOT).as_posix())
    # a check or a command is named after what it checks or does; every other module name is unique
    checks_and_commands = {p.stem for d in ("checks", "commands") for p in (ROOT / "harness" / d).glob("*.py")}
    assert {n: paths for n, paths in names.items() if len(paths) > 1 or n in checks_and_commands} == {}
