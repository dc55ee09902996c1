"""``python -m harness coverage MODEL``: which submodules of an HF model tico's ``prepare`` leaves
unwrapped.

    python -m harness coverage qwen3_vl                 # a model_type: AutoModel of a tiny config
    python -m harness coverage Qwen3VLForConditionalGeneration
    python -m harness coverage gemma4 --json
    python -m harness coverage llama --set num_hidden_layers=1 --set text_config.hidden_size=32

MODEL is a transformers model class name (built from its ``config_class``) or a model type
(``AutoConfig.for_model`` + ``AutoModel.from_config``). Nothing is downloaded: the config gets
tiny sizes (the matrix's tiny configs for qwen3_vl, gemma4 and llama; generic small sizes
otherwise) plus any ``--set key=value``, and the weights are random. The model is prepared with
``tico.quantization.prepare`` and the PTQ config its family's cases use (``PTQConfig()`` with
``strict_wrap=False`` otherwise, so an unsupported root still gets its children wrapped).

Printed: every module that stays unwrapped (no registered wrapper on it or on any module
above it, so it runs in float), grouped by class with counts and dotted paths; the regions
that are only partly wrapped (containers above wrappers); and the wrapped modules summarised
by float class -> wrapper class. Exit status 0 when it ran (unwrapped modules are information),
2 on a bad model name or a config / build / prepare failure, with the reason.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import time
from typing import Any

from harness.pipeline import unwrap

HELP = "list the submodules of an HF model (tiny config, no download) that tico's prepare leaves unwrapped"

_QWEN3_VL_GRID = (1, 8, 8)

# The matrix's tiny configs (cases/qwen3_vl_text.py, cases/gemma4*.py, cases/llama.py), as
# keyword arguments of the family's config class. Sub-configs are dicts.
TINY: dict[str, dict[str, Any]] = {
    "qwen3_vl": {
        "vision_config": {
            "hidden_size": 64,
            "num_heads": 4,
            "depth": 2,
            "temporal_patch_size": 2,
            "patch_size": 16,
            "out_hidden_size": 64,
            "spatial_merge_size": 2,
            "deepstack_visual_indexes": [0, 1],
        },
        "text_config": {
            "hidden_size": 64,
            "intermediate_size": 256,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "head_dim": 32,
            "num_hidden_layers": 2,
            "vocab_size": 1000,
            "max_position_embeddings": 1024,
            "rope_scaling": {"rope_type": "default", "mrope_section": [1, 1, 2]},
        },
        "image_token_id": 998,
        "video_token_id": 999,
        "vision_start_token_id": 997,
        "vision_end_token_id": 996,
    },
    "gemma4": {
        "text_config": {
            "vocab_size": 256,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "num_global_key_value_heads": 2,
            "head_dim": 32,
            "global_head_dim": 32,
            "max_position_embeddings": 128,
            "num_hidden_layers": 2,
            "layer_types": ["sliding_attention", "full_attention"],
            "rope_parameters": {
                "full_attention": {
                    "rope_type": "proportional",
                    "partial_rotary_factor": 0.25,
                    "rope_theta": 1_000_000.0,
                },
                "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            },
            "enable_moe_block": False,
            "hidden_size_per_layer_input": 0,
        },
        "vision_config": {
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 8,
            "max_position_embeddings": 128,
            "use_clipped_linears": False,
            "rope_parameters": {"rope_type": "default", "rope_theta": 100.0},
            "standardize": True,
        },
        "audio_config": None,
        "image_token_id": 10,
        "video_token_id": 11,
        "audio_token_id": 12,
    },
    "llama": {
        "vocab_size": 256,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 128,
    },
}
TINY["gemma4_text"] = dict(TINY["gemma4"]["text_config"])
TINY["qwen3_vl_text"] = dict(TINY["qwen3_vl"]["text_config"])

# Any other model type: these attributes, where its config (or a sub-config) has them.
GENERIC = {
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 256,
    "max_position_embeddings": 128,
    "depth": 2,
    "num_heads": 4,
    "num_layers": 2,
}
SUB_CONFIGS = ("text_config", "vision_config", "audio_config")


class UsageError(Exception):
    """A bad model name or an unusable config: said in one line, exit status 2."""


def resolve(model: str) -> tuple[type, type | None, str]:
    """(config class, model class or None for AutoModel, model_type) for a class name or model type."""
    import transformers
    from transformers import AutoConfig, PretrainedConfig, PreTrainedModel

    candidate = getattr(transformers, model, None) if model[:1].isupper() else None
    if isinstance(candidate, type) and issubclass(candidate, PreTrainedModel):
        config_class = getattr(candidate, "config_class", None)
        if not (isinstance(config_class, type) and issubclass(config_class, PretrainedConfig)):
            raise UsageError(f"{model} has no config_class to build a config from")
        return config_class, candidate, config_class.model_type
    if isinstance(candidate, type) and issubclass(candidate, PretrainedConfig):
        return candidate, None, candidate.model_type
    try:
        config = AutoConfig.for_model(model)
    except (ValueError, KeyError) as exc:
        raise UsageError(
            f"unknown model {model!r}: neither a transformers model class (e.g. "
            "Qwen3VLForConditionalGeneration) nor a model type AutoConfig knows (e.g. qwen3_vl, gemma4, "
            f"llama); transformers says: {str(exc).split('. Should contain')[0]}"
        ) from None
    return type(config), None, config.model_type


def _parse_sets(pairs: list[str]) -> dict[str, Any]:
    out = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--set wants key=value, got {pair!r}")
        try:
            out[key] = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            out[key] = raw
    return out


def tiny_config(config_class: type, model_type: str, sets: dict[str, Any]) -> Any:
    """The config: the family's tiny keyword arguments (or generic small sizes), then ``--set``
    (``text_config.hidden_size=32`` reaches a sub-config)."""
    kwargs = json.loads(json.dumps(TINY.get(model_type, {})))
    try:
        config = config_class(**kwargs)
    except Exception as exc:  # noqa: BLE001 - a config class refusing its arguments is a usage problem
        raise UsageError(f"cannot build {config_class.__name__} with tiny sizes: {type(exc).__name__}: {exc}") from None
    targets = [config] + [getattr(config, name) for name in SUB_CONFIGS if getattr(config, name, None) is not None]
    if model_type not in TINY:
        for target in targets:
            for key, value in GENERIC.items():
                if isinstance(getattr(target, key, None), int):
                    setattr(target, key, value)
    for key, value in sets.items():
        owner_name, _, attr = key.rpartition(".")
        owner = getattr(config, owner_name, None) if owner_name else config
        if owner is None or (owner_name and owner_name not in SUB_CONFIGS):
            raise UsageError(f"--set {key}: {config_class.__name__} has no sub-config {owner_name!r}")
        setattr(owner, attr, value)
    for target in targets:
        target._attn_implementation = "eager"
        vocab = getattr(target, "vocab_size", None)
        if isinstance(vocab, int):
            # special token ids of the full vocabulary (phi3's pad_token_id 32000) must fit the tiny one
            for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
                if isinstance(getattr(target, key, None), int) and getattr(target, key) >= vocab:
                    setattr(target, key, vocab - 1)
    return config


def ptq_config(model_type: str, config: Any) -> tuple[Any, str]:
    """The PTQ config the family's cases use, and a line saying which."""
    from tico.quantization.config.ptq import PTQConfig

    if model_type == "qwen3_vl":
        merge = config.vision_config.spatial_merge_size
        return (
            PTQConfig(
                model_args={"vision": {"grid_thw": _QWEN3_VL_GRID, "visual_start_idx": 1, "spatial_merge_size": merge}},
                strict_wrap=False,
            ),
            f"PTQConfig(model_args vision grid_thw={_QWEN3_VL_GRID}, as cases/qwen3_vl_text.py)",
        )
    if model_type == "gemma4":
        from tico.quantization.config.gemma4_builders import build_gemma4_e2b_ptq_config

        cfg = build_gemma4_e2b_ptq_config(
            num_text_layers=config.text_config.num_hidden_layers,
            num_vision_layers=config.vision_config.num_hidden_layers,
            model_args={"vision": {"visual_start_idx": 0, "num_visual_tokens": 4}},
        )
        cfg.strict_wrap = False
        return cfg, "build_gemma4_e2b_ptq_config (as cases/gemma4_multimodal.py)"
    return PTQConfig(strict_wrap=False), "PTQConfig(strict_wrap=False)"


def analyse(float_modules: dict[str, type], prepared: Any) -> dict[str, Any]:
    """Which float submodules (``float_modules``: dotted path -> class, taken before ``prepare``)
    got a wrapper of their own. tico's wrappers record the float path they wrap as ``fp_name``
    (the outermost one has ``fp_name=None``: the path of the module handed to ``prepare``)."""
    from tico.quantization.wrapq.wrappers.ptq_wrapper import PTQWrapper
    from tico.quantization.wrapq.wrappers.quant_module_base import QuantModuleBase
    from tico.quantization.wrapq.wrappers.registry import lookup

    top = unwrap(prepared)
    by_path: dict[str, str] = {}
    unplaced: dict[str, int] = {}
    for module in prepared.modules():
        if not isinstance(module, QuantModuleBase) or isinstance(module, PTQWrapper):
            continue
        path = "" if module is top and module.fp_name is None else module.fp_name
        if path in float_modules:
            by_path[path] = type(module).__name__
        else:  # e.g. a module tico built itself (a fused embedding): no float path to name
            unplaced[type(module).__name__] = unplaced.get(type(module).__name__, 0) + 1

    def nearest_wrapper(path: str) -> str | None:
        best = None
        for wrapped_path in by_path:
            if wrapped_path == "" or path.startswith(wrapped_path + "."):
                if best is None or len(wrapped_path) > len(best):
                    best = wrapped_path
        return best

    import torch

    unwrapped: dict[str, dict[str, Any]] = {}
    wrapped: dict[str, int] = {}
    for path, cls in float_modules.items():
        if path in by_path:
            key = f"{cls.__name__} -> {by_path[path]}"
            wrapped[key] = wrapped.get(key, 0) + 1
            continue
        if cls in (torch.nn.ModuleList, torch.nn.ModuleDict):
            continue  # containers without a forward of their own
        name = f"{cls.__module__}.{cls.__qualname__}"
        registered = lookup(cls)
        entry = unwrapped.setdefault(
            name, {"registered_wrapper": registered.__name__ if registered else None, "paths": [], "inside": {}}
        )
        entry["paths"].append(path or "<root>")
        owner = nearest_wrapper(path)
        label = f"{by_path[owner]} ({owner or '<root>'})" if owner is not None else "no wrapper (runs in float)"
        entry["inside"][label] = entry["inside"].get(label, 0) + 1
    return {
        "unwrapped": dict(sorted(unwrapped.items(), key=lambda kv: (-len(kv[1]["paths"]), kv[0]))),
        "wrapped": dict(sorted(wrapped.items(), key=lambda kv: (-kv[1], kv[0]))),
        "wrappers_without_float_path": dict(sorted(unplaced.items())),
    }


def run(model: str, sets: dict[str, Any] | None = None) -> dict[str, Any]:
    import torch

    config_class, model_class, model_type = resolve(model)
    config = tiny_config(config_class, model_type, sets or {})
    start = time.perf_counter()
    torch.manual_seed(0)
    try:
        if model_class is None:
            from transformers import AutoModel

            hf = AutoModel.from_config(config)
        else:
            hf = model_class(config)
    except Exception as exc:  # noqa: BLE001
        raise UsageError(
            f"cannot build {model_class.__name__ if model_class else model_type} from its tiny config: "
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''} "
            "(adjust sizes with --set key=value)"
        ) from None
    hf.eval()
    float_modules = {path: type(module) for path, module in hf.named_modules()}
    built = time.perf_counter()
    from tico.quantization import prepare

    cfg, cfg_text = ptq_config(model_type, config)
    try:
        prepared = prepare(hf, cfg, inplace=True)
    except Exception as exc:  # noqa: BLE001
        raise UsageError(f"tico's prepare failed on {type(hf).__name__}: {type(exc).__name__}: {exc}") from None
    done = time.perf_counter()
    report = analyse(float_modules, prepared)
    return {
        "model": type(hf).__name__,
        "model_type": model_type,
        "ptq_config": cfg_text,
        "float_modules": len(float_modules),
        "seconds": {"build": round(built - start, 3), "prepare": round(done - built, 3)},
        **report,
    }


def render(result: dict[str, Any], max_paths: int = 6) -> str:
    from tabulate import tabulate

    def paths_cell(paths: list[str]) -> str:
        extra = f" (+{len(paths) - max_paths} more)" if len(paths) > max_paths else ""
        return ", ".join(paths[:max_paths]) + extra

    unwrapped, wrapped = result["unwrapped"], result["wrapped"]
    total = sum(len(v["paths"]) for v in unwrapped.values())
    lines = [
        f"{result['model']} (model_type {result['model_type']}, {result['float_modules']} modules, random "
        f"weights), prepared with {result['ptq_config']}: build {result['seconds']['build']} s, "
        f"prepare {result['seconds']['prepare']} s",
        "",
        f"unwrapped: {total} of {result['float_modules']} modules ({len(unwrapped)} classes) have no wrapper "
        "of their own (ModuleList/ModuleDict containers not counted); 'inside' is the nearest wrapped "
        "ancestor, which handles or skips them",
    ]
    if unwrapped:
        rows = [
            [
                name.rsplit(".", 1)[1],
                len(entry["paths"]),
                entry["registered_wrapper"] or "-",
                "; ".join(f"{k} x{v}" if v > 1 else k for k, v in entry["inside"].items()),
                paths_cell(entry["paths"]),
            ]
            for name, entry in unwrapped.items()
        ]
        lines.append(
            tabulate(rows, headers=["class", "count", "registered wrapper", "inside", "paths"], tablefmt="github")
        )
    lines += ["", f"wrapped: {sum(wrapped.values())} modules, {len(wrapped)} float class -> wrapper pairs"]
    lines.append(
        tabulate([[k, v] for k, v in wrapped.items()], headers=["float class -> wrapper", "count"], tablefmt="github")
    )
    if result["wrappers_without_float_path"]:
        lines += [
            "",
            "wrappers with no float path (modules tico built itself): "
            + ", ".join(f"{k} x{v}" for k, v in result["wrappers_without_float_path"].items()),
        ]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness coverage", description=HELP)
    parser.add_argument(
        "model", help="a transformers model class (Qwen3VLForConditionalGeneration) or model type (qwen3_vl)"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config attribute (text_config.KEY / vision_config.KEY for sub-configs)",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    try:
        result = run(args.model, _parse_sets(args.set))
    except UsageError as exc:
        print(f"python -m harness coverage: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=1) if args.json else render(result))
    return 0
