"""The table of harness modules in docs/architecture.md: each module and the first paragraph of its
docstring (its job). ``--write`` replaces the table between the markers; tests/test_house.py fails
when it is stale.

    ./scripts/env.sh python scripts/module_table.py --write
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "architecture.md"
BEGIN, END = "<!-- modules:begin -->", "<!-- modules:end -->"


def table() -> str:
    rows = ["| module | its job |", "|---|---|"]
    for path in sorted((ROOT / "harness").rglob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        job = " ".join(doc.split("\n\n")[0].split()).replace("|", "\\|")
        rows.append(f"| `{path.relative_to(ROOT).as_posix()}` | {job} |")
    return "\n".join(rows)


def current() -> str:
    text = PAGE.read_text()
    return text[text.index(BEGIN) + len(BEGIN) : text.index(END)].strip()


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        text = PAGE.read_text()
        start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
        PAGE.write_text(text[:start] + "\n" + table() + "\n" + text[end:])
    else:
        print(table())
