"""Hooks the harness offers to other pytest plugins."""

from __future__ import annotations

import pytest


@pytest.hookspec
def pytest_wrapq_checks(config: pytest.Config) -> list:
    """Return further harness ``Check`` objects to run on every case (a check owns its settings,
    metrics and report fragment, so nothing in the harness needs to change for it)."""
