"""Group ablation: a case's QUANT output error with a named group of fake-quant sites switched off
together, or with every site but that group switched off.

Leave-one-out attribution (harness/diagnosis/site_attribution.py) cannot see a loss that two sites cause
together: when two observers quantize one tensor, either one alone off leaves the other clipping
it, and both read 0 dB. A diagnosis names such groups ("obs_softmax and obs_attn_weights") and
states the SQNR with the group off; this module recomputes those numbers on demand, so a
diagnosis written into a limits table can be re-run (``python -m harness explain CASE --off
PATTERNS``) instead of trusted.

Sites are selected by ``fnmatch`` patterns over their module paths in the QUANT tree (the paths
``python -m harness explain`` prints). A pattern that selects no site is an error: a typo or a
renamed observer must not read as "switching it off changes nothing".
"""

from __future__ import annotations

import copy
import fnmatch
from dataclasses import dataclass

import torch

from harness.diagnosis.site_attribution import observer_sites
from harness.primitives.metrics import peir, select_valid, sqnr_db

MODES = ("off", "only")


class GroupError(ValueError):
    """A group that cannot be evaluated as stated (a pattern selecting no site, an unknown mode)."""


@dataclass
class GroupResult:
    label: str  # the patterns as given
    mode: str  # "off": the group switched off; "only": every other site switched off
    sites: list[str]  # the selected site paths
    sqnr_db: float
    peir: float
    gain_db: float  # sqnr_db minus the case's SQNR as is


def parse_group(text: str) -> list[str]:
    """``'*obs_softmax,*obs_attn_weights'`` -> its patterns (empty entries refused)."""
    patterns = [p.strip() for p in text.split(",")]
    if not text.strip() or any(not p for p in patterns):
        raise GroupError(f"group {text!r}: give comma-separated site path patterns, none empty")
    return patterns


def select_sites(paths: list[str], patterns: list[str]) -> list[str]:
    """The paths any pattern matches, in tree order; GroupError naming each pattern that matches none."""
    unmatched = [p for p in patterns if not fnmatch.filter(paths, p)]
    if unmatched:
        raise GroupError(
            f"pattern(s) {', '.join(map(repr, unmatched))} select no fake-quant site (sites: {', '.join(paths)})"
        )
    return [path for path in paths if any(fnmatch.fnmatchcase(path, p) for p in patterns)]


def ablate_groups(
    pipeline, groups: list[list[str]], *, mode: str = "off", sample_name: str = "default"
) -> tuple[float, float, list[GroupResult]]:
    """(SQNR as is, PEIR as is, one result per group) on a private copy of ``pipeline``'s quantized
    tree; the shared artifact is never touched. Each group is evaluated from the tree as is."""
    if mode not in MODES:
        raise GroupError(f"mode {mode!r}: one of {', '.join(MODES)}")
    sample = pipeline.sample(sample_name)
    reference = select_valid(pipeline.output("reference", sample_name), sample.valid_tokens)
    twin = copy.deepcopy(pipeline.quantized)
    sites = observer_sites(twin)
    paths = [path for path, _ in sites]
    chosen = [select_sites(paths, group) for group in groups]  # every group checked before any forward

    def output() -> torch.Tensor:
        with torch.no_grad():
            return select_valid(pipeline.case.output(sample.call(twin)).detach(), sample.valid_tokens)

    as_is = output()
    base_sqnr, base_peir = sqnr_db(reference, as_is), peir(reference, as_is)
    enabled = {id(obs): bool(getattr(obs, "fake_quant_enabled", True)) for _, obs in sites}
    results = []
    for group, selected in zip(groups, chosen):
        names = set(selected)
        switched = [obs for path, obs in sites if (path in names) == (mode == "off")]
        for obs in switched:
            obs.set_fake_quant_enabled(False)
        try:
            out = output()
        finally:
            for obs in switched:
                obs.set_fake_quant_enabled(enabled[id(obs)])
        s = sqnr_db(reference, out)
        results.append(
            GroupResult(
                label=",".join(group),
                mode=mode,
                sites=selected,
                sqnr_db=s,
                peir=peir(reference, out),
                gain_db=s - base_sqnr,
            )
        )
    return base_sqnr, base_peir, results
