"""Real vs random weights, per fake-quant site: the attribution check's leave-one-out gains of a
real-weights case beside the same sites' gains when the same module, with the same inputs and the
same PTQConfig, holds random weights of the same shapes (harness/diagnosis/random_twin.py). A site that
dominates on the trained checkpoint and not on random weights is a loss the weights' distributions
cause (outlier rows, massive activations), which a random-weight profile never shows.

Computed at run time by ``attribution`` for a case whose settings ask for it
(``{"attribution": {"random_weights_contrast": True}}``): the twin is prepared, calibrated and
converted from scratch, then attributed on the sites the real run evaluated.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from harness.diagnosis.random_twin import randomize_weights
from harness.diagnosis.site_attribution import attribute
from harness.pipeline import Pipeline

# a site "dominates on real weights" when it gains this much more there than on random weights
DOMINANT_MARGIN_DB = 1.0
TOP = 10


def random_weights_case(case):
    """``case`` with every nn.Linear / nn.Embedding weight of its built module replaced by portable
    iid normals of the same shape; inputs, PTQConfig and capabilities unchanged."""

    real_build = case.build

    def build(profile: str):
        built = real_build(profile)
        randomize_weights(built.module)
        return built

    return dataclasses.replace(case, name=f"{case.name}_random_weights", build=build)


def _gain(value: float | None) -> float | None:
    return None if value is None or math.isnan(value) else value


def contrast(pipeline, real, *, max_sites: int) -> dict[str, Any]:
    """The random-weights twin of ``pipeline``'s case attributed on the sites ``real`` (an
    Attribution of the real case) evaluated; rows for the top sites of either run."""

    evaluated = {s.path for s in real.sites if s.evaluated}
    twin = Pipeline(random_weights_case(pipeline.case), pipeline.profile)
    random = attribute(twin, max_sites=max_sites, only=evaluated, with_submodules=False)
    real_gain = {s.path: _gain(s.gain_db) for s in real.sites if s.evaluated}
    random_gain = {s.path: _gain(s.gain_db) for s in random.sites if s.evaluated}
    boundary = {s.path: s.boundary for s in real.sites}
    top_real = [s.path for s in real.sites if s.evaluated][:TOP]
    top_random = [s.path for s in random.sites if s.evaluated][:TOP]
    rows = []
    for path in dict.fromkeys(top_real + top_random):
        r, q = real_gain.get(path), random_gain.get(path)
        rows.append(
            {
                "path": path,
                "real_gain_db": r,
                "random_gain_db": q,
                "real_minus_random_db": None if r is None or q is None else r - q,
                "boundary": boundary.get(path),
            }
        )
    rows.sort(key=lambda row: -(row["real_gain_db"] if row["real_gain_db"] is not None else -math.inf))
    deltas = [row for row in rows if row["real_minus_random_db"] is not None]
    dominant = sorted(
        (row for row in deltas if row["real_minus_random_db"] > DOMINANT_MARGIN_DB),
        key=lambda row: -row["real_minus_random_db"],
    )
    interior_random = [g for p, g in random_gain.items() if g is not None and boundary.get(p) is None]
    return {
        "sqnr_db": random.sqnr_db,
        "peir": random.peir,
        "evaluated": random.evaluated,
        "top_site_gain_db": max(interior_random, default=0.0),
        "max_real_minus_random_db": max(
            (
                real_gain[p] - random_gain[p]
                for p in real_gain
                if real_gain[p] is not None and random_gain.get(p) is not None
            ),
            default=0.0,
        ),
        "rows": rows,
        "real_dominant": [row["path"] for row in dominant],
        "margin_db": DOMINANT_MARGIN_DB,
    }
