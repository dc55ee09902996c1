"""tico's recipe entry point, ``QuantizationRunner``, as its users call it: a recipe YAML
(``cases/recipes/llama_gptq.yaml``) loaded with ``load_recipe_config`` and a ``--set``-style
override, its GPTQ stage on the whole tiny Llama causal LM, then wrapq's PTQ with the handoff the
recipe's PTQ stage runs (``inject_gptq_qparams``).

tico's built-in Llama adapter loads a checkpoint by ``name_or_path`` and calibrates on wikitext from
the hub. The recipe names an out-of-tree adapter instead, the way tico's recipes take one: its
``extensions`` entry registers a ``LlamaAdapter`` subclass with ``register_adapter`` and
``model.adapter`` selects it. The subclass hands the runner the case's seeded model and calibration
samples (``name_or_path`` is the key they are handed over under) and calibrates as the case's
reference runs; the rest (config validation, dataset-usage checks, the GPTQ config class the
adapter layer resolves, the stage's payload filtering, prepare/convert) is tico's.

The recipe's own PTQ stage is off: the harness prepares, calibrates and converts, so every check
sees the prepared tree.
"""

from __future__ import annotations

import contextlib
import functools
import io
import warnings
from pathlib import Path
from typing import Any, Callable

import torch

from cases import llama_model
from cases.algorithm_models import nightly_whole_model
from cases.algorithms import gptq_model_handoff, gptq_record, record_gptq_grids
from harness import AlgorithmCapability, AlgorithmRecord

RECIPE = Path(__file__).parent / "recipes" / "llama_gptq.yaml"
ADAPTER_KEY = "wrapq_case"
KEY_PREFIX = "wrapq-case:"

# What each running recipe is handed, by its model.name_or_path.
_HANDED_OVER: dict[str, tuple[torch.nn.Module, tuple, Callable[[torch.nn.Module, Any], Any]]] = {}


def _handed_over(ctx: Any) -> tuple[torch.nn.Module, tuple, Callable[[torch.nn.Module, Any], Any]]:
    key = ctx.cfg["model"]["name_or_path"]
    if key not in _HANDED_OVER:
        raise KeyError(
            f"model.name_or_path {key!r} names no model handed over by a case: the {ADAPTER_KEY!r} adapter "
            "serves recipes run through cases.recipe_runner.recipe_gptq_run"
        )
    return _HANDED_OVER[key]


@functools.cache
def _case_adapter() -> Any:
    """One adapter object per process: tico's register_adapter accepts the same object again."""
    from tico.quantization.recipes.adapters.llama import LlamaAdapter

    class CaseLlamaAdapter(LlamaAdapter):
        """tico's Llama adapter, fed a case's seeded model and samples instead of a hub checkpoint and wikitext."""

        def load_model(self, ctx):
            ctx.model = _handed_over(ctx)[0].eval()
            ctx.device, ctx.dtype = torch.device("cpu"), torch.float32
            return ctx

        def build_calibration_inputs(self, ctx):
            return list(_handed_over(ctx)[1])

        def forward_calibration(self, ctx, model, calibration_inputs, *, desc):
            call = _handed_over(ctx)[2]
            model.eval()
            with torch.no_grad():
                for sample in calibration_inputs:
                    call(model, sample)

    return CaseLlamaAdapter()


def register_case_adapter() -> None:
    """The recipe's ``extensions`` entry: register the case adapter under ``model.adapter``'s key."""
    from tico.quantization.recipes.adapters import register_adapter

    register_adapter(ADAPTER_KEY, _case_adapter())


def recipe_gptq_run(recipe: Path = RECIPE):
    """The recipe run by tico's QuantizationRunner on the case's float module, recording GPTQ's grids."""

    def run(module: torch.nn.Module, calibration: tuple, call) -> AlgorithmRecord:
        from tico.quantization.recipes.config import load_recipe_config
        from tico.quantization.recipes.runner import QuantizationRunner

        record = gptq_record(module, calibration, call)
        key = f"{KEY_PREFIX}{id(module)}"
        cfg = load_recipe_config(recipe, overrides=[f"model.name_or_path={key}"])
        printed = io.StringIO()
        _HANDED_OVER[key] = (module, calibration, call)
        try:
            with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(printed):
                warnings.simplefilter("always")
                ctx = QuantizationRunner().run(cfg)
        finally:
            del _HANDED_OVER[key]
        if ctx.model is not module:
            raise RuntimeError("the recipe's GPTQ stage left another model in its context than the one it was handed")
        record_gptq_grids(module, record, "the recipe's GPTQ stage")
        record.facts["recipe"] = {
            "file": RECIPE.relative_to(Path(__file__).parents[1]).as_posix() if recipe == RECIPE else str(recipe),
            "stages_run": [s["name"] for s in cfg["pipeline"] if s.get("enabled", True)],
            "runner_said": [
                line for line in printed.getvalue().splitlines() if line.startswith(("Applying", "Skipping"))
            ],
            "warnings": sorted({f"{w.category.__name__}: {w.message}" for w in caught}),
        }
        return record

    return run


RECIPE_GPTQ = AlgorithmCapability(
    name="recipe_gptq",
    run=recipe_gptq_run(),
    handoff=gptq_model_handoff,
    claims=("layer_reconstruction",),
    description=(
        "tico's QuantizationRunner on a recipe YAML (out-of-tree adapter through extensions): its GPTQ stage "
        "on the whole causal LM, then wrapq's PTQConfig"
    ),
)

_CAUSAL_LM = {case.name: case for case in llama_model.CASES}["llama_for_causal_lm"]
CASES = [nightly_whole_model(_CAUSAL_LM, "llama_recipe_gptq_for_causal_lm", RECIPE_GPTQ)]
