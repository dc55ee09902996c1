"""Every private torch / pytest / xdist API the harness relies on, in one place.

Each is looked up here once, against the versions the harness was tested with (``TESTED``);
``problems()`` lists what is missing or untested, and the plugin refuses to start when a
required one is gone (``require()``), naming the API and the installed version -- a loud
error at startup instead of a slow or hanging run later. An optional one (the deferred FX
codegen, a speed-up only) falls back and says so.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import inspect
from typing import Any

# distribution -> the major.minor series these private uses were read and tested against
TESTED = {"torch": "2.13", "pytest": "9.2", "pytest-xdist": "3.8"}


class CompatError(RuntimeError):
    """A private API the harness needs is missing in the installed version."""


def _series(distribution: str) -> str:
    try:
        version = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"
    return ".".join(version.split("+")[0].split(".")[:2])


def _lookup(distribution: str, module: str, attribute: str) -> Any:
    try:
        value = importlib.import_module(module)
        for part in attribute.split("."):
            value = getattr(value, part)
        return value
    except (ImportError, AttributeError) as exc:
        raise CompatError(
            f"{module}.{attribute} is not available in {distribution} {_series(distribution)} "
            f"(the harness was tested with {TESTED[distribution]}): {exc}"
        ) from None


# -- torch ------------------------------------------------------------------------------
# torch has no public pytree module in 2.13; export programs and outputs are pytrees.
def _pytree() -> Any:
    return importlib.import_module("torch.utils._pytree")


def tree_flatten(tree: Any) -> tuple[list, Any]:
    return _pytree().tree_flatten(tree)


def tree_leaves(tree: Any) -> list:
    return _pytree().tree_leaves(tree)


def tree_unflatten(leaves: list, spec: Any) -> Any:
    return _pytree().tree_unflatten(leaves, spec)


def treespec_dumps(spec: Any) -> str:
    return _pytree().treespec_dumps(spec)


def treespec_loads(text: str) -> Any:
    return _pytree().treespec_loads(text)


def torch_dispatch_mode() -> type:
    """torch's TorchDispatchMode: how export reuse sees the aten ops an adapter dispatches."""
    return _lookup("torch", "torch.utils._python_dispatch", "TorchDispatchMode")


def lazy_graph_module() -> tuple[Any, Any] | None:
    """(_LazyGraphModule, _use_lazy_graph_module), or None where torch lacks them (conversion
    then regenerates code after every pass, as tico does: slower, same result)."""
    try:
        return (
            _lookup("torch", "torch.fx._lazy_graph_module", "_LazyGraphModule"),
            _lookup("torch", "torch.fx._lazy_graph_module", "_use_lazy_graph_module"),
        )
    except CompatError:
        return None


def replace_program_graph_module(program: Any, graph_module: Any) -> None:
    """ExportedProgram keeps its graph module in ``_graph_module`` (its property has no setter)."""
    if not hasattr(program, "_graph_module"):
        raise CompatError(
            f"ExportedProgram has no _graph_module in torch {_series('torch')} (tested with {TESTED['torch']})"
        )
    program._graph_module = graph_module


# -- pytest ------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _skip_takes_item_location() -> bool:
    import pytest

    return "_use_item_location" in inspect.signature(pytest.skip.Exception.__init__).parameters


def skip_at_item(reason: str) -> None:
    """Skip, reported at the item's location (the case file) rather than the plugin's line."""
    import pytest

    if _skip_takes_item_location():
        raise pytest.skip.Exception(reason, _use_item_location=True)
    raise pytest.skip.Exception(reason)


# -- pytest-xdist -------------------------------------------------------------------------
XDIST_SCHEDULER_MEMBERS = ("remove_node", "_reschedule", "_assign_work_unit", "_pending_of", "_split_scope")
XDIST_SCHEDULER_STATE = ("assigned_work", "workqueue")


def loadscope_scheduling() -> type:
    """xdist's LoadScopeScheduling, with the members the crash-safe subclass overrides or reads."""
    cls = _lookup("pytest-xdist", "xdist.scheduler", "LoadScopeScheduling")
    missing = [name for name in XDIST_SCHEDULER_MEMBERS if not hasattr(cls, name)]
    source = inspect.getsource(cls.__init__) if hasattr(cls, "__init__") else ""
    missing += [name for name in XDIST_SCHEDULER_STATE if f"self.{name}" not in source]
    if missing:
        raise CompatError(
            f"xdist.scheduler.LoadScopeScheduling lacks {', '.join(missing)} in pytest-xdist "
            f"{_series('pytest-xdist')} (tested with {TESTED['pytest-xdist']})"
        )
    return cls


# -- the guard ---------------------------------------------------------------------------
def problems() -> list[str]:
    """Everything that does not hold on the installed stack: a missing private API (required or
    optional), or a distribution outside the tested series."""
    found = []
    for check in (_pytree, torch_dispatch_mode, loadscope_scheduling):
        try:
            check()
        except (CompatError, ImportError) as exc:
            found.append(str(exc))
    for name in ("tree_flatten", "tree_leaves", "tree_unflatten", "treespec_dumps", "treespec_loads"):
        if not hasattr(_pytree(), name):
            found.append(f"torch.utils._pytree.{name} is missing in torch {_series('torch')}")
    if lazy_graph_module() is None:
        found.append(
            f"torch.fx._lazy_graph_module is missing in torch {_series('torch')}: Circle conversion "
            f"regenerates code after every pass (slower, same result)"
        )
    if not _skip_takes_item_location():
        found.append(
            f"pytest {_series('pytest')} skip() takes no _use_item_location: skips are reported at the plugin's line"
        )
    for distribution, series in TESTED.items():
        if _series(distribution) not in (series, "not installed"):
            found.append(
                f"{distribution} {_series(distribution)} is not the tested series {series}: the private "
                f"APIs above were checked present, their behaviour was not"
            )
    return found


def require() -> None:
    """Refuse to run where a required private API is gone (the optional ones only slow down)."""
    for check in (_pytree, torch_dispatch_mode):
        check()
