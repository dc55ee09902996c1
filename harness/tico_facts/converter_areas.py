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


def area_of(relative: str) -> str | None:
    """The area of a file named by its path under the tico package, or None (outside every area)."""
    return next((area for area, directory in AREAS if relative.startswith(directory + "/")), None)


def core_line(core: dict[str, Any]) -> str:
    """``core``: the CONVERTER_CORE areas' totals (branch_coverage.converter_core)."""
    return (
        f"tico converter core ({' + '.join(CONVERTER_CORE)}): {core['percent_branches']}% of branches "
        f"({core['branches_covered']}/{core['branches']}), {core['percent_lines']}% of lines in {core['files']} files"
    )
