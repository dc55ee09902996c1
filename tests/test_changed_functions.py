"""A change to tico, named as functions (file + qualified name) or wider: module level, a new or removed
Python file, a non-Python file. Line shifts rename nothing; comments at module level change nothing."""

from __future__ import annotations

import textwrap
from pathlib import Path

from harness.tico_facts.changed_functions import (
    FUNCTION,
    MODULE,
    NEW_FILE,
    NON_PYTHON,
    REMOVED_FILE,
    Change,
    changes,
    file_changes,
    functions,
)

BASE = textwrap.dedent(
    """\
    import torch

    REGISTRY = ["a", "b"]


    class QuantThing:
        scale = 2

        @staticmethod
        def helper(x):
            return x * 2

        def forward(self, x):
            def inner(y):
                return y + 1

            y = inner(x)
            return y
    """
)


def test_functions_are_named_by_qualified_name_with_their_decorators():
    assert functions(BASE) == [
        ("QuantThing.helper", 9, 11),
        ("QuantThing.forward", 13, 18),
        ("QuantThing.forward.inner", 14, 15),
    ]


def test_a_change_inside_a_function_names_the_innermost_one_and_line_shifts_rename_nothing():
    head = BASE.replace("return y + 1", "return y + 2")
    assert file_changes("m.py", BASE, head) == {Change("m.py", FUNCTION, "QuantThing.forward.inner")}
    shifted = "# a comment above everything\n\n" + BASE.replace("return x * 2", "return x * 3")
    assert file_changes("m.py", BASE, shifted) == {Change("m.py", FUNCTION, "QuantThing.helper")}
    # a statement added between two of a function's lines changes that function
    inserted = BASE.replace("        y = inner(x)\n", "        y = inner(x)\n        y = y * 1\n")
    assert file_changes("m.py", BASE, inserted) == {Change("m.py", FUNCTION, "QuantThing.forward")}
    # a decorator is part of its function
    decorated = BASE.replace("    @staticmethod\n", "    @staticmethod\n    @torch.no_grad()\n")
    assert Change("m.py", FUNCTION, "QuantThing.helper") in file_changes("m.py", BASE, decorated)


def test_code_outside_every_function_is_a_module_level_change_and_comments_there_are_none():
    assert file_changes("m.py", BASE, BASE.replace('["a", "b"]', '["a", "b", "c"]')) == {Change("m.py", MODULE)}
    assert file_changes("m.py", BASE, BASE.replace("scale = 2", "scale = 3")) == {Change("m.py", MODULE)}
    assert file_changes("m.py", BASE, "# Copyright\n# licence\n" + BASE) == set()
    # a class's decorator (a registration) is module-level code, not nothing: its line lies above the class line
    registered = BASE.replace("class QuantThing:", '@try_register("torch.nn.SiLU")\nclass QuantThing:')
    extra = registered.replace('"torch.nn.SiLU")', '"torch.nn.SiLU", "transformers.activations.GELUTanh")')
    assert file_changes("m.py", registered, extra) == {Change("m.py", MODULE)}
    removed = BASE.replace("    @staticmethod\n    def helper(x):\n        return x * 2\n\n", "")
    assert file_changes("m.py", BASE, removed) == {Change("m.py", FUNCTION, "QuantThing.helper")}


def _tree(root: Path, files: dict[str, str]) -> Path:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_a_tree_change_lists_functions_new_removed_and_non_python_files(tmp_path):
    base = _tree(tmp_path / "base", {"q/m.py": BASE, "q/old.py": "X = 1\n", "q/schema.fbs": "table A {}\n"})
    head = _tree(
        tmp_path / "head",
        {
            "q/m.py": BASE.replace("return y\n", "return y * 1\n"),
            "q/new.py": "def f():\n    return 1\n",
            "q/schema.fbs": "table A { b: int; }\n",
        },
    )
    (head / "q" / "__pycache__").mkdir()
    (head / "q" / "__pycache__" / "m.cpython-311.pyc").write_bytes(b"\0")
    assert changes(base, head) == [
        Change("q/m.py", FUNCTION, "QuantThing.forward"),
        Change("q/new.py", NEW_FILE),
        Change("q/old.py", REMOVED_FILE),
        Change("q/schema.fbs", NON_PYTHON),
    ]
    assert changes(base, base) == []
