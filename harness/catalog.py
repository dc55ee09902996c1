"""Generated cases x checks table (applicable / n/a / expected failure), for docs/catalog.md.

python -m harness.catalog            # print the markdown table
python -m harness.catalog --write    # replace the table between the markers in docs/catalog.md
"""

from __future__ import annotations

import argparse
import importlib
import sys
import tomllib
from pathlib import Path
from types import ModuleType

from harness import limits_data
from harness.case import Case
from harness.checks import all_checks
from harness.findings import for_this_tico

BEGIN, END = "<!-- catalog:begin -->", "<!-- catalog:end -->"
ROOT = Path(__file__).resolve().parents[1]


def configured_case_dirs() -> list[Path]:
    """The case directories pytest collects (``wrapq_cases_dir`` in pyproject.toml)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    dirs = config["tool"]["pytest"]["ini_options"].get("wrapq_cases_dir", "cases")
    return [ROOT / d for d in dirs.split()]


def add_configured_import_roots() -> None:
    """Put the import roots pytest gets from pyproject (``pythonpath``, the out-of-tree example's
    package too) on sys.path, for scripts that load cases outside pytest."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for entry in reversed(config["tool"]["pytest"]["ini_options"].get("pythonpath", [])):
        if str(ROOT / entry) not in sys.path:
            sys.path.insert(0, str(ROOT / entry))


def cases_of(module: ModuleType) -> list[Case]:
    """A case module's cases as the harness runs them: with the limits data beside the file."""
    return limits_data.complete(list(getattr(module, "CASES", [])), Path(module.__file__))


def load_cases(case_dirs: list[Path] | None = None) -> list[tuple[str, Case]]:
    """(case file relative to the repo root, case) for every collected case."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    found = []
    for cases_dir in case_dirs or configured_case_dirs():
        for path in sorted(cases_dir.glob("[!_]*.py")):
            module_name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            module = importlib.import_module(module_name)
            found += [(path.relative_to(ROOT).as_posix(), case) for case in cases_of(module)]
    return found


def cell(case: Case, check) -> str:
    if check.name in case.not_applicable:
        return "n/a*"
    if check.applies(case) is not None:
        return "n/a"
    expectation = case.expected_failures.get(check.name)
    if expectation is not None and for_this_tico(expectation) is not None:
        return "xfail*"
    return "yes"


def table() -> str:
    checks = all_checks()
    lines = ["| case | profiles | " + " | ".join(c.name for c in checks) + " |", "|---|---|" + "---|" * len(checks)]
    for _, case in load_cases():
        lines.append(
            f"| `{case.name}` | {', '.join(case.profiles)} | " + " | ".join(cell(case, c) for c in checks) + " |"
        )
    lines.append("")
    lines.append(
        "`n/a`: the case lacks the capability; `n/a*`: not applicable for a reason stated in the case; "
        "`xfail*`: strict expected failure with a reason stated in the case (a pass fails)."
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.catalog", description=__doc__.splitlines()[0])
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


if __name__ == "__main__":
    raise SystemExit(main())
