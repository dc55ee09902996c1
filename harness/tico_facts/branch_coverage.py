"""Which lines and branches of tico the matrix executes (``--tico-coverage``).

coverage.py measures branches in every process of the run (controller and xdist workers), restricted
to the tico package by its directory: tico is found by path and never imported early (a dotted
``--cov=tico`` imports it before the harness and tico registers its torch operators twice). Each
process writes its own data file; the controller combines them and reads coverage's JSON report,
which already breaks every file down per class. Files are named relative to the tico package, so a
checkout, a wheel and an editable install of the same sources report the same names.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import json
import linecache
import shutil
from pathlib import Path
from typing import Any, Iterator

import coverage

from harness.tico_facts import converter_areas, item_map, stage_contexts
from harness.tico_facts.tico_identity import identity

# The scope the percentages are quoted for: the wrappers users call.
SCOPE = "quantization/wrapq/wrappers"
DATA_NAME = ".coverage"
SUMMARY_NAME = "tico-coverage.json"


def tico_root() -> Path:
    """The directory of the tico package the run imports, found without importing it."""
    spec = importlib.util.find_spec("tico")
    if spec is None or spec.origin is None:
        raise RuntimeError("tico is not importable: nothing to measure")
    return Path(spec.origin).resolve().parent


class Measurement:
    """One process's measurement: started before any case runs, saved when the process's session ends."""

    def __init__(self, data_dir: Path):
        data_dir.mkdir(parents=True, exist_ok=True)
        self.coverage = coverage.Coverage(
            data_file=str(data_dir / DATA_NAME),
            data_suffix=True,
            branch=True,
            source=[str(tico_root())],
            config_file=False,
        )

    def start(self) -> None:
        self.coverage.start()

    def save(self) -> None:
        self.coverage.stop()
        self.coverage.save()


def clear(data_dir: Path) -> None:
    """Remove data files a previous run left, so a combination never counts another run's lines."""
    for stale in [*data_dir.glob(f"{DATA_NAME}*"), *data_dir.glob("first-group.*.txt")]:
        stale.unlink()
    stage_contexts.clear(data_dir)


def combine(data_dir: Path, wall_seconds: float | None = None, html: bool = True) -> dict[str, Any]:
    """Combine every process's data in ``data_dir``, write coverage's HTML pages for tico there (unless
    ``html`` is false), and return (and write, as tico-coverage.json) the summary: per file and per class
    under tico."""
    root = tico_root()
    combined = coverage.Coverage(data_file=str(data_dir / DATA_NAME), branch=True, config_file=False)
    combined.combine([str(data_dir)], strict=False)
    combined.save()
    include = [str(root / "*")]
    report_path = data_dir / "coverage.json"
    combined.json_report(outfile=str(report_path), include=include, ignore_errors=True)
    if html:  # most of a combination's time: coverage parses and highlights every file of tico again
        combined.html_report(
            directory=str(data_dir / "html"), include=include, ignore_errors=True, title="tico coverage"
        )
    raw = json.loads(report_path.read_text())
    summary = summarize(raw, root)
    summary["wall_seconds"] = wall_seconds
    if any(combined.get_data().measured_contexts() - {""}):
        groups = item_map.build(data_dir / DATA_NAME, report_files(raw, root))
        measured = {
            "version": identity().get("version"),
            "source_sha256": identity().get("source_sha256"),
            "files": item_map.source_files(root),
        }
        size = item_map.write(groups, data_dir / item_map.MAP_NAME, measured)
        summary["item_map"] = {"groups": len(groups["groups"]), "functions": len(groups["functions"]), "bytes": size}
    (data_dir / SUMMARY_NAME).write_text(json.dumps(summary, indent=1, sort_keys=True))
    return summary


def _counts(summary: dict[str, Any]) -> dict[str, int]:
    return {  # coverage leaves the branch counts out of a file that recorded no arc at all
        "statements": summary.get("num_statements", 0),
        "lines_covered": summary.get("covered_lines", 0),
        "branches": summary.get("num_branches", 0),
        "branches_covered": summary.get("covered_branches", 0),
    }


def _branch(path: Path, arc: list[int], function: str) -> dict[str, Any]:
    """An untaken branch: its lines (``to`` negative: it leaves the function), the function holding it
    and the source of both lines, which name it across a refactor (harness/tico_facts/branch_reasons.py)."""
    source = lambda line: linecache.getline(str(path), line).strip()  # noqa: E731
    return {
        "line": arc[0],
        "to": arc[1],
        "function": function,
        "condition": source(arc[0]),
        "target": "exit" if arc[1] < 0 else source(arc[1]),
    }


def _functions_of_arcs(entry: dict[str, Any]) -> dict[tuple[int, int], str]:
    """Which function (qualified name, "" at module level) holds each untaken branch of a file."""
    return {
        tuple(arc): name
        for name, part in (entry.get("functions") or {}).items()
        for arc in part.get("missing_branches", [])
    }


def report_files(raw: dict[str, Any], root: Path) -> Iterator[tuple[Path, str, dict[str, Any]]]:
    """(absolute path, path under the tico package, entry) of each file of coverage's JSON report under ``root``."""
    for name, entry in raw["files"].items():
        path = (Path(name) if Path(name).is_absolute() else Path.cwd() / name).resolve()
        try:
            relative = path.relative_to(root).as_posix()
        except ValueError:
            continue
        yield path, relative, entry


def summarize(raw: dict[str, Any], root: Path) -> dict[str, Any]:
    """coverage's JSON report, reduced to what the harness reports: counts, missing lines and
    uncovered branches per file and per class, keyed by the path under the tico package."""
    files: dict[str, Any] = {}
    classes: dict[str, Any] = {}
    functions: dict[str, int] = {}
    for path, relative, entry in report_files(raw, root):
        held_by = _functions_of_arcs(entry)
        branch = lambda arc: _branch(path, arc, held_by.get(tuple(arc), ""))  # noqa: E731
        files[relative] = {
            **_counts(entry["summary"]),
            "missing_lines": entry["missing_lines"],
            "executed_lines": entry["executed_lines"],
            "uncovered_branches": [branch(arc) for arc in entry.get("missing_branches", [])],
        }
        for function_name, part in (entry.get("functions") or {}).items():
            if function_name:
                functions[f"{relative}::{function_name}"] = part["summary"].get("covered_lines", 0)
        for class_name, part in (entry.get("classes") or {}).items():
            if class_name:
                classes[f"{relative}::{class_name}"] = {
                    **_counts(part["summary"]),
                    "uncovered_branches": [branch(arc) for arc in part.get("missing_branches", [])],
                }
    return {
        "tico_root": str(root),
        "scope": SCOPE,
        "totals": totals(files),
        "scope_totals": totals({k: v for k, v in files.items() if k.startswith(SCOPE + "/")}),
        "areas": area_totals(files),
        "files": files,
        "classes": classes,
        "functions": functions,
    }


# The public entry points users call, by where tico defines them: the public interface, the config
# builders, the algorithms' quantizers and the recipe runner (file glob, what counts: functions or classes).
ENTRY_POINTS = (
    ("quantization/public_interface.py", "functions"),
    ("quantization/config/*builders.py", "functions"),
    ("quantization/algorithm/*/quantizer.py", "classes"),
    ("quantization/recipes/runner.py", "classes"),
)


def entry_points(summary: dict[str, Any]) -> list[tuple[str, bool]]:
    """(file::name, whether the run executed any of its body) for every public entry point."""
    found = []
    for pattern, kind in ENTRY_POINTS:
        for key in sorted(summary.get(kind, {})):
            path, name = key.split("::", 1)
            if not fnmatch.fnmatchcase(path, pattern) or name.startswith("_") or "." in name:
                continue
            if kind == "classes" and not name.endswith(("Quantizer", "Runner")):
                continue  # the quantizer modules' helper classes (StopForward, ...) are not entry points
            value = summary[kind][key]
            ran = (value if isinstance(value, int) else value["lines_covered"]) > 0
            found.append((key, ran))
    return found


def totals(files: dict[str, Any]) -> dict[str, Any]:
    sums = {key: sum(f[key] for f in files.values()) for key in ("statements", "lines_covered", "branches")}
    sums["branches_covered"] = sum(f["branches_covered"] for f in files.values())
    sums["files"] = len(files)
    sums["percent_lines"] = round(100.0 * sums["lines_covered"] / sums["statements"], 1) if sums["statements"] else None
    sums["percent_branches"] = (
        round(100.0 * sums["branches_covered"] / sums["branches"], 1) if sums["branches"] else None
    )
    return sums


def area_totals(files: dict[str, Any]) -> dict[str, Any]:
    """``totals`` per area of tico (converter_areas.AREAS, every area, measured or not)."""
    return {
        area: totals({k: v for k, v in files.items() if converter_areas.area_of(k) == area})
        for area, _ in converter_areas.AREAS
    }


def converter_core(files: dict[str, Any]) -> dict[str, Any]:
    """``totals`` of the converter's core areas (converter_areas.CONVERTER_CORE) together."""
    return totals({k: v for k, v in files.items() if converter_areas.area_of(k) in converter_areas.CONVERTER_CORE})


def merge(report_dirs: list[Path], data_dir: Path, html: bool = True) -> dict[str, Any]:
    """One summary for the shards of a run: each shard's combined data (``<report dir>/tico-coverage``)
    combined again in ``data_dir``, with coverage's HTML pages unless ``html`` is false. The shards must
    have measured the same tico at the same path."""
    data_dir.mkdir(parents=True, exist_ok=True)
    clear(data_dir)
    walls = []
    for i, where in enumerate(report_dirs):
        found = next((d for d in (where / "tico-coverage", where) if (d / DATA_NAME).is_file()), None)
        if found is None:
            raise FileNotFoundError(f"no {DATA_NAME} under {where}: was that run made with --tico-coverage?")
        shutil.copyfile(found / DATA_NAME, data_dir / f"{DATA_NAME}.shard{i}")
        # the per-item map's process records: first groups (one-time work) and stages read per item
        for record in [*found.glob("first-group.*.txt"), *found.glob("stages.*.json")]:
            kind, _, rest = record.name.partition(".")
            shutil.copyfile(record, data_dir / f"{kind}.shard{i}-{rest}")
        if (found / SUMMARY_NAME).is_file():
            walls.append(json.loads((found / SUMMARY_NAME).read_text()).get("wall_seconds") or 0.0)
    return combine(data_dir, sum(walls) or None, html=html)


def load(where: Path) -> dict[str, Any]:
    """A run's summary, from its report directory, its tico-coverage directory or the JSON file."""
    for candidate in (where, where / SUMMARY_NAME, where / "tico-coverage" / SUMMARY_NAME):
        if candidate.is_file():
            summary = json.loads(candidate.read_text())
            if any(isinstance(b, list) for f in summary["files"].values() for b in f["uncovered_branches"]):
                # a summary written before branches were named by function: its data can be summarised again
                raise FileNotFoundError(
                    f"{candidate} predates branch names by function: rerun, or re-summarise its data with "
                    f"python -m harness tico-coverage {candidate.parent} --merge-into DIR"
                )
            summary.setdefault("areas", area_totals(summary["files"]))  # written before areas
            return summary
    raise FileNotFoundError(
        f"no {SUMMARY_NAME} under {where}: run the matrix with --tico-coverage (it writes "
        f"<report dir>/tico-coverage/{SUMMARY_NAME})"
    )


def headline(summary: dict[str, Any]) -> str:
    scope = summary["scope_totals"]
    lines = f"{scope['percent_lines']}% of lines ({scope['lines_covered']}/{scope['statements']})"
    branches = f"{scope['percent_branches']}% of branches ({scope['branches_covered']}/{scope['branches']})"
    return f"tico {summary['scope']}: {lines}, {branches} in {scope['files']} files"
