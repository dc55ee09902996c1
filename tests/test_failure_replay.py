"""A reproducible export or conversion failure is cached under the key a success would have had
and replayed as the same stage failure: the warm verdict is the cold one, without redoing the
failing work; a failure of other code (a pass patched in memory) is never served to this code,
and failures that say something about the machine (a timeout) are never kept."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cases.nn import CASES as NN_CASES
from cases.qwen3_vl_text import CASES as QWEN_TEXT_CASES
from harness.export import failure_replay
from harness.pipeline import Pipeline, RunSettings, StageError, StageTimeout

# the caches, their keys and traces are what these tests read: no stage is shared (tests/stage_sharing.py)
pytestmark = pytest.mark.fresh_stages

REPO = Path(__file__).resolve().parents[1]
LINEAR = next(c for c in NN_CASES if c.name == "nn_linear")
# torch.export refuses its adapter (a data-dependent size in the vision merge); eager runs it.
QWEN_MODEL = next(c for c in QWEN_TEXT_CASES if c.name == "qwen3_vl_model")


def _pipeline(case, cache: Path | None) -> Pipeline:
    settings = (
        RunSettings(circle_cache_dir=cache / "circle", export_cache_dir=cache / "export") if cache else RunSettings()
    )
    return Pipeline(case, "tiny", settings=settings)


def _stage_failure(get) -> StageError:
    with pytest.raises(StageError) as caught:
        get()
    return caught.value


def _said(err: StageError) -> tuple[str, str, str]:
    return err.stage, err.error_type, err.error_text


def _failures_stored(cache: Path) -> int:
    return sum("failure" in json.loads(p.read_text()) for p in cache.rglob("*.json"))


def _refusing_pass(monkeypatch, error: Exception) -> None:
    """A conversion pass that refuses the graph (as tico does an operator it cannot convert)."""
    from tico.quantization.passes import propagate_qparam_forward as forward

    def refuse(self, exported_program):
        raise error

    monkeypatch.setattr(forward.PropagateQParamForward, "call", refuse)


def test_only_failures_of_the_input_and_code_are_recorded():
    assert failure_replay.record("circle_convert", ValueError("refused")) is not None
    for error in (StageTimeout("late"), MemoryError(), RecursionError(), OSError("disk"), KeyboardInterrupt()):
        assert failure_replay.record("circle_convert", error) is None, type(error).__name__


def test_a_timeout_wrapped_by_the_tracer_is_not_recorded():
    """dynamo re-raises what it catches as its own error: the timeout is in the chain."""
    try:
        try:
            raise StageTimeout("exceeded the per-stage limit")
        except StageTimeout as inner:
            raise RuntimeError("InternalTorchDynamoError while tracing") from inner
    except RuntimeError as wrapped:
        assert failure_replay.record("torch_export", wrapped) is None
    try:
        try:
            raise KeyError("missing")
        except KeyError:
            raise RuntimeError("refused")  # an ordinary chain of reproducible errors
    except RuntimeError as plain:
        assert failure_replay.record("torch_export", plain) is not None


def test_a_refused_conversion_is_replayed_as_the_cold_failure_and_not_served_to_other_code(tmp_path, monkeypatch):
    from tico.utils.errors import NotYetSupportedError

    _refusing_pass(monkeypatch, NotYetSupportedError("injected: operator refused"))
    cold = _stage_failure(lambda: _pipeline(LINEAR, None).circle)
    first = _stage_failure(lambda: _pipeline(LINEAR, tmp_path).circle)
    assert first.replayed_from is None and _failures_stored(tmp_path / "circle") == 1
    warm = _stage_failure(lambda: _pipeline(LINEAR, tmp_path).circle)
    assert warm.replayed_from is not None and "Circle cache entry" in warm.replayed_from
    assert (
        _said(warm)
        == _said(first)
        == _said(cold)
        == ("circle_convert", "NotYetSupportedError", "injected: operator refused")
    )
    assert "NotYetSupportedError" in warm.traceback_text and "replayed from" in warm.traceback_text
    monkeypatch.undo()  # the pass as installed: other conversion code, so the failure is not found
    artifact = _pipeline(LINEAR, tmp_path).circle
    assert artifact.cache_status == "miss" and artifact.binary


def test_a_timed_out_conversion_is_not_kept(tmp_path, monkeypatch):
    _refusing_pass(monkeypatch, StageTimeout("exceeded the per-stage limit"))
    err = _stage_failure(lambda: _pipeline(LINEAR, tmp_path).circle)
    assert err.error_type == "StageTimeout" and _failures_stored(tmp_path / "circle") == 0
    again = _stage_failure(lambda: _pipeline(LINEAR, tmp_path).circle)
    assert again.replayed_from is None


def test_a_refused_export_is_replayed_as_the_cold_failure(tmp_path):
    cold = _stage_failure(lambda: _pipeline(QWEN_MODEL, None).export_record)
    first = _stage_failure(lambda: _pipeline(QWEN_MODEL, tmp_path).export_record)
    assert _failures_stored(tmp_path / "export") == 1
    warm_pipeline = _pipeline(QWEN_MODEL, tmp_path)
    warm = _stage_failure(lambda: warm_pipeline.export_record)
    assert warm.replayed_from is not None and "export cache entry" in warm.replayed_from
    assert _said(warm) == _said(first) == _said(cold) and warm.stage == "torch_export"
    assert "torch_export" not in warm_pipeline.timings  # replayed, not traced again
    # The Circle stage fails with the export's failure, as in the cold run.
    assert _said(_stage_failure(lambda: warm_pipeline.circle)) == _said(cold)


_KEY_SCRIPT = """
from cases.qwen3_vl_text import CASES
from harness.export.execution_key import execution_key
from harness.pipeline import Pipeline
case = next(c for c in CASES if c.name == "qwen3_vl_for_conditional_generation")
pipeline = Pipeline(case, "tiny")
name = pipeline.export_sample_name
print(execution_key(pipeline.export_adapter("quant", name), case.export.args(pipeline.sample(name))))
"""


def test_the_execution_key_is_the_same_in_processes_with_other_hash_seeds():
    """transformers' GenerationConfig keeps a salted hash of itself; keyed, it made every process
    miss (and re-export) this case."""
    keys = set()
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=str(REPO))
        done = subprocess.run(
            [sys.executable, "-c", _KEY_SCRIPT], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, done.stderr[-2000:]
        keys.add(done.stdout.strip().splitlines()[-1])
    assert len(keys) == 1, keys
