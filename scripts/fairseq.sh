#!/usr/bin/env bash
# The optional fairseq profile (cases/fairseq.py, cases/fairseq_models.py): tico's wrappers for fairseq's
# own Transformer modules, on real fairseq modules. fairseq lives in its own thin venv, .venv-fairseq, which puts fairseq and its
# dependencies (requirements-fairseq.txt) in front of .venv's packages; .venv itself never sees fairseq.
#   ./scripts/fairseq.sh install          # build/reuse .venv, then .venv-fairseq
#   ./scripts/fairseq.sh check            # exit 0 when the profile can run, else print why
#   ./scripts/fairseq.sh run [pytest args]  # pytest --profile fairseq in .venv-fairseq (add other profiles freely)
# fairseq is taken from the fairseq-fixed 0.12.3.1 sdist (fairseq 0.12.2 does not import on Python 3.11):
# its Python package is unpacked, not built, because its setup compiles extensions fairseq.modules never uses.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
if [ -n "${WRAPQ_TICO:-}" ]; then
    echo "[fairseq] WRAPQ_TICO is not supported here: .venv-fairseq stacks on .venv's pinned tico" >&2
    exit 2
fi
venv="$root/.venv-fairseq"
sdist="fairseq_fixed-0.12.3.1.tar.gz"
sdist_sha256="c607577a54ab30e2ee0f0b0a754ea5cdbc6ad0a9f99a1726638a2201445bc1cc"
pip_quiet=(--quiet --disable-pip-version-check)
probe='from harness.model import fairseq_extra as f; import sys; r = f.unavailable_reason(); print(r or "fairseq: ready, " + f.where()); sys.exit(1 if r else 0)'

install() {
    ./scripts/env.sh true
    # .venv's own stamp too: a rebuilt .venv (new pins) rebuilds the venv stacked on it
    stamp="$(cat requirements-fairseq.txt .venv/.wrapq-stamp | sha256sum | cut -d' ' -f1)-$sdist_sha256"
    if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.wrapq-stamp" 2>/dev/null)" = "$stamp" ]; then
        return 0
    fi
    echo "[fairseq] building $venv" >&2
    rm -rf "$venv"
    python3.11 -m venv "$venv"
    local site base_site work
    site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    base_site="$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    "$venv/bin/pip" install "${pip_quiet[@]}" --no-deps -c constraints.txt -r requirements-fairseq.txt
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' RETURN
    # Without build isolation: pip's isolated metadata build would install an unpinned torch (a CUDA
    # build) just to read the sdist's metadata; .venv has the torch and setuptools its setup.py imports.
    .venv/bin/pip download "${pip_quiet[@]}" --no-deps --no-build-isolation "fairseq-fixed==0.12.3.1" -d "$work"
    echo "$sdist_sha256  $work/$sdist" | sha256sum --check --quiet
    tar -xzf "$work/$sdist" -C "$work"
    cp -r "$work/fairseq_fixed-0.12.3.1/fairseq" "$site/fairseq"
    # .venv's packages (and their .pth files: the harness is installed editable) after fairseq's.
    echo "import site; site.addsitedir('$base_site')" > "$site/zz_wrapq_pinned_stack.pth"
    printf '#!%s\nimport sys\nfrom pytest import console_main\nsys.exit(console_main())\n' \
        "$venv/bin/python" > "$venv/bin/pytest"
    chmod +x "$venv/bin/pytest"
    echo "$stamp" > "$venv/.wrapq-stamp"
}

case "${1:-install}" in
    install)
        install
        "$venv/bin/python" -c "$probe"
        ;;
    check)
        if [ ! -x "$venv/bin/python" ]; then
            echo "fairseq: $venv does not exist; run ./scripts/fairseq.sh install"; exit 1
        fi
        "$venv/bin/python" -c "$probe"
        ;;
    run)
        shift
        install
        PATH="$venv/bin:$PATH" "$venv/bin/pytest" --profile fairseq "$@"
        ;;
    *)
        echo "usage: $0 [install|check|run [pytest args]]" >&2; exit 2 ;;
esac
