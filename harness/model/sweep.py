"""Configuration sweeps: a case declares axes (named values) and the harness runs its variants.

Wrappers branch on configuration (GQA ratio, attention layout, dtype policy, conv geometry);
a case that fixes one value per axis never reaches the other branches. A ``Sweep`` names the
axes -- the first value of each is the baseline, the case as declared -- and which variants the
PR gate runs and which the nightly runs (``--sweep pr|nightly|off``). Each variant is the same
case with its builder (and PTQ config) called with the variant's axis values, and with the
overrides whose selector it matches applied; its id lists the axes that differ from the
baseline, ``llama_attention_prefill[tiny,kv_heads=2]``, so adding an axis renames nothing and
the unswept case keeps its id, goldens and history.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import itertools
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

# How a set of variants is chosen: every value once with the other axes at their baseline
# ("each"), every pair of values of two axes at least once ("pairwise"), the full product
# ("all"), or an explicit tuple of selectors ("kv_heads=2,layout=unrolled").
SET_MODES = ("each", "pairwise", "all")
SWEEP_MODES = ("pr", "nightly", "off")
# Case fields a variant may override; mappings are merged into the case's (settings per check).
OVERRIDABLE = (
    "settings",
    "expected_failures",
    "not_applicable",
    "unused_observers",
    "qparam_allowlist",
    "ungated_samples",
    "expected_observer_count",
)
_VALUE_RE = re.compile(r"^[A-Za-z0-9_.]+$")
_AXIS_RE = re.compile(r"^[a-z][a-z0-9_]*$")
# Above this many combinations the pairwise search would be slow; no tiny case needs it.
_MAX_PRODUCT = 4096

Values = tuple[tuple[str, Any], ...]


class SweepError(ValueError):
    """A malformed sweep; ``field_name`` says which part (reported as the case's definition item)."""

    def __init__(self, field_name: str, problem: str):
        self.field_name = field_name
        super().__init__(problem)


@dataclass(frozen=True)
class Sweep:
    """Axes of one case and the variants its PR gate and nightly run.

    ``axes``: axis -> values, the first the baseline (what the case's builder and ptq_config
    default to). ``pr`` / ``nightly``: a mode of SET_MODES or a tuple of selectors (``pr=()``: the PR
    gate runs the baseline only, the variants are nightly); the nightly set always includes the PR set.
    ``overrides``: selector -> {Case field: value}, applied to every
    variant the selector matches (expected failures, allowlists, limits of that variant); in a
    mapping field a None value drops the key (an expectation whose cause the variant lacks).
    ``profiles``: the profiles the variants run at (other profiles run the baseline only).
    ``why``: axis -> the wrapper line it exercises, shown in the catalog."""

    axes: Mapping[str, tuple]
    pr: str | tuple[str, ...] = "each"
    nightly: str | tuple[str, ...] = "all"
    overrides: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    profiles: tuple[str, ...] = ("tiny",)
    why: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Variant:
    """One point of a sweep: every axis's value, and the id suffix naming those off baseline."""

    values: Values
    label: str

    def as_dict(self) -> dict[str, Any]:
        return dict(self.values)


def format_value(value: Any) -> str:
    return str(value)


def _check_value(axis: str, value: Any) -> None:
    if isinstance(value, bool) or isinstance(value, int):
        return
    if isinstance(value, str) and _VALUE_RE.match(value):
        return
    raise SweepError(
        f"sweep.axes[{axis!r}]",
        f"value {value!r} must be an int, a bool or a string of [A-Za-z0-9_.] (it becomes part of the node id)",
    )


def validate(sweep: Any, case_profiles: tuple[str, ...], callables: Mapping[str, Callable]) -> None:
    """Raise SweepError on anything malformed: axis names and values, modes, selectors naming an
    axis or value the sweep lacks, overrides of fields a variant cannot change, an axis neither
    the builder nor ptq_config reads, or one whose default there is not the baseline."""
    if not isinstance(sweep, Sweep):
        raise SweepError("sweep", f"must be harness.Sweep or None, got {type(sweep).__name__}")
    if not isinstance(sweep.axes, Mapping) or not sweep.axes:
        raise SweepError("sweep.axes", "must map at least one axis name to its values")
    for axis, values in sweep.axes.items():
        if not isinstance(axis, str) or not _AXIS_RE.match(axis):
            raise SweepError("sweep.axes", f"axis name {axis!r} must match [a-z][a-z0-9_]*")
        if not isinstance(values, tuple) or len(values) < 2:
            raise SweepError(
                f"sweep.axes[{axis!r}]", "must be a tuple of at least two values (the first is the baseline)"
            )
        for value in values:
            _check_value(axis, value)
        texts = [format_value(v) for v in values]
        if len(set(texts)) != len(texts):
            raise SweepError(f"sweep.axes[{axis!r}]", f"repeats a value: {texts}")
    for name in ("pr", "nightly"):
        spec = getattr(sweep, name)
        if isinstance(spec, str):
            if spec not in SET_MODES:
                raise SweepError(f"sweep.{name}", f"{spec!r} is not one of {SET_MODES} or a tuple of selectors")
        elif isinstance(spec, tuple) and (spec or name == "pr"):
            for selector in spec:
                parse_selector(sweep, selector, f"sweep.{name}")
        else:
            raise SweepError(
                f"sweep.{name}",
                f"must be one of {SET_MODES} or a tuple of selectors"
                + (" (empty: the PR gate runs the baseline only)" if name == "pr" else ", not empty"),
            )
    if not isinstance(sweep.profiles, tuple) or not sweep.profiles or not set(sweep.profiles) <= set(case_profiles):
        raise SweepError("sweep.profiles", f"must be a non-empty tuple of profiles the case runs {case_profiles}")
    if not isinstance(sweep.why, Mapping) or set(sweep.why) - set(sweep.axes):
        raise SweepError("sweep.why", f"names an axis the sweep lacks: {sorted(set(sweep.why) - set(sweep.axes))}")
    if not isinstance(sweep.overrides, Mapping):
        raise SweepError("sweep.overrides", "must map selectors to {case field: value}")
    nightly = [v.as_dict() for v in variants(sweep, "nightly")]
    for selector, changes in sweep.overrides.items():
        wanted = parse_selector(sweep, selector, "sweep.overrides")
        if not isinstance(changes, Mapping) or not changes:
            raise SweepError(f"sweep.overrides[{selector!r}]", "must map case fields to values")
        bad = sorted(set(changes) - set(OVERRIDABLE))
        if bad:
            raise SweepError(
                f"sweep.overrides[{selector!r}]",
                f"cannot override {', '.join(bad)} (a variant may override {', '.join(OVERRIDABLE)})",
            )
        if not any(_matches(wanted, values) for values in nightly):
            raise SweepError(f"sweep.overrides[{selector!r}]", "matches no variant the sweep runs, even nightly")
    for axis in sweep.axes:
        readers = [name for name, fn in callables.items() if axis in _parameters(fn)]
        if not readers:
            raise SweepError(
                f"sweep.axes[{axis!r}]",
                f"is read by none of {', '.join(callables)}: name it as a "
                f"keyword parameter whose default is the baseline {sweep.axes[axis][0]!r}",
            )
        for name in readers:
            default = _parameters(callables[name])[axis].default
            if (
                default is inspect.Parameter.empty
                or default != sweep.axes[axis][0]
                or type(default) is not type(sweep.axes[axis][0])
            ):
                raise SweepError(
                    f"sweep.axes[{axis!r}]",
                    f"{name}'s default for {axis!r} is "
                    f"{'missing' if default is inspect.Parameter.empty else repr(default)}, not the "
                    f"baseline {sweep.axes[axis][0]!r}: the unswept case must be the baseline",
                )


def _parameters(fn: Callable) -> Mapping[str, inspect.Parameter]:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return {}
    return {
        name: p
        for name, p in params.items()
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }


def parse_selector(sweep: Sweep, selector: Any, where: str) -> dict[str, Any]:
    """'kv_heads=2,layout=unrolled' -> {'kv_heads': 2, 'layout': 'unrolled'}, values looked up by
    their text among the axis's declared values."""
    if not isinstance(selector, str) or not selector.strip():
        raise SweepError(where, f"selector {selector!r} must be a string like 'axis=value,axis=value'")
    out: dict[str, Any] = {}
    for part in selector.split(","):
        axis, sep, text = part.strip().partition("=")
        if not sep:
            raise SweepError(where, f"selector {selector!r}: {part!r} is not axis=value")
        if axis not in sweep.axes:
            raise SweepError(where, f"selector {selector!r} names no axis {axis!r} (axes: {', '.join(sweep.axes)})")
        found = [v for v in sweep.axes[axis] if format_value(v) == text]
        if not found:
            raise SweepError(
                where, f"selector {selector!r}: {text!r} is not a value of {axis!r} {tuple(sweep.axes[axis])}"
            )
        if axis in out:
            raise SweepError(where, f"selector {selector!r} names {axis!r} twice")
        out[axis] = found[0]
    return out


def _matches(wanted: Mapping[str, Any], values: Mapping[str, Any]) -> bool:
    return all(format_value(values[a]) == format_value(v) for a, v in wanted.items())


def make_variant(sweep: Sweep, chosen: Mapping[str, Any]) -> Variant:
    values = tuple((axis, chosen.get(axis, vals[0])) for axis, vals in sweep.axes.items())
    label = ",".join(
        f"{axis}={format_value(value)}"
        for (axis, value), vals in zip(values, sweep.axes.values())
        if format_value(value) != format_value(vals[0])
    )
    return Variant(values=values, label=label)


def _select(sweep: Sweep, spec: str | tuple[str, ...]) -> list[dict[str, Any]]:
    axes = list(sweep.axes.items())
    if isinstance(spec, tuple):
        return [parse_selector(sweep, s, "sweep") for s in spec]
    if spec == "each":
        return [{axis: value} for axis, values in axes for value in values[1:]]
    product = [dict(zip(sweep.axes, combo)) for combo in itertools.product(*sweep.axes.values())]
    if spec == "all":
        return product
    return _pairwise(sweep, product)


def _pairs(combo: Mapping[str, Any]) -> set[tuple]:
    items = [(a, format_value(v)) for a, v in combo.items()]
    return {(x, y) for x, y in itertools.combinations(items, 2)}


def _pairwise(sweep: Sweep, product: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Greedy covering array: starting from the baseline, repeatedly take the first combination
    (in product order) that covers the most value pairs not yet covered. Deterministic."""
    if len(product) > _MAX_PRODUCT:
        raise SweepError("sweep", f"{len(product)} combinations: too many for a pairwise search; list selectors")
    wanted = set().union(*(_pairs(c) for c in product)) if len(sweep.axes) > 1 else set()
    covered = _pairs(product[0])
    chosen: list[dict[str, Any]] = []
    if len(sweep.axes) == 1:
        return product[1:]
    while covered != wanted:
        best = max(product, key=lambda c: len(_pairs(c) - covered))
        chosen.append(best)
        covered |= _pairs(best)
    return chosen


def variants(sweep: Sweep, mode: str) -> list[Variant]:
    """The variants ``--sweep mode`` runs, baseline excluded (the case as declared runs anyway),
    in declaration order without repeats; the nightly set includes the PR set."""
    if mode not in SWEEP_MODES:
        raise ValueError(f"--sweep must be one of {SWEEP_MODES}, got {mode!r}")
    if mode == "off":
        return []
    chosen = _select(sweep, sweep.pr)
    if mode == "nightly":
        chosen = chosen + _select(sweep, sweep.nightly)
    out: dict[str, Variant] = {}
    for combo in chosen:
        variant = make_variant(sweep, combo)
        if variant.label and variant.label not in out:
            out[variant.label] = variant
    return list(out.values())


def _bind(fn: Callable, values: Mapping[str, Any]) -> Callable:
    params = _parameters(fn)
    given = {axis: value for axis, value in values.items() if axis in params}
    return functools.partial(fn, **given) if given else fn


def _merge(case: Any, changes: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in changes.items():
        current = out.get(name, getattr(case, name))
        if name == "settings":
            merged = {check: dict(fields) for check, fields in current.items()}
            for check, fields in value.items():
                merged.setdefault(check, {}).update(fields)
            out[name] = merged
        elif isinstance(current, Mapping):  # a None value drops the key (an expectation the variant lacks)
            merged = {**current, **value}
            out[name] = {key: item for key, item in merged.items() if item is not None}
        else:
            out[name] = value
    return out


def expand(case: Any, variant: Variant) -> Any:
    """The case as ``variant`` runs it: builder and ptq_config bound to its axis values, the
    matching overrides applied in declaration order, and no goldens (variants are gated by their
    limits; the baseline keeps the case's goldens)."""
    sweep: Sweep = case.sweep
    values = variant.as_dict()
    changes: dict[str, Any] = {}
    staged = case
    for selector, override in sweep.overrides.items():
        if _matches(parse_selector(sweep, selector, "sweep.overrides"), values):
            changes.update(_merge(staged, override))
            staged = dataclasses.replace(staged, **changes)
    return dataclasses.replace(
        case,
        **changes,
        build=_bind(case.build, values),
        ptq_config=_bind(case.ptq_config, values),
        golden_profiles=(),
        structure_profiles=case.golden_profiles if case.structure_profiles is None else case.structure_profiles,
        variant=variant,
    )


def group_label(case: Any, profile: str) -> str:
    """What goes between the brackets of a node id: the profile, then the variant's axes."""
    variant = getattr(case, "variant", None)
    return f"{profile},{variant.label}" if variant is not None and variant.label else profile


def marker_kwargs(case: Any, variant: Variant | None) -> dict[str, Any] | None:
    """Axis values for the ``sweep`` marker (``-m 'sweep(kv_heads=2)'``): every axis of a swept
    case, the baseline included; None for an unswept case."""
    if case.sweep is None:
        return None
    if variant is None:
        variant = make_variant(case.sweep, {})
    return variant.as_dict()


def iter_selected(case: Any, profile: str, mode: str) -> Iterable[Any]:
    """The case itself, then its variants for ``mode`` where the sweep covers ``profile``."""
    yield case
    if case.sweep is not None and profile in case.sweep.profiles:
        for variant in variants(case.sweep, mode):
            yield expand(case, variant)
