"""A (case, profile) group named on the command line: ``pytest cases/nn.py::nn_linear[tiny]``.

pytest reads ``[tiny]`` as the parametrization of the last part, so it would look for a child of the
case file named ``nn_linear[tiny]``; the case node is ``nn_linear`` and its items carry the bracket
(``nn_linear::golden[tiny]``, harness/records/node_ids.py). As pytest means ``test_f[a]`` -- the test at
that parametrization -- a group argument means the case's items at that profile (and sweep variant):
it is collected as the case and its other groups are deselected, unless another argument names them.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

_GROUP_ARG = re.compile(r"^(?P<file>[^:\[]+\.py)::(?P<case>[^:\[]+)\[(?P<label>[^\]]+)\]$")
_GROUPS = pytest.StashKey[tuple]()


def rewrite(config: pytest.Config) -> None:
    """Replace each group argument by its case, remembering which groups of it were asked for."""
    wanted: dict[tuple[Path, str], set[str]] = {}
    given = list(config.args)
    args: list[str] = []
    for arg in given:
        match = _GROUP_ARG.match(arg)
        path = (config.invocation_params.dir / match["file"]).resolve() if match else None
        if match is None or not path.is_file():
            args.append(arg)
            continue
        wanted.setdefault((path, match["case"]), set()).add(match["label"])
        case_arg = f"{match['file']}::{match['case']}"
        if case_arg not in args:
            args.append(case_arg)
    # the arguments that name more than the groups asked for: all but the cases put in their place
    others = [arg for arg in args if arg in given]
    config.args[:] = args
    config.stash[_GROUPS] = (wanted, others)


def deselect(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep, of a case named by group, the groups asked for and the items another argument names."""
    wanted, others = config.stash.get(_GROUPS, ({}, []))
    if not wanted:
        return
    keep, dropped = [], []
    for item in items:
        labels = wanted.get((item.path.resolve(), getattr(getattr(item, "case", None), "name", None)))
        if labels is None or item.label in labels or _named_elsewhere(config, item, others):
            keep.append(item)
        else:
            dropped.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


def _named_elsewhere(config: pytest.Config, item: pytest.Item, others: list[str]) -> bool:
    """Another argument covers the item: its file or a directory above it, its case, or the item."""
    own = item.nodeid.partition("::")[2]
    for arg in others:
        file, _, rest = arg.partition("::")
        path = (config.invocation_params.dir / file).resolve()
        if path != item.path.resolve() and not item.path.resolve().is_relative_to(path):
            continue
        if not rest or own == rest or own.startswith(rest + "::") or own.partition("[")[0] == rest:
            return True
    return False
