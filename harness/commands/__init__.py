"""Command-line tools of ``python -m harness``: one module per command, each with ``HELP`` and
``main(argv) -> int``. Modules starting with ``_`` are helpers, not commands."""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType


def available() -> list[str]:
    """Command names: the module names, with '-' for '_' (``new_case.py`` is ``new-case``)."""
    return sorted(
        info.name.replace("_", "-") for info in pkgutil.iter_modules(__path__) if not info.name.startswith("_")
    )


def load(name: str) -> ModuleType:
    module = importlib.import_module(f"{__name__}.{name.replace('-', '_')}")
    if not callable(getattr(module, "main", None)) or not isinstance(getattr(module, "HELP", None), str):
        raise TypeError(f"harness.commands.{name} must define HELP (str) and main(argv) -> int")
    return module
