"""The fairseq profile: its cases never run by default, and without fairseq each says how to get it."""

from __future__ import annotations

import importlib.util

import pytest

from cases import fairseq, fairseq_models
from harness.model import fairseq_extra

CASES = [*fairseq.CASES, *fairseq_models.CASES]


def test_the_profile_is_opt_in_and_every_case_wraps_a_class_tico_registers():
    assert len(CASES) == 7
    for case in CASES:
        assert case.profiles == ("fairseq",) and case.unavailable is fairseq_extra.unavailable_reason
        # the single-step case's root is tico's export adapter around the registered decoder wrapper
        assert (case.expected_wrapper or "QuantFairseq").startswith("QuantFairseq")


@pytest.mark.skipif(importlib.util.find_spec("fairseq") is not None, reason="fairseq is installed here")
def test_without_fairseq_each_case_skips_naming_the_commands():
    for case in CASES:
        reason = case.unavailable_reason()
        assert reason is not None and "./scripts/fairseq.sh run" in reason and "./scripts/fairseq.sh install" in reason
        assert "ModuleNotFoundError" in reason


def test_the_pinned_requirements_leave_the_main_stack_alone():
    """requirements-fairseq.txt installs beside constraints.txt, never over one of its pins."""
    root = fairseq_extra.__file__.rsplit("/harness/", 1)[0]

    def pins(name: str) -> dict[str, str]:
        lines = open(f"{root}/{name}").read().splitlines()
        return {
            line.split("==")[0].lower().replace("_", "-"): line.split("==")[1]
            for line in lines
            if "==" in line and not line.startswith("#")
        }

    extra, pinned = pins("requirements-fairseq.txt"), pins("constraints.txt")
    assert extra and not set(extra) & set(pinned)
