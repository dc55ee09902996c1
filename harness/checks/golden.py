"""Regression gate against committed golden tensors (see harness/golden/tensors.py, harness/golden/portable.py).

With ``--update-golden`` it stages the golden for the end of the run and says what the rewrite
changes (new, beyond the measured noise, within it, identical); ``--update-golden=fail`` fails
every item whose golden is new or changed beyond noise, so a CI job cannot turn itself green
by regenerating. Without it the check only reads: a missing golden fails with the command that
creates it, a corrupt one fails naming the damage, a stale one (case declaration or inputs
changed) is reported as stale rather than as numeric drift, and drift names the tensor, the
statistic over its limit, how far beyond the measured cross-platform noise it is, and which
library versions and platform differ from the manifest."""

from harness.checks.base import Check, CheckResult, Metric
from harness.golden import baseline, portable
from harness.golden import tensors as golden
from harness.records import node_ids

QPARAMS = "qparams."
# a problem line that names what the tico under test no longer has (harness/run/items.py sets it aside
# as stale on another tico than the one the findings were recorded on)
STALE = " (stale golden qparams)"


def run(pipeline) -> CheckResult:
    result = CheckResult()
    settings = pipeline.settings
    case, profile = pipeline.case.name, pipeline.profile
    nodeid = node_ids.item_id(pipeline.group, CHECK.name)
    # Compute first: a crashing case reports its failing stage, not a golden-file problem.
    collected = golden.collect(pipeline)
    current = collected[0]
    current_hash = golden.input_hash(pipeline)
    if pipeline.case.export is not None and not any(k.startswith("export_output.") for k in current):
        result.notes.append("export output not pinned: the export adapter does not run (see dynamic_vs_export)")
    if settings.update_golden:
        rewrite = golden.classify_rewrite(
            settings.golden_dir, case, profile, nodeid, current, current_hash, pipeline.check_settings(CHECK)
        )
        manifest = golden.stage(pipeline, settings.golden_staging_dir, collected)
        result.metrics["tensors"] = len(manifest["tensors"])
        result.evidence["rewrite"] = {"kind": rewrite.kind, "detail": rewrite.detail}
        message = (
            f"golden for {case}[{profile}] rewritten at the end of the run ({rewrite.kind}: {rewrite.detail}); "
            f"review the diff of {settings.golden_dir.name}/{case}.{profile}.* before committing it"
        )
        if settings.update_golden == "fail" and rewrite.kind in ("new", "changed"):
            result.fail(message + " (--update-golden=fail: a rewrite never passes)")
        else:
            result.notes.append(message)
        return result
    if settings.run_golden_dir is not None:
        golden.write(pipeline, settings.run_golden_dir, collected, run_id=settings.run_id)  # a base for later runs
    source_dir, against = settings.golden_dir, ""
    if settings.base_results is not None:
        base = baseline.cached_load(settings.base_results)
        if golden.kept_by_run(base.golden_dir, case, profile, base.run_id):
            source_dir, against = base.golden_dir, f" [compared with the {base.label}]"
            result.evidence["compared_with"] = base.label
        else:
            result.notes.append(
                f"the base run kept no golden for {case}[{profile}] (it did not reach the golden "
                f"check): compared with the committed golden"
            )
    try:
        manifest, stored = golden.load(source_dir, case, profile, nodeid)
    except golden.GoldenError as exc:
        result.fail(str(exc))
        return result
    moved = golden.version_changes(manifest)
    platform = golden.platform_differences(manifest)
    context = (f" (manifest differs: {', '.join(moved)})" if moved else "") + against
    result.evidence["version_changes"] = moved
    result.evidence["platform_differences"] = platform
    if manifest.get("input_hash") != current_hash:
        result.metrics["stale"] = True
        result.fail(
            f"golden for {case}[{profile}] is stale: the case identity, seed, PTQ config or the names, shapes or "
            f"integer contents of its weights and inputs changed since it was written{context}; review, then "
            f"regenerate with: {golden.update_command(nodeid)}"
        )
        return result
    moved_inputs = golden.sketch_changes(manifest.get("input_sketch") or {}, golden.input_sketch(pipeline))
    if moved_inputs:
        result.metrics["stale"] = True
        result.fail(
            f"golden for {case}[{profile}] is stale: float inputs changed by more than rounding noise: "
            f"{', '.join(moved_inputs[:5])}{context}; review, then regenerate with: {golden.update_command(nodeid)}"
        )
        return result
    missing, added = sorted(set(stored) - set(current)), sorted(set(current) - set(stored))
    qparams = [name for name in (*missing, *added) if name.startswith(QPARAMS)]
    if qparams:
        # the observers of the tico under test: on another tico than the recorded one an observer it dropped or
        # added is set aside as stale there (harness/run/items.py), the other tensors still compared
        gone, new = [n for n in qparams if n in missing], [n for n in qparams if n in added]
        result.fail(f"golden qparams of observers this tico does not have {gone[:5]}, or new in it {new[:5]}{STALE}")
    missing, added = [n for n in missing if n not in qparams], [n for n in added if n not in qparams]
    if missing or added:
        result.fail(f"golden tensor set changed: gone {missing[:5]}, new {added[:5]}{context}")
    measured_cases = portable.load_measured_noise(settings.golden_dir).get("cases", {})
    measured = measured_cases.get(case, {})
    # a case on record with no entries was measured: none of its outputs is gated by err_ratio
    if case not in measured_cases:
        result.notes.append(
            f"no measured platform noise for {case} in {settings.golden_dir}/noise.json: quantized "
            f"outputs held to the unmeasured limit; measure with scripts/golden_noise.py"
        )
    evidence, problems = golden.compare(stored, current, manifest, pipeline.check_settings(CHECK), measured)
    result.evidence.update(evidence)
    where = f" [golden written on another platform: {'; '.join(platform)}]" if problems and platform else ""
    for problem in problems:
        result.fail(problem + context + where)
    result.metrics.update(
        {
            "tensors": len(stored),
            "drifted": len(problems),
            "worst_score": max((e.get("score", 0.0) for e in evidence.values()), default=0.0),
        }
    )
    committed = source_dir == settings.golden_dir  # not the base run's tensors
    recorded = (manifest.get("tico") or {}).get("version") or (manifest.get("versions") or {}).get("tico")
    elsewhere = baseline.other_release(recorded) if committed else None
    if elsewhere and result.problems:
        result.notes += [f"{problem} -- {elsewhere}" for problem in result.problems]
        result.problems.clear()
    return result


def applies_to_profile(case, profile: str) -> str | None:
    if profile in case.golden_profiles:
        return None
    if getattr(case, "variant", None) is not None:
        return (
            f"not applicable: sweep variant {case.variant.label} of {case.name!r} is gated by its checks' limits; "
            f"goldens are kept for the case as declared"
        )
    kept = (
        f"keeps goldens for profile(s) {', '.join(case.golden_profiles)} only"
        if case.golden_profiles
        else "keeps no goldens"
    )
    return f"not applicable: {case.name!r} {kept}; the {profile} profile is gated by its thresholds"


CHECK = Check(
    name="golden",
    run=run,
    description=__doc__.splitlines()[0],
    applies_to_profile=applies_to_profile,
    settings=portable.GoldenTolerance,
    metrics=(
        Metric("drifted", label="drifted tensors"),
        Metric("worst_score", label="golden score (1 = at the limit)"),
        Metric("tensors", better=None, label="golden tensors"),
    ),
    report="""{% if rec.get("evidence") %}<details><summary>golden drift details</summary><pre>{{ rec.evidence "
    "| tojson_pretty }}</pre></details>{% endif %}""",
)
