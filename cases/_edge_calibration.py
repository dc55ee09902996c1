"""Calibration and evaluation at the edges real data has and dense random samples never reach.

An algorithm or observer can be right on dense random inputs and wrong where real activations are
not: hidden features that never fire during calibration and then do (GPTQ zeroes those weight
columns while it runs and must put their rounded weights back; SmoothQuant's smoothing scale for them
is 0 and must be floored), a channel with one value in every token, a token row far above the rest
(first and last position). ``edge_inputs`` rewrites a case's hidden-state inputs (the first argument,
batch x tokens x hidden) so a ``calibration=edge`` sweep variant runs every check on them.
"""

from __future__ import annotations

import dataclasses

import torch

from harness import Built, CaseInputs, Sample, Sweep

DEAD = (1, 6)  # hidden channels never active during calibration
CONSTANT = 3  # a hidden channel with one value in every token, calibration and evaluation
CONSTANT_VALUE = 0.5
OUTLIER = 40.0  # a whole token row scaled by this


def _with_hidden(sample: Sample, edit) -> Sample:
    hidden = sample.args[0].clone()
    edit(hidden)
    return dataclasses.replace(sample, args=(hidden, *sample.args[1:]))


def _constant(hidden: torch.Tensor) -> None:
    hidden[..., CONSTANT] = CONSTANT_VALUE


def _dead(hidden: torch.Tensor) -> None:
    hidden[..., list(DEAD)] = 0.0
    _constant(hidden)


def _outlier(position: int):
    def edit(hidden: torch.Tensor) -> None:
        _constant(hidden)
        hidden[:, position, :] *= OUTLIER

    return edit


def edge_inputs(inputs: CaseInputs) -> CaseInputs:
    """Calibration: every sample with the DEAD channels zero and the CONSTANT channel fixed, the first
    sample's first token an outlier row. Evaluation: every sample of the case with the CONSTANT channel
    fixed and the DEAD channels active (what calibration never showed), plus ``outlier_last_token``:
    the default sample with its last token an outlier row."""
    calibration = [_with_hidden(s, _dead) for s in inputs.calibration]
    calibration[0] = _with_hidden(calibration[0], _outlier(0))
    evaluation = {name: _with_hidden(sample, _constant) for name, sample in inputs.evaluation.items()}
    evaluation["outlier_last_token"] = _with_hidden(inputs.evaluation["default"], _outlier(-1))
    return CaseInputs(calibration=tuple(calibration), evaluation=evaluation)


def with_edge_calibration(build):
    """A builder taking the sweep axis ``calibration``: "dense" (the case as declared) or "edge"."""

    def edge_build(profile: str, calibration: str = "dense") -> Built:
        built = build(profile)
        if calibration == "dense":
            return built
        if calibration != "edge":
            raise ValueError(f"calibration must be 'dense' or 'edge', got {calibration!r}")
        return dataclasses.replace(built, inputs=edge_inputs(built.inputs))

    return edge_build


def edge_sweep(**edge_overrides) -> Sweep:
    """The ``calibration`` axis, its edge variant in the PR gate, with that variant's own limits and
    expectations (``edge_overrides``: Case fields)."""
    return Sweep(
        axes={"calibration": ("dense", "edge")},
        why={"calibration": "features never active in calibration, a constant channel, outlier token rows"},
        pr="each",
        nightly="each",
        overrides={"calibration=edge": edge_overrides},
    )
