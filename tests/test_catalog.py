"""The catalog page's cases x checks table is generated, and kept in step with the code."""

from harness.model.case_loading import ROOT
from harness.report import case_catalog as catalog


def test_readme_catalog_is_current():
    readme = (ROOT / "docs" / "catalog.md").read_text()
    start = readme.index(catalog.BEGIN) + len(catalog.BEGIN)
    end = readme.index(catalog.END)
    assert readme[start:end].strip() == catalog.table().strip(), (
        "run: ./scripts/env.sh python -m harness catalog --write"
    )


def test_catalog_marks_capabilities_and_reasons():
    table = catalog.table()
    row = next(line for line in table.splitlines() if line.startswith("| `qwen3_vl_vision_model`"))
    assert "n/a*" in row and "xfail*" in row
