"""The groups a change to tico can reach, read from a per-item map: each rule of
harness/tico_facts/change_selection.py on a map whose answer is known."""

from __future__ import annotations

from harness.tico_facts.change_selection import select
from harness.tico_facts.changed_functions import FUNCTION, MODULE, NEW_FILE, NON_PYTHON, REMOVED_FILE, Change

LINEAR = "w/nn/quant_linear.py"
ATTENTION = "w/llama/quant_attention.py"
MAP = {
    "functions": [
        f"{LINEAR}::QuantLinear.forward",  # 0
        f"{ATTENTION}::QuantLlamaAttention.forward",  # 1
        "w/registry.py::lookup",  # 2: filled lazily: the first group on each worker ran it
        f"{LINEAR}::",  # 3: a module body
        "w/dtypes.py::",  # 4: constants only
    ],
    "outside_items": [],
    "first_only": [2, 3, 4],
    "groups": {"nn_linear[tiny]": [0, 2, 3, 4], "llama_attention[tiny]": [0, 1], "act_relu[tiny]": []},
}


def test_a_function_selects_the_groups_that_ran_it():
    found = select([Change(ATTENTION, FUNCTION, "QuantLlamaAttention.forward")], MAP)
    assert found.units == {"llama_attention[tiny]"} and not found.everything
    assert [str(r) for r in found.reasons] == [f"{ATTENTION}::QuantLlamaAttention.forward -> 1 group(s)"]


def test_one_time_work_and_non_python_files_select_every_group():
    for change in (Change("w/registry.py", FUNCTION, "lookup"), Change("circle/schema.fbs", NON_PYTHON)):
        found = select([change], MAP)
        assert found.everything and found.units == set(MAP["groups"]), found.reasons


def test_unseen_functions_and_module_level_code_select_the_groups_that_ran_the_file():
    unseen = select([Change(LINEAR, FUNCTION, "QuantLinear.new_helper")], MAP)
    assert unseen.units == {"nn_linear[tiny]", "llama_attention[tiny]"}
    assert "unseen in the map" in str(unseen.reasons[0])
    module = select([Change(LINEAR, MODULE)], MAP)
    assert module.units == {"nn_linear[tiny]", "llama_attention[tiny]"} and not module.everything
    assert select([Change(LINEAR, REMOVED_FILE)], MAP).units == module.units
    # a module of constants no group calls into but every item may read
    assert select([Change("w/dtypes.py", MODULE)], MAP).everything


def test_new_files_select_their_directory_and_code_nothing_runs_selects_nothing():
    beside = select([Change("w/nn/quant_new.py", NEW_FILE)], MAP)
    assert beside.units == {"nn_linear[tiny]", "llama_attention[tiny]"}
    fresh = select([Change("w/fresh/quant_x.py", NEW_FILE)], MAP)
    assert fresh.units == set() and not fresh.everything and "only an import reaches it" in str(fresh.reasons[0])
    never = select([Change("w/fairseq/quant_mha.py", FUNCTION, "QuantMHA.forward")], MAP)
    assert never.units == set() and [str(r) for r in never.reasons] == [
        "w/fairseq/quant_mha.py::QuantMHA.forward: no group runs w/fairseq/quant_mha.py -> no group"
    ]


# The same map with each process's imports: worker 0 imported the registry, quant_linear and dtypes, then ran
# nn_linear; worker 1 ran act_relu before anything imported quant_linear, then llama_attention after it.
IMPORTS = {
    "files": ["w/registry.py", LINEAR, "w/dtypes.py", ATTENTION],
    "processes": [[0, 1, 2], [0, 3, 1]],
    "groups": {"nn_linear[tiny]": [[0, 3]], "act_relu[tiny]": [[1, 1]], "llama_attention[tiny]": [[1, 3]]},
}
WITH_IMPORTS = {**MAP, "imports": IMPORTS, "tico": {"files": {LINEAR: "aaaa", ATTENTION: "bbbb", "w/dtypes.py": "cc"}}}


def test_module_level_code_selects_every_group_that_had_imported_the_module():
    """A constant, a class attribute or a registration reaches whoever imported the module, whether or not it
    runs one of the module's functions; a group whose process had not imported it yet is not reached."""
    module = select([Change(LINEAR, MODULE)], WITH_IMPORTS)
    assert module.units == {"nn_linear[tiny]", "llama_attention[tiny]"} and not module.everything
    assert "in every group that imported it" in str(module.reasons[0])
    # dtypes.py: no group runs a function of it, yet nn_linear's process had imported it; act_relu's had not
    assert select([Change("w/dtypes.py", MODULE)], WITH_IMPORTS).units == {"nn_linear[tiny]"}
    assert select([Change("w/other.py", MODULE)], WITH_IMPORTS).units == set()


def test_a_file_the_map_has_in_another_form_or_lacks_widens_the_selection_and_says_so():
    base = {LINEAR: "aaaa", ATTENTION: "zzzz", "w/dtypes.py": "cc", "w/new_in_base.py": "dd"}
    same = select([Change(ATTENTION, FUNCTION, "QuantLlamaAttention.forward")], WITH_IMPORTS, base)
    assert same.units == {"llama_attention[tiny]"} and "another form than BASE" in str(same.reasons[0])
    narrow = select([Change(LINEAR, FUNCTION, "QuantLinear.forward")], WITH_IMPORTS, base)
    assert narrow.units == {"nn_linear[tiny]", "llama_attention[tiny]"} and "another form" not in str(narrow.reasons)
    lacking = select([Change("w/new_in_base.py", FUNCTION, "f")], WITH_IMPORTS, base)
    assert lacking.everything and "a file the map's tico does not have" in str(lacking.reasons[0])


# A map recorded per item: nn_linear's two checks share its stages; only circle_structure reads the Circle one.
CONVERT = "utils/convert.py::convert_exported_module_to_circle"
PER_ITEM = {
    "functions": [f"{LINEAR}::QuantLinear.forward", CONVERT, f"{LINEAR}::QuantLinear.__init__"],
    "outside_items": [],
    "first_only": [],
    "groups": {"nn_linear[tiny]": [0, 1, 2]},
    "stages": {"nn_linear[tiny]": {"names": ["quantized", "circle_convert"], "functions": [[0], [1]]}},
    "checks": {
        "nn_linear[tiny]": {"quant_accuracy": [[], [0]], "circle_structure": [[], [0, 1]], "lifecycle": [[2], []]}
    },
}


def test_a_map_recorded_per_item_selects_the_items_whose_stages_or_own_code_ran_the_change():
    circle = select([Change("utils/convert.py", FUNCTION, "convert_exported_module_to_circle")], PER_ITEM)
    assert circle.per_item and circle.units == {"nn_linear::circle_structure[tiny]"}
    assert [str(r) for r in circle.reasons] == [f"{CONVERT} -> 1 item(s)"]
    forward = select([Change(LINEAR, FUNCTION, "QuantLinear.forward")], PER_ITEM)
    assert forward.units == {"nn_linear::quant_accuracy[tiny]", "nn_linear::circle_structure[tiny]"}
    assert select([Change(LINEAR, FUNCTION, "QuantLinear.__init__")], PER_ITEM).units == {"nn_linear::lifecycle[tiny]"}
    assert select([Change(LINEAR, MODULE)], PER_ITEM).units == {
        f"nn_linear::{c}[tiny]" for c in PER_ITEM["checks"]["nn_linear[tiny]"]
    }


# The same map with anchors: the first statement of one of QuantLinear.forward's blocks (line 40) ran in
# circle_structure's own code only, another's (line 30) under the quantized stage, line 50 only outside
# every item.
WITH_LINES = PER_ITEM | {
    "tico": {"files": {LINEAR: "aaaa", "utils/convert.py": "bbbb"}},
    "lines": [f"{LINEAR}:30", f"{LINEAR}:40", f"{LINEAR}:50"],
    "lines_outside_items": [2],
    "lines_first_only": [],
    "stages": {
        "nn_linear[tiny]": {"names": ["quantized", "circle_convert"], "functions": [[0], [1]], "lines": [[0], []]}
    },
    "checks": {
        "nn_linear[tiny]": {
            "quant_accuracy": [[], [0], []],
            "circle_structure": [[], [0, 1], [1]],
            "lifecycle": [[2], [], []],
        }
    },
}
SAME_BASE = {LINEAR: "aaaa", "utils/convert.py": "bbbb"}


def test_a_change_inside_blocks_selects_the_items_that_entered_them_where_the_map_s_file_is_base_s():
    def forward(lines):
        return Change(LINEAR, FUNCTION, "QuantLinear.forward", frozenset(lines))

    inside_if = select([forward({40})], WITH_LINES, SAME_BASE)
    assert inside_if.units == {"nn_linear::circle_structure[tiny]"}
    assert [str(r) for r in inside_if.reasons] == [
        f"{LINEAR}::QuantLinear.forward, inside the blocks at line(s) 40 -> 1 item(s)"
    ]
    # an anchor run under a stage reaches every item reading that stage
    assert select([forward({30})], WITH_LINES, SAME_BASE).units == {
        "nn_linear::quant_accuracy[tiny]",
        "nn_linear::circle_structure[tiny]",
    }
    assert select([forward({60})], WITH_LINES, SAME_BASE).units == set()  # an anchor no item ran
    assert select([forward(set())], WITH_LINES, SAME_BASE).units == set()  # only code beside it changed
    assert select([forward({50})], WITH_LINES, SAME_BASE).everything  # run outside every item
    # not narrowed: the file differs from the map's, no BASE hashes, a map without lines, no anchors
    whole = {"nn_linear::quant_accuracy[tiny]", "nn_linear::circle_structure[tiny]"}
    assert select([forward({40})], WITH_LINES, {**SAME_BASE, LINEAR: "cccc"}).units == whole
    assert select([forward({40})], WITH_LINES).units == whole
    assert select([forward({40})], PER_ITEM, SAME_BASE).units == whole
    assert select([Change(LINEAR, FUNCTION, "QuantLinear.forward")], WITH_LINES, SAME_BASE).units == whole


def test_a_map_with_lines_round_trips_and_an_older_map_without_them_still_loads(tmp_path):
    from harness.tico_facts import item_map

    item_map.write(WITH_LINES, tmp_path / "m.json.gz", WITH_LINES["tico"])
    loaded = item_map.load(tmp_path / "m.json.gz")
    assert {key: loaded[key] for key in WITH_LINES} == WITH_LINES
    assert item_map.item_reach(loaded, "lines") == {
        "nn_linear::quant_accuracy[tiny]": {0},
        "nn_linear::circle_structure[tiny]": {0, 1},
        "nn_linear::lifecycle[tiny]": set(),
    }
    item_map.write(PER_ITEM, tmp_path / "old.json", {})
    assert item_map.item_reach(item_map.load(tmp_path / "old.json"), "lines") is None
