#!/usr/bin/env bash
# Rewrite golden/item-map/pinned-tico.json.gz, the per-item map --select-changed reads by default: the
# PR gate's matrix on the pinned tico, caches off, measured per item group (--tico-coverage). Run it
# when the pinned tico, a case or a check changes what items run (a group the map lacks runs on
# every change until then). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ -n "${WRAPQ_TICO:-}" ]; then
    echo "refresh-item-map: the committed map is the pinned tico's; unset WRAPQ_TICO" >&2
    exit 2
fi
report=reports/item-map
./scripts/env.sh pytest -n auto --tico-coverage "--wrapq-report-dir=$report" "$@"
mkdir -p golden/item-map
# -n: no name or time stamp in the archive, so the same map is the same bytes
gzip -9 -n -c "$report/tico-coverage/item-map.json" > golden/item-map/pinned-tico.json.gz
echo "golden/item-map/pinned-tico.json.gz: $(wc -c < golden/item-map/pinned-tico.json.gz) bytes"
