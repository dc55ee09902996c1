"""``python -m harness explain <case> [--profile tiny] [--top N] [--max-sites N]``: why a case loses
accuracy. Builds the case's pipeline, runs the leave-one-out attribution of harness/diagnosis/site_attribution.py
(one forward per fake-quant site) and prints the ranked sites with the case's SQNR as is, the
isolated vs propagated error per wrapped submodule, and with ``--deployed`` the sites ranked by
the Circle-vs-torch gap left with each one off (harness/diagnosis/deployed_attribution.py).

``--off PATTERNS`` / ``--only PATTERNS`` (repeatable) print instead the SQNR with a group of sites
switched off together, or with every site but the group off (harness/diagnosis/group_ablation.py): the
losses two sites cause together, which leave-one-out reads as 0 dB for each."""

from __future__ import annotations

import argparse
import math
import sys

from harness.checks.attribution import CHECK
from harness.diagnosis.deployed_attribution import deployed_attribution
from harness.diagnosis.group_ablation import GroupError, ablate_groups, parse_group
from harness.diagnosis.site_attribution import attribute, table_rows
from harness.diagnosis.submodule_error import error_origin
from harness.model.case_loading import add_configured_import_roots, load_cases
from harness.model.sweep import SweepError, expand, group_label, make_variant, parse_selector
from harness.pipeline import PipelineCache

HELP = "rank a case's fake-quant sites by the SQNR gained with each one alone off"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m harness explain", description=__doc__.splitlines()[0])
    parser.add_argument("case", help="case name (as in the catalog)")
    parser.add_argument("--profile", default="tiny")
    parser.add_argument(
        "--variant",
        default="",
        help="a point of the case's sweep, as its node id names it: 'kv_heads=2,layout=unrolled' "
        "(any declared axis values, also those no sweep mode selects)",
    )
    parser.add_argument("--top", type=int, default=15, help="rows to print (default 15; 0: all)")
    parser.add_argument(
        "--max-sites",
        type=int,
        default=None,
        help="sites to evaluate (default: the case's attribution max_sites setting)",
    )
    parser.add_argument(
        "--deployed",
        action="store_true",
        help="also convert to Circle and rank the sites by the Circle-vs-torch gap left with each "
        "one off (harness/diagnosis/deployed_attribution.py)",
    )
    parser.add_argument(
        "--off",
        action="append",
        default=[],
        metavar="PATTERNS",
        help="a group of sites to switch off together, as comma-separated fnmatch patterns over the "
        "site paths ('*obs_softmax,*obs_attn_weights'); repeat for more groups. Prints the "
        "group table only (no leave-one-out)",
    )
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="PATTERNS",
        help="like --off, but every site except the group is switched off: what the group alone costs",
    )
    return parser


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    from tabulate import tabulate

    add_configured_import_roots()
    cases = {case.name: case for _, case in load_cases()}
    case = cases.get(args.case)
    if case is None:
        print(f"unknown case {args.case!r}; cases: {', '.join(sorted(cases))}", file=sys.stderr)
        return 2
    if args.profile not in case.profiles:
        print(
            f"case {case.name!r} has no profile {args.profile!r} (it has {', '.join(case.profiles)})", file=sys.stderr
        )
        return 2
    if args.variant:
        case, problem = _variant_of(case, args.variant, args.profile)
        if problem:
            print(problem, file=sys.stderr)
            return 2
    unavailable = case.unavailable_reason()
    if unavailable:
        print(f"case {case.name!r} cannot run here: {unavailable}", file=sys.stderr)
        return 2
    pipeline = PipelineCache().get(case, args.profile)
    if args.off or args.only:
        return _print_groups(case, args, pipeline)
    max_sites = args.max_sites if args.max_sites is not None else pipeline.check_settings(CHECK).max_sites
    att = attribute(pipeline, max_sites=max_sites)
    limit = None if args.top == 0 else args.top
    headers = ["site", "gain dB", "scale", "zp", "range", "clipped %", "boundary"]

    print(
        f"{case.name} [{group_label(case, args.profile)}]  sample {att.sample!r}: SQNR as is {att.sqnr_db:.2f} "
        f"dB, PEIR {att.peir:.4g}"
    )
    print(tabulate(table_rows(att, limit), headers=headers, disable_numparse=True))
    applied = sum(1 for s in att.sites if s.enabled and s.calls)
    print(
        f"{att.evaluated} of {len(att.sites)} sites evaluated ({applied} applied on the sample"
        f"{f'; capped at {att.max_sites}' if att.capped else ''}), {att.forwards} forwards, {att.seconds:.2f} s "
        f"({1000 * att.seconds_per_forward:.1f} ms per forward); 'range' is the site's input on the sample"
    )
    if any(s.boundary for s in att.sites[: limit or None]):
        print(
            "boundary: the site returns the output or quantizes an input as given; its loss is that tensor's own "
            "dtype resolution (the attribution check does not gate it)"
        )
    resolved = [s for s in att.sites if s.resolved_levels is not None and math.isfinite(s.resolved_levels)]
    if resolved:
        s = min(resolved, key=lambda s: s.resolved_levels)
        print(
            f"coarsest resolution: {s.path} step {s.scale:.4g} over the values it must resolve "
            f"{s.resolved_min:.4g}..{s.resolved_max:.4g} ({s.resolved_levels:.3g} steps"
            f"{'; its input splits in two clusters' if s.split else ''})"
        )
    if att.submodules:
        print()
        print(
            "per wrapped submodule: isolated = its own error (alone, on the float model's inputs to it); "
            "propagated = in the quantized model, with everything upstream"
        )
        rows = [
            [
                r.path + (" (whole case)" if r.outermost else ""),
                r.wrapper,
                r.calls,
                _db(r.isolated_sqnr_db),
                _db(r.propagated_sqnr_db),
                _db(r.inherited_db),
                r.note,
            ]
            for r in att.submodules
        ]
        print(
            tabulate(
                rows,
                headers=["submodule", "wrapper", "calls", "isolated dB", "propagated dB", "inherited dB", ""],
                disable_numparse=True,
            )
        )
        origin = error_origin(att.submodules)
        if origin is not None:
            if origin.own_sites:
                print(
                    f"error is made most by {origin.path} ({origin.wrapper})'s own fake-quant sites, beyond what "
                    f"its children make alone: {_db(origin.isolated_sqnr_db)} dB"
                )
            else:
                print(
                    f"error is made most in {origin.path} ({origin.wrapper}): {_db(origin.isolated_sqnr_db)} dB alone"
                )
    if args.deployed:
        _print_deployed(pipeline, limit, tabulate)
    return 0


def _print_groups(case, args, pipeline) -> int:
    from tabulate import tabulate

    rows = []
    try:
        for mode, texts in (("off", args.off), ("only", args.only)):
            if not texts:
                continue
            base_sqnr, base_peir, results = ablate_groups(pipeline, [parse_group(t) for t in texts], mode=mode)
            rows += [
                [
                    r.label,
                    "off" if mode == "off" else "all others off",
                    len(r.sites),
                    f"{r.sqnr_db:.2f}",
                    f"{r.gain_db:+.2f}",
                    f"{r.peir:.4g}",
                ]
                for r in results
            ]
    except GroupError as exc:
        print(f"explain: {exc}", file=sys.stderr)
        return 2
    print(
        f"{case.name} [{group_label(case, args.profile)}]  sample 'default': SQNR as is {base_sqnr:.2f} dB, "
        f"PEIR {base_peir:.4g}"
    )
    print(tabulate(rows, headers=["group", "switched", "sites", "SQNR dB", "gain dB", "PEIR"], disable_numparse=True))
    return 0


def _variant_of(case, selector: str, profile: str):
    """(the case as the sweep variant ``selector`` runs it, None) or (case, why not)."""

    if case.sweep is None:
        return case, f"case {case.name!r} declares no sweep, so it has no variant {selector!r}"
    if profile not in case.sweep.profiles:
        return case, f"case {case.name!r} sweeps profile(s) {', '.join(case.sweep.profiles)}, not {profile!r}"
    try:
        chosen = parse_selector(case.sweep, selector, "--variant")
    except SweepError as exc:
        return case, str(exc)
    return expand(case, make_variant(case.sweep, chosen)), None


def _print_deployed(pipeline, limit, tabulate) -> None:

    print()
    if pipeline.case.export is None:
        print("deployed: the case declares no export, so there is no Circle model to compare with")
        return
    deployed = deployed_attribution(pipeline)
    print(
        f"Circle ({deployed.mode} replay) vs torch QUANT on the export sample: max {deployed.max_steps:.3g} steps, "
        f"mean {deployed.mean_steps:.3g} steps of each output's scale"
    )
    rows = [[s.path, f"{s.max_steps_off:.3g}", f"{s.mean_steps_off:.3g}"] for s in deployed.sites[:limit]]
    print(
        tabulate(
            rows, headers=["site switched off in torch", "max steps left", "mean steps left"], disable_numparse=True
        )
    )
    if deployed.closing:
        print(
            f"switching off any one of these alone closes the gap (<= 1 step): {', '.join(deployed.closing)} -- "
            f"the gap runs through them: the Circle graph does not apply at least one of them as torch does"
        )
    elif deployed.max_steps > 1.0:
        print("no single site closes the gap: it is not one missing or re-parameterised fake-quant")


def _db(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"
