"""The call contracts of tico's Gemma4 patch embedder and pooler export modules (``as_export_module``), on
a padded patch layout the cases' own samples do not feed: the patch embedder derives the padding from
the positions when none is given, the pooler bakes it into its pooling matrix, and each answers as
Hugging Face's module does with the padding mask passed explicitly. Refusals: another export mode, a
layout or padding mask of the wrong shape or contradicting the positions, a pooling the layout cannot
make (no valid output, valid outputs that are not a prefix, a patch count that is not k^2 per output,
more outputs than patches), each with its own error."""

from __future__ import annotations

import torch

from cases._gemma4_common import padded_positions, valid_patches
from harness import Built, CallProbe, unwrap


def _half_padded(positions: torch.Tensor) -> torch.Tensor:
    """The case's grid width, its first half of patch slots valid and the rest padding."""
    count, width = positions.shape[1], int(positions[0, :, 0].max()) + 1
    return padded_positions(count // 2, count, width=width)


def patch_embedder_probes(built: Built) -> list[CallProbe]:
    pixels, grid, _ = built.inputs.evaluation["default"].args
    padded = _half_padded(grid)
    padding = ~valid_patches(padded)

    def export(mode="prefill", **layout):
        return lambda m: unwrap(m).as_export_module(mode, **layout)(pixels)

    refused = [
        ("another export mode", export("decode", pixel_position_ids=padded), "ValueError: Unsupported .* mode"),
        ("no pixel_position_ids", export(), "ValueError: .* requires construction-time pixel_position_ids"),
        ("pixel_position_ids of rank 2", export(pixel_position_ids=padded[0]), "ValueError: pixel_position_ids must"),
        (
            "a padding mask of another shape",
            export(pixel_position_ids=padded, padding_positions=padding[:, 1:]),
            "ValueError: padding_positions shape must match",
        ),
        (
            "a padding mask contradicting the positions",
            export(pixel_position_ids=padded, padding_positions=~padding),
            "ValueError: padding_positions must match the -1 entries",
        ),
    ]
    return [
        CallProbe(
            "the export module on a padded layout, padding derived from the positions",
            export(pixel_position_ids=padded),
            reference=lambda hf: hf(pixels, padded, padding),
            pick=lambda out: [out],
        ),
        *(CallProbe(label, call, refusal=refusal) for label, call, refusal in refused),
    ]


def pooler_probes(built: Built) -> list[CallProbe]:
    kwargs = built.inputs.evaluation["default"].kwargs
    hidden, grid, outputs = kwargs["hidden_states"], kwargs["pixel_position_ids"], kwargs["output_length"]
    count = grid.shape[1]
    kernel = int((count // outputs) ** 0.5)
    padded = _half_padded(grid)  # the padding slots' hidden states are left nonzero: the pooling must drop them
    # the patches of every output in the first kernel columns padded: the first output has none left
    first_column_padded = padded.masked_fill(padded[..., :1] < kernel, -1)
    all_padding = torch.full_like(grid, -1)

    def export(mode="prefill", positions=padded, length=outputs):
        return lambda m: unwrap(m).as_export_module(mode, output_length=length, pixel_position_ids=positions)(hidden)

    refused = [
        ("another export mode", export("decode"), "ValueError: Unsupported .* export mode"),
        ("pixel_position_ids of rank 2", export(positions=padded[0]), "ValueError: .* requires pixel_position_ids"),
        ("a layout of padding only", export(positions=all_padding), "ValueError: .* no valid pooled output"),
        (
            "valid pooled outputs that are not a prefix",
            export(positions=first_column_padded),
            "ValueError: .* contiguous prefix",
        ),
        ("patches that are not k^2 per output", export(length=outputs - 1), "ValueError: Cannot pool"),
        (
            "more outputs than patches",
            lambda m: m(hidden, grid, ~valid_patches(grid), count + 1),
            "ValueError: Cannot output more soft tokens",
        ),
    ]
    return [
        CallProbe(
            "the export module on a padded layout, padding baked into the pooling",
            export(),
            reference=lambda hf: hf(hidden, padded, ~valid_patches(padded), outputs)[0],
            pick=lambda out: [out],
        ),
        *(CallProbe(label, call, refusal=refusal) for label, call, refusal in refused),
    ]
