"""``python -m harness new-case TARGET [--wrapper pkg.mod:Class] [--out DIR]``: a case module for an
HF module, and a wrapper skeleton where tico registers none.

    python -m harness new-case Phi3MLP --out ~/my_cases          # a submodule class of an HF model
    python -m harness new-case llama --out ~/my_cases            # a model type (or class): the whole model
    ./scripts/env.sh pytest --wrapq-cases-dir=~/my_cases         # collected and run at once

TARGET is a transformers model class or model type (the whole model, as ``coverage`` builds it), or
the class name of a module inside one (``Phi3MLP``: the model type is read off the name's prefix).
The case builds the tiny config ``coverage`` builds (no download), seeds it, and feeds the module
what it receives when the tiny model runs on random token ids (captured with a forward pre-hook:
calibration and evaluation samples). Where tico registers no wrapper for the class and
``--wrapper`` names none, a wrapper package is written beside the case in tico's
``QuantModuleBase`` style: observers on the input and the output around the float forward, to be
replaced by the module's own computation. A red verdict on the skeleton is expected; the harness
runs it at once.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from harness.commands.coverage import UsageError, resolve, tiny_config

HELP = "write a case module (and a wrapper skeleton where tico has none) for an HF module"


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()


def _model_type_of(class_name: str) -> str:
    """The model type whose name (underscores dropped) the class name starts with, longest first."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    squashed = class_name.lower()
    candidates = [t for t in CONFIG_MAPPING_NAMES if squashed.startswith(t.replace("_", "").replace("-", ""))]
    if not candidates:
        raise UsageError(f"no transformers model type is a prefix of {class_name!r}; pass a model type or class")
    return max(candidates, key=len)


def locate(target: str) -> dict[str, Any]:
    """What the case builds: model type, config keyword arguments, the module's dotted path in the
    tiny model and its class."""
    try:
        config_class, model_class, model_type = resolve(target)
        module_class, path = model_class, ""
    except UsageError:
        model_type = _model_type_of(target)
        config_class, model_class, _ = resolve(model_type)
        module_class, path = None, None
    config = tiny_config(config_class, model_type, {})
    from transformers import AutoModel

    model = (model_class or AutoModel).from_config(config)
    if path is None:
        found = [(name, type(m)) for name, m in model.named_modules() if type(m).__name__ == target]
        if not found:
            raise UsageError(f"the tiny {model_type} model holds no {target}")
        path, module_class = found[0]
    module_class = module_class or type(model)
    return {
        "model_type": model_type,
        "config": config.to_diff_dict(),
        "path": path,
        "cls": module_class,
        "model_class": model_class,
    }


def case_source(found: dict[str, Any], case_name: str, wrapper_import: str | None, wrapper_name: str | None) -> str:
    model = f"transformers.{found['model_class'].__name__}" if found["model_class"] else "transformers.AutoModel"
    skip = ("transformers_version", "architectures", "model_type")
    config = {k: v for k, v in found["config"].items() if k not in skip and not k.startswith("_")}
    lines = [
        f'"""Case for {found["cls"].__module__}.{found["cls"].__name__}, written by `python -m harness new-case`.',
        "",
        "The module comes out of a seeded tiny model (no download) and is fed what it receives when that",
        "model runs on random token ids. Edit freely: settings, more samples, capabilities (README).",
        '"""',
        "",
        "import torch",
        "import transformers",
        "",
        "from harness import Built, Case, CaseInputs, Sample",
    ]
    if wrapper_import:
        lines += [f"import {wrapper_import}  # noqa: F401 - registers the wrapper before prepare()"]
    lines += [
        "",
        f"MODEL_TYPE = {found['model_type']!r}",
        f"CONFIG = {config!r}",
        f"PATH = {found['path']!r}  # the module inside the tiny model ('' = the model itself)",
        "",
        "",
        "def _model():",
        "    config = transformers.AutoConfig.for_model(MODEL_TYPE, **CONFIG)",
        '    config._attn_implementation = "eager"',
        f"    return {model}.from_config(config).eval()",
        "",
        "",
        "def _detached(value):",
        "    if isinstance(value, torch.Tensor):",
        "        return value.detach().clone()",
        "    if isinstance(value, (tuple, list)):",
        "        return type(value)(_detached(v) for v in value)",
        "    return value",
        "",
        "",
        "def _samples(model, count, seq=8):",
        "    calls = []",
        "    module = model.get_submodule(PATH)",
        "    hook = module.register_forward_pre_hook(lambda m, args, kwargs: calls.append((args, kwargs)),",
        "                                            with_kwargs=True)",
        "    with torch.no_grad():",
        "        for _ in range(count):",
        "            model(input_ids=torch.randint(0, model.config.vocab_size, (1, seq)), use_cache=False)",
        "    hook.remove()",
        "    kept = (torch.Tensor, tuple, type(None))",
        "    return [Sample(args=_detached(tuple(args)),",
        "                   kwargs={k: _detached(v) for k, v in kwargs.items() if isinstance(v, kept)})",
        "            for args, kwargs in calls[:count]]",
        "",
        "",
        "def build(profile):",
        "    model = _model()",
        "    samples = _samples(model, 4)",
        "    inputs = CaseInputs(calibration=tuple(samples[:3]), evaluation={'default': samples[3]})",
        "    return Built(module=model.get_submodule(PATH), inputs=inputs)",
        "",
        "",
        "CASES = [",
        f"    Case(name={case_name!r}, family={found['model_type']!r}, build=build, seed=0"
        + (f", expected_wrapper={wrapper_name!r}" if wrapper_name else "")
        + "),",
        "]",
        "",
    ]
    return "\n".join(lines)


def wrapper_source(cls: type, wrapper_name: str) -> str:
    full = f"{cls.__module__}.{cls.__name__}"
    return f'''"""``{wrapper_name}``: a skeleton tico wrapq wrapper for ``{full}``, written by
`python -m harness new-case`. Children tico has wrappers for (Linear, activations, norms, ...) are
wrapped with PTQWrapper in a copy of the float module, and the input and the output are fake-quantized
around its float forward. What the forward computes between its children (a product, a sum, a
reshape) still runs in float: give each such value an observer, as tico's wrappers do, and let the
harness's checks tell what is missing."""

import copy
from typing import Iterable, Optional

import torch.nn as nn
from tico.quantization.config.ptq import PTQConfig
from tico.quantization.wrapq.wrappers.ptq_wrapper import PTQWrapper
from tico.quantization.wrapq.wrappers.quant_module_base import QuantModuleBase
from tico.quantization.wrapq.wrappers.registry import lookup, try_register


@try_register("{full}")
class {wrapper_name}(QuantModuleBase):
    def __init__(self, fp_module: nn.Module, *, qcfg: Optional[PTQConfig] = None, fp_name: Optional[str] = None):
        super().__init__(qcfg, fp_name=fp_name)
        # a copy whose children are the wrapped ones; the float module itself is left as it was
        self.module = copy.copy(fp_module)
        self.module._modules = dict(fp_module._modules)
        for name, child in fp_module.named_children():
            if lookup(type(child)) is not None:
                child_name = f"{{fp_name}}.{{name}}" if fp_name else name
                wrapped = PTQWrapper(child, qcfg=qcfg.child(name) if qcfg else None, fp_name=child_name)
                setattr(self.module, name, wrapped)  # what the float forward calls
                setattr(self, name, wrapped)  # a direct child: tico's mode switches reach it
        self.obs_act_in = self._make_obs("act_in")
        self.obs_act_out = self._make_obs("act_out")

    def forward(self, hidden_states, *args, **kwargs):
        out = self.module(self._fq(hidden_states, self.obs_act_in), *args, **kwargs)
        if isinstance(out, tuple):
            return (self._fq(out[0], self.obs_act_out),) + tuple(out[1:])
        return self._fq(out, self.obs_act_out)

    def _all_observers(self) -> Iterable:
        yield self.obs_act_in
        yield self.obs_act_out
'''


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness new-case", description=__doc__.splitlines()[0])
    parser.add_argument("target", help="an HF model class or model type, or a module class inside one (Phi3MLP)")
    parser.add_argument("--wrapper", help="your wrapper as pkg.module:Class (imported by the case; no skeleton)")
    parser.add_argument("--out", type=Path, default=Path("."), help="the case directory to write into")
    parser.add_argument("--force", action="store_true", help="overwrite files that exist")
    args = parser.parse_args(argv)
    try:
        found = locate(args.target)
    except UsageError as exc:
        print(f"new-case: {exc}", file=sys.stderr)
        return 2
    from tico.quantization.wrapq.wrappers import registry

    cls = found["cls"]
    snake = _snake(cls.__name__)
    out = args.out.expanduser().resolve()
    written: dict[Path, str] = {}
    wrapper_import = wrapper_name = None
    if args.wrapper:
        module_name, _, wrapper_name = args.wrapper.partition(":")
        wrapper_import = module_name
    elif registry.lookup(cls) is not None:
        wrapper_name = registry.lookup(cls).__name__
    else:
        wrapper_name = f"Quant{cls.__name__}"
        wrapper_import = f"wrapq_{snake}"
        written[out / wrapper_import / "__init__.py"] = (
            f'"""Importing this package registers {wrapper_name} in tico\'s wrapper registry."""\n\n'
            f"from {wrapper_import}.quant_{snake} import {wrapper_name}\n\n__all__ = [{wrapper_name!r}]\n"
        )
        written[out / wrapper_import / f"quant_{snake}.py"] = wrapper_source(cls, wrapper_name)
    written[out / f"{snake}_case.py"] = case_source(found, snake, wrapper_import, wrapper_name)
    existing = [str(p) for p in written if p.exists()]
    if existing and not args.force:
        print(f"new-case: would overwrite {', '.join(existing)} (--force to do it)", file=sys.stderr)
        return 2
    for path, text in written.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    print(f"wrote {', '.join(str(p) for p in written)}")
    print(f"run it: ./scripts/env.sh pytest --wrapq-cases-dir={out}")
    return 0
