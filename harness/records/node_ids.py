"""The harness's node ids, written the way pytest addresses them.

An item is one check of one (case, profile): ``cases/nn.py::nn_linear::golden[tiny]``. pytest
splits an argument at ``::`` and reads a ``[`` only as the last part's parametrization, so the
profile (and a sweep variant's axes, ``tiny,kv_heads=2``) goes in that last bracket; the id runs as
printed, by ``pytest ID`` and from an ``@file``.

A *group* is the (case, profile) the items of one pipeline share: ``cases/nn.py::nn_linear[tiny]``.
It is a key (durations, the item map, xdist's scope), never a node id; to run a group, run its items.

Runs recorded before this form (``file::case[profile]::check``) are read through ``current``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_ITEM = re.compile(r"^(?P<file>[^:]+)::(?P<case>[^\[:]+)::(?P<check>[^\[:]+)\[(?P<label>[^\]]+)\]$")
_OLD_ITEM = re.compile(r"^(?P<file>[^:]+)::(?P<case>[^\[:]+)\[(?P<label>[^\]]+)\]::(?P<check>[^\[:]+)$")
_GROUP = re.compile(r"^(?P<head>.+?)\[(?P<label>[^\]]+)\]$")


@dataclass(frozen=True)
class ItemId:
    file: str
    case: str
    label: str
    check: str

    @property
    def group(self) -> str:
        return group_id(self.file, self.case, self.label)

    def __str__(self) -> str:
        return f"{self.file}::{self.case}::{self.check}[{self.label}]"


def group_id(file: str, case: str, label: str) -> str:
    """``file::case[label]``: the key of one (case, profile) group."""
    return f"{file}::{case}[{label}]" if file else f"{case}[{label}]"


def item_id(group: str, check: str) -> str:
    """The node id of ``check`` in ``group`` (``file::case[label]`` -> ``file::case::check[label]``)."""
    match = _GROUP.match(group)
    if match is None:
        return f"{group}::{check}"
    return f"{match['head']}::{check}[{match['label']}]"


def parse(nodeid: str) -> ItemId | None:
    """A check item's parts, from its id in either form (None for any other node id)."""
    match = _ITEM.match(nodeid) or _OLD_ITEM.match(nodeid)
    if match is None:
        return None
    return ItemId(match["file"], match["case"], match["label"], match["check"])


def group_of(nodeid: str) -> str:
    """An item's group (``file::case[label]``); a node id that is no check item is its own group."""
    parts = parse(nodeid)
    return parts.group if parts else nodeid


def current(nodeid: str) -> str:
    """The id in today's form: a record written as ``file::case[label]::check`` reads as its item."""
    match = _OLD_ITEM.match(nodeid)
    return str(ItemId(match["file"], match["case"], match["label"], match["check"])) if match else nodeid
