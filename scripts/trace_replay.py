"""Where the Circle runtime and circle_replay's aligned torch copy part: every fake-quant the copy
applies, compared with the value the runtime holds for the tensor that carries its qparams
(``CircleReferenceRuntime.run(..., trace=True)``), in graph order, in steps of that tensor's scale.
The first row with a step is where a diagnosis starts (docs/diagnosis.md).

usage: ./scripts/env.sh python scripts/trace_replay.py CASE [PROFILE] [--no-biases]

Uses the export and Circle caches under .wrapq-cache/ (a pytest run of the case fills them)."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from harness import compat
from harness.circle.alignment import aligned_to_circle
from harness.circle.records import bias_off_rule, bias_steps_off
from harness.model.case_loading import load_cases
from harness.pipeline import Pipeline, RunSettings


def _recording(twin: torch.nn.Module, applied: list[dict]) -> dict[str, list[torch.Tensor]]:
    """Wrap each applied observer's fake_quant so its outputs are kept, per observer path, in call order."""
    recorded: dict[str, list[torch.Tensor]] = {}
    paths = {}
    for record in applied:
        if record.get("observer"):
            paths.setdefault(id(twin.get_submodule(record["observer"])), record["observer"])
    for module in twin.modules():
        if id(module) not in paths:
            continue

        def keep(x, _original=module.fake_quant, _path=paths[id(module)]):
            out = _original(x)
            recorded.setdefault(_path, []).append(out.detach().clone())
            return out

        module.fake_quant = keep
    return recorded


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("case")
    parser.add_argument("profile", nargs="?", default="tiny")
    parser.add_argument("--no-biases", action="store_true", help="leave the integer biases out of the aligned copy")
    options = parser.parse_args()
    from tico.circle.runtime.executor import CircleReferenceRuntime
    from tico.circle.runtime.kernels.base import ExecutionMode

    torch.set_num_threads(1)
    cases = {case.name: case for _, case in load_cases()}
    if options.case not in cases:
        parser.error(f"unknown case {options.case!r}")
    case = cases[options.case]
    root = Path.cwd() / ".wrapq-cache"
    pipeline = Pipeline(
        case, options.profile, settings=RunSettings(circle_cache_dir=root / "circle", export_cache_dir=root / "export")
    )
    audit = pipeline.circle.audit
    name = pipeline.export_sample_name
    args = case.export.args(pipeline.sample(name))
    adapter = pipeline.export_adapter("quant", name)
    for record in audit.quantized_biases:  # each integer bias: its size and its distance from the float bias
        float_bias = adapter.get_parameter(record["parameter"])
        off, size = bias_steps_off(record, float_bias), np.abs(record["values"])
        worst = int(off.argmax())
        print(
            f"bias {record['parameter']}: max |q| {size.max():.3g}; {off[worst]:.4f} steps from the float bias "
            f"at |q| {size[worst]:.3g} ({bias_off_rule(record, float_bias) or 'accepted'})"
        )
    twin, why = aligned_to_circle(
        adapter,
        audit.applied,
        audit.overwritten,
        audit.requantized,
        audit.redundant,
        inputs=pipeline.circle.input_quantization,
        biases=[] if options.no_biases else audit.quantized_biases,
    )
    if twin is None:
        print("no aligned copy:", "; ".join(why))
        return 1
    recorded = _recording(twin.inner, audit.applied)
    with torch.no_grad():
        leaves = [leaf for leaf in compat.tree_flatten(twin(*args))[0] if isinstance(leaf, torch.Tensor)]
    runtime = CircleReferenceRuntime(pipeline.circle.binary)
    arrays = [a.detach().numpy() for a in compat.tree_flatten(args)[0] if isinstance(a, torch.Tensor)]
    traced = runtime.run(arrays, mode=ExecutionMode.FAKE_QUANTIZE, trace=True)
    program = runtime.program
    # Circle tensor names are '<module>::<fx node name>'
    by_name = {program.tensor(i).name.split("::")[-1]: i for i in range(len(program.tensors))}
    for index, (out, leaf) in enumerate(zip(traced.outputs, leaves)):
        diff = (torch.from_numpy(np.asarray(out)).reshape(leaf.shape) - leaf).abs().max()
        print(f"output {index}: max |diff| {float(diff):.6g}")
    calls: dict[str, int] = {}
    for record in audit.applied:
        observer = record.get("observer")
        call = calls.get(observer, 0)
        calls[observer] = call + 1
        values, tensor = recorded.get(observer), by_name.get(record["tensor"])
        if values is None or tensor is None or call >= len(values) or tensor not in traced.tensor_values:
            print(f"{record['ordinal']:4d} {record['tensor']:24s} not comparable by name")
            continue
        circle = torch.from_numpy(np.asarray(traced.tensor_values[tensor], dtype=np.float32)).reshape(-1)
        ours = values[call].reshape(-1)
        if circle.numel() != ours.numel():
            print(f"{record['ordinal']:4d} {record['tensor']:24s} {circle.numel()} vs {ours.numel()} elements")
            continue
        quant = program.tensor(tensor).quantization
        step = float(quant.scale[0]) if quant is not None and len(quant.scale or ()) == 1 else record["scale"]
        steps = (circle - ours).abs() / step
        print(
            f"{record['ordinal']:4d} {record['tensor']:24s} max {float(steps.max()):.3g} steps, "
            f"{int((steps > 0.5).sum())} of {steps.numel()} elements apart  ({observer})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
