"""Regression gate against committed golden tensors (see harness/golden.py).

Without ``--update-golden`` it only reads: a missing golden fails with the command that
creates it, a corrupt one fails naming the damage, a stale one (case config or inputs
changed) is reported as stale rather than as numeric drift, and drift names the tensor, how
many elements moved, the worst index and the size in quantization steps and absolute, plus
which library versions differ from the manifest."""

from harness import golden
from harness.checks.base import Check, CheckResult


def run(pipeline) -> CheckResult:
    result = CheckResult()
    settings = pipeline.settings
    case, profile = pipeline.case.name, pipeline.profile
    nodeid = f"{pipeline.nodeid}::golden"
    # Compute first: a crashing case reports its failing stage, not a golden-file problem.
    collected = golden.collect(pipeline)
    current = collected[0]
    current_hash = golden.input_hash(pipeline)
    if settings.update_golden:
        manifest = golden.write(pipeline, settings.golden_dir, collected)
        result.notes.append(f"golden written: {len(manifest['tensors'])} tensors to {settings.golden_dir}")
        result.metrics["tensors"] = len(manifest["tensors"])
        return result
    try:
        manifest, stored = golden.load(settings.golden_dir, case, profile, nodeid)
    except golden.GoldenError as exc:
        result.fail(str(exc))
        return result
    moved = golden.version_changes(manifest)
    context = f" (manifest differs: {', '.join(moved)})" if moved else ""
    result.evidence["version_changes"] = moved
    if manifest.get("input_hash") != current_hash:
        result.metrics["stale"] = True
        result.fail(
            f"golden for {case}[{profile}] is stale: the case config, reference weights or inputs changed since "
            f"it was written{context}; review, then regenerate with: {golden.update_command(nodeid)}"
        )
        return result
    missing, added = sorted(set(stored) - set(current)), sorted(set(current) - set(stored))
    if missing or added:
        result.fail(f"golden tensor set changed: gone {missing[:5]}, new {added[:5]}{context}")
    drifted = 0
    for key in sorted(set(stored) & set(current)):
        step = manifest["tensors"][key].get("step")
        evidence, problem = golden.compare_tensor(key, stored[key], current[key], step, pipeline.case.golden_tolerance)
        if evidence.get("changed"):
            result.evidence[key] = evidence
        if problem:
            drifted += 1
            result.fail(problem + context)
    result.metrics.update({"tensors": len(stored), "drifted": drifted})
    return result


def applies_to_profile(case, profile: str) -> str | None:
    if profile in case.golden_profiles:
        return None
    return (f"not applicable: {case.name!r} keeps goldens for profile(s) {', '.join(case.golden_profiles)} only; "
            f"the {profile} profile is gated by its thresholds")


CHECK = Check(name="golden", run=run, description=__doc__.splitlines()[0], applies_to_profile=applies_to_profile)
