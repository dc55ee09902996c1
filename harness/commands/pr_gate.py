"""``python -m harness pr-gate --head TICO --base TICO --report-dir DIR``: a tico pull request's gate.

What the CI workflow (examples/ci/tico-pr-gate.yml) runs, step by step, and what runs locally:

1. ``select``: the items the change from BASE to HEAD can reach (``--select-changed``, collection only),
   written to ``DIR/select/selected-items.txt``;
2. ``base``: those items on BASE (``DIR/base``);
3. ``head``: the same items on HEAD, judged against the base run (``--baseline``: goldens, structure
   records and metrics are the base run's, and a failure the base had the same way is pre-existing);
4. ``compare``: what got worse, written to ``DIR/compare.md`` (the selection, then the comparison) and
   ``DIR/compare.html``.

Each side runs through scripts/env.sh with ``WRAPQ_TICO`` set, as a user runs one tico. ``--step all``
(the default) runs the four in order. Exit status: 0 nothing got worse, 1 the head is worse,
2 the gate could not run (bad options, a run that did not finish, an empty selection).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from harness.commands import compare as compare_command
from harness.records import node_ids
from harness.records.results import atomic_write_text
from harness.run.select_changed import ITEMS_FILE, SELECTION_FILE, describe

HELP = "a tico pull request's gate: select, run the selection on base and head, compare; exit 1 if worse"
ROOT = Path(__file__).resolve().parents[2]
STEPS = ("select", "base", "head", "compare")
_VERSION = re.compile(r"^[0-9][0-9A-Za-z.+!-]*$")


class GateError(RuntimeError):
    """The gate could not run a step: the message says which and how to fix it."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m harness pr-gate",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="exit status: 0 nothing got worse, 1 the head is worse, 2 the gate could not run. Arguments after "
        "'--' go to every pytest run (e.g. -- -k nn_linear narrows the selection).",
    )
    p.add_argument("--head", required=True, metavar="TICO", help="the pull request's tico, as WRAPQ_TICO takes it")
    p.add_argument("--base", required=True, metavar="TICO", help="its base (a checkout, a tree, a wheel or a version)")
    p.add_argument("--report-dir", required=True, type=Path, metavar="DIR", help="where the steps write")
    p.add_argument("--step", choices=(*STEPS, "all"), default="all", help="run one step (default: all, in order)")
    p.add_argument(
        "--workers", default="auto", help="pytest-xdist workers per run (default: auto, at most one per selected group)"
    )
    p.add_argument("--item-map", type=Path, metavar="PATH", help="the per-item map to select from (default: pinned)")
    p.add_argument("--no-select", action="store_true", help="run every item of the PR gate instead of a selection")
    p.add_argument(
        "--diff-coverage",
        action="store_true",
        help="measure which of tico's lines the head run reaches and list the changed lines none reaches "
        "(DIR/diff-coverage.txt; the head run's caches are off)",
    )
    return p


def _tico(spec: str, option: str) -> str:
    """A tico source as WRAPQ_TICO takes it; a directory or wheel made absolute (env.sh runs from the
    project root); anything else refused with the fix."""
    path = Path(spec).expanduser()
    if path.is_dir() and not (path / "tico" / "__init__.py").is_file():
        if not (path.name == "tico" and (path / "__init__.py").is_file()):
            raise GateError(f"{option} {spec}: no tico/__init__.py there; give a tico checkout or a tree holding tico/")
    if path.is_dir() or (path.is_file() and path.suffix == ".whl"):
        return str(path.resolve())
    if _VERSION.match(spec) and not path.exists():
        return spec
    raise GateError(
        f"{option} {spec}: no such directory or .whl file, and not a version; give a tico checkout, a tree "
        f"holding tico/, a wheel or a version such as 0.4.0.dev261026"
    )


def _pytest(tico: str, args: list[str], log: Path) -> int:
    """pytest through scripts/env.sh on ``tico``, its output shown and kept in ``log``."""
    env = dict(os.environ, WRAPQ_TICO=tico)
    command = [str(ROOT / "scripts" / "env.sh"), "pytest", *args]
    print(f"$ WRAPQ_TICO={tico} ./scripts/env.sh pytest {' '.join(args)}", flush=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        assert process.stdout is not None
        for line in process.stdout:
            sys.stdout.write(line)
            out.write(line)
        return process.wait()


def _items_file(report: Path) -> Path:
    items = report / "select" / ITEMS_FILE
    if not items.is_file() or not items.read_text().strip():
        raise GateError(f"{items} is missing or empty: run the select step first (--step select)")
    return items


def _workers(asked: str, items: Path) -> str:
    """xdist workers for a side's run: as asked, but for ``auto`` no more than the selection's (case, profile)
    groups, each of which runs on one worker: a one-group selection runs in-process, with no worker to start."""
    if asked != "auto":
        return asked
    groups = {node_ids.group_of(line) for line in items.read_text().split()}
    return str(min(len(groups), os.cpu_count() or 1)) if len(groups) > 1 else "0"


def select(args: argparse.Namespace, head: str, base: str, extra: list[str]) -> None:
    out = args.report_dir / "select"
    if args.no_select:
        code = _pytest(head, ["--co", "-q", *extra], out / "select.log")
        ids = [line for line in (out / "select.log").read_text().splitlines() if "::" in line and " " not in line]
        atomic_write_text(out / ITEMS_FILE, "".join(f"{i}\n" for i in ids))
    else:
        options = [f"--select-changed={base}", f"--wrapq-report-dir={out}"]
        options += [f"--item-map={args.item_map.resolve()}"] if args.item_map else []
        code = _pytest(head, ["--co", "-q", *options, *extra], out / "select.log")
    if code != 0:
        raise GateError(f"the select step's collection exited {code}: see {out / 'select.log'}")
    print(f"selected: {len(_items_file(args.report_dir).read_text().split())} item(s) in {out / ITEMS_FILE}")


def run_side(args: argparse.Namespace, side: str, tico: str, extra: list[str]) -> None:
    report = args.report_dir / side
    items = _items_file(args.report_dir)
    options = [f"--numprocesses={_workers(args.workers, items)}", f"@{items}", f"--wrapq-report-dir={report}"]
    if side == "head":
        base_results = args.report_dir / "base" / "results.json"
        if not base_results.is_file():
            raise GateError(f"{base_results} is missing: run the base step first (--step base)")
        options.append(f"--baseline={base_results.parent}")
        options += ["--tico-coverage"] if args.diff_coverage else []
    code = _pytest(tico, [*options, *extra], report / "run.log")
    # 0 green, 1 some item red (the comparison judges it); anything else: the run did not finish
    if code not in (0, 1) or not (report / "results.json").is_file():
        raise GateError(f"the {side} run exited {code} without its results: see {report / 'run.log'}")


def compare(args: argparse.Namespace, head: str, base: str) -> int:
    report = args.report_dir
    markdown, html = report / "comparison.md", report / "compare.html"
    code = compare_command.main(
        [str(report / "base"), str(report / "head"), f"--markdown={markdown}", f"--html={html}"]
    )
    if code == 2 or not markdown.is_file():
        raise GateError(f"the comparison could not be made (exit {code}): see its error above")
    parts = ["## wrapq gate", ""]
    record = report / "select" / SELECTION_FILE
    if record.is_file():
        parts += ["```", *[line for line in describe(json.loads(record.read_text())) if line], "```", ""]
    if args.diff_coverage:
        parts += _diff_coverage(report, head, base)
    atomic_write_text(report / "compare.md", "\n".join(parts) + markdown.read_text())
    print(f"gate: {report / 'compare.md'}")
    return code


def _diff_coverage(report: Path, head: str, base: str) -> list[str]:
    """The changed tico lines no selected item reaches, from the head run's measurement."""
    env = dict(os.environ, WRAPQ_TICO=head)
    done = subprocess.run(
        [str(ROOT / "scripts" / "env.sh"), "python", "-m", "harness", "tico-coverage", str(report / "head"),
         f"--base={base}"],
        cwd=ROOT, env=env, capture_output=True, text=True,
    )  # fmt: skip
    atomic_write_text(report / "diff-coverage.txt", done.stdout + done.stderr)
    return ["### tico lines this change touches", "```", done.stdout.strip() or done.stderr.strip(), "```", ""]


def main(argv: list[str]) -> int:
    argv = list(argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    try:
        args = parser().parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    try:
        head, base = _tico(args.head, "--head"), _tico(args.base, "--base")
        args.report_dir = args.report_dir.expanduser().resolve()
        args.report_dir.mkdir(parents=True, exist_ok=True)
        steps = STEPS if args.step == "all" else (args.step,)
        for step in steps:
            print(f"== pr-gate: {step} ==", flush=True)
            if step == "select":
                select(args, head, base, extra)
            elif step in ("base", "head"):
                run_side(args, step, base if step == "base" else head, extra)
            else:
                return compare(args, head, base)
    except (GateError, OSError) as exc:
        print(f"pr-gate: error: {exc}", file=sys.stderr)
        return 2
    return 0
