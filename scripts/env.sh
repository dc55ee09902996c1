#!/usr/bin/env bash
# Create or reuse .venv from the pinned files, then run the given command inside it (pytest with
# this project's pyproject.toml as its config, wherever its path arguments point).
#
# .venv is rebuilt only when the dependency declarations change: constraints.txt and the
# [project]/[build-system] tables of pyproject.toml (not pytest's settings).
#
# WRAPQ_TICO=<tico source> runs the command on another tico, everything else pinned as in .venv:
#   WRAPQ_TICO=/path/to/TICO           a checkout (installed editable) or a plain tree holding tico/
#   WRAPQ_TICO=/path/to/tico-X.whl     a wheel file
#   WRAPQ_TICO=0.4.0.dev261026         a release or nightly from the package index (--pre allowed)
# Each source gets its own thin venv under .venv-tico/ that puts the tico under review in front
# of .venv's packages; results.json records which tico ran (harness/tico_facts/tico_identity.py).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
pip_quiet=(--quiet --disable-pip-version-check)
deps_stamp="$( { python3.11 - <<'PY'
import json, tomllib
d = tomllib.load(open("pyproject.toml", "rb"))
print(json.dumps([d["build-system"], d["project"].get("dependencies"), d["project"].get("optional-dependencies"),
                  d["project"].get("entry-points")], sort_keys=True))
PY
cat constraints.txt; } | sha256sum | cut -d' ' -f1)"
if [ ! -x .venv/bin/python ] || [ "$(cat .venv/.wrapq-stamp 2>/dev/null)" != "$deps_stamp" ]; then
    echo "[env] building .venv from constraints.txt" >&2
    rm -rf .venv
    python3.11 -m venv .venv
    # torch first: pinned to the CPU wheel so nothing pulls a CUDA build.
    .venv/bin/pip install "${pip_quiet[@]}" -c constraints.txt torch==2.13.0
    .venv/bin/pip install "${pip_quiet[@]}" -c constraints.txt -e ".[dev]"
    echo "$deps_stamp" > .venv/.wrapq-stamp
fi
venv="$root/.venv"
if [ -n "${WRAPQ_TICO:-}" ]; then
    source_spec="$WRAPQ_TICO"
    if [ -d "$source_spec" ]; then
        source_dir="$(cd "$source_spec" && pwd)"
        [ "$(basename "$source_dir")" = tico ] && [ -f "$source_dir/__init__.py" ] && source_dir="$(dirname "$source_dir")"
        if [ ! -f "$source_dir/tico/__init__.py" ]; then
            echo "[env] WRAPQ_TICO=$source_spec: no tico/__init__.py there (give a TICO checkout or a tree holding tico/)" >&2
            exit 2
        fi
        key="dir:$source_dir"
    elif [ -f "$source_spec" ] && [[ "$source_spec" == *.whl ]]; then
        source_file="$(cd "$(dirname "$source_spec")" && pwd)/$(basename "$source_spec")"
        export WRAPQ_TICO_WHEEL_SHA256="$(sha256sum "$source_file" | cut -d' ' -f1)"
        key="wheel:$WRAPQ_TICO_WHEEL_SHA256"
    elif [[ "$source_spec" =~ ^[0-9][0-9A-Za-z.+!-]*$ ]]; then
        key="version:$source_spec"
    else
        echo "[env] WRAPQ_TICO=$source_spec is neither a directory, a .whl file nor a version" >&2
        exit 2
    fi
    venv="$root/.venv-tico/$(printf '%s\n%s' "$key" "$deps_stamp" | sha256sum | cut -c1-16)"
    if [ ! -x "$venv/bin/python" ] || [ "$(cat "$venv/.wrapq-source" 2>/dev/null)" != "$key" ]; then
        echo "[env] building $venv for tico from $source_spec" >&2
        rm -rf "$venv"
        # No pip of its own (ensurepip is most of a venv's build time): .venv's pip installs into it.
        python3.11 -m venv --without-pip "$venv"
        pip_into=(.venv/bin/pip --python "$venv/bin/python" install "${pip_quiet[@]}" --no-deps)
        site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
        base_site="$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
        case "$key" in
            dir:*)
                if [ -f "$source_dir/pyproject.toml" ] || [ -f "$source_dir/setup.py" ]; then
                    "${pip_into[@]}" -e "$source_dir"
                fi
                # The tree itself first on the path, whatever the editable install's mechanism.
                echo "$source_dir" > "$site/00_wrapq_tico_under_review.pth" ;;
            wheel:*) "${pip_into[@]}" "$source_file" ;;
            version:*) "${pip_into[@]}" --pre "tico==$source_spec" ;;
        esac
        # .venv's packages (and their .pth files: the harness is installed editable) after the tico.
        echo "import site; site.addsitedir('$base_site')" > "$site/zz_wrapq_pinned_stack.pth"
        printf '#!%s\nimport sys\nfrom pytest import console_main\nsys.exit(console_main())\n' \
            "$venv/bin/python" > "$venv/bin/pytest"
        chmod +x "$venv/bin/pytest"
        echo "$key" > "$venv/.wrapq-source"
    fi
    export WRAPQ_TICO
fi
export PATH="$venv/bin:$PATH"
# pytest takes its rootdir, and so its config, from the common directory of its path arguments, a
# path option's value given as '--opt DIR' among them: a case file or a tico beside the project would
# drop this project's pyproject.toml. Name it, so path arguments and options work in either form.
if [ "${1:-}" = pytest ]; then
    shift
    set -- pytest --config-file="$root/pyproject.toml" "$@"
fi
exec "$@"
