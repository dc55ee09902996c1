"""Longest-first order and --shard i/n: deterministic, balanced by recorded durations, and two
real shards merged give the same results as one run."""

from __future__ import annotations

import json

import pytest

from harness.records import node_ids
from harness.report import shard_merge as merge
from harness.run.scheduling import (
    ShardSpecError,
    assign_shards,
    load_durations,
    longest_first,
    parse_shard,
    write_durations,
)
from tests import preloaded_python
from tests.test_plugin import project, toy_goldens  # noqa: F401 - pytest fixtures

DURATIONS = {"a[tiny]": 30.0, "b[tiny]": 5.0, "c[tiny]": 20.0, "d[tiny]": 12.0, "e[tiny]": 11.0}


def test_parse_shard():
    assert parse_shard("2/4") == (2, 4)
    for bad in ("0/2", "3/2", "1-2", "x/y", "1/0"):
        with pytest.raises(ShardSpecError):
            parse_shard(bad)


def test_longest_first_puts_unknown_groups_first_and_breaks_ties_by_name():
    assert longest_first(["b[tiny]", "new[tiny]", "a[tiny]", "c[tiny]"], DURATIONS) == [
        "new[tiny]",
        "a[tiny]",
        "c[tiny]",
        "b[tiny]",
    ]
    assert longest_first(["y", "x"], {}) == ["x", "y"]


def test_shards_partition_every_group_balanced_and_deterministic():
    groups = list(DURATIONS)
    two = assign_shards(groups, DURATIONS, 2)
    assert set(two) == set(groups) and set(two.values()) == {1, 2}
    loads = [sum(DURATIONS[g] for g, s in two.items() if s == i) for i in (1, 2)]
    assert sorted(loads) == [37.0, 41.0]  # greedy LPT: {a, e} vs {c, d, b}
    assert assign_shards(reversed(groups), DURATIONS, 2) == two  # input order does not matter
    assert sorted(assign_shards(groups, DURATIONS, 7).values()) == [1, 2, 3, 4, 5]


def test_durations_file_round_trip_keeps_groups_not_run(tmp_path):
    path = tmp_path / "durations.json"
    assert load_durations(path) == {}
    path.write_text("not json")
    assert load_durations(path) == {}
    write_durations(path, {"a[tiny]": 3.14159}, {"a[tiny]": 1.0, "old[tiny]": 2.0})
    assert load_durations(path) == {"a[tiny]": 3.14, "old[tiny]": 2.0}


def test_collection_is_longest_first_from_the_durations_file(project):
    (project.path / "case_durations.json").write_text(
        json.dumps({"groups": {"toy_linear[tiny]": 1.0, "toy_future[tiny]": 9.0, "toy_missing[tiny]": 5.0}})
    )
    result = preloaded_python.runpytest(project, "--collect-only", "-q")
    order = []
    for line in result.outlines:
        if "::" in line and (group := node_ids.group_of(line).split("::")[1]) not in order:
            order.append(group)
    assert order == ["toy_future[tiny]", "toy_missing[tiny]", "toy_linear[tiny]"]


def test_two_shards_merged_equal_one_run(project):
    (project.path / "case_durations.json").write_text(
        json.dumps({"groups": {"toy_linear[tiny]": 9.0, "toy_future[tiny]": 1.0, "toy_missing[tiny]": 1.0}})
    )
    preloaded_python.runpytest(project, "-p", "no:xdist", "--wrapq-report-dir", "whole")
    shards = []
    for index in (1, 2):
        result = preloaded_python.runpytest(
            project, "-p", "no:xdist", "--shard", f"{index}/2", "--wrapq-report-dir", f"s{index}"
        )
        assert "deselected" in result.stdout.str()
        shards.append(json.loads((project.path / f"s{index}" / "results.json").read_text()))
    # toy_linear (9 s) alone on one shard, the two 1 s groups on the other.
    assert {r["case"] for r in shards[0]["results"]} == {"toy_linear"}
    assert {r["case"] for r in shards[1]["results"]} == {"toy_future", "toy_missing"}
    assert [s["run"]["shard"] for s in shards] == ["1/2", "2/2"]
    whole = json.loads((project.path / "whole" / "results.json").read_text())
    merged = merge.merge(shards)

    def essence(doc):
        return {r["nodeid"]: (r["outcome"], r.get("metrics"), r.get("message", "")) for r in doc["results"]}

    assert essence(merged) == essence(whole)
    assert merged["run"]["counts"] == whole["run"]["counts"]
    with pytest.raises(merge.MergeError, match=r"missing \[2\]"):
        merge.merge(shards[:1])


def test_record_durations_writes_the_groups_that_ran(project):
    preloaded_python.runpytest(project, "-p", "no:xdist", "-k", "toy_linear", "--record-durations")
    recorded = load_durations(project.path / "case_durations.json")
    assert set(recorded) == {"toy_linear[tiny]"} and recorded["toy_linear[tiny]"] > 0
