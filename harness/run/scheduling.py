"""Longest-first ordering and deterministic sharding of case groups from recorded durations.

A case group is one (case, profile): the unit xdist's loadscope hands to a worker and the
unit a CI shard receives. The durations file maps group ids (``gemma4_vision_encoder[tiny]``)
to seconds; it is written by ``--record-durations`` and committed, so a fresh CI clone
schedules as well as a rerun. Groups the file does not know (new cases) are assumed long and
go first: an unknown cost is the worst one to discover last.

Scheduling itself stays with the existing engines: the order is the collection order that
xdist's loadscope follows, and a shard is a deselection that a CI matrix fans out.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Iterable, Mapping

_SHARD = re.compile(r"^(\d+)/(\d+)$")


class ShardSpecError(ValueError):
    pass


def parse_shard(text: str) -> tuple[int, int]:
    """'2/4' -> (2, 4); shards are numbered from 1."""
    match = _SHARD.match(text.strip())
    if not match:
        raise ShardSpecError(f"--shard must look like i/n (e.g. 1/4), got {text!r}")
    index, count = int(match.group(1)), int(match.group(2))
    if not 1 <= index <= count:
        raise ShardSpecError(f"--shard {text}: i must be between 1 and n")
    return index, count


def load_durations(path: Path) -> dict[str, float]:
    """Recorded seconds per group; a missing or unreadable file means nothing is known."""
    try:
        data = json.loads(Path(path).read_text())
        return {str(k): float(v) for k, v in data.get("groups", {}).items()}
    except (OSError, ValueError, AttributeError, TypeError):
        return {}


def write_durations(path: Path, measured: Mapping[str, float], previous: Mapping[str, float]) -> None:
    """Merge this run's group totals into the file (groups not run keep their old value)."""
    groups = dict(previous)
    groups.update({k: round(v, 2) for k, v in measured.items()})
    Path(path).write_text(json.dumps({"groups": dict(sorted(groups.items()))}, indent=1) + "\n")


def expected_seconds(group: str, durations: Mapping[str, float]) -> float:
    return durations.get(group, math.inf)


def longest_first(groups: Iterable[str], durations: Mapping[str, float]) -> list[str]:
    """Groups by descending recorded duration; ties (and unknowns) by name, so every
    worker computes the same order."""
    return sorted(set(groups), key=lambda g: (-expected_seconds(g, durations), g))


def assign_shards(groups: Iterable[str], durations: Mapping[str, float], count: int) -> dict[str, int]:
    """Greedy longest-processing-time assignment to ``count`` shards (1-based). Unknown
    groups count as the median known duration so they spread instead of piling up."""
    ordered = longest_first(groups, durations)
    known = sorted(v for g in ordered if (v := durations.get(g)) is not None)
    fallback = known[len(known) // 2] if known else 1.0
    loads = [0.0] * count
    assignment: dict[str, int] = {}
    for group in ordered:
        shard = min(range(count), key=lambda i: (loads[i], i))
        loads[shard] += durations.get(group, fallback)
        assignment[group] = shard + 1
    return assignment
