"""Why the case loses accuracy: leave-one-out gain of every fake-quant site, and a gate on one
interior site that alone costs more than ``max_site_gain_db``; beside it, every wrapped
submodule's isolated vs propagated error and the one where error is made most.

``harness/diagnosis/site_attribution.py`` switches each site's fake-quant off on a private copy of the QUANT
tree (one forward per site) and records the output SQNR / PEIR gain vs the Hugging Face
reference on the default sample, with the site's dtype, qparams, calibrated and seen ranges
and clipped fraction. The ranked table is the evidence; the check fails on

* an **interior** site whose removal gains more than ``max_site_gain_db``. Boundary sites (the
  observer whose fake-quant returns the case output, or one that quantizes an input tensor as
  given) are reported, never gated: their loss is that tensor's own dtype resolution, the floor
  of any wrapper at that dtype (nn_linear's input observer alone costs 20 dB of its 22.5 dB);
* a site whose step exceeds ``1 / min_resolved_levels`` of the range of the values it must
  resolve (its input on the sample, or the larger cluster when a gap wider than half the range
  splits it, as logits plus a -120 mask fill do): it cannot tell those values apart.

Default limit, 8.6 dB: the largest clean interior gain on the tiny cases outside the diagnosed mask-add
observer (``obs_mask_add``: logits plus the -120 mask fill in one per-tensor uint8 observer), plus the
1.5 dB margin ``python -m harness limits`` gives dB metrics; ``obs_mask_add`` is a precise expectation
on qwen3_vl_text_attention_prefill and under the limit elsewhere, named by the ranking, not failed
(numbers in docs/diagnosis.md, under the ``attribution`` check).

A case whose settings set ``random_weights_contrast`` (every real-weights case) also gets the same
sites measured on random weights of the same shapes (harness/diagnosis/weight_contrast.py): rows, the sites
that dominate on the real weights only, three tracked metrics; not gated.

Cost: one forward per evaluated site (at most ``max_sites``, the noisiest first by local SQNR;
capping is recorded as a note; the seconds are in the evidence, not the metrics, which must
not differ between runs). With the export cache on, an attribution of a model that executes
exactly as before is reused (harness/diagnosis/attribution_cache.py; ``attribution_cache`` in the
evidence says hit or miss) and judged again against the current settings. Run on the case's first profile only
(``tiny`` for every case here, the
profile its limits are stated for): at ``e2b_dims`` one forward costs seconds and a tiny-measured
limit says nothing there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from harness.checks.base import Check, CheckResult, Metric
from harness.diagnosis.attribution_cache import cached_attribute
from harness.diagnosis.submodule_error import error_origin
from harness.diagnosis.weight_contrast import contrast


@dataclass(frozen=True)
class Settings:
    max_site_gain_db: float | None = 8.6
    max_sites: int = 64
    min_resolved_levels: float | None = 1.0
    # real-weights cases: the same sites on random weights of the same shapes (harness/diagnosis/weight_contrast.py)
    random_weights_contrast: bool = False


def _fmt(v) -> str:
    return "n/a" if v is None else f"{v:.4g}"


def run(pipeline) -> CheckResult:

    th = pipeline.check_settings(CHECK)
    result = CheckResult()
    if th.max_sites < 1:
        result.fail(f"max_sites {th.max_sites} evaluates no site")
        return result
    export_cache = pipeline.settings.export_cache_dir
    att, cache_status = cached_attribute(
        pipeline, max_sites=th.max_sites, cache_dir=export_cache / "attribution" if export_cache else None
    )
    gated = [s for s in att.sites if s.evaluated and s.boundary is None and s.gain_db is not None]
    boundary = [s for s in att.sites if s.evaluated and s.boundary is not None]
    if not att.sites:
        result.fail("no fake-quant site found in the wrapper tree")
    if not any(s.evaluated for s in att.sites):
        result.fail("no site was evaluated (none is enabled and applied on the default sample)")
    if att.submodules_refused:
        result.notes.append(
            f"no per-submodule error table: tico runs no float forward of the tree ({att.submodules_refused})"
        )
    for site in (s for s in att.sites if s.not_switchable):
        result.notes.append(f"site {site.path} not evaluated: tico runs no forward without it ({site.not_switchable})")
    top = max(gated, key=lambda s: s.gain_db, default=None)
    resolved = [s for s in att.sites if s.resolved_levels is not None]
    coarsest = min(resolved, key=lambda s: s.resolved_levels, default=None)
    result.metrics.update(
        {
            "top_site_gain_db": top.gain_db if top else 0.0,
            "top_boundary_gain_db": max((s.gain_db for s in boundary), default=0.0),
            "sqnr_db": att.sqnr_db,
            "peir": att.peir,
            "sites": len(att.sites),
            "evaluated_sites": att.evaluated,
            "min_resolved_levels": coarsest.resolved_levels if coarsest else math.inf,
        }
    )
    if th.max_site_gain_db is not None:
        for s in gated:
            if s.gain_db > th.max_site_gain_db:
                result.fail(
                    f"site {s.path} gains {s.gain_db:.3g} dB when only its fake-quant is off (SQNR "
                    f"{att.sqnr_db:.3g} -> "
                    f"{s.sqnr_db_off:.3g} dB), above the limit {th.max_site_gain_db:.3g} dB; {s.dtype} step "
                    f"{_fmt(s.scale)}, "
                    f"input {_fmt(s.input_min)}..{_fmt(s.input_max)}, the values it must resolve "
                    f"{_fmt(s.resolved_min)}..{_fmt(s.resolved_max)} ({_fmt(s.resolved_levels)} steps)"
                )
    else:
        result.notes.append("site gain not gated (max_site_gain_db is None)")
    if th.min_resolved_levels is not None:
        for s in resolved:
            if s.resolved_levels < th.min_resolved_levels:
                result.fail(
                    f"site {s.path}: step {_fmt(s.scale)} exceeds 1/{th.min_resolved_levels:g} of the range "
                    f"{_fmt(s.resolved_min)}..{_fmt(s.resolved_max)} of the values it must resolve "
                    f"({s.resolved_levels:.3g} steps; input {_fmt(s.input_min)}..{_fmt(s.input_max)})"
                )
    if coarsest is not None:
        result.notes.append(
            f"coarsest resolution: {coarsest.path} resolves {_fmt(coarsest.resolved_min)}.."
            f"{_fmt(coarsest.resolved_max)} with step {_fmt(coarsest.scale)} "
            f"({coarsest.resolved_levels:.3g} steps{', its input split in two clusters' if coarsest.split else ''})"
        )
    for s in boundary:
        if th.max_site_gain_db is not None and s.gain_db is not None and s.gain_db > th.max_site_gain_db:
            result.notes.append(
                f"{s.boundary} site {s.path} gains {s.gain_db:.3g} dB: the {s.boundary}'s own "
                f"{s.dtype} resolution, reported, not gated"
            )
    if att.capped:
        result.notes.append(
            f"capped: {att.evaluated} of {sum(1 for s in att.sites if s.enabled and s.calls)} "
            f"applied sites evaluated (max_sites {att.max_sites}, noisiest first by local SQNR)"
        )
    for label, paths in (
        ("observers tico's iter_quantization_sites does not yield", att.not_in_tico_sites),
        ("tico sites the module walk did not find", att.not_walked),
    ):
        if paths:
            result.notes.append(f"{len(paths)} {label}: {', '.join(paths[:5])}{' ...' if len(paths) > 5 else ''}")
    origin = error_origin(att.submodules)
    if origin is not None:
        # the worst child's own error keeps its series; the case's own sites' share is another one
        worst_child = error_origin([row for row in att.submodules if not row.outermost])
        if worst_child is not None:
            result.metrics["origin_isolated_sqnr_db"] = worst_child.isolated_sqnr_db
        if origin.own_sites:
            result.metrics["origin_own_sites_sqnr_db"] = origin.isolated_sqnr_db
        if origin.own_sites:
            result.notes.append(
                f"error is made most by {origin.path} ({origin.wrapper})'s own fake-quant sites, beyond what its "
                f"children make alone: {origin.isolated_sqnr_db:.3g} dB"
            )
        else:
            result.notes.append(
                f"error is made most in {origin.path} ({origin.wrapper}): {origin.isolated_sqnr_db:.3g} dB on float "
                f"inputs alone, {_fmt(origin.propagated_sqnr_db)} dB in the quantized model"
            )
    for row in att.submodules:
        if row.note:
            result.notes.append(f"submodule {row.path}: {row.note}")
    if th.random_weights_contrast:
        versus = contrast(pipeline, att, max_sites=th.max_sites)
        result.evidence["random_weights"] = versus
        result.metrics["random_weights_sqnr_db"] = versus["sqnr_db"]
        result.metrics["random_weights_top_site_gain_db"] = versus["top_site_gain_db"]
        result.metrics["real_minus_random_gain_db"] = versus["max_real_minus_random_db"]
        named = ", ".join(
            f"{row['path']} ({_fmt(row['real_gain_db'])} vs {_fmt(row['random_gain_db'])} dB)"
            for row in versus["rows"]
            if row["path"] in versus["real_dominant"][:5]
        )
        result.notes.append(
            f"random weights of the same shapes: SQNR {att.sqnr_db:.3g} dB real vs {versus['sqnr_db']:.3g} dB random; "
            + (
                f"sites that gain over {versus['margin_db']:g} dB more on the real weights: {named}"
                if named
                else f"no site gains over {versus['margin_db']:g} dB more on the real weights than on random ones"
            )
        )
    result.evidence.update(att.as_dict())
    result.evidence["attribution_cache"] = cache_status
    result.evidence["bars"] = [[s.path, s.gain_db] for s in att.sites[:10] if s.evaluated]
    return result


CHECK = Check(
    name="attribution",
    run=run,
    description=__doc__.splitlines()[0],
    applies_to_profile=lambda case, profile: (
        None
        if profile == case.profiles[0]
        else (
            f"not applicable on profile {profile!r}: leave-one-out costs one forward per site and its limit is "
            f"measured on the case's first profile, {case.profiles[0]!r} "
            f"(`python -m harness explain {case.name} --profile {profile}` runs it here)"
        )
    ),
    settings=Settings,
    metrics=(
        Metric("top_site_gain_db", unit="dB", label="top site gain dB", limit="max_site_gain_db", headline=True),
        Metric("top_boundary_gain_db", better=None, unit="dB", label="top boundary gain dB"),
        Metric("min_resolved_levels", better="higher", label="min resolved steps", limit="min_resolved_levels"),
        Metric("origin_isolated_sqnr_db", better="higher", unit="dB", label="worst own SQNR dB"),
        Metric("origin_own_sites_sqnr_db", better="higher", unit="dB", label="case's own sites SQNR dB"),
        Metric("sqnr_db", better=None, unit="dB", label="SQNR dB as is"),
        Metric("peir", better=None, label="PEIR as is"),
        Metric("random_weights_sqnr_db", better="higher", unit="dB", label="SQNR dB, random weights"),
        Metric("random_weights_top_site_gain_db", unit="dB", label="top site gain dB, random weights"),
        Metric("real_minus_random_gain_db", unit="dB", label="site gain real - random dB"),
        Metric("sites", better=None),
        Metric("evaluated_sites", better=None),
    ),
    report="""{% set ev = rec.get("evidence") or {} %}{% set m = rec.get("metrics") or {} %}
<p>SQNR as is {{ ev.get("sqnr_db") | num }} dB; {{ ev.get("evaluated") }} of {{ (ev.get("sites") or []) |
length }} sites
evaluated in {{ ev.get("seconds") | num }} s{% if ev.get("attribution_cache") == "hit" %} (an earlier run's: the model
executes as it did then){% endif %}{% if ev.get("capped") %} (capped at {{ ev.get("max_sites") }}){% endif %}.</p>
{{ ev.get("bars") | bars }}
<table class="limits"><tr><th>site</th><th>gain dB</th><th>PEIR gain</th><th>dtype</th><th>scale</th><th>zp</th>
<th>calibrated range</th><th>input range</th><th>clipped %</th><th>resolved steps</th><th></th></tr>
{% for s in (ev.get("sites") or [])[:10] %}<tr><td>{{ s.path }}</td><td>{{ s.gain_db | num }}</td><td>{{
s.peir_gain | num }}</td>
<td>{{ s.dtype }}</td><td>{{ s.scale | num }}</td><td>{{ s.zero_point | num }}</td>
<td>{{ s.observed_min | num }}..{{ s.observed_max | num }}</td><td>{{ s.input_min | num }}..{{ s.input_max | num }}</td>
<td>{% if s.clipped_fraction is not none %}{{ (100 * s.clipped_fraction) | num }}{% endif %}</td>
<td>{{ s.resolved_levels | num }}</td><td class="muted">{{ s.boundary or "" }}</td></tr>
{% endfor %}</table>
{% set rw = ev.get("random_weights") %}{% if rw %}<p>The same sites with random weights of the same shapes (same inputs
and PTQConfig; harness/diagnosis/weight_contrast.py): SQNR as is {{ rw.get("sqnr_db") | num }} dB (real {{
ev.get("sqnr_db") | num }} dB).
Dominant on the real weights only (over {{ rw.get("margin_db") | num }} dB more than random):
{{ (rw.get("real_dominant") or ["none"]) | join(", ") }}.</p>
<table class="limits"><tr><th>site</th><th>gain dB, real</th><th>gain dB, random</th><th>real - random
dB</th><th></th></tr>
{% for r in rw.get("rows") or [] %}<tr><td>{{ r.path }}</td><td>{{ r.real_gain_db | num }}</td><td>{{
r.random_gain_db | num }}</td>
<td>{{ r.real_minus_random_db | num }}</td><td class="muted">{{ r.boundary or "" }}</td></tr>
{% endfor %}</table>{% endif %}
{% if ev.get("submodules") %}<p>Per wrapped submodule: its own error (isolated: alone, on the float model's
inputs to it)
and its error in the quantized model (propagated: with everything upstream).</p>
<table class="limits"><tr><th>submodule</th><th>wrapper</th><th>calls</th><th>isolated SQNR dB</th>
<th>propagated SQNR dB</th><th>inherited dB</th><th></th></tr>
{% for r in ev.get("submodules") %}<tr><td>{{ r.path }}</td><td>{{ r.wrapper }}</td><td>{{ r.calls }}</td>
<td>{{ r.isolated_sqnr_db | num }}</td><td>{{ r.propagated_sqnr_db | num }}</td><td>{{ r.inherited_db | num }}</td>
<td class="muted">{{ "whole case" if r.outermost else "" }}{{ r.note }}</td></tr>
{% endfor %}</table>{% endif %}""",
)
