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
    assert circle.per_item and circle.units == {"nn_linear[tiny]::circle_structure"}
    assert [str(r) for r in circle.reasons] == [f"{CONVERT} -> 1 item(s)"]
    forward = select([Change(LINEAR, FUNCTION, "QuantLinear.forward")], PER_ITEM)
    assert forward.units == {"nn_linear[tiny]::quant_accuracy", "nn_linear[tiny]::circle_structure"}
    assert select([Change(LINEAR, FUNCTION, "QuantLinear.__init__")], PER_ITEM).units == {"nn_linear[tiny]::lifecycle"}
    assert select([Change(LINEAR, MODULE)], PER_ITEM).units == {
        f"nn_linear[tiny]::{c}" for c in PER_ITEM["checks"]["nn_linear[tiny]"]
    }
