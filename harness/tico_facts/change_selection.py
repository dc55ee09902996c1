"""Which items a change to tico can reach, read from the per-item map: sound before small.

A unit is an item where the map records items (what it ran and what the stages it reads ran:
``item_map.item_reach``), a (case, profile) group where it records groups only. The rules, each
stated with the units it selects (``Selection.reasons``):
- a function some unit reaches: those units; where the change lies inside blocks of it (``Change.lines``),
  the map records lines per item and the map's tico file is BASE's byte for byte, the units that ran one
  of its anchors, the first statements of those blocks (every unit where one ran only at first use or
  outside every item; none where no unit ran one);
- a function only the processes' first groups ran, or one run outside every item (one-time work:
  module bodies, a lazily filled registry): every unit;
- a function of a file units reach, that the map has never seen (new or renamed): the units that
  reach that file;
- module-level code (an import added, a constant, a class attribute, a registration) or a removed file: the
  units whose process had imported the module by their group's end (the map's ``imports``); with a map
  that kept no imports, the units that reach a function of that file, every unit when none does but its
  body ran;
- a change in a file the map's tico has in another form than BASE's: as module-level code of that file (the
  map's functions and lines may not be BASE's), said so; in a file BASE has and the map's tico lacks: every
  unit, said so (no unit's import of it was measured);
- a new Python file: the units that reach a file of its directory (it takes effect through an import,
  and an import added elsewhere is itself a change there); none when none does (tico imports no
  directory by listing it: no pkgutil walk, its registries import fixed module names);
- a non-Python file (a schema, package data) or tico's dependency declarations: every unit;
- a function, module or file no unit and no import ever ran: none, said so.
``--select-changed`` (harness/run/select_changed.py) applies it to a run's items.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness.records import node_ids
from harness.tico_facts.changed_functions import (
    DEPENDENCIES,
    FUNCTION,
    MODULE,
    NEW_FILE,
    NON_PYTHON,
    REMOVED_FILE,
    Change,
)
from harness.tico_facts.item_map import groups_importing
from harness.tico_facts.item_map import item_reach as item_map_reach


@dataclass(frozen=True)
class Reason:
    """Why some units were selected: ``units`` None means every unit."""

    text: str
    units: frozenset[str] | None
    unit: str = "group"

    def __str__(self) -> str:
        if self.units is None:
            return f"{self.text} -> every {self.unit}"
        return f"{self.text} -> {len(self.units)} {self.unit}(s)" if self.units else f"{self.text} -> no {self.unit}"


@dataclass
class Selection:
    """The selected units: item node ids where the map records items (``per_item``), else groups;
    ``known``: every unit the map measured (a unit outside it runs whatever changed)."""

    units: set[str] = field(default_factory=set)
    known: set[str] = field(default_factory=set)
    everything: bool = False
    reasons: list[Reason] = field(default_factory=list)
    per_item: bool = False


def units_of(item_map: dict[str, Any]) -> tuple[dict[str, set[int]], bool]:
    """What each unit runs, by function index: every item where the map records items, else every group."""
    reach = item_map_reach(item_map)
    if reach is not None:
        return reach, True
    return {group: set(found) for group, found in item_map["groups"].items()}, False


def _narrowable(item_map: dict[str, Any], base_files: dict[str, str] | None) -> set[str]:
    """The files whose changes may be narrowed to lines: the map's tico has them as BASE does."""
    measured = (item_map.get("tico") or {}).get("files") or {}
    return {name for name, digest in (base_files or {}).items() if measured.get(name) == digest}


def select(changes: list[Change], item_map: dict[str, Any], base_files: dict[str, str] | None = None) -> Selection:
    """``base_files``: a short hash of each of BASE's Python files (``item_map.source_files``), which lets
    a change be narrowed to lines where the map's tico has the same file."""
    names: list[str] = item_map["functions"]
    runs, per_item = units_of(item_map)
    line_runs = item_map_reach(item_map, "lines")
    narrowable = _narrowable(item_map, base_files) if line_runs is not None else set()
    line_names: list[str] = item_map.get("lines", [])
    once = [*item_map.get("lines_outside_items", []), *item_map.get("lines_first_only", [])]
    one_time_lines = {line_names[i] for i in once}
    unit = "item" if per_item else "group"
    one_time = {names[i] for i in [*item_map.get("outside_items", []), *item_map.get("first_only", [])]}
    seen = set(names)
    selection = Selection(known=set(runs), per_item=per_item)

    def units_running(predicate) -> set[str]:
        matching = {i for i, name in enumerate(names) if predicate(name)}
        return {u for u, functions in runs.items() if functions & matching}

    def take(found: set[str], why: str) -> None:
        selection.units |= found
        selection.reasons.append(Reason(why, frozenset(found), unit))

    def everything(why: str) -> None:
        selection.everything = True
        selection.reasons.append(Reason(why, None, unit))

    def nothing(why: str) -> None:
        selection.reasons.append(Reason(why, frozenset(), unit))

    measured_files = (item_map.get("tico") or {}).get("files")

    def importers(file: str) -> set[str] | None:
        groups = groups_importing(item_map, file)
        if groups is None:
            return None
        return {u for u in runs if (node_ids.group_of(u) if per_item else u) in groups}

    for change in changes:
        in_file = lambda f, file=change.file: f.split("::", 1)[0] == file  # noqa: E731
        body_ran = f"{change.file}::" in seen
        in_base = base_files is not None and change.file in base_files and change.kind not in (NEW_FILE, NON_PYTHON)
        if in_base and measured_files is not None and change.file not in measured_files:
            everything(f"{change.file}: a file the map's tico does not have (no {unit}'s import of it was measured)")
            continue
        if in_base and measured_files is not None and measured_files[change.file] != base_files[change.file]:
            found = importers(change.file)
            if found is not None:
                take(
                    found,
                    f"{change.file}: the map's tico has it in another form than BASE: every {unit} that imported it",
                )
                continue
        if change.kind == NON_PYTHON:
            everything(f"{change.file}: a non-Python file")
        elif change.kind == DEPENDENCIES:
            everything(f"{change.file}: tico's dependency declarations")
        elif change.kind == FUNCTION:
            key = f"{change.file}::{change.name}"
            if key in one_time:
                everything(f"{key}: one-time work (first use in a process, or outside every item)")
            elif key in seen and change.lines is not None and change.file in narrowable:
                anchors = {f"{change.file}:{line}" for line in change.lines}
                where = f"{key}, inside the blocks at line(s) {', '.join(map(str, sorted(change.lines)))}"
                if not anchors:
                    nothing(f"{key}: only code beside it changed")
                elif anchors & one_time_lines:
                    everything(f"{where}: one-time work (first use in a process, or outside every item)")
                else:
                    indices = {i for i, name in enumerate(line_names) if name in anchors}
                    take({u for u, ran in (line_runs or {}).items() if ran & indices}, where)
            elif key in seen:
                take(units_running(lambda f, k=key: f == k), key)
            elif any(in_file(f) for f in seen):
                take(units_running(lambda f: in_file(f) and not f.endswith("::")), f"{key}: unseen in the map")
            else:
                nothing(f"{key}: no {unit} runs {change.file}")
        elif change.kind in (MODULE, REMOVED_FILE) and (found := importers(change.file)) is not None:
            if found:
                take(found, f"{change.file}: {change.kind}, in every {unit} that imported it")
            else:
                nothing(f"{change.file}: {change.kind}, never imported")
        elif change.kind in (MODULE, REMOVED_FILE):
            found = units_running(lambda f: in_file(f) and not f.endswith("::"))
            if found:
                take(found, f"{change.file}: {change.kind}")
            elif body_ran:
                everything(f"{change.file}: {change.kind} in a module every item may import")
            else:
                nothing(f"{change.file}: {change.kind}, never run")
        elif change.kind == NEW_FILE:
            directory = change.file.rpartition("/")[0]
            found = units_running(lambda f, d=directory: f.split("::", 1)[0].rpartition("/")[0] == d)
            if found:
                take(found, f"{change.file}: a new file beside {directory or 'the package root'}'s")
            else:
                nothing(f"{change.file}: a new file in a directory no {unit} runs (only an import reaches it)")
    if selection.everything:
        selection.units = set(selection.known)
    return selection
