"""Which item and which stage tico's code runs for, as a ``--tico-coverage`` run labels it.

The per-item map (``item_map``) needs to know, for each item (case x profile x check), every tico
function its verdict depends on. An item runs some tico code itself and reads stages (wrap,
calibrate, export, Circle conversion ...) that the first item of its group to ask computed. So
coverage.py's context is the item's node id while the item runs, and ``<group>|<stage>`` while a
stage computes; each process also records which stages each item asked for (memo hits included)
and which stages a stage asked for while computing, so a later item that only read a stage still
reaches what computing it ran. Written per process as ``stages.<pid>.json`` beside the data, with the
process's tico modules in the order it imported them and, per group, how many it had imported by the
group's end (``imports``): a module-level change reaches the groups that had imported its module.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Callable

from harness.records import node_ids

STAGE_SEPARATOR = "|"
_FILE = "stages.{pid}.json"


def group_of_context(context: str) -> str:
    """The (case, profile) group a context belongs to ("" outside every item)."""
    if STAGE_SEPARATOR in context:
        return context.split(STAGE_SEPARATOR, 1)[0]
    return node_ids.group_of(context)


def stage_of_context(context: str) -> str | None:
    return context.split(STAGE_SEPARATOR, 1)[1] if STAGE_SEPARATOR in context else None


class StageContexts:
    """The stage observer of a measured process (``harness/primitives/stage_engine.observe_stages``)."""

    def __init__(self, switch_context: Callable[[str], None]):
        self._switch = switch_context
        self._item = ""
        self._running: list[str] = []
        self.asked: dict[str, set[str]] = {}
        self.deps: dict[str, dict[str, set[str]]] = {}
        self.items: set[str] = set()
        # group -> how many of the package's modules this process had imported by the group's end
        self.imported: dict[str, int] = {}

    def _group(self) -> str:
        return group_of_context(self._item)

    def item_starts(self, nodeid: str) -> None:
        """An item this process runs (one a crashed process ran is in no record: the map lacks it, and a
        selection runs it whatever changed)."""
        self._note_imports()
        self._item = nodeid
        self.items.add(nodeid)
        self._running.clear()
        self._switch(nodeid)

    def requested(self, name: str) -> None:
        if not self._item:
            return
        self.asked.setdefault(self._item, set()).add(name)
        if self._running:
            self.deps.setdefault(self._group(), {}).setdefault(self._running[-1], set()).add(name)

    def entered(self, name: str) -> None:
        self._running.append(name)
        if self._item:
            self._switch(f"{self._group()}{STAGE_SEPARATOR}{name}")

    def left(self, name: str) -> None:
        if self._running:
            self._running.pop()
        if self._item:
            below = f"{self._group()}{STAGE_SEPARATOR}{self._running[-1]}" if self._running else self._item
            self._switch(below)

    def _note_imports(self) -> None:
        """The item that ran until now had the package's modules imported so far (sys.modules keeps import
        order, so a count is a prefix of ``imported_modules``)."""
        if self._item:
            group = self._group()
            self.imported[group] = max(self.imported.get(group, 0), len(imported_modules()))

    def write(self, data_dir: Path) -> None:
        self._note_imports()
        document = {
            "asked": {item: sorted(found) for item, found in self.asked.items()},
            "deps": {group: {s: sorted(d) for s, d in deps.items()} for group, deps in self.deps.items()},
            "items": sorted(self.items),
            "imports": {"order": imported_modules(), "groups": self.imported},
        }
        (data_dir / _FILE.format(pid=os.getpid())).write_text(json.dumps(document))


def imported_modules(package: str = "tico") -> list[str]:
    """The package's modules this process imported, in import order, as files under the package
    (``quantization/wrapq/wrappers/nn/quant_linear.py``, a package as its ``__init__.py``)."""
    root = sys.modules.get(package)
    if root is None or not getattr(root, "__file__", None):
        return []
    top = Path(root.__file__).resolve().parent
    found = []
    for name, module in list(sys.modules.items()):
        where = getattr(module, "__file__", None) if (name == package or name.startswith(f"{package}.")) else None
        if where:
            path = Path(where).resolve()
            if path.is_relative_to(top):
                found.append(path.relative_to(top).as_posix())
    return found


def read_imports(data_dir: Path) -> list[dict]:
    """Each process's ``imports`` record (none from a run before they were kept)."""
    found = []
    for path in sorted(data_dir.glob(_FILE.format(pid="*"))):
        imports = json.loads(path.read_text()).get("imports")
        if imports is not None:
            found.append(imports)
    return found


def forget_memoized(package: str = "tico") -> int:
    """Empty every ``functools`` cache of the package's functions and methods (tico memoizes a few
    lookups per process): each item then runs what it needs itself, so the map never credits a
    memoized function, or what it calls, to only the item that happened to fill the cache first.
    Returns how many caches were emptied."""
    if _memoized[0] != len(sys.modules):
        _memoized[:] = [len(sys.modules), _caches_of(package)]
    for clear in _memoized[1]:
        clear()
    return len(_memoized[1])


_memoized: list = [-1, []]  # (len(sys.modules) when scanned, the cache_clear callables found)


def _caches_of(package: str) -> list[Callable[[], None]]:
    found = []
    for name, module in list(sys.modules.items()):
        if module is None or not (name == package or name.startswith(f"{package}.")):
            continue
        for value in list(vars(module).values()):
            members = [value]
            if isinstance(value, type) and value.__module__ == name:
                members += [getattr(m, "__func__", m) for m in vars(value).values()]
            found += [m.cache_clear for m in members if callable(getattr(m, "cache_clear", None))]
    return found


def read(data_dir: Path) -> tuple[dict[str, set[str]], dict[str, dict[str, set[str]]], set[str]] | None:
    """Every process's records merged: stages asked per item, stage dependencies per group, the items
    run; None when no process recorded (a run before this existed)."""
    paths = sorted(data_dir.glob(_FILE.format(pid="*")))
    if not paths:
        return None
    asked: dict[str, set[str]] = {}
    deps: dict[str, dict[str, set[str]]] = {}
    items: set[str] = set()
    for path in paths:
        document = json.loads(path.read_text())
        for item, found in document["asked"].items():
            asked.setdefault(item, set()).update(found)
        for group, by_stage in document["deps"].items():
            for stage, found in by_stage.items():
                deps.setdefault(group, {}).setdefault(stage, set()).update(found)
        items.update(document["items"])
    return asked, deps, items


def clear(data_dir: Path) -> None:
    for stale in data_dir.glob(_FILE.format(pid="*")):
        stale.unlink()


def closure(asked: set[str], deps: dict[str, set[str]]) -> set[str]:
    """The stages an item reads: those it asked for and, transitively, those they asked for."""
    found, todo = set(asked), list(asked)
    while todo:
        for below in deps.get(todo.pop(), ()):
            if below not in found:
                found.add(below)
                todo.append(below)
    return found
