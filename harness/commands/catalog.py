"""``python -m harness catalog [--write]``: print the case x check catalog, or rewrite it in docs/catalog.md."""

from __future__ import annotations

import argparse

from harness.model.case_loading import ROOT
from harness.report.case_catalog import BEGIN, END, table

HELP = "print or write the case x check catalog (docs/catalog.md)"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness catalog", description=HELP)
    parser.add_argument("--write", action="store_true", help="rewrite the table in docs/catalog.md in place")
    args = parser.parse_args(argv)
    text = table()
    if not args.write:
        print(text)
        return 0
    readme = ROOT / "docs" / "catalog.md"
    content = readme.read_text()
    start, end = content.index(BEGIN) + len(BEGIN), content.index(END)
    readme.write_text(content[:start] + "\n" + text + "\n" + content[end:])
    return 0
