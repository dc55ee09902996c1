#!/usr/bin/env bash
# Nightly drift mode: run the case matrix against newer transformers/tico than the pinned gate.
#
#   scripts/drift.sh                         # newest transformers and tico on PyPI
#   scripts/drift.sh 5.24.0                  # a given transformers, newest tico
#   scripts/drift.sh 5.24.0 0.3.0 -k qwen3   # given versions; the rest goes to pytest
#
# Builds .venv-drift (torch stays at the pinned CPU wheel: drift is about the HF/tico stack),
# then runs `pytest -n auto --drift`: every failure is reported as drift with the versions that
# moved, the error and what the findings data explains it by: a known finding, a tico change the
# case must follow, or nothing known (terminal section "wrapq drift", reports/drift/results.json).
# To judge one tico build (a nightly, a checkout) with everything else pinned, use WRAPQ_TICO
# (docs/tico-under-review.md): a finding fixed there is reported fixed, not as drift.
# Exit status is pytest's: non-zero when anything drifted.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
transformers_version="${1:-}"; [ $# -gt 0 ] && shift
tico_version="${1:-}"; [ $# -gt 0 ] && shift
venv=.venv-drift
rm -rf "$venv"
python3.11 -m venv "$venv"
pip=("$venv/bin/pip" install --quiet --disable-pip-version-check)
# Pins for everything but the drifting stack, so only what is under test moves.
grep -viE '^(transformers|tico|tokenizers|huggingface[-_]hub|hf-xet|safetensors)==' constraints.txt > "$venv/pins.txt"
"${pip[@]}" -c "$venv/pins.txt" torch==2.13.0
"${pip[@]}" -c "$venv/pins.txt" --no-deps -e .
"${pip[@]}" -c "$venv/pins.txt" pytest pytest-xdist tabulate jinja2 numpy packaging
"${pip[@]}" -c "$venv/pins.txt" --upgrade \
    "transformers${transformers_version:+==$transformers_version}" "tico${tico_version:+==$tico_version}" safetensors
"$venv/bin/python" -c 'import importlib.metadata as m; print("[drift] transformers", m.version("transformers"), "tico", m.version("tico"))'
# Every program traced afresh: a drift run is exactly where reuse must not be trusted.
exec "$venv/bin/python" -m pytest -n auto --drift --no-export-cache --wrapq-report-dir reports/drift "$@"
