"""tico's code by area, for coverage figures beside the wrappers': where tico's fixes land.

An area is a directory under the tico package. The wrappers are one; the others are the converter (its
operator visitors, its passes, the quantization passes, utils, the interpreter, the config) and the
quantization algorithms, recipes and config builders. A file belongs to the first area whose directory
holds it, so ``quantization/passes`` never counts under ``passes``.
"""

from __future__ import annotations

from typing import Any

# (area, its directory under the tico package), in the order the figures are printed
AREAS = (
    ("wrappers", "quantization/wrapq/wrappers"),
    ("serialize/operators", "serialize/operators"),
    ("passes", "passes"),
    ("quantization/passes", "quantization/passes"),
    ("utils", "utils"),
    ("interpreter", "interpreter"),
    ("config", "config"),
    ("quantization/algorithm", "quantization/algorithm"),
    ("quantization/recipes", "quantization/recipes"),
    ("quantization/config", "quantization/config"),
)
# The converter's core, quoted as one figure: the operator visitors and both kinds of passes.
CONVERTER_CORE = ("serialize/operators", "passes", "quantization/passes")
_COUNTS = ("statements", "lines_covered", "branches", "branches_covered")


def area_of(relative: str) -> str | None:
    """The area of a file named by its path under the tico package, or None (outside every area)."""
    return next((area for area, directory in AREAS if relative.startswith(directory + "/")), None)


def _figures(counts: dict[str, int]) -> dict[str, Any]:
    share = lambda part, whole: round(100.0 * part / whole, 1) if whole else None  # noqa: E731
    return {
        **counts,
        "percent_lines": share(counts["lines_covered"], counts["statements"]),
        "percent_branches": share(counts["branches_covered"], counts["branches"]),
    }


def area_totals(files: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per area (every area, in ``AREAS`` order, measured or not): files, lines and branches, and the share
    of each the run executed; ``files`` is a --tico-coverage summary's per-file table."""
    counts = {area: dict.fromkeys(("files", *_COUNTS), 0) for area, _ in AREAS}
    for relative, entry in files.items():
        area = area_of(relative)
        if area is not None:
            counts[area]["files"] += 1
            for key in _COUNTS:
                counts[area][key] += entry[key]
    return {area: _figures(row) for area, row in counts.items()}


def converter_core(areas: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The ``CONVERTER_CORE`` areas' figures summed into one."""
    return _figures({key: sum(areas[area][key] for area in CONVERTER_CORE) for key in ("files", *_COUNTS)})


def core_line(areas: dict[str, dict[str, Any]]) -> str:
    core = converter_core(areas)
    return (
        f"tico converter core ({' + '.join(CONVERTER_CORE)}): {core['percent_branches']}% of branches "
        f"({core['branches_covered']}/{core['branches']}), {core['percent_lines']}% of lines in {core['files']} files"
    )
