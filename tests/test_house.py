"""The house rules hold: the import-linter contracts in pyproject.toml (no import cycle, the engine
never imports the cases, the layers) and ruff's lint and format."""

from __future__ import annotations

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
