"""Pipeline stages: memoised once per (case, profile), failures remembered, mutation detected."""

import pytest
import torch

from harness import Built, Case, CaseInputs, Sample
from harness.pipeline import Pipeline, PipelineCache, StageError


def _counting_case(counter: dict, fail: bool = False) -> Case:
    def build(profile):
        counter["builds"] = counter.get("builds", 0) + 1
        if fail:
            raise ValueError("bad config")
        sample = lambda: Sample(args=(torch.randn(2, 8),))
        return Built(torch.nn.Linear(8, 4), CaseInputs(calibration=(sample(),), evaluation={"default": sample()}))

    return Case(name="counting", family="nn", build=build)


def test_stages_run_once_however_many_consumers():
    counter: dict = {}
    pipeline = PipelineCache().get(_counting_case(counter), "tiny")
    for _ in range(3):
        pipeline.output("reference", "default")
        pipeline.output("quant", "default")
        pipeline.output("noquant", "default")
    assert counter["builds"] == 1
    assert {"reference", "wrap", "prepare", "calibrate", "convert", "quantized"} <= set(pipeline.timings)


def test_seeded_build_is_reproducible():
    a = Pipeline(_counting_case({}), "tiny").output("quant", "default")
    b = Pipeline(_counting_case({}), "tiny").output("quant", "default")
    assert torch.equal(a, b)


def test_failed_stage_is_remembered_not_rerun():
    counter: dict = {}
    pipeline = Pipeline(_counting_case(counter, fail=True), "tiny")
    for _ in range(2):
        with pytest.raises(StageError, match="stage 'reference' failed: ValueError: bad config"):
            pipeline.output("quant", "default")
    assert counter["builds"] == 1


def test_quantized_stage_leaves_noquant_wrapper_untouched():
    from tico.quantization.wrapq.mode import Mode

    pipeline = Pipeline(_counting_case({}), "tiny")
    assert pipeline.quantized.wrapped._mode is Mode.QUANT
    assert pipeline.wrapped.wrapped._mode is Mode.NO_QUANT
    assert pipeline.wrapped is not pipeline.quantized


def test_snapshot_detects_in_place_mutation_and_mode_change():
    from tico.quantization.wrapq.mode import Mode

    pipeline = Pipeline(_counting_case({}), "tiny")
    out = pipeline.output("quant", "default")
    pipeline.output("noquant", "default")
    before = pipeline.snapshot()
    assert pipeline.mutated_since(before) == []
    out.add_(1.0)
    pipeline.wrapped.wrapped._mode = Mode.CALIB
    mutated = pipeline.mutated_since(before)
    assert "quant_output[default]" in mutated
    assert "wrap#modes" in mutated


def test_guard_blames_the_check_not_the_stages():
    pipeline = Pipeline(_counting_case({}), "tiny")
    pipeline.guard_start()
    out = pipeline.output("quant", "default")  # stage work may touch modules: not the check's doing
    assert pipeline.guard_end() == []
    pipeline.guard_start()
    out.add_(1.0)  # the check mutates a shared output...
    pipeline.output("noquant", "default")  # ...then triggers another stage: still caught
    assert "quant_output[default]" in pipeline.guard_end()


def test_guard_baseline_reuse_does_not_blame_a_check_for_unwatched_stage_work():
    """guard_start reuses the previous check's closing snapshot; a stage run outside any check
    in between (here: one that changes a module the way lazily built observers do) drops it."""
    from tico.quantization.wrapq.mode import Mode

    pipeline = Pipeline(_counting_case({}), "tiny")
    pipeline.guard_start()
    pipeline.output("noquant", "default")
    assert pipeline.guard_end() == []
    pipeline.wrapped.wrapped._mode = Mode.CALIB  # as an unwatched stage would...
    pipeline.output("quant", "default")  # ...and an unwatched stage does run
    pipeline.guard_start()
    assert pipeline.guard_end() == []
    pipeline.guard_start()
    pipeline.wrapped.wrapped._mode = Mode.NO_QUANT  # a check's own change is still caught
    assert "wrap#modes" in pipeline.guard_end()
