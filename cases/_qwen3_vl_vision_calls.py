"""The Qwen3-VL vision model's export call contract (the call_contract check): the grid forms
``as_export_module("prefill", grid_thw=...)`` documents (a ``(3,)`` or ``(1, 3)`` integer tensor, a
``Qwen3VLVisionProfile``, a list), each adapter answering the sample's patches as Hugging Face's
Qwen3VLVisionModel answers them for that grid, and the grids it refuses with its own error."""

from __future__ import annotations

import torch

from harness import Built, CallProbe, unwrap


def _merged(out) -> list[torch.Tensor]:
    return [out.pooler_output if hasattr(out, "pooler_output") else out[0]]


def vision_export_probes(built: Built) -> list[CallProbe]:
    from tico.quantization.wrapq.wrappers.qwen_vl.vision_profile import Qwen3VLVisionProfile

    pixels, grid = built.inputs.evaluation["default"].args  # grid: (1, 3) int tensor
    t, h, w = (int(v) for v in grid[0])

    def adapter_answer(label, grid_thw):
        return CallProbe(
            label,
            lambda m: unwrap(m).as_export_module("prefill", grid_thw=grid_thw)(pixels),
            reference=lambda hf: hf(pixels, grid),
            pick=_merged,
        )

    def refused(label, refusal, grid_thw):
        return CallProbe(label, lambda m: unwrap(m).as_export_module("prefill", grid_thw=grid_thw), refusal=refusal)

    return [
        adapter_answer("grid as a (1, 3) tensor", grid.clone()),
        adapter_answer("grid as a (3,) tensor", grid[0].clone()),
        adapter_answer("grid as a Qwen3VLVisionProfile", Qwen3VLVisionProfile(t, h, w)),
        adapter_answer("grid as a list", [t, h, w]),
        refused("a (2, 3) grid tensor", "ValueError: .*shape `\\(3,\\)` or `\\(1, 3\\)`", grid.repeat(2, 1)),
        refused("a float grid tensor", "TypeError: .*integer dtype", grid.float()),
        refused("a grid of two values", "ValueError: .*exactly three values", [t, h]),
        refused("a bool dimension", "TypeError: .*dimensions must be integers", [True, h, w]),
        refused("a float dimension", "TypeError: .*dimensions must be integers", [t, float(h), w]),
        refused("a zero dimension", "ValueError: .*must be positive", [0, h, w]),
        refused("a grid as a string", "TypeError: .*must be a profile", "1x4x4"),
        refused("a height the merger cannot split", "ValueError: .*divisible by spatial_merge_size", [t, h + 1, w]),
    ]
