"""harness/compat.py: every private torch / pytest / xdist API the harness uses is looked up in
one place, and a missing one is a loud error at startup, not a slow or hanging run."""

from __future__ import annotations

import sys
import textwrap

import pytest

from harness import compat
from tests import preloaded_python
from tests.helpers import PINNED


def test_the_pinned_stack_has_every_private_api_the_harness_uses():
    assert compat.problems() == []
    assert compat.lazy_graph_module() is not None
    leaves, spec = compat.tree_flatten({"a": (1, [2, 3])})
    assert leaves == [1, 2, 3]
    assert compat.tree_unflatten(leaves, compat.treespec_loads(compat.treespec_dumps(spec))) == {"a": (1, [2, 3])}


def test_the_tested_series_are_the_pinned_ones():
    for distribution, series in compat.TESTED.items():
        assert PINNED[distribution].startswith(series + "."), (distribution, PINNED[distribution], series)


def test_a_missing_required_api_names_itself_and_the_version(monkeypatch):
    import torch.utils._python_dispatch as dispatch

    monkeypatch.delattr(dispatch, "TorchDispatchMode")
    with pytest.raises(
        compat.CompatError,
        match=r"torch\.utils\._python_dispatch\.TorchDispatchMode is not available "
        r"in torch 2\.13 \(the harness was tested with 2\.13\)",
    ):
        compat.require()
    assert any("TorchDispatchMode" in p for p in compat.problems())


def test_xdist_scheduler_members_are_checked(monkeypatch):
    import xdist.scheduler

    monkeypatch.delattr(xdist.scheduler.LoadScopeScheduling, "_assign_work_unit")
    with pytest.raises(compat.CompatError, match="LoadScopeScheduling lacks _assign_work_unit"):
        compat.loadscope_scheduling()


def test_an_untested_series_is_reported(monkeypatch):
    monkeypatch.setitem(compat.TESTED, "pytest", "1.0")
    assert any("pytest 9.2 is not the tested series 1.0" in p for p in compat.problems())


def test_the_plugin_refuses_to_start_without_a_required_api(tmp_path):
    """Fails fast: the session stops at configure with the API named (no case runs)."""
    (tmp_path / "conftest.py").write_text(
        textwrap.dedent("""
        import torch.utils._python_dispatch as dispatch
        del dispatch.TorchDispatchMode
    """)
    )
    (tmp_path / "pytest.ini").write_text("[pytest]\nwrapq_cases_dir = cases\n")
    done = preloaded_python.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 4, done.stdout[-2000:] + done.stderr[-2000:]
    assert "wrapq harness: torch.utils._python_dispatch.TorchDispatchMode is not available" in done.stderr
