"""Configuration sweeps (harness/model/sweep.py): variant sets, ids, selection, grouping, malformed
sweeps as definition items, and a seeded GQA defect that only one variant exposes."""

from __future__ import annotations

import itertools
import json
import textwrap

import pytest

from harness import Case, Sweep
from harness.model.sweep import SweepError, validate, variants
from harness.records import node_ids
from tests import preloaded_python


def _build(profile, kv_heads=1, layout="batched"):
    return None


def _ptq(profile, policy="uint8"):
    return None


CALLABLES = {"build": _build, "ptq_config": _ptq}


def test_each_runs_every_value_once_with_the_others_at_baseline():
    sweep = Sweep(axes={"kv_heads": (1, 2, 4), "layout": ("batched", "unrolled")})
    assert [v.label for v in variants(sweep, "pr")] == ["kv_heads=2", "kv_heads=4", "layout=unrolled"]
    assert variants(sweep, "off") == []


def test_pairwise_covers_every_pair_and_nightly_includes_the_pr_set():
    axes = {"a": (0, 1, 2), "b": ("x", "y"), "c": (False, True), "d": (5, 6, 7)}
    sweep = Sweep(axes=axes, pr=("a=2,d=7",), nightly="pairwise")
    chosen = [v.as_dict() for v in variants(sweep, "nightly")]
    full = len(list(itertools.product(*axes.values())))
    assert len(chosen) < full - 1  # a covering set, not the product
    points = chosen + [{k: v[0] for k, v in axes.items()}]  # the baseline runs as the case itself
    for (a1, v1s), (a2, v2s) in itertools.combinations(axes.items(), 2):
        for v1, v2 in itertools.product(v1s, v2s):
            assert any(p[a1] == v1 and p[a2] == v2 for p in points), (a1, v1, a2, v2)
    assert chosen[0] == {"a": 2, "b": "x", "c": False, "d": 7}  # the PR set leads
    assert [v.label for v in variants(sweep, "pr")] == ["a=2,d=7"]


def test_an_override_of_none_drops_the_expectation_a_variant_lacks():
    from harness import expect
    from harness.model.sweep import expand

    baseline = expect("conv3d-decomposed-float-bias")
    sweep = Sweep(axes={"bias": (True, False)}, overrides={"bias=False": {"expected_failures": {"qparam_audit": None}}})
    case = Case(
        name="swept", build=lambda profile, bias=True: None, family="nn", profiles=("tiny",), sweep=sweep,
        expected_failures={"qparam_audit": baseline, "circle_replay": baseline},
    )  # fmt: skip
    (no_bias,) = variants(sweep, "pr")
    assert dict(expand(case, no_bias).expected_failures) == {"circle_replay": baseline}
    assert set(case.expected_failures) == {"qparam_audit", "circle_replay"}  # the baseline keeps both


def test_labels_name_only_the_axes_off_baseline_in_axis_order():
    sweep = Sweep(axes={"heads": (2, 4), "kv_heads": (1, 2)}, pr=("kv_heads=2,heads=4",), nightly="all")
    assert [v.label for v in variants(sweep, "pr")] == ["heads=4,kv_heads=2"]
    assert [v.label for v in variants(sweep, "nightly")] == ["heads=4,kv_heads=2", "kv_heads=2", "heads=4"]


def test_an_empty_pr_set_leaves_every_variant_to_the_nightly():
    sweep = Sweep(axes={"kv_heads": (1, 2)}, pr=())
    validate(sweep, ("tiny",), CALLABLES)
    assert variants(sweep, "pr") == []
    assert [v.label for v in variants(sweep, "nightly")] == ["kv_heads=2"]


@pytest.mark.parametrize(
    "sweep, field, message",
    [
        (Sweep(axes={"kv_heads": (1, 2)}, pr=("kv_head=2",)), "sweep.pr", "names no axis 'kv_head'"),
        (Sweep(axes={"kv_heads": (1, 2)}, pr=("kv_heads=3",)), "sweep.pr", "'3' is not a value of 'kv_heads'"),
        (Sweep(axes={"kv_heads": (1,)}), "sweep.axes['kv_heads']", "at least two values"),
        (Sweep(axes={"kv_heads": (1, 2.5)}), "sweep.axes['kv_heads']", "must be an int, a bool or a string"),
        (Sweep(axes={"kv_heads": (1, 2)}, nightly="everything"), "sweep.nightly", "is not one of"),
        (Sweep(axes={"kv_heads": (1, 2)}, nightly=()), "sweep.nightly", "a tuple of selectors, not empty"),
        (
            Sweep(axes={"kv_heads": (1, 2)}, overrides={"kv_heads=2": {"seed": 3}}),
            "sweep.overrides['kv_heads=2']",
            "cannot override seed",
        ),
        (
            Sweep(axes={"kv_heads": (1, 2)}, nightly="each", overrides={"kv_heads=1": {"settings": {}}}),
            "sweep.overrides['kv_heads=1']",
            "matches no variant",
        ),
        (Sweep(axes={"heads": (2, 4)}), "sweep.axes['heads']", "is read by none of build, ptq_config"),
        (
            Sweep(axes={"kv_heads": (2, 1)}),
            "sweep.axes['kv_heads']",
            "build's default for 'kv_heads' is 1, not the baseline 2",
        ),
        (Sweep(axes={"kv_heads": (1, 2)}, profiles=("wide",)), "sweep.profiles", "profiles the case runs"),
    ],
)
def test_malformed_sweeps_name_the_field(sweep, field, message):
    with pytest.raises(SweepError, match=message) as info:
        validate(sweep, ("tiny",), CALLABLES)
    assert info.value.field_name == field


SWEPT_CASES = """
import torch
from harness import Built, Case, CaseInputs, Expected, Sample, Sweep


def build_attention(profile, heads=2, kv_heads=1):
    from transformers.models.llama.configuration_llama import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding

    config = LlamaConfig(hidden_size=16, num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=8,
                         max_position_embeddings=8, attn_implementation="eager")
    module = LlamaAttention(config, layer_idx=0)
    rope = LlamaRotaryEmbedding(config)(torch.zeros(1), torch.arange(6)[None])
    mask = torch.where(torch.ones(6, 6, dtype=torch.bool).tril(), 0.0, -120.0)[None]

    def sample():
        return Sample(args=(torch.randn(1, 6, 16), rope), kwargs={"attention_mask": mask})

    return Built(module, CaseInputs(calibration=(sample(),), evaluation={"default": sample()}))


def reference_eval(profile):
    from tico.quantization.config.ptq import PTQConfig

    return PTQConfig(model_args={"profile": "reference_eval"})


def hf_call(reference, sample):
    kwargs = dict(sample.kwargs, attention_mask=sample.kwargs["attention_mask"][:, None])
    return reference(*sample.args, **kwargs)


CASES = [Case(name="toy_attention", family="llama", build=build_attention, ptq_config=reference_eval,
              reference_call=hf_call,
              sweep=Sweep(axes={"heads": (2, 4), "kv_heads": (1, 2)}, pr=("kv_heads=2", "heads=4,kv_heads=2"),
                          nightly="all"))]
"""

INI = """
[pytest]
testpaths = cases
wrapq_cases_dir = cases
addopts = -p no:cacheprovider
"""

# A classic GQA defect seeded into tico's batched attention: K/V heads tiled with repeat() instead
# of repeat_interleave(), so query head i reads K/V head i % kv_heads instead of i // kv_rep.
# With one K/V head (kv_heads=1) the two agree and with kv_heads == heads nothing is repeated:
# only heads=4,kv_heads=2 can show it.
GQA_DEFECT_CONFTEST = """
import torch
from tico.quantization.wrapq.wrappers.llama.quant_attention import QuantLlamaAttention

_batched = QuantLlamaAttention._forward_batched
_interleave = torch.Tensor.repeat_interleave


def _tiled(self, repeats, dim=None, **kwargs):
    if dim == 1 and isinstance(repeats, int) and self.dim() == 4:
        return self.repeat(1, repeats, 1, 1)
    return _interleave(self, repeats, dim=dim, **kwargs)


def _forward_batched(self, **kwargs):
    torch.Tensor.repeat_interleave = _tiled
    try:
        return _batched(self, **kwargs)
    finally:
        torch.Tensor.repeat_interleave = _interleave


QuantLlamaAttention._forward_batched = _forward_batched
"""


@pytest.fixture
def swept(pytester):
    pytester.makeini(INI)
    cases = pytester.mkpydir("cases")
    (cases / "toy.py").write_text(textwrap.dedent(SWEPT_CASES))
    return pytester


def _ids(result) -> list[str]:
    return [line for line in result.outlines if "::" in line]


def test_variant_ids_keep_the_declared_case_and_select_with_k_and_m(swept):
    ids = _ids(preloaded_python.runpytest(swept, "--collect-only", "-q"))
    groups = sorted({node_ids.group_of(i) for i in ids})
    assert groups == [
        "cases/toy.py::toy_attention[tiny,heads=4,kv_heads=2]",
        "cases/toy.py::toy_attention[tiny,kv_heads=2]",
        "cases/toy.py::toy_attention[tiny]",
    ]
    assert "cases/toy.py::toy_attention::noquant_parity[tiny,kv_heads=2]" in ids
    nightly = {
        node_ids.group_of(i)
        for i in _ids(preloaded_python.runpytest(swept, "--collect-only", "-q", "--sweep", "nightly"))
    }
    assert "cases/toy.py::toy_attention[tiny,heads=4]" in nightly and len(nightly) == 4
    off = {
        node_ids.group_of(i) for i in _ids(preloaded_python.runpytest(swept, "--collect-only", "-q", "--sweep", "off"))
    }
    assert off == {"cases/toy.py::toy_attention[tiny]"}
    # -k matches the axis in the id; -m sweep(...) selects by value (the baseline carries its values too).
    # (-k's grammar has no '=' or ',': it matches an axis name as a substring of the id)
    by_k = _ids(preloaded_python.runpytest(swept, "--collect-only", "-q", "-k", "kv_heads and noquant_parity"))
    assert by_k == [
        "cases/toy.py::toy_attention::noquant_parity[tiny,heads=4,kv_heads=2]",
        "cases/toy.py::toy_attention::noquant_parity[tiny,kv_heads=2]",
    ]
    by_m = _ids(preloaded_python.runpytest(swept, "--collect-only", "-q", "-m", "sweep(kv_heads=1) and lifecycle"))
    assert by_m == ["cases/toy.py::toy_attention::lifecycle[tiny]"]
    by_m = _ids(preloaded_python.runpytest(swept, "--collect-only", "-q", "-m", "sweep(heads=4) and lifecycle"))
    assert by_m == ["cases/toy.py::toy_attention::lifecycle[tiny,heads=4,kv_heads=2]"]


def test_seeded_gqa_defect_fails_only_the_grouped_variant_and_groups_stay_on_one_worker(swept):
    swept.makeconftest(GQA_DEFECT_CONFTEST)
    result = preloaded_python.runpytest(
        swept, "-n", "2", "-v", "-k", "noquant_parity or lifecycle or (golden and kv_heads)"
    )
    doc = json.loads((swept.path / "reports" / "results.json").read_text())
    outcomes = {r["nodeid"].split("::", 1)[1]: r["outcome"] for r in doc["results"]}
    failed = sorted(k for k, v in outcomes.items() if v == "failed")
    assert failed == ["toy_attention::noquant_parity[tiny,heads=4,kv_heads=2]"], outcomes
    message = next(r["message"] for r in doc["results"] if r["outcome"] == "failed")
    assert "noquant_parity failed for toy_attention[tiny,heads=4,kv_heads=2]:" in message, message
    assert outcomes["toy_attention::noquant_parity[tiny,kv_heads=2]"] == "passed"
    assert outcomes["toy_attention::noquant_parity[tiny]"] == "passed"
    # a variant keeps no golden: its limits gate it; the declared case still has its golden item
    assert outcomes["toy_attention::golden[tiny,kv_heads=2]"] == "skipped"
    by_id = {r["nodeid"].split("::", 1)[1]: r for r in doc["results"]}
    assert (
        "sweep variant kv_heads=2 of 'toy_attention' is gated by its checks' limits"
        in by_id["toy_attention::golden[tiny,kv_heads=2]"]["message"]
    )
    record = by_id["toy_attention::noquant_parity[tiny,heads=4,kv_heads=2]"]
    assert record["case"] == "toy_attention" and record["profile"] == "tiny,heads=4,kv_heads=2"
    assert record["axes"] == {"heads": 4, "kv_heads": 2}
    assert "axes" not in by_id["toy_attention::noquant_parity[tiny]"]
    # loadscope: each variant's checks ran on one worker (they share its pipeline)
    workers: dict[str, set[str]] = {}
    for line in result.outlines:
        if line.startswith("[gw") and "::" in line:
            workers.setdefault(node_ids.group_of(line.split()[-1]), set()).add(line.split()[0])
    assert len(workers) == 3 and all(len(w) == 1 for w in workers.values()), workers


def test_clean_tico_passes_every_variant_under_scalar_kernels(swept, monkeypatch):
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    result = preloaded_python.runpytest(swept, "-k", "noquant_parity or lifecycle")
    result.assert_outcomes(passed=6)


def test_a_malformed_sweep_is_a_definition_item_and_other_cases_run(swept):
    (swept.path / "cases" / "bad.py").write_text(
        textwrap.dedent(SWEPT_CASES)
        .replace('pr=("kv_heads=2", "heads=4,kv_heads=2")', 'pr=("kv_heads=3",)')
        .replace('"toy_attention"', '"bad_attention"')
    )
    result = preloaded_python.runpytest(swept, "-k", "bad or (toy_attention and lifecycle)")
    result.assert_outcomes(passed=3, failed=1)
    out = result.stdout.str()
    assert "cases/bad.py::<definition:bad_attention.sweep.pr>" in out
    assert (
        "malformed case definition in bad.py: case 'bad_attention': field 'sweep.pr': selector 'kv_heads=3': "
        "'3' is not a value of 'kv_heads' (1, 2)"
    ) in out


def test_declared_cases_reject_a_non_sweep():
    from harness.model.sweep import validate as check

    with pytest.raises(SweepError, match="must be harness.Sweep"):
        check({"kv_heads": (1, 2)}, ("tiny",), CALLABLES)
    assert Case(name="plain", family="nn", build=_build).sweep is None
