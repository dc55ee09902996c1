"""Which of tico's registered wrappers each case reaches, measured at run time.

For one (case, profile) the pipeline records, during the QUANT evaluation it runs anyway
(``Pipeline.output('quant', ...)``), which modules of the quantized tree ran a forward (one
global forward hook around each of those calls). ``measure`` then walks the tree once:
every module whose class is a registered wrapper is *instantiated*; those whose forward ran
on an evaluation sample *ran in QUANT*. The case's root wrapper (inside tico's PTQWrapper
shell) is *standalone*; every other instance is a *child*.

The plugin attaches the result to the last item of each case group (``wrapper_coverage`` in
that item's record in results.json), so it travels with pytest's reports and merges across
xdist workers like every other record field. ``wrapper_coverage.json`` (committed) is the
same measurement for every tiny case, taken by ``python -m harness wrappers --measure
--write``; the table in docs/wrapper-coverage.md and the reasons check
(``cases/wrapper_coverage_reasons.toml``) read it.
"""

from __future__ import annotations

import json
import time
import tomllib
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator

from harness.primitives.lifecycle_ops import unwrap
from harness.records.results import package_versions

if TYPE_CHECKING:
    import torch

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOT = ROOT / "wrapper_coverage.json"
BEGIN, END = "<!-- wrapper-coverage:begin -->", "<!-- wrapper-coverage:end -->"
SNAPSHOT_PROFILE = "tiny"


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def registered_wrappers() -> dict[type, list[type]]:
    """Every wrapper class in tico's registry -> the float classes registered for it.

    tico 0.3.0's registry has a public ``lookup(fp_cls)`` but nothing that lists its entries,
    so this one function reads the private ``_WRAPPERS`` dict (after ``lookup`` has run the
    registry's one-shot ``_lazy_init``). If tico renames it, this fails with that said."""
    import torch
    from tico.quantization.wrapq.wrappers import registry

    table = getattr(registry, "_WRAPPERS", None)
    if isinstance(table, dict):
        registry.lookup(torch.nn.Linear)  # public entry point; runs _lazy_init(), filling the dict in place
    if not isinstance(table, dict) or not table:
        raise RuntimeError(
            "tico.quantization.wrapq.wrappers.registry has no non-empty _WRAPPERS dict "
            f"(got {type(table).__name__}); tico offers no public way to list its wrappers, so "
            "harness.tico_facts.wrapper_coverage.registered_wrappers must be updated for this tico"
        )
    out: dict[type, list[type]] = {}
    for fp_cls, wrapper_cls in table.items():
        out.setdefault(wrapper_cls, []).append(fp_cls)
    return out


def tico_wrappers(registered: dict[type, list[type]] | None = None) -> dict[str, dict[str, Any]]:
    """tico's own registered wrappers by class name: {"module": ..., "float_classes": [...]}.
    Wrappers registered from outside tico (e.g. the out-of-tree example) are not tico's and
    are left out. Class names are unique in tico 0.3.0; a clash fails loudly."""
    out: dict[str, dict[str, Any]] = {}
    for wrapper_cls, fp_classes in (registered or registered_wrappers()).items():
        if not wrapper_cls.__module__.startswith("tico."):
            continue
        name = wrapper_cls.__name__
        if name in out:
            raise RuntimeError(
                f"two registered tico wrappers are named {name}: {out[name]['module']} and "
                f"{wrapper_cls.__module__}; key the coverage map by full name"
            )
        out[name] = {"module": wrapper_cls.__module__, "float_classes": sorted(_name(c) for c in fp_classes)}
    return out


@contextmanager
def record_forwards(ran: set[int]) -> Iterator[None]:
    """Add id(module) of every module whose forward runs inside the block to ``ran``."""
    import torch

    def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
        ran.add(id(module))

    handle = torch.nn.modules.module.register_module_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def measure(
    root: torch.nn.Module,
    ran: set[int],
    registered: dict[type, list[type]] | None = None,
    reference: torch.nn.Module | None = None,
) -> dict[str, Any]:
    """The coverage record of one quantized tree, given the ids of modules that ran in QUANT;
    with ``reference``, also the registered float classes the float module hands to prepare."""
    from tico.quantization.wrapq.wrappers.ptq_wrapper import PTQWrapper
    from tico.quantization.wrapq.wrappers.quant_module_base import QuantModuleBase

    registered = registered or registered_wrappers()
    top = unwrap(root)
    root_name = type(top).__name__ if type(top) in registered else None
    instantiated: dict[str, int] = {}
    ran_quant: dict[str, int] = {}
    as_child: dict[str, int] = {}
    unregistered: dict[str, int] = {}
    for module in root.modules():  # nn.Module.modules() yields each module once
        cls = type(module)
        if cls in registered:
            name = cls.__name__
            instantiated[name] = instantiated.get(name, 0) + 1
            if id(module) in ran:
                ran_quant[name] = ran_quant.get(name, 0) + 1
                if module is not top:
                    as_child[name] = as_child.get(name, 0) + 1
        elif isinstance(module, QuantModuleBase) and cls is not PTQWrapper:
            unregistered[_name(cls)] = unregistered.get(_name(cls), 0) + 1
    floats = (
        sorted({_name(type(m)) for m in reference.modules() if any(type(m) in fps for fps in registered.values())})
        if reference is not None
        else None
    )
    return {
        "float_classes": floats,
        "root": root_name,
        "root_ran": root_name is not None and id(top) in ran,
        "instantiated": dict(sorted(instantiated.items())),
        "ran_quant": dict(sorted(ran_quant.items())),
        "ran_as_child": dict(sorted(as_child.items())),
        # quant modules of classes nobody registered (helpers a wrapper builds itself)
        "unregistered_quant_modules": dict(sorted(unregistered.items())),
    }


# -- one map from many case records ------------------------------------------------------------
def from_results(doc: dict[str, Any], profile: str = SNAPSHOT_PROFILE) -> dict[str, dict[str, Any]]:
    """case -> coverage record, from a results.json document (whichever item carries it)."""
    out: dict[str, dict[str, Any]] = {}
    for rec in doc.get("results", []):
        cov = rec.get("wrapper_coverage")
        if isinstance(cov, dict) and rec.get("profile") == profile and rec.get("case"):
            out[rec["case"]] = cov
    return dict(sorted(out.items()))


def aggregate(per_case: dict[str, dict[str, Any]]) -> dict[str, dict[str, list[str]]]:
    """wrapper class name -> {"standalone": cases, "child": cases, "instantiated_only": cases}."""
    out: dict[str, dict[str, list[str]]] = {}

    def add(name: str, kind: str, case: str) -> None:
        slot = out.setdefault(name, {"standalone": [], "child": [], "instantiated_only": []})
        if case not in slot[kind]:
            slot[kind].append(case)

    for case, cov in sorted(per_case.items()):
        if "instantiated" not in cov:
            continue  # a case whose measurement failed (recorded with its error)
        if cov.get("root") and cov.get("root_ran"):
            add(cov["root"], "standalone", case)
        for name in cov.get("ran_as_child", {}):
            add(name, "child", case)
        for name in cov["instantiated"]:
            if name not in cov.get("ran_quant", {}):
                add(name, "instantiated_only", case)
    return out


def exercised(agg: dict[str, dict[str, list[str]]]) -> set[str]:
    return {name for name, slot in agg.items() if slot["standalone"] or slot["child"]}


def problems(registered: Iterable[str], agg: dict[str, dict[str, list[str]]], reasons: dict[str, str]) -> list[str]:
    """What the reviewed reasons file and the measured map disagree on (empty: they agree)."""
    registered = set(registered)
    ran = exercised(agg)
    found = []
    for name in sorted(registered - ran - set(reasons)):
        where = agg.get(name, {}).get("instantiated_only")
        extra = f" (instantiated but never run in QUANT by: {', '.join(where)})" if where else ""
        found.append(
            f"{name}: registered in tico, exercised by no case, and no reason is stated in "
            f"cases/wrapper_coverage_reasons.toml{extra}"
        )
    for name in sorted(set(reasons) & ran):
        slot = agg[name]
        found.append(
            f"{name}: a reason is stated in cases/wrapper_coverage_reasons.toml, but cases now exercise it "
            f"(standalone: {', '.join(slot['standalone']) or '-'}; child: {', '.join(slot['child']) or '-'}); "
            "remove the stale entry"
        )
    for name in sorted(set(reasons) - registered):
        found.append(
            f"{name}: a reason is stated in cases/wrapper_coverage_reasons.toml, but tico no longer registers "
            "a wrapper of that name; remove the stale entry"
        )
    for name, reason in sorted(reasons.items()):
        if not isinstance(reason, str) or len(reason.strip()) < 20:
            found.append(f"{name}: the stated reason {reason!r} is not a reason (write why no case exercises it)")
    return found


# -- snapshot ----------------------------------------------------------------------------------
def load_snapshot(path: Path = SNAPSHOT) -> dict[str, Any]:
    return json.loads(path.read_text())


def snapshot_document(per_case: dict[str, dict[str, Any]]) -> dict[str, Any]:

    versions = package_versions()
    return {
        "comment": "generated by `./scripts/env.sh python -m harness wrappers --measure --write`; do not edit",
        "profile": SNAPSHOT_PROFILE,
        "versions": {k: versions.get(k) for k in ("torch", "transformers", "tico")},
        "cases": {case: {k: v for k, v in cov.items() if k != "seconds"} for case, cov in per_case.items()},
    }


def _cases_cell(cases: list[str], limit: int = 6) -> str:
    if not cases:
        return "-"
    shown = ", ".join(f"`{c}`" for c in cases[:limit])
    return shown + (f" (+{len(cases) - limit} more)" if len(cases) > limit else "")


def table(per_case: dict[str, dict[str, Any]], reasons: dict[str, str], registered: dict[str, dict[str, Any]]) -> str:
    """Markdown: one row per registered tico wrapper (and per out-of-tree wrapper a case ran)."""
    agg = aggregate(per_case)
    ran = exercised(agg)
    names = sorted(set(registered) | {n for n in ran if n not in registered})
    standalone = sum(1 for n in registered if agg.get(n, {}).get("standalone"))
    child_only = sum(1 for n in registered if n in ran and not agg[n]["standalone"])
    none = [n for n in registered if n not in ran]
    reached = {f for cov in per_case.values() for f in cov.get("float_classes") or ()}
    lines = [
        f"{len(registered)} wrapper classes registered by tico (for "
        f"{sum(len(v['float_classes']) for v in registered.values())} float classes); measured on "
        f"{len(per_case)} tiny cases: {standalone} run standalone (a case's root wrapper), "
        f"{child_only} only as a child, {len(none)} by no case "
        f"({sum(1 for n in none if n in reasons)} with a reason in `cases/wrapper_coverage_reasons.toml`).",
        "",
        "| wrapper | registered for | standalone in | as a child in | no case: why |",
        "|---|---|---|---|---|",
    ]
    for name in names:
        slot = agg.get(name, {"standalone": [], "child": [], "instantiated_only": []})
        floats = registered.get(name, {}).get("float_classes")
        floats_cell = (
            ", ".join(f"`{f.rsplit('.', 1)[1]}`" + ("" if f in reached else " (no case)") for f in floats)
            if floats
            else "out of tree"
        )
        why = ""
        if name not in ran:
            why = reasons.get(name, "**no reason stated**")
            if slot["instantiated_only"]:
                why += f" (instantiated, never run in QUANT: {_cases_cell(slot['instantiated_only'], 3)})"
        lines.append(
            f"| `{name}` | {floats_cell} | {_cases_cell(slot['standalone'])} | {_cases_cell(slot['child'])} | {why} |"
        )
    lines += [
        "",
        "standalone: the case's root wrapper ran in QUANT; as a child: an instance inside a case's "
        "wrapper tree ran in QUANT; (no case): a registered float class no case's float module contains "
        "(its wrapper may still run for another float class).",
    ]
    return "\n".join(lines)


REASONS = ROOT / "cases" / "wrapper_coverage_reasons.toml"


def load_reasons(path: Path = REASONS) -> dict[str, str]:
    """The reviewed reasons (wrapper class -> why no case exercises it), from their data file."""
    return dict(tomllib.loads(path.read_text()).get("unexercised") or {})


def write_readme(text: str, readme: Path = ROOT / "docs" / "wrapper-coverage.md") -> None:
    content = readme.read_text()
    start, end = content.index(BEGIN) + len(BEGIN), content.index(END)
    readme.write_text(content[:start] + "\n" + text + "\n" + content[end:])


def readme_table(readme: Path = ROOT / "docs" / "wrapper-coverage.md") -> str:
    content = readme.read_text()
    return content[content.index(BEGIN) + len(BEGIN) : content.index(END)].strip()


def timed(fn, *args) -> tuple[Any, float]:
    start = time.perf_counter()
    value = fn(*args)
    return value, time.perf_counter() - start
