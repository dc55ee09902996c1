"""Which tico functions each item runs: the per-item map ``--select-changed`` reads.

A ``--tico-coverage`` run labels coverage.py's measurement with the item running, and with
``<group>|<stage>`` while a stage computes (``stage_contexts``): an item's verdict depends on what it
ran itself and on what computing the stages it reads ran, whichever item of its (case, profile) group
computed them. The map keeps, per group, the functions each stage ran (``stages``), and per item its
own functions and the stages it reads (``checks``); ``item_reach`` joins them. ``groups`` is the
union per group, for maps and rules that work per group. Functions are named as
``harness/tico_facts/changed_functions.py`` names a change: the file under the tico package and the
qualified name coverage.py gives the function, never a line number, so the map reads on other tico
versions by name. Code run outside every item (imports, the controller, warm-up) is kept apart as
``outside_items``: a change there can reach every item. One-time work done at first use in a process
(a registry filled lazily, a module imported late) is measured under the first group that needed it
only; each process's first group is recorded (``first_groups``), and the functions only first groups
ran are listed (``first_only``) so a selection can treat them as reaching every item. ``imports`` keeps
each process's tico modules in import order and how many each group had imported by its end: a module
body's names (a constant, a class attribute, a registration) reach whoever imported it, whether or not
they run one of its functions (``groups_importing``).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from pathlib import Path
from typing import Any, Iterable

import coverage

from harness.records import node_ids
from harness.tico_facts import changed_lines, stage_contexts

MAP_NAME = "item-map.json"
_FIRST = "first-group.{pid}.txt"


def source_files(root: Path) -> dict[str, str]:
    """Each Python file of the measured tico package and a short hash of its bytes: how far the map's
    tico is from another is told from these alone, without its sources."""
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()[:16]
        for p in sorted(root.rglob("*.py"))
        if "__pycache__" not in p.parts
    }


def files_differing(item_map: dict[str, Any], root: Path) -> int | None:
    """How many Python files differ between the map's tico and the package at ``root`` (None for a
    map that kept no per-file hashes)."""
    recorded = (item_map.get("tico") or {}).get("files")
    if recorded is None:
        return None
    present = source_files(root)
    return sum(recorded.get(name) != present.get(name) for name in set(recorded) | set(present))


def record_first_group(data_dir: Path, group: str) -> None:
    """Note the first group this process ran (read back by ``build``)."""
    (data_dir / _FIRST.format(pid=os.getpid())).write_text(group)


def first_groups(data_dir: Path) -> list[str]:
    return sorted({p.read_text() for p in data_dir.glob(_FIRST.format(pid="*"))})


def build(data_file: Path, files: Iterable[tuple[Path, str, dict[str, Any]]]) -> dict[str, Any]:
    """The map from combined coverage data with contexts and the files of coverage's JSON report of it
    (``branch_coverage.report_files``: path, path under the package, entry), whose function regions give
    each function's lines. Beside the functions, where the run was recorded per item, it keeps the anchors
    each unit ran (``lines``: ``file:line``, a block's first statement), which narrow a change inside a
    function to the units that entered its block (``changed_lines``)."""
    data = coverage.CoverageData(basename=str(data_file))
    data.read()
    names: list[str] = []
    index: dict[str, int] = {}
    by_context: dict[str, set[int]] = {}
    lines: list[str] = []
    lines_by_context: dict[str, set[int]] = {}
    for path, relative, entry in files:
        by_line = data.contexts_by_lineno(str(path))
        for function, part in (entry.get("functions") or {}).items():
            contexts = {c for line in part.get("executed_lines", []) for c in by_line.get(line, [])}
            if not contexts:
                continue
            key = f"{relative}::{function}"
            position = index.setdefault(key, len(names))
            if position == len(names):
                names.append(key)
            for context in contexts:
                by_context.setdefault(context or "", set()).add(position)
        for line, span in changed_lines.anchor_spans(path.read_text()).items() if by_line else []:
            contexts = {c for run in span for c in by_line.get(run, [])}
            if contexts:
                for context in contexts:
                    lines_by_context.setdefault(context or "", set()).add(len(lines))
                lines.append(f"{relative}:{line}")
    first = first_groups(data_file.parent)
    built = {"functions": names, **_one_time(by_context, first)}
    built["groups"] = {group: sorted(found) for group, found in sorted(_by_group(by_context).items()) if group}
    imports = stage_contexts.read_imports(data_file.parent)
    if imports:
        built["imports"] = _imports(imports)
    recorded = stage_contexts.read(data_file.parent)
    if recorded is not None:
        built |= _per_item(by_context, *recorded)
        _add_lines(built, lines, _per_item(lines_by_context, *recorded))
        one_time = _one_time(lines_by_context, first)
        built |= {"lines_outside_items": one_time["outside_items"], "lines_first_only": one_time["first_only"]}
    return built


def _imports(processes: list[dict]) -> dict[str, Any]:
    """Per process the files of its tico modules in import order (indices into ``files``; the order matters,
    so these lists are kept as they are, not as runs), and per group the [process, count] pairs saying how
    many of them it had imported by its end."""
    index: dict[str, int] = {}
    orders, groups = [], {}
    for position, record in enumerate(processes):
        orders.append([index.setdefault(f, len(index)) for f in record["order"]])
        for group, count in record["groups"].items():
            groups.setdefault(group, []).append([position, count])
    files = sorted(index, key=index.get)
    return {"files": files, "processes": orders, "groups": groups}


def groups_importing(item_map: dict[str, Any], file: str) -> set[str] | None:
    """The groups whose process had imported ``file`` (a module under the package) by the group's end;
    None for a map that kept no imports."""
    imports = item_map.get("imports")
    if imports is None:
        return None
    if file not in imports["files"]:
        return set()
    wanted = imports["files"].index(file)
    orders = imports["processes"]
    return {group for group, seen in imports["groups"].items() if any(wanted in orders[p][:count] for p, count in seen)}


def _add_lines(built: dict[str, Any], lines: list[str], per_line: dict[str, Any]) -> None:
    """Beside each stage's functions its anchors, and after each check's own functions and stage
    positions its own lines (the stages are the same: both come from the same recorded asks)."""
    built["lines"] = lines
    for group, table in built["stages"].items():
        table["lines"] = per_line["stages"][group]["functions"]
    for group, by_check in built["checks"].items():
        for check, entry in by_check.items():
            entry.append(per_line["checks"][group][check][0])


def _by_group(by_context: dict[str, set[int]]) -> dict[str, set[int]]:
    groups: dict[str, set[int]] = {}
    for context, found in by_context.items():
        groups.setdefault(stage_contexts.group_of_context(context), set()).update(found)
    return groups


def _one_time(by_context: dict[str, set[int]], processes_first: list[str]) -> dict[str, Any]:
    """What ran outside every item, and what only the processes' first groups ran."""
    groups = _by_group(by_context)
    outside = sorted(groups.pop("", set()))
    first = [g for g in processes_first if g in groups]
    later = set().union(*(found for group, found in groups.items() if group not in first))
    first_only = sorted(set().union(*(groups[g] for g in first)) - later) if first else []
    return {"outside_items": outside, "first_groups": first, "first_only": first_only}


def _per_item(
    by_context: dict[str, set[int]], asked: dict[str, set[str]], deps: dict[str, dict[str, set[str]]], items: set[str]
) -> dict[str, Any]:
    """Per group, the functions each stage's computation ran (``stages``: names and function lists),
    and per item its own functions and the stages it reads, closure included (``checks``)."""
    stages: dict[str, dict[str, list]] = {}
    checks: dict[str, dict[str, list]] = {}
    for item in sorted(items):
        parts = node_ids.parse(item)
        group, check = (parts.group, parts.check) if parts else (item, "")
        read = sorted(stage_contexts.closure(asked.get(item, set()), deps.get(group, {})))
        table = stages.setdefault(group, {"names": [], "functions": []})
        for stage in read:
            if stage not in table["names"]:
                table["names"].append(stage)
                table["functions"].append(sorted(by_context.get(f"{group}{stage_contexts.STAGE_SEPARATOR}{stage}", ())))
        positions = sorted(table["names"].index(stage) for stage in read)
        checks.setdefault(group, {})[check] = [sorted(by_context.get(item, ())), positions]
    return {"stages": stages, "checks": checks}


def item_reach(item_map: dict[str, Any], part: str = "functions") -> dict[str, set[int]] | None:
    """Per item node id, every function index its verdict depends on (``part="lines"``: every anchor
    line index): what it ran and what computing the stages it reads ran; None for a map recorded per
    group only, or without lines when they are asked for."""
    if "checks" not in item_map or (part == "lines" and "lines" not in item_map):
        return None
    own_at = 0 if part == "functions" else 2
    reach: dict[str, set[int]] = {}
    for group, by_check in item_map["checks"].items():
        table = item_map["stages"].get(group, {part: []})
        for check, entry in by_check.items():
            found = set(entry[own_at])
            for position in entry[1]:
                found.update(table[part][position])
            reach[node_ids.item_id(group, check)] = found
    return reach


def _ranges(indices: list[int]) -> str:
    """Sorted function indices as runs (``"0-5 9 12-40"``): a file's functions are numbered together,
    so a group that runs a wrapper runs a run of them."""
    runs: list[str] = []
    for index in sorted(indices):
        if runs and "-" not in runs[-1] and int(runs[-1]) == index - 1:
            runs[-1] = f"{runs[-1]}-{index}"
        elif runs and "-" in runs[-1] and int(runs[-1].split("-")[1]) == index - 1:
            runs[-1] = f"{runs[-1].split('-')[0]}-{index}"
        else:
            runs.append(str(index))
    return " ".join(runs)


def _indices(text: str | list[int]) -> list[int]:
    if isinstance(text, list):
        return text
    found: list[int] = []
    for run in text.split():
        first, _, last = run.partition("-")
        found.extend(range(int(first), int(last or first) + 1))
    return found


_INDEXED = ("outside_items", "first_only", "lines_outside_items", "lines_first_only")
_STAGE_PARTS = ("functions", "lines")


def write(item_map: dict[str, Any], path: Path, identity: dict[str, Any]) -> int:
    """Write the map with the tico it measured, index lists as runs (gzip-compressed for a ``.gz`` path);
    its size in bytes."""
    document = {"tico": identity, **item_map}
    document["groups"] = {group: _ranges(found) for group, found in item_map["groups"].items()}
    document |= {key: _ranges(item_map[key]) for key in _INDEXED if key in item_map}
    if "checks" in item_map:
        document["stages"] = {
            group: {"names": table["names"]}
            | {part: [_ranges(f) for f in table[part]] for part in _STAGE_PARTS if part in table}
            for group, table in item_map["stages"].items()
        }
        document["checks"] = {
            group: {check: [_ranges(found) for found in entry] for check, entry in by_check.items()}
            for group, by_check in item_map["checks"].items()
        }
    data = json.dumps(document, separators=(",", ":"), sort_keys=True).encode()
    if path.suffix == ".gz":  # the committed map: 17x smaller, the same bytes for the same map
        data = gzip.compress(data, compresslevel=9, mtime=0)
    path.write_bytes(data)
    return len(data)


def load(path: Path) -> dict[str, Any]:
    try:
        data = path.read_bytes()
        document = json.loads(gzip.decompress(data) if path.suffix == ".gz" else data)
    except (OSError, EOFError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise FileNotFoundError(f"cannot read the item map {path}: {exc}") from exc
    for key in ("functions", "groups", "outside_items"):
        if key not in document:
            raise FileNotFoundError(f"{path} is no item map (no {key!r})")
    try:
        document["groups"] = {group: _indices(found) for group, found in document["groups"].items()}
        document |= {key: _indices(document[key]) for key in _INDEXED if key in document}
        document.setdefault("first_only", [])
        for table in document.get("stages", {}).values():
            for part in _STAGE_PARTS:
                if part in table:
                    table[part] = [_indices(found) for found in table[part]]
        for by_check in document.get("checks", {}).values():
            for check, entry in by_check.items():
                by_check[check] = [_indices(found) for found in entry]
    except (ValueError, AttributeError, TypeError) as exc:
        raise FileNotFoundError(f"{path} is no item map (unreadable function indices: {exc})") from exc
    return document


def functions_by_group(item_map: dict[str, Any]) -> dict[str, set[str]]:
    names = item_map["functions"]
    return {group: {names[i] for i in found} for group, found in item_map["groups"].items()}
