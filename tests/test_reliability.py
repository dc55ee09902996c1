"""Bad input never takes the gate down: each failure stays with its item, the session
finishes, and results.json / report.html are still written."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from harness import Built, Case, CaseInputs, ExportCapability, Sample
from harness.pipeline import Pipeline, RunSettings, StageError
from tests import preloaded_python
from tests.helpers import CHECKS, problems_text

REPO = Path(__file__).resolve().parents[1]


def _linear_case(name="rel_linear", module_factory=lambda: torch.nn.Linear(8, 4), **kwargs) -> Case:
    def build(profile):
        sample = lambda: Sample(args=(torch.randn(2, 8),))
        return Built(module_factory(), CaseInputs(calibration=(sample(),), evaluation={"default": sample()}))

    return Case(name=name, family="nn", build=build, **kwargs)


# -- a wrapper that raises: the stage is named ----------------------------------------------


@pytest.mark.parametrize("stage", ["prepare", "calibrate", "convert"])
def test_wrapper_raising_names_the_stage(monkeypatch, stage):
    import tico.quantization
    from tico.quantization.wrapq.wrappers.nn.quant_linear import QuantLinear

    if stage == "prepare":
        monkeypatch.setattr(
            tico.quantization, "prepare", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom in prepare"))
        )
    elif stage == "calibrate":
        original = QuantLinear.forward

        def forward(self, x):
            if self._mode.name == "CALIB":
                raise RuntimeError("boom in calibration forward")
            return original(self, x)

        monkeypatch.setattr(QuantLinear, "forward", forward)
    else:
        monkeypatch.setattr(
            tico.quantization, "convert", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom in convert"))
        )
    pipeline = Pipeline(_linear_case(), "tiny")
    with pytest.raises(StageError, match=rf"stage '{stage}' failed: RuntimeError: boom in"):
        pipeline.output("quant", "default")
    # The NO_QUANT path does not depend on the failed stage and still works.
    assert CHECKS["noquant_parity"].run(pipeline).passed


def test_export_adapter_raising_names_the_stage():
    def broken_adapter(root, sample, built):
        raise ValueError("adapter cannot be built for this profile")

    case = _linear_case(export=ExportCapability(adapter=broken_adapter, args=lambda s: s.args))
    with pytest.raises(StageError, match=r"stage 'export_adapter\[quant,default\]' failed: ValueError: adapter cannot"):
        CHECKS["torch_export"].run(Pipeline(case, "tiny"))


@pytest.mark.parametrize("check", ["mask_fill", "mask_quant", "rotary_parity"])
def test_a_case_probe_the_wrapper_crashes_in_names_its_stage(check):
    """A mask probe or rotary table that runs the wrapper on an input it refuses (as a model given a mask
    form it cannot broadcast) fails that check as a named stage, judged like any stage failure."""
    from harness import MaskCapability, RotaryCapability

    def refused(*args):
        raise RuntimeError("The size of tensor a (16) must match the size of tensor b (2)")

    case = _linear_case(mask=MaskCapability(probes=refused), rotary=RotaryCapability(tables=refused))
    stage = {"mask_fill": "mask_probes[noquant]", "mask_quant": "mask_probes[quant]"}.get(check, "rotary_tables")
    with pytest.raises(StageError, match=rf"stage '{re.escape(stage)}' failed: RuntimeError: The size of tensor a"):
        CHECKS[check].run(Pipeline(case, "tiny"))


def test_hung_stage_times_out():
    import time

    def hang(profile):
        time.sleep(30)

    case = Case(name="hangs", family="nn", build=hang)
    pipeline = Pipeline(case, "tiny", settings=RunSettings(stage_timeout=1.0))
    start = time.perf_counter()
    with pytest.raises(
        StageError, match=r"stage 'reference' failed: StageTimeout: exceeded the per-stage limit of 1 s"
    ):
        pipeline.output("quant", "default")
    assert time.perf_counter() - start < 10


# -- NaN / inf are named, never compared as numbers ----------------------------------------


class _NaNLinear(torch.nn.Linear):
    def forward(self, x):
        out = super().forward(x)
        out[0, 0] = float("nan")
        return out


def test_nan_in_reference_is_named():
    from tico.quantization.wrapq.wrappers.nn.quant_linear import QuantLinear
    from tico.quantization.wrapq.wrappers.registry import register

    register(_NaNLinear)(QuantLinear)  # the wrapper exists, so only the NaN is the problem
    case = _linear_case(name="nan_linear", module_factory=lambda: _NaNLinear(8, 4))
    pipeline = Pipeline(case, "tiny")
    text = problems_text(CHECKS["quant_accuracy"].run(pipeline))
    assert "[default] reference output has 1 NaN and 0 inf of 8 elements" in text
    assert "expected has 1 NaN and 0 inf of 8 elements" in problems_text(CHECKS["noquant_parity"].run(pipeline))


# -- whole sessions --------------------------------------------------------------------------

SESSION_CASES = """
import os, time
import torch
from harness import Built, Case, CaseInputs, Sample

def build_linear(profile):
    sample = lambda: Sample(args=(torch.randn(2, 8),))
    return Built(torch.nn.Linear(8, 4), CaseInputs(calibration=(sample(),), evaluation={"default": sample()}))

def build_dies(profile):
    os._exit(3)

def build_hangs(profile):
    time.sleep(120)

CASES = [
    Case(name="aaa_linear", family="nn", build=build_linear),
    Case(name="dies", family="nn", build=build_dies),
    Case(name="hangs", family="nn", build=build_hangs),
    Case(name="zzz_linear", family="nn", build=build_linear),
]
"""


@pytest.fixture
def session_project(tmp_path):
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\ntestpaths = cases\nwrapq_cases_dir = cases\naddopts = -p no:cacheprovider\n"
    )
    (tmp_path / "cases").mkdir()
    (tmp_path / "cases" / "__init__.py").write_text("")
    (tmp_path / "cases" / "mixed.py").write_text(textwrap.dedent(SESSION_CASES))
    return tmp_path


def test_dying_worker_and_hung_stage_fail_alone(session_project):
    done = preloaded_python.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--stage-timeout", "10", "-k", "noquant_parity or quant_accuracy"],
        cwd=session_project,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = done.stdout
    assert done.returncode == 1, out[-3000:]
    doc = json.loads((session_project / "reports" / "results.json").read_text())
    outcomes = {r["nodeid"].split("::", 1)[1]: r["outcome"] for r in doc["results"]}
    assert outcomes["aaa_linear::quant_accuracy[tiny]"] == "passed"
    assert outcomes["zzz_linear::quant_accuracy[tiny]"] == "passed"
    assert outcomes["hangs::noquant_parity[tiny]"] == "failed"
    assert {outcomes["dies::noquant_parity[tiny]"], outcomes["dies::quant_accuracy[tiny]"]} <= {"crashed"}
    assert "exceeded the per-stage limit of 10 s" in out
    assert re.search(r"worker 'gw\d' crashed", out)
    assert (session_project / "reports" / "report.html").exists()


# -- goldens under concurrent writers ---------------------------------------------------------


def test_concurrent_update_golden_leaves_valid_files(session_project):
    (session_project / "cases" / "mixed.py").write_text(
        textwrap.dedent(SESSION_CASES).replace(
            'Case(name="dies", family="nn", build=build_dies),\n    Case(name="hangs", family="nn", '
            "build=build_hangs),\n",
            "",
        )
    )
    cmd = [sys.executable, "-m", "pytest", "-q", "-k", "golden", "--update-golden"]
    procs = [
        subprocess.Popen(
            cmd + ["--wrapq-report-dir", f"r{i}"],
            cwd=session_project,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(3)
    ]
    for proc in procs:
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, out[-2000:]
    check = preloaded_python.run(
        [sys.executable, "-m", "pytest", "-q", "-k", "golden"],
        cwd=session_project,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert check.returncode == 0, check.stdout[-2000:]
    leftovers = [p.name for p in (session_project / "golden").iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []


# -- no pickle, no eval of data files ---------------------------------------------------------


def test_no_pickle_or_eval_in_the_harness():
    offenders = []
    for path in (REPO / "harness").rglob("*.py"):
        text = path.read_text()
        for pattern in (
            r"\bimport pickle\b",
            r"\bpickle\.",
            r"(?<![\w.])eval\(",
            r"(?<![\w.])exec\(",
            r"torch\.load\(",
            r"yaml\.load\(",
            r"allow_pickle\s*=\s*True",
        ):
            if re.search(pattern, text):
                offenders.append(f"{path.relative_to(REPO)}: {pattern}")
    assert offenders == []


# -- determinism of the whole matrix ----------------------------------------------------------


def _metrics_of(report_dir: Path) -> dict:
    doc = json.loads((report_dir / "results.json").read_text())
    return {r["nodeid"]: (r["outcome"], r.get("metrics")) for r in doc["results"]}


# One case per family and kind (leaf, attention decode, layer, text model), every check: the whole matrix
# twice would cost more CI time than it adds evidence. The golden items of one case per case module ride
# along (their tensors); every golden's own bits are the main job's and test_portable_golden's to judge.
DETERMINISM_CASES = (
    "nn_conv3d or llama_attention_decode or gemma4_text_decoder_layer_sliding_prefill or qwen3_vl_text_model"
)


def _one_golden_case_per_module() -> set[str]:
    """The first case of each case module that has a committed tiny golden."""
    from harness.model.case_loading import add_configured_import_roots, load_cases

    committed = {p.name.removesuffix(".tiny.json") for p in (REPO / "golden").glob("*.tiny.json")}
    add_configured_import_roots()
    first: dict[str, str] = {}
    for path, case in load_cases():
        if case.name in committed:
            first.setdefault(path, case.name)
    return set(first.values())


def _goldens_of(golden_dir: Path) -> dict[str, str]:
    return {
        p.name: json.dumps({k: v["sha256"] for k, v in json.loads(p.read_text())["tensors"].items()}, sort_keys=True)
        for p in sorted(golden_dir.glob("*.json"))
    }


def test_matrix_metrics_and_goldens_identical_serial_and_parallel(tmp_path):
    """Serial and -n 2 give the same outcome and metrics per item (caches off: export and conversion
    run in both) and write bitwise the same goldens, one case per case module. Bitwise identity is
    a same-machine, same-kernel-selection property; against the committed goldens (written elsewhere)
    the portable comparator applies (tests/test_portable_golden.py)."""
    golden_cases = _one_golden_case_per_module()
    runs, goldens = {}, {}
    for label, dist in (("serial", ["-p", "no:xdist"]), ("parallel", ["-n", "2"])):
        report_dir = tmp_path / label
        done = preloaded_python.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                *dist,
                "-k",
                f"(golden and ({' or '.join(sorted(golden_cases))})) or {DETERMINISM_CASES}",
                # the declared cases only: a sweep variant takes the same code paths through xdist
                "--sweep",
                "off",
                "--no-circle-cache",
                "--no-export-cache",
                "--update-golden",
                "--golden-dir",
                str(report_dir / "golden"),
                "--wrapq-report-dir",
                str(report_dir),
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=1200,
        )
        assert done.returncode == 0, done.stdout[-3000:]
        runs[label] = _metrics_of(report_dir)
        goldens[label] = _goldens_of(report_dir / "golden")
    assert runs["serial"].keys() == runs["parallel"].keys() and len(runs["serial"]) > 100
    assert runs["serial"] == runs["parallel"]
    # the tiny profile's goldens (a nightly profile keeps its own, e.g. tiny_nightly); -k matches names as
    # substrings, so a selected name may bring a longer one's golden along
    committed = {p.name for p in (REPO / "golden").glob("*.tiny.json")}
    chosen = {f"{name}.tiny.json" for name in golden_cases}
    assert goldens["serial"].keys() == goldens["parallel"].keys()
    assert chosen <= goldens["serial"].keys() <= committed and len(chosen) >= 10, sorted(goldens["serial"])
    assert goldens["serial"] == goldens["parallel"]
