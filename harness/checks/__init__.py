"""Generic checks. Each module in this package defines one ``CHECK``; adding a check is
adding a file. Order is the module name order, so node ids are stable."""

from __future__ import annotations

import importlib
import pkgutil

from harness.checks.base import Check, CheckResult

__all__ = ["Check", "CheckResult", "all_checks"]


def all_checks() -> list[Check]:
    checks = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.name.startswith("_") or info.name == "base":
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        check = getattr(module, "CHECK", None)
        if not isinstance(check, Check):
            raise TypeError(f"harness.checks.{info.name} must define CHECK = Check(...)")
        checks.append(check)
    names = [c.name for c in checks]
    if len(names) != len(set(names)):
        raise ValueError(f"duplicate check names: {names}")
    return checks
