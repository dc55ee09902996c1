"""Merge results.json files from CI matrix shards into one results.json and report.html.

    python -m harness merge shard1/results.json shard2/results.json -o reports/results.json

Refuses shards of different commits, golden sets or testbeds (their numbers are not
comparable: the history keys every series by the testbed the run records, so a merged run on
two testbeds would file one shard's numbers under the other's), and node ids reported by more
than one shard, unless --allow-mixed is given. A mixed merge records no single platform; each
shard's stays in ``merged_from``.
"""

from __future__ import annotations

from typing import Any

from harness.report.history_store import testbed_id, testbed_label


class MergeError(ValueError):
    pass


def merge(docs: list[dict[str, Any]], *, allow_mixed: bool = False) -> dict[str, Any]:
    if not docs:
        raise MergeError("nothing to merge")
    runs = [d.get("run", {}) for d in docs]
    for field in ("commit", "golden_set"):
        values = {r.get(field) for r in runs}
        if len(values) > 1 and not allow_mixed:
            raise MergeError(
                f"shards differ in {field}: {sorted(map(str, values))}; pass --allow-mixed to merge anyway"
            )
    testbeds = {testbed_id(r.get("platform")): testbed_label(r.get("platform")) for r in runs}
    if len(testbeds) > 1 and not allow_mixed:
        raise MergeError(
            f"shards ran on different testbeds: {sorted(testbeds.values())}; their float bits differ, "
            f"so merging them would file one shard's numbers under the other's testbed (pass "
            f"--allow-mixed to merge anyway; the merged run then records no platform)"
        )
    shards = [r.get("shard") for r in runs]
    if any(shards) and not allow_mixed:
        _check_complete_partition(shards)
    seen: dict[str, int] = {}
    results = []
    for i, doc in enumerate(docs):
        for rec in doc.get("results", []):
            if rec["nodeid"] in seen and not allow_mixed:
                raise MergeError(f"{rec['nodeid']} appears in shard {seen[rec['nodeid']]} and shard {i}")
            seen[rec["nodeid"]] = i
            results.append(rec)
    results.sort(key=lambda r: r["nodeid"])
    counts: dict[str, int] = {}
    for rec in results:
        counts[rec["outcome"]] = counts.get(rec["outcome"], 0) + 1
    first = runs[0]
    run = dict(first)
    run.update(
        {
            "started_at": min(r.get("started_at", "") for r in runs),
            "duration_s": max(float(r.get("duration_s") or 0) for r in runs),
            "exitstatus": max(int(r.get("exitstatus") or 0) for r in runs),
            "counts": counts,
            "argv": [],
            # every check any shard declared (shards of one run declare the same ones)
            "checks": {name: meta for r in runs for name, meta in (r.get("checks") or {}).items()},
            "merged_from": [
                {k: r.get(k) for k in ("started_at", "duration_s", "exitstatus", "argv", "counts", "shard", "platform")}
                for r in runs
            ],
        }
    )
    if len(testbeds) > 1:
        run["platform"] = None
    return {"schema": docs[0].get("schema"), "run": run, "results": results}


def _check_complete_partition(labels: list[str | None]) -> None:
    """Shards of one run are 1/n .. n/n, each once: a missing or repeated shard is lost or
    double-counted work, so it is refused rather than merged."""
    parsed = []
    for label in labels:
        if not label or "/" not in label:
            raise MergeError(f"a sharded run cannot be merged with an unsharded one (shard labels: {labels})")
        index, count = (int(x) for x in label.split("/"))
        parsed.append((index, count))
    counts = {count for _, count in parsed}
    if len(counts) != 1:
        raise MergeError(f"shards come from different splits: {sorted(labels)}")
    (count,) = counts
    indices = sorted(index for index, _ in parsed)
    if indices != list(range(1, count + 1)):
        missing = sorted(set(range(1, count + 1)) - set(indices))
        repeated = sorted({i for i in indices if indices.count(i) > 1})
        raise MergeError(f"incomplete shard set for n={count}: missing {missing}, repeated {repeated}")
