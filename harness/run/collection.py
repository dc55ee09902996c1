"""The collection tree: a case file -> one node per case -> one item per (check, profile)
(harness/run/items.py).

Node ids read ``cases/gemma4.py::gemma4_vision_encoder::rotary_parity[tiny]``: the profile (and a
sweep variant's axes) is the last part's parametrization, so pytest runs every id as printed
(harness/records/node_ids.py). The items of one (case, profile) share a pipeline and are the xdist
scope that keeps them on one worker (harness/run/xdist_scheduler.py). A case file that cannot be
loaded becomes one failing definition item, never lost."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.checks.base import Check
from harness.model import limits_data, sweep
from harness.model.case import Case, CaseDefinitionError
from harness.model.check_settings import validate as validate_settings
from harness.run.items import CheckItem
from harness.run.session import state_of
from harness.tico_facts import findings_data


def import_root(directory: Path) -> Path:
    """The directory a case directory's modules import from: above its outermost package (the
    directory itself when it is no package), so a wrapper package beside the cases imports too."""
    root = directory.resolve()
    while (root / "__init__.py").is_file():
        root = root.parent
    return root


def _import_case_module(path: Path, rootpath: Path) -> Any:
    path = path.resolve()
    root = rootpath.resolve() if path.is_relative_to(rootpath.resolve()) else import_root(path.parent)
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    name = ".".join(path.relative_to(root).with_suffix("").parts)
    module = importlib.import_module(name)
    if Path(module.__file__ or "").resolve() != path:
        raise ImportError(
            f"{path} imports as module {name!r}, which is already {module.__file__}: rename the "
            f"file or its package (case directories outside the project must not reuse its names)"
        )
    return module


class CaseFile(pytest.File):
    """One case module: defines ``CASES``, a list of harness.Case."""

    def collect(self):
        state = state_of(self.config)
        try:
            module = _import_case_module(self.path, self.config.rootpath)
            cases = getattr(module, "CASES", None)
            if not isinstance(cases, (list, tuple)):
                raise CaseDefinitionError(self.path.stem, "CASES", "module must define CASES as a list of harness.Case")
            for i, case in enumerate(cases):
                if not isinstance(case, Case):
                    raise CaseDefinitionError(
                        f"{self.path.stem}.CASES[{i}]", "CASES", f"is {type(case).__name__}, not harness.Case"
                    )
            cases = limits_data.complete(list(cases), self.path)
        except Exception as exc:  # noqa: BLE001 - a broken case file fails alone, the session goes on
            yield DefinitionErrorItem.from_parent(self, name="<definition>", error=exc)
            return
        checks = state.checks
        names = {check.name for check in checks}
        for case in cases:
            state.case_names.add(case.name)
            for field_name in ("not_applicable", "expected_failures"):
                unknown = sorted(set(getattr(case, field_name)) - names)
                if unknown:
                    error = CaseDefinitionError(
                        case.name,
                        field_name,
                        f"names no check: {', '.join(unknown)} (checks: {', '.join(sorted(names))})",
                    )
                    yield DefinitionErrorItem.from_parent(
                        self, name=f"<definition:{case.name}.{field_name}>", error=error
                    )
            for check_name, expectation in case.expected_failures.items():
                for message in findings_data.definition_errors(check_name, expectation):
                    error = CaseDefinitionError(case.name, f"expected_failures[{check_name!r}]", message)
                    yield DefinitionErrorItem.from_parent(
                        self, name=f"<definition:{case.name}.expected_failures>", error=error
                    )
            settings_errors = validate_settings(case, checks)
            for error in settings_errors:
                yield DefinitionErrorItem.from_parent(
                    self, name=f"<definition:{case.name}.{error.field_name}>", error=error
                )
            if settings_errors:
                continue  # its checks cannot be judged with settings that do not exist
            try:
                if case.sweep is not None:
                    sweep.validate(case.sweep, case.profiles, {"build": case.build, "ptq_config": case.ptq_config})
                selected = {
                    profile: list(sweep.iter_selected(case, profile, state.sweep_mode))
                    for profile in case.profiles
                    if state.wants(case, profile)
                }
                sweep_errors = _variant_errors(case, selected, checks, names)
            except sweep.SweepError as exc:
                sweep_errors = [CaseDefinitionError(case.name, exc.field_name, str(exc))]
            for error in sweep_errors:
                yield DefinitionErrorItem.from_parent(
                    self, name=f"<definition:{case.name}.{error.field_name}>", error=error
                )
            if sweep_errors:
                continue  # a malformed sweep is a malformed case: none of its variants runs
            groups = [(profile, v) for profile, variants in selected.items() for v in variants]
            if groups:
                yield CaseNode.from_parent(self, name=case.name, groups=groups, checks=checks, declared=case)


def _variant_errors(
    case: Case, selected: dict[str, list[Case]], checks: list[Check], names: set[str]
) -> list[CaseDefinitionError]:
    """A sweep validated against the case (harness/model/sweep.py), and each variant's overrides against
    the checks, as a case's own settings are."""
    if case.sweep is None:
        return []
    errors: list[CaseDefinitionError] = []
    for variant_case in (v for variants in selected.values() for v in variants[1:]):
        where = f"sweep[{variant_case.variant.label}]"
        for field_name in ("not_applicable", "expected_failures"):
            unknown = sorted(set(getattr(variant_case, field_name)) - names)
            if unknown:
                errors.append(
                    CaseDefinitionError(case.name, f"{where}.{field_name}", f"names no check: {', '.join(unknown)}")
                )
        errors += [
            CaseDefinitionError(case.name, f"{where}.{e.field_name}", str(e).split(": ", 2)[-1])
            for e in validate_settings(variant_case, checks)
        ]
    return errors


class CaseNode(pytest.Collector):
    """One case: its items are each selected (profile, variant) times each check, grouped so that a
    group's checks run one after another on the worker that holds its pipeline."""

    def __init__(self, *, groups: list[tuple[str, Case]], checks: list[Check], declared: Case, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.groups = groups
        self.checks = checks
        # the case as its file declares it (a sweep variant's case is a copy of it)
        self.declared = declared

    def collect(self):
        for profile, variant_case in self.groups:
            label = sweep.group_label(variant_case, profile)
            for check in self.checks:
                # The id is given as the string pytest parses stored ids from (NodeId.parse: the bracket is the
                # parametrization), so --lf, --ff and --sw find the item; one built from the name would keep
                # the bracket inside the name and never equal it.
                yield CheckItem.from_parent(
                    self,
                    name=f"{check.name}[{label}]",
                    nodeid=f"{self.nodeid}::{check.name}[{label}]",
                    case=variant_case,
                    profile=profile,
                    check=check,
                    declared=self.declared,
                )


class DefinitionErrorItem(pytest.Item):
    """Stands in for a case file that could not be loaded, so the failure is named, not lost."""

    def __init__(self, *, error: BaseException, **kwargs: Any):
        super().__init__(**kwargs)
        self.error = error

    def runtest(self) -> None:
        raise self.error

    def repr_failure(self, excinfo, style=None) -> str:
        err = excinfo.value
        if isinstance(err, CaseDefinitionError):
            return f"malformed case definition in {self.path.name}: {err}"
        return f"cannot load case module {self.path.name}: {type(err).__name__}: {err}"

    def reportinfo(self):
        return self.path, 0, f"{self.path.name}::<definition>"
