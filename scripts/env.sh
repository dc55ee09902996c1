#!/usr/bin/env bash
# Create or reuse .venv from the pinned files, then run the given command inside it.
# The venv is rebuilt whenever pyproject.toml or constraints.txt change (stamp = their hash).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
stamp_want="$(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)"
stamp_file=".venv/.wrapq-stamp"
if [ ! -x .venv/bin/python ] || [ "$(cat "$stamp_file" 2>/dev/null)" != "$stamp_want" ]; then
    echo "[env] building .venv from constraints.txt" >&2
    rm -rf .venv
    python3.11 -m venv .venv
    # torch first: pinned to the CPU wheel so nothing pulls a CUDA build.
    .venv/bin/pip install --quiet --disable-pip-version-check -c constraints.txt torch==2.13.0
    .venv/bin/pip install --quiet --disable-pip-version-check -c constraints.txt -e .
    echo "$stamp_want" > "$stamp_file"
fi
export PATH="$root/.venv/bin:$PATH"
exec "$@"
