"""Goldens: drift in steps, tolerance, stale vs drift, corrupt/missing files, update round trip,
and a numeric defect that stays under every threshold but is caught by the golden alone."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from tico.quantization.wrapq.wrappers.gemma4.quant_vision_encoder import QuantGemma4VisionEncoder

from cases.gemma4 import VISION_ENCODER
from harness.checks import all_checks
from harness.golden import tensors as golden
from harness.pipeline import Pipeline, RunSettings
from tests.helpers import PINNED, edit_golden, problems_text

GOLDEN = next(c for c in all_checks() if c.name == "golden")
REPO = Path(__file__).resolve().parents[1]


def _pipeline(golden_dir: Path, update: str | None = None, case=VISION_ENCODER) -> Pipeline:
    return Pipeline(
        case,
        "tiny",
        settings=RunSettings(
            golden_dir=golden_dir, update_golden=update, golden_staging_dir=golden.staging_dir(golden_dir, "test")
        ),
    )


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> Path:
    """A golden written for the clean Gemma4 encoder into a private directory: staged by the
    check, promoted as the end of the run promotes it."""
    directory = tmp_path_factory.mktemp("golden")
    result = GOLDEN.run(_pipeline(directory, update="write"))
    assert result.passed and "rewritten at the end of the run (new: no usable golden before" in result.notes[0]
    assert list(directory.glob("*.json")) == []  # nothing in place before the run ends
    assert golden.promote(golden.staging_dir(directory, "test"), directory) == ["gemma4_vision_encoder.tiny"]
    assert not (directory / golden.STAGING / "test").exists()
    return directory


@pytest.fixture
def golden_copy(written, tmp_path) -> Path:
    """The written golden plus the committed measured noise (its per-tensor limits)."""
    for f in written.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    (tmp_path / "noise.json").write_bytes((REPO / "golden" / "noise.json").read_bytes())
    return tmp_path


def _edit(directory: Path, edit) -> None:
    edit_golden(directory, "gemma4_vision_encoder", "tiny", edit)


def _step(directory: Path, key: str) -> float:
    manifest = json.loads(golden.paths(directory, "gemma4_vision_encoder", "tiny")[1].read_text())
    return manifest["tensors"][key]["step"]


def test_round_trip_passes(written):
    result = GOLDEN.run(_pipeline(written))
    assert result.passed, problems_text(result)
    assert result.metrics["tensors"] > 100


def test_manifest_records_versions_seed_hash_and_steps(written):
    manifest = json.loads(golden.paths(written, "gemma4_vision_encoder", "tiny")[1].read_text())
    assert manifest["versions"]["tico"] == PINNED["tico"] and manifest["versions"]["torch"].startswith(PINNED["torch"])
    assert manifest["seed"] == 123 and len(manifest["input_hash"]) == 64
    # The output observer (obs_encoder_out) was found generically and gives the step.
    step = manifest["tensors"]["quant_output.default"]["step"]
    assert step == pytest.approx(float(_pipeline(written).quantized.wrapped.obs_encoder_out._cached_scale))


def test_a_rounding_flip_passes(golden_copy):
    """One element one step off: what a rounding flip does on another CPU. The encoder's measured
    noise shows no flips, so the limit is the one-flip floor."""
    step = _step(golden_copy, "quant_output.default")
    _edit(golden_copy, lambda t: t["quant_output.default"][0, 3, 5].add_(step))
    result = GOLDEN.run(_pipeline(golden_copy))
    assert result.passed, problems_text(result)
    assert result.evidence["quant_output.default"]["changed"] == 1


def test_whole_output_moved_one_step_fails_with_the_statistic(golden_copy):
    step = _step(golden_copy, "quant_output.default")
    _edit(golden_copy, lambda t: t["quant_output.default"].add_(step))
    text = problems_text(GOLDEN.run(_pipeline(golden_copy)))
    assert "quant_output.default: err_ratio" in text and "rms move / the output's own quantization error rms" in text
    assert "256 of 256 elements changed" in text and "x the largest value measured across kernel selections" in text


def test_observer_scale_one_level_off_fails(golden_copy):
    _edit(golden_copy, lambda t: t["qparams.obs_encoder_out.scale"].mul_(255 / 254))
    assert "qparams.obs_encoder_out.scale: scale_rel 0.0039" in (
        text := problems_text(GOLDEN.run(_pipeline(golden_copy)))
    )
    assert "> limit 5e-06 (relative scale change)" in text


def test_zero_point_off_by_one_fails(golden_copy):
    _edit(golden_copy, lambda t: t["qparams.obs_encoder_out.zp"].add_(1))
    assert "qparams.obs_encoder_out.zp: zero_point_abs 1 > limit 0" in problems_text(GOLDEN.run(_pipeline(golden_copy)))


def test_float_tensor_relative_to_its_magnitude(golden_copy):
    magnitude = float(
        load_file(str(golden.paths(golden_copy, "gemma4_vision_encoder", "tiny")[0]))["reference_output.padded"]
        .abs()
        .max()
    )
    _edit(golden_copy, lambda t: t["reference_output.padded"][0, 0, 0].add_(1e-6 * magnitude))
    assert GOLDEN.run(_pipeline(golden_copy)).passed
    _edit(golden_copy, lambda t: t["reference_output.padded"][0, 0, 0].add_(1e-3 * magnitude))
    assert "reference_output.padded: float_rel 0.001 > limit 0.0001" in problems_text(
        GOLDEN.run(_pipeline(golden_copy))
    )


def test_stale_config_is_reported_as_stale_not_drift(golden_copy):
    import dataclasses

    changed = dataclasses.replace(VISION_ENCODER, seed=124)
    text = problems_text(GOLDEN.run(_pipeline(golden_copy, case=changed)))
    assert "is stale: the case identity, seed, PTQ config" in text
    assert "err_ratio" not in text


def test_a_golden_recorded_on_another_tico_release_is_reported_not_gated(golden_copy, monkeypatch):
    import importlib.metadata

    _edit(golden_copy, lambda t: t["quant_output.default"].add_(0.5))
    assert not GOLDEN.run(_pipeline(golden_copy)).passed  # the same release: gated
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda d: "9.9.dev1" if d == "tico" else real(d))
    result = GOLDEN.run(_pipeline(golden_copy))
    assert result.passed, problems_text(result)
    assert any("quant_output.default" in n and "this run is tico 9.9.dev1: not gated here" in n for n in result.notes)


def _manifest_edit(directory: Path, edit) -> None:
    _, manifest_path = golden.paths(directory, "gemma4_vision_encoder", "tiny")
    manifest = json.loads(manifest_path.read_text())
    edit(manifest)
    manifest_path.write_text(json.dumps(manifest))


def test_float_inputs_within_rounding_noise_are_not_stale(golden_copy):
    """Inputs computed in float move by rounding noise across CPUs: not a reason to call it stale."""

    def nudge(manifest):
        for sketch in manifest["input_sketch"].values():
            sketch[1] *= 1 + 1e-6

    _manifest_edit(golden_copy, nudge)
    assert GOLDEN.run(_pipeline(golden_copy)).passed


def test_changed_float_input_is_stale(golden_copy):
    """An input whose content moved by 1% (another generator, a changed preprocessing)."""

    def change(manifest):
        sketch = manifest["input_sketch"]["evaluation[default].inputs_embeds"]
        sketch[1] *= 1.01

    _manifest_edit(golden_copy, change)
    text = problems_text(GOLDEN.run(_pipeline(golden_copy)))
    assert "is stale: float inputs changed by more than rounding noise" in text


def test_failure_names_the_platform_that_wrote_the_golden(golden_copy):
    def elsewhere(manifest):
        manifest["platform"]["cpu_capability"] = "NEON"

    _manifest_edit(golden_copy, elsewhere)
    _edit(golden_copy, lambda t: t["qparams.obs_encoder_out.zp"].add_(1))
    assert "[golden written on another platform: cpu_capability 'NEON' -> " in problems_text(
        GOLDEN.run(_pipeline(golden_copy))
    )


def test_version_change_is_named(golden_copy):
    _, manifest_path = golden.paths(golden_copy, "gemma4_vision_encoder", "tiny")
    manifest = json.loads(manifest_path.read_text())
    manifest["versions"]["transformers"] = "5.9.0"
    manifest_path.write_text(json.dumps(manifest))
    _edit(golden_copy, lambda t: t["qparams.obs_encoder_out.zp"].add_(1))
    assert f"(manifest differs: transformers 5.9.0 -> {PINNED['transformers']})" in problems_text(
        GOLDEN.run(_pipeline(golden_copy))
    )


def test_missing_golden_fails_with_the_command(tmp_path):
    text = problems_text(GOLDEN.run(_pipeline(tmp_path)))
    assert "no golden for gemma4_vision_encoder[tiny]" in text
    assert "create it with: ./scripts/env.sh pytest 'gemma4_vision_encoder::golden[tiny]' --update-golden" in text


def test_missing_manifest_fails_cleanly(golden_copy):
    golden.paths(golden_copy, "gemma4_vision_encoder", "tiny")[1].unlink()
    assert "golden manifest gemma4_vision_encoder.tiny.json is missing" in problems_text(
        GOLDEN.run(_pipeline(golden_copy))
    )


def test_truncated_file_fails_cleanly(golden_copy):
    tensor_path = golden.paths(golden_copy, "gemma4_vision_encoder", "tiny")[0]
    tensor_path.write_bytes(tensor_path.read_bytes()[:1000])
    assert "golden tensors gemma4_vision_encoder.tiny.safetensors are unreadable" in problems_text(
        GOLDEN.run(_pipeline(golden_copy))
    )


def test_checksum_mismatch_is_corruption(golden_copy):
    tensor_path = golden.paths(golden_copy, "gemma4_vision_encoder", "tiny")[0]
    tensors = load_file(str(tensor_path))
    tensors["quant_output.default"][0, 0, 0] += 1.0
    save_file(tensors, str(tensor_path))  # manifest not re-signed
    assert "golden tensor quant_output.default: checksum mismatch" in problems_text(GOLDEN.run(_pipeline(golden_copy)))


def test_wrong_dtype_is_reported(golden_copy):
    _edit(golden_copy, lambda t: t.__setitem__("quant_output.default", t["quant_output.default"].double()))
    assert "quant_output.default: now torch.float32 [1, 8, 32], golden torch.float64" in problems_text(
        GOLDEN.run(_pipeline(golden_copy))
    )


def test_defect_under_every_threshold_is_caught_by_golden_alone(written, monkeypatch, tmp_path):
    """Output scale 2% off: accuracy thresholds still pass; the golden sees it, and so does circle_structure
    (the Circle model gains a requantize of the output)."""
    original = QuantGemma4VisionEncoder.freeze_qparams

    def nudged(self):
        original(self)
        obs = self.obs_encoder_out
        obs.load_qparams(obs._cached_scale * 1.02, obs._cached_zp)

    monkeypatch.setattr(QuantGemma4VisionEncoder, "freeze_qparams", nudged)
    # the golden plus the committed structure baseline: a qparam nudge builds the same graph
    directory = tmp_path / "golden"
    shutil.copytree(written, directory)
    shutil.copytree(REPO / "golden" / "structure", directory / "structure")
    pipeline = _pipeline(directory)
    for check in all_checks():
        if (
            check.name != "golden"
            and check.applies(VISION_ENCODER) is None
            and check.name not in VISION_ENCODER.expected_failures
        ):
            if check.name in ("circle_replay", "qparam_audit", "torch_export"):
                continue  # export checks compare the model with itself; skipped here for time
            result = check.run(pipeline)
            if check.name == "circle_structure":  # the output's new qparams make tico requantize it
                assert "QUANTIZE 0 -> 1 in Gemma4VisionEncoderPrefillExportAdapter" in problems_text(result)
                continue
            assert result.passed, f"{check.name}: {problems_text(result)}"
    text = problems_text(GOLDEN.run(pipeline))
    assert "qparams.obs_encoder_out.scale: scale_rel" in text and "> limit 5e-06" in text


def test_update_golden_is_the_only_writer(tmp_path):
    GOLDEN.run(_pipeline(tmp_path))  # compare mode on an empty dir
    assert list(tmp_path.iterdir()) == []


def test_a_rewrite_says_what_it_changes_and_fail_mode_never_passes_one(golden_copy):
    """--update-golden classifies each rewrite against the golden in place; --update-golden=fail
    fails the items whose golden is new or changed beyond the measured noise (CI cannot green
    itself by regenerating), and passes those that only moved within the noise."""
    same = GOLDEN.run(_pipeline(golden_copy, update="fail"))
    assert same.passed, problems_text(same)
    assert "(unchanged: identical tensors)" in same.notes[0] or "(noise: " in same.notes[0]
    _edit(golden_copy, lambda t: t.__setitem__("reference_output.default", t["reference_output.default"] * 1.01))
    moved = GOLDEN.run(_pipeline(golden_copy, update="fail"))
    assert not moved.passed
    assert "rewritten at the end of the run (changed: 1 tensor(s) beyond the portable limits" in problems_text(moved)
    assert "--update-golden=fail: a rewrite never passes" in problems_text(moved)
    written = GOLDEN.run(_pipeline(golden_copy, update="write"))
    assert written.passed and "(changed: " in written.notes[0]
    assert written.evidence["rewrite"]["kind"] == "changed"


def test_a_half_staged_golden_is_never_promoted(tmp_path):
    staging = golden.staging_dir(tmp_path, "run1")
    staging.mkdir(parents=True)
    (staging / "c.tiny.json").write_text("{}")  # its tensors never arrived (the item crashed)
    assert golden.promote(staging, tmp_path) == []
    assert list(tmp_path.glob("*.json")) == []


def test_orphan_goldens_are_named(tmp_path):
    for stem in ("kept.tiny", "gone.tiny", "gone.e2b_dims"):
        (tmp_path / f"{stem}.json").write_text("{}")
    (tmp_path / "noise.json").write_text("{}")
    assert golden.orphans(tmp_path, {"kept"}) == ["gone.e2b_dims", "gone.tiny"]


def _adapter_raising(case):
    """The case with an export adapter whose eager call raises (as a wrapper without an export
    path does when called with its static ABI)."""
    import dataclasses

    def adapter(root, sample, built):
        class Refusing(torch.nn.Module):
            def forward(self, *args):
                raise RuntimeError(
                    "Expected tensor for argument #1 'indices' to have one of the following scalar types"
                )

        return Refusing()

    return dataclasses.replace(case, export=dataclasses.replace(case.export, adapter=adapter))


def test_export_output_not_pinned_while_the_adapter_cannot_run(tmp_path):
    """A case whose export adapter raises keeps a golden of everything else (the export checks own
    that failure), says so, and round-trips."""
    case = _adapter_raising(VISION_ENCODER)
    written = GOLDEN.run(_pipeline(tmp_path, update="write", case=case))
    assert written.passed, problems_text(written)
    golden.promote(golden.staging_dir(tmp_path, "test"), tmp_path)
    manifest = json.loads(golden.paths(tmp_path, "gemma4_vision_encoder", "tiny")[1].read_text())
    assert "quant_output.default" in manifest["tensors"]
    assert not any(k.startswith("export_output.") for k in manifest["tensors"])
    (tmp_path / "noise.json").write_bytes((REPO / "golden" / "noise.json").read_bytes())
    result = GOLDEN.run(_pipeline(tmp_path, case=case))
    assert result.passed, problems_text(result)
    assert any("export output not pinned" in note for note in result.notes)


def test_export_adapter_that_stops_running_fails_the_golden(golden_copy):
    """Seeded defect: the export adapter breaks after the golden pinned its output -- the golden's
    tensor set changes and the item fails naming the export output."""
    result = GOLDEN.run(_pipeline(golden_copy, case=_adapter_raising(VISION_ENCODER)))
    assert not result.passed
    assert "golden tensor set changed: gone ['export_output.default']" in problems_text(result)


def test_a_golden_holding_qparams_of_an_observer_the_tico_lacks_names_it_as_stale(golden_copy):
    """tico main dropped obs_past_key/value from its attentions: a golden recorded on 0.3.0 holds their qparams.
    The check names such observers apart from the outputs (marked stale: on a tico other than the recorded
    one the item sets the line aside, harness/run/items.py), and still compares every tensor both hold."""

    def drop_output_qparams(tensors):
        for key in [k for k in tensors if k.startswith("qparams.") and "obs_act_out" in k]:
            del tensors[key]

    edit_golden(golden_copy, "gemma4_vision_encoder", "tiny", drop_output_qparams)
    manifest_path = golden.paths(golden_copy, "gemma4_vision_encoder", "tiny")[1]
    manifest = json.loads(manifest_path.read_text())
    manifest["tensors"] = {k: v for k, v in manifest["tensors"].items() if not ("qparams." in k and "obs_act_out" in k)}
    manifest_path.write_text(json.dumps(manifest))
    result = GOLDEN.run(_pipeline(golden_copy))
    (line,) = result.problems
    assert line.startswith("golden qparams of observers this tico does not have [], or new in it ['qparams.")
    assert line.endswith("(stale golden qparams)") and "golden tensor set changed" not in line


def test_upstream_stage_failure_is_not_hidden_as_an_unpinned_export(tmp_path, monkeypatch):
    """Only the export adapter's own stages are left out: a calibration crash still fails the golden."""
    import dataclasses

    def broken_build(profile):
        built = VISION_ENCODER.build(profile)
        built.inputs.calibration[0].kwargs["inputs_embeds"] = "not a tensor"
        return built

    case = dataclasses.replace(VISION_ENCODER, build=broken_build)
    with pytest.raises(Exception, match="stage 'calibrate' failed"):
        GOLDEN.run(_pipeline(tmp_path, update="write", case=case))


# Goldens at a profile other than tiny: scripts/golden_noise.py recomputes tiny goldens only (noise.json is
# keyed by case), so these are compared against the unmeasured limit, and their golden item says so.
_UNMEASURED_GOLDENS = {"llama_gptq_decoder_layer_prefill.tiny_nightly"}


def test_every_committed_golden_has_measured_noise_and_no_entry_is_stale():
    """A golden compared without measured noise falls back to the loose unmeasured limit (the check says so
    in its notes): every committed tiny golden's case is in golden/noise.json, every entry names one, and the
    goldens left unmeasured are exactly the stated ones."""
    from harness.golden import portable

    golden_dir = REPO / "golden"
    stems = {path.name[: -len(".safetensors")] for path in golden_dir.glob("*.safetensors")}
    tiny = {stem.split(".")[0] for stem in stems if stem.endswith(".tiny")}
    measured = set(portable.load_measured_noise(golden_dir).get("cases", {}))
    assert sorted(tiny - measured) == [], "goldens without measured noise: run scripts/golden_noise.py --write-noise"
    assert sorted(measured - tiny) == [], "noise.json entries for cases without a tiny golden"
    assert {stem for stem in stems if not stem.endswith(".tiny")} == _UNMEASURED_GOLDENS


def test_the_unmeasured_note_names_a_case_missing_from_noise_json_only(golden_copy):
    """A case absent from noise.json is held to the unmeasured limit and its result says so; a case on record
    with no err_ratio-gated output (gemma4_assistant_sparse_head: its outputs equal their float reference) is
    measured, and gets no such note."""
    noise_path = golden_copy / "noise.json"
    noise = json.loads(noise_path.read_text())
    assert GOLDEN.run(_pipeline(golden_copy)).notes == []
    noise["cases"]["gemma4_vision_encoder"] = {}
    noise_path.write_text(json.dumps(noise))
    assert GOLDEN.run(_pipeline(golden_copy)).notes == []
    del noise["cases"]["gemma4_vision_encoder"]
    noise_path.write_text(json.dumps(noise))
    result = GOLDEN.run(_pipeline(golden_copy))
    assert result.passed and any("no measured platform noise for gemma4_vision_encoder" in n for n in result.notes)
