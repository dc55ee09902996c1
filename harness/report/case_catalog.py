"""Generated cases x checks table (applicable / n/a / expected failure), for docs/catalog.md
(``python -m harness catalog [--write]``)."""

from __future__ import annotations

from harness.checks import all_checks
from harness.model.case import Case
from harness.model.case_loading import load_cases
from harness.tico_facts.findings_data import for_this_tico

BEGIN, END = "<!-- catalog:begin -->", "<!-- catalog:end -->"


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
