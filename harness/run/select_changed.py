"""``--select-changed BASE``: run only the items a change to tico can reach.

The change is the tico under review against BASE (``harness/tico_facts/tico_sources.py``), named by the
functions it touches (``changed_functions``); the items are chosen from a per-item map of the tico
functions each item reaches (``item_map``, committed for the pinned tico, or ``--item-map`` from a
nightly) by the rules of ``change_selection``. An item the map never measured (a new case or check,
another profile) runs whatever changed. When nothing the map runs changed, the import smoke runs so the run
still proves this tico imports and wraps. Every process selects alike; the one that collected writes
what it chose to ``<report dir>/selection.json``, which the controller prints and keeps in results.json,
and the selected node ids to ``selected-items.txt``, which runs the same items on another tico.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest

from harness.records import node_ids
from harness.run.items import CheckItem
from harness.run.session import SessionState
from harness.tico_facts import change_selection, changed_functions, item_map, tico_identity, tico_sources

DEFAULT_MAP = "golden/item-map/pinned-tico.json.gz"
# The group that runs when the change reaches no item: the smallest case that imports tico, wraps a
# module, calibrates, converts and exports.
SMOKE_CASE = "nn_linear"
SELECTION_FILE = "selection.json"
ITEMS_FILE = "selected-items.txt"
_SHOWN_REASONS = 25


class SelectChangedRun:
    def __init__(self, state: SessionState, base_spec: str, map_path: Path | None):
        """``map_path`` None: the committed map nearest BASE (``nearest_map``)."""
        self.state = state
        self.base_spec = base_spec
        self.record_path = state.report_dir / SELECTION_FILE
        head = tico_identity.package_dir()
        if head is None:
            raise pytest.UsageError("--select-changed: no tico is importable to compare with BASE")
        cache = state.config.rootpath / ".wrapq-cache" / "tico-sources"
        try:
            base = tico_sources.resolve(base_spec, cache)
        except tico_sources.BaseSourceError as exc:
            raise pytest.UsageError(f"--select-changed {base_spec}: {exc}") from None
        try:
            self.map_path, self.item_map, self.other_maps = nearest_map(map_path, state.config.rootpath, base)
        except FileNotFoundError as exc:
            raise pytest.UsageError(f"--select-changed: {exc} (make one: docs/select-changed.md)") from None
        self.base, self.head = base, head
        self.changes = changed_functions.changes(base, head)
        self.notes: list[str] = []
        declared = tico_sources.declarations(base), tico_sources.declarations(head)
        if None not in declared and declared[0].keys() == declared[1].keys():
            if declared[0] != declared[1]:
                where = ", ".join(sorted(declared[0]))
                self.changes.append(changed_functions.Change(where, changed_functions.DEPENDENCIES))
        else:
            self.notes.append(
                "tico's dependency declarations were not compared (BASE and the tico under review are not both "
                "checkouts or both wheels); scripts/env.sh installs tico --no-deps on the pinned stack"
            )
        self.selection = change_selection.select(self.changes, self.item_map, item_map.source_files(base))
        if not state.is_worker:
            for stale in (self.record_path, self.record_path.parent / ITEMS_FILE):
                stale.unlink(missing_ok=True)

    def _map_record(self) -> dict[str, Any]:
        rootpath = self.state.config.rootpath
        return {**describe_map(self.map_path, self.item_map, self.base, rootpath), "others": self.other_maps}

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, session: pytest.Session, config: pytest.Config, items: list) -> None:
        """After -k, -m and --shard: what the run would have run, narrowed to what the change reaches."""
        per_item = self.selection.per_item
        mapped = self.selection.known
        units = {
            id(item): item.nodeid if per_item else node_ids.group_of(item.nodeid)
            for item in items
            if isinstance(item, CheckItem)
        }
        unmapped = {unit for unit in units.values() if unit not in mapped}
        running = self.selection.units | unmapped
        keep = [item for item in items if units.get(id(item)) is None or units[id(item)] in running]
        smoke = None
        if not any(id(item) in units for item in keep):
            smoke_groups = {node_ids.group_of(i.nodeid) for i in items if id(i) in units and i.case.name == SMOKE_CASE}
            smoke = min(smoke_groups, key=lambda g: (len(g), g)) if smoke_groups else None
            keep = [i for i in items if id(i) not in units or node_ids.group_of(i.nodeid) == smoke]
        kept = {id(item) for item in keep}
        dropped = [item for item in items if id(item) not in kept]
        if dropped:
            config.hook.pytest_deselected(items=dropped)

        def items_in(found: frozenset[str] | None) -> int:
            reached = mapped if found is None else found
            return sum(1 for unit in units.values() if unit in reached)

        record = {
            "base": self.base_spec,
            "base_root": str(self.base),
            "head_root": str(self.head),
            "map": self._map_record(),
            "per_item": per_item,
            "changes": [change.label() for change in self.changes],
            "everything": self.selection.everything,
            "reasons": [{"reason": str(r), "items": items_in(r.units)} for r in self.selection.reasons],
            "unmapped_groups": sorted({node_ids.group_of(i.nodeid) for i in items if units.get(id(i)) in unmapped}),
            "unmapped_items": sum(1 for unit in units.values() if unit in unmapped),
            "smoke_group": smoke,
            "collected_items": len(units),
            "selected_items": sum(1 for item in keep if id(item) in units),
            "notes": self.notes,
        }
        self.state.selection = record
        self.record_path.parent.mkdir(parents=True, exist_ok=True)
        _write(self.record_path, json.dumps(record, indent=1, sort_keys=True))
        # the same items on another tico (the pull request's base): ``pytest @selected-items.txt``
        _write(self.record_path.parent / ITEMS_FILE, "".join(f"{item.nodeid}\n" for item in keep))
        items[:] = keep

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        """The controller under xdist collected nothing: it reads what a worker chose (before the run's
        results are written)."""
        if self.state.is_worker or self.state.selection is not None:
            return
        try:
            self.state.selection = json.loads(self.record_path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            self.state.selection = {"error": f"no worker recorded its selection ({exc})", "base": self.base_spec}

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        for line in describe(self.state.selection or {}):
            terminalreporter.write_line(line) if line else terminalreporter.section("wrapq select-changed")


def describe_map(path: Path, loaded: dict[str, Any], base: Path, rootpath: Path) -> dict[str, Any]:
    """Which tico a map measured, and how many of its Python files differ from BASE's (None: unknown)."""
    measured = loaded.get("tico") or {}
    try:
        shown = path.resolve().relative_to(rootpath).as_posix()
    except ValueError:
        shown = str(path)
    return {
        "path": shown,
        "tico_version": measured.get("version"),
        "tico_source_sha256": measured.get("source_sha256"),
        "files_differing_from_base": item_map.files_differing(loaded, base),
    }


def nearest_map(given: Path | None, rootpath: Path, base: Path) -> tuple[Path, dict[str, Any], list[dict[str, Any]]]:
    """The map to select from and the other committed maps, described: the map given, else of the committed
    maps (``golden/item-map/*.json.gz``: the pinned tico's, and tico main's the nightly writes) the one whose
    tico differs from BASE in the fewest Python files, the pinned one on a tie."""
    if given is not None:
        return given, item_map.load(given), []
    default = rootpath / DEFAULT_MAP
    paths = sorted({default, *default.parent.glob("*.json.gz")})
    loaded = {path: item_map.load(path) for path in paths}

    def distance(path: Path) -> tuple:
        differing = item_map.files_differing(loaded[path], base)
        return (math.inf if differing is None else differing, path != default, path.name)

    chosen = min(paths, key=distance)
    others = [describe_map(p, loaded[p], base, rootpath) for p in paths if p != chosen]
    return chosen, loaded[chosen], others


def _write(path: Path, text: str) -> None:
    """Every xdist worker writes the same selection: each replaces the file whole."""
    temporary = path.with_suffix(f".{os.getpid()}.tmp")
    temporary.write_text(text)
    temporary.replace(path)


def describe(record: dict[str, Any]) -> list[str]:
    """The terminal's account of a selection; "" opens the section."""
    if "error" in record:
        return ["", f"BASE {record['base']}: {record['error']}"]
    if not record:
        return []
    known = record["map"]
    distance = known["files_differing_from_base"]
    far = (
        "the map's tico is BASE's sources"
        if distance == 0
        else f"the map's tico differs from BASE in {distance} Python file(s)"
        if distance is not None
        else "how far the map's tico is from BASE is unknown (no per-file hashes)"
    )
    lines = [
        "",
        f"BASE {record['base']} -> the tico under review: {len(record['changes'])} change(s)",
        f"map {known['path']} (tico {known['tico_version']}); {far}",
        *[
            f"  not chosen: map {other['path']} (tico {other['tico_version']}), "
            f"{other['files_differing_from_base']} Python file(s) from BASE"
            for other in known.get("others") or []
        ],
        f"selected {record['selected_items']} of {record['collected_items']} items",
    ]
    if record["everything"]:
        lines.append("every mapped item runs:")
    for reason in record["reasons"][:_SHOWN_REASONS]:
        lines.append(f"  {reason['reason'].rsplit(' -> ', 1)[0]} -> {reason['items']} items")
    if len(record["reasons"]) > _SHOWN_REASONS:
        lines.append(f"  ... {len(record['reasons']) - _SHOWN_REASONS} more in results.json (run.selection)")
    if record["unmapped_items"]:
        lines.append(
            f"  {record['unmapped_items']} items the map never measured run whatever changed "
            f"(in {len(record['unmapped_groups'])} group(s))"
        )
    if record["smoke_group"]:
        lines.append(f"  nothing the map runs changed: the import smoke runs (group {record['smoke_group']})")
    lines += [f"  note: {note}" for note in record["notes"]]
    return lines
