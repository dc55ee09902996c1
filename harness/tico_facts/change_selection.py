"""Which item groups a change to tico can reach, read from the per-item map: sound before small.

The rules, each stated with the groups it selects (``Selection.reasons``):
- a function some group ran: those groups;
- a function only the processes' first groups ran, or one run outside every item (one-time work:
  module bodies, a lazily filled registry): every group;
- a function of a file groups ran, that the map has never seen (new or renamed): the groups that ran
  that file;
- module-level code or a removed file: the groups that ran a function of that file; every group when
  none did but its body ran (a module of constants every item may read);
- a new Python file: the groups that ran a file of its directory (it takes effect through an import,
  and an import added elsewhere is itself a change there); none when no group did (tico imports no
  directory by listing it: no pkgutil walk, its registries import fixed module names);
- a non-Python file (a schema, package data): every group;
- tico's dependency declarations: every group;
- a function, module or file no group and no import ever ran: no group, said so.
``--select-changed`` (harness/run/select_changed.py) applies it to a run's items.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness.tico_facts.changed_functions import (
    DEPENDENCIES,
    FUNCTION,
    MODULE,
    NEW_FILE,
    NON_PYTHON,
    REMOVED_FILE,
    Change,
)


@dataclass(frozen=True)
class Reason:
    """Why some groups were selected: ``groups`` None means every group."""

    text: str
    groups: frozenset[str] | None

    def __str__(self) -> str:
        if self.groups is None:
            return f"{self.text} -> every group"
        return f"{self.text} -> {len(self.groups)} group(s)" if self.groups else f"{self.text} -> no group"


@dataclass
class Selection:
    groups: set[str] = field(default_factory=set)
    everything: bool = False
    reasons: list[Reason] = field(default_factory=list)


def select(changes: list[Change], item_map: dict[str, Any]) -> Selection:
    names: list[str] = item_map["functions"]
    runs = {group: {names[i] for i in found} for group, found in item_map["groups"].items()}
    one_time = {names[i] for i in [*item_map.get("outside_items", []), *item_map.get("first_only", [])]}
    seen = set(names)
    selection = Selection()

    def groups_running(predicate) -> set[str]:
        return {group for group, functions in runs.items() if any(predicate(f) for f in functions)}

    def take(found: set[str], why: str) -> None:
        selection.groups |= found
        selection.reasons.append(Reason(why, frozenset(found)))

    def everything(why: str) -> None:
        selection.everything = True
        selection.reasons.append(Reason(why, None))

    def nothing(why: str) -> None:
        selection.reasons.append(Reason(why, frozenset()))

    for change in changes:
        in_file = lambda f, file=change.file: f.split("::", 1)[0] == file  # noqa: E731
        body_ran = f"{change.file}::" in seen
        if change.kind == NON_PYTHON:
            everything(f"{change.file}: a non-Python file")
        elif change.kind == DEPENDENCIES:
            everything(f"{change.file}: tico's dependency declarations")
        elif change.kind == FUNCTION:
            key = f"{change.file}::{change.name}"
            if key in one_time:
                everything(f"{key}: one-time work (first use in a process, or outside every item)")
            elif key in seen:
                take(groups_running(lambda f, k=key: f == k), key)
            elif any(in_file(f) for f in seen):
                take(groups_running(lambda f: in_file(f) and not f.endswith("::")), f"{key}: unseen in the map")
            else:
                nothing(f"{key}: no group runs {change.file}")
        elif change.kind in (MODULE, REMOVED_FILE):
            found = groups_running(lambda f: in_file(f) and not f.endswith("::"))
            if found:
                take(found, f"{change.file}: {change.kind}")
            elif body_ran:
                everything(f"{change.file}: {change.kind} in a module every item may import")
            else:
                nothing(f"{change.file}: {change.kind}, never run")
        elif change.kind == NEW_FILE:
            directory = change.file.rpartition("/")[0]
            found = groups_running(lambda f, d=directory: f.split("::", 1)[0].rpartition("/")[0] == d)
            if found:
                take(found, f"{change.file}: a new file beside {directory or 'the package root'}'s")
            else:
                nothing(f"{change.file}: a new file in a directory no group runs (only an import reaches it)")
    if selection.everything:
        selection.groups = set(runs)
    return selection
