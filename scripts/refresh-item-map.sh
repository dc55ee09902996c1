#!/usr/bin/env bash
# Rewrite a per-item map --select-changed reads: the PR gate's matrix, caches off, measured per item
# (--tico-coverage). On the pinned tico it is golden/item-map/pinned-tico.json.gz, the default; with
# WRAPQ_TICO=<a tico> (WRAPQ_TICO=newest: the newest build of tico main, as the nightly does) golden/item-map/tico-<version>.json.gz, which a
# selection reads where its tico is nearer BASE than the pinned one. Run it when the tico, a case or a check
# changes what items run (a group the map lacks runs on every change until then). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ "${WRAPQ_TICO:-}" = newest ]; then  # the newest build of tico main on the package index
    WRAPQ_TICO=$(python3.11 -m pip index versions tico --pre 2>/dev/null | sed -nE '1s/^tico \((.*)\)$/\1/p')
    [ -n "$WRAPQ_TICO" ] || { echo "refresh-item-map: no tico version found on the package index" >&2; exit 2; }
    export WRAPQ_TICO
fi
report=reports/item-map${WRAPQ_TICO:+-other}
status=0
./scripts/env.sh pytest -n auto --tico-coverage "--wrapq-report-dir=$report" "$@" || status=$?
# a red item is a verdict, not a failed measurement (tico main has diagnosed findings); anything else is
if [ "$status" -gt 1 ]; then exit "$status"; fi
if [ -n "${WRAPQ_TICO:-}" ]; then
    version=$(./scripts/env.sh python -c "import importlib.metadata as m; print(m.version('tico'))")
    target=golden/item-map/tico-$version.json.gz
    rm -f golden/item-map/tico-*.json.gz  # one map of tico main: the newest
else
    target=golden/item-map/pinned-tico.json.gz
fi
mkdir -p golden/item-map
# -n: no name or time stamp in the archive, so the same map is the same bytes
gzip -9 -n -c "$report/tico-coverage/item-map.json" > "$target"
echo "$target: $(wc -c < "$target") bytes"
