"""The recipe case (cases/recipe_runner.py): tico's QuantizationRunner runs the case's recipe YAML on the
handed-over seeded model through the out-of-tree adapter, and a failing recipe leaves nothing behind."""

from __future__ import annotations

import copy
import subprocess
import sys
from importlib import metadata

import pytest
import torch

from cases import algorithms, llama_model, recipe_runner


def _causal_lm():
    torch.manual_seed(0)
    return llama_model.build_causal_lm("tiny")


def test_the_recipe_runs_tico_gptq_on_the_handed_over_model():
    """The runner's GPTQ stage (the recipe's options, the config class the adapter layer resolves) computes
    what tico's GPTQConfig computes called directly on the same model and samples, and it moved the weights."""
    built = _causal_lm()
    calibration = built.inputs.calibration
    by_recipe = recipe_runner.RECIPE_GPTQ.run(copy.deepcopy(built.module), calibration, llama_model.hf_call)
    direct = algorithms.GPTQ_W8.run(copy.deepcopy(built.module), calibration, llama_model.hf_call)

    assert sorted(by_recipe.grids) == sorted(direct.grids) and len(by_recipe.grids) == 14
    for name, weight in by_recipe.weights.items():
        torch.testing.assert_close(weight, direct.weights[name], rtol=0, atol=0)
        torch.testing.assert_close(by_recipe.grids[name].scale, direct.grids[name].scale, rtol=0, atol=0)
        assert not torch.equal(weight, by_recipe.original_weights[name]), name
    facts = by_recipe.facts["recipe"]
    assert facts["stages_run"] == ["gptq"]
    assert facts["runner_said"] == ["Applying gptq …", "Skipping ptq …"]
    assert any("UNREGISTERED CALIBRATION DATASET" in w for w in facts["warnings"])
    assert recipe_runner._HANDED_OVER == {}


@pytest.mark.filterwarnings("ignore:UNREGISTERED CALIBRATION DATASET:RuntimeWarning")
def test_a_recipe_naming_no_handed_over_model_says_which_adapter_serves_it():
    from tico.quantization.recipes.config import load_recipe_config
    from tico.quantization.recipes.runner import QuantizationRunner

    cfg = load_recipe_config(recipe_runner.RECIPE, overrides=["model.name_or_path=wrapq-case:nothing"])
    with pytest.raises(KeyError, match="names no model handed over by a case: the 'wrapq_case' adapter"):
        QuantizationRunner().run(cfg)


def test_a_failing_recipe_releases_the_handed_over_model(monkeypatch):
    from tico.quantization.recipes.stages.gptq import GPTQStage

    def broken(self, ctx, stage_cfg):
        raise RuntimeError("GPTQ stage broke")

    monkeypatch.setattr(GPTQStage, "run", broken)
    built = _causal_lm()
    with pytest.raises(RuntimeError, match="GPTQ stage broke"):
        recipe_runner.RECIPE_GPTQ.run(built.module, built.inputs.calibration, llama_model.hf_call)
    assert recipe_runner._HANDED_OVER == {}


def test_a_stage_that_returns_another_model_is_refused(monkeypatch):
    """The case's checks read the module the recipe was handed: a stage that swaps in a copy must not pass
    unnoticed as 'GPTQ ran'."""
    from tico.quantization.recipes.stages.gptq import GPTQStage

    original = GPTQStage.run

    def copying(self, ctx, stage_cfg):
        ctx = original(self, ctx, stage_cfg)
        ctx.model = copy.deepcopy(ctx.model)
        return ctx

    monkeypatch.setattr(GPTQStage, "run", copying)
    built = _causal_lm()
    with pytest.raises(RuntimeError, match="left another model in its context"):
        recipe_runner.RECIPE_GPTQ.run(built.module, built.inputs.calibration, llama_model.hf_call)


def test_tico_recipes_need_datasets_which_tico_does_not_declare():
    """Why pyproject.toml pins ``datasets``: tico's recipe adapters import it at module level
    (recipes/data/llm.py, evaluation/vlm_eval_utils.py), and tico's metadata does not require it, so
    ``import tico.quantization.recipes.runner`` fails in an environment with only tico's declared dependencies."""
    declared = [req.split(";")[0].split()[0].lower() for req in metadata.requires("tico") or ()]
    assert "datasets" not in declared, declared
    hidden = "import sys; sys.modules['datasets'] = None; import tico.quantization.recipes.runner"
    run = subprocess.run([sys.executable, "-c", hidden], capture_output=True, text=True)
    assert run.returncode != 0
    assert "ModuleNotFoundError: import of datasets halted" in run.stderr, run.stderr[-2000:]
    chain = "tico/quantization/recipes/adapters/__init__.py"
    assert chain in run.stderr.replace("\\", "/"), run.stderr[-2000:]
