"""A case converts with the tico compile options it declares (tico.convert's ``config``): the options reach
the conversion, a name tico's config lacks is refused for that item instead of silently converting with the
defaults, and a cached conversion never answers for other options."""

from __future__ import annotations

import dataclasses

import pytest

from cases.conversion_options import ACTS_ON_NO_CASE, CASES, ENTRIES
from cases.llama import CASES as LLAMA_CASES
from harness.checks import all_checks
from harness.export.compile_options import UnknownCompileOption, options_key, tico_config
from harness.pipeline import Pipeline, RunSettings
from harness.primitives.stage_engine import StageError

# the caches and their keys are what these tests read: no stage is shared (tests/stage_sharing.py)
pytestmark = pytest.mark.fresh_stages
CHECKS = {check.name: check for check in all_checks()}
PREFILL = next(c for c in LLAMA_CASES if c.name == "llama_attention_prefill")
SLICE_CAT = next(c for c in CASES if c.name == "llama_attention_prefill_expand_to_slice_cat")


def test_a_misspelt_option_is_refused_with_the_names_tico_has():
    with pytest.raises(UnknownCompileOption, match=r"convert_expand_to_slicecat.*convert_expand_to_slice_cat"):
        tico_config({"convert_expand_to_slicecat": True})
    with pytest.raises(UnknownCompileOption, match="must be True or False"):
        tico_config({"circle_optimize": "no"})
    assert tico_config({"circle_optimize": False}).get("circle_optimize") is False


def test_options_are_part_of_the_circle_cache_key_and_no_options_keep_the_programs_key():
    assert options_key("k" * 64, {}) == "k" * 64
    keys = {options_key("k" * 64, o) for o in ({"circle_optimize": False}, {"convert_expand_to_slice_cat": True})}
    assert len(keys) == 2 and "k" * 64 not in keys


def test_every_option_of_ticos_config_is_on_a_case_or_says_why_none():
    declared = {name for _, _, options, _ in ENTRIES for name in options} | set(ACTS_ON_NO_CASE)
    assert declared == set(tico_config({}).to_dict())


def test_the_option_reaches_the_conversion_and_a_warm_cache_keeps_the_two_apart(tmp_path):
    settings = RunSettings(circle_cache_dir=tmp_path / "circle", export_cache_dir=tmp_path / "export")
    default = Pipeline(PREFILL, "tiny", settings=settings).circle
    option = Pipeline(SLICE_CAT, "tiny", settings=settings).circle
    assert option.cache_status == "miss" and option.binary != default.binary  # the same program, other options
    again = Pipeline(SLICE_CAT, "tiny", settings=settings).circle
    assert again.cache_status == "hit" and again.binary == option.binary


def test_an_unknown_option_fails_that_items_conversion_by_name():
    misspelt = dataclasses.replace(SLICE_CAT, compile_options=lambda profile: {"convert_expand_to_slicecat": True})
    pipeline = Pipeline(misspelt, "tiny")
    with pytest.raises(StageError, match=r"stage 'circle_convert' failed: UnknownCompileOption: .*slicecat"):
        CHECKS["circle_structure"].run(pipeline)
    assert pipeline.built is not None  # the stages before the conversion are unaffected
