"""Generic checks. Each module in this package defines one ``CHECK``; adding a check is
adding a file. A pytest plugin outside the harness adds its own with the
``pytest_wrapq_checks(config)`` hook (harness/run/hookspecs.py). Order is by name, so node ids
are stable."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any, Iterable

from harness.checks.base import Check, CheckResult, Metric

__all__ = ["Check", "CheckResult", "Metric", "all_checks", "builtin_checks", "describe_checks"]


def builtin_checks() -> list[Check]:
    checks = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.name.startswith("_") or info.name == "base":
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        check = getattr(module, "CHECK", None)
        if not isinstance(check, Check):
            raise TypeError(f"harness.checks.{info.name} must define CHECK = Check(...)")
        checks.append(check)
    return checks


def all_checks(extra: Iterable[Check] = ()) -> list[Check]:
    """The harness's checks plus ``extra`` (from plugins), by name; a name used twice is an error."""
    extra = list(extra)
    for check in extra:
        if not isinstance(check, Check):
            raise TypeError(f"a plugin's pytest_wrapq_checks returned {check!r}, not a harness Check")
    checks = sorted(builtin_checks() + extra, key=lambda c: c.name)
    names = [c.name for c in checks]
    if len(names) != len(set(names)):
        raise ValueError(f"duplicate check names: {sorted(n for n in set(names) if names.count(n) > 1)}")
    return checks


def describe_checks(checks: Iterable[Check]) -> dict[str, dict[str, Any]]:
    """What results.json carries about each check (metrics, report fragment), so the summary,
    report and history work from the file alone."""
    return {check.name: check.describe() for check in checks}
