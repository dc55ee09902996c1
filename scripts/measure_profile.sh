#!/usr/bin/env bash
# Measure one case at a non-tiny profile for its limits: a native run, then a run under
# ATEN_CPU_CAPABILITY=default with the caches off (another kernel selection, nothing reused), then
# `python -m harness limits` over both. The proposal is printed for review; nothing is written to cases/.
#   ./scripts/measure_profile.sh PROFILE CASE ["-k expression"]
# Reports: reports/<profile>-measure/<case>-native and -scalar (each with results.json, report.html and
# /usr/bin/time's peak RSS in time.txt). The -k expression defaults to the case name; give one when the name
# is a prefix of another case's (e.g. "gemma4_vision_encoder and not gemma4_vision_encoder_layer").
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
profile="${1:?usage: $0 PROFILE CASE [-k expression]}"
case_name="${2:?usage: $0 PROFILE CASE [-k expression]}"
expr="${3:-$case_name}"
out="reports/${profile}-measure/${case_name}"
run() {  # run LABEL [env...]: one pytest run of the case into $out-LABEL; its exit status is reported, not fatal
    local label="$1"; shift
    mkdir -p "$out-$label"
    env "$@" /usr/bin/time -v -o "$out-$label/time.txt" ./scripts/env.sh pytest -n 1 -q -p no:cacheprovider \
        --profile "$profile" -k "$expr" --wrapq-report-dir="$out-$label" "${extra[@]}" > "$out-$label/pytest.txt" 2>&1
    echo "$case_name $label: pytest exit $?, $(grep -E 'Elapsed|Maximum resident' "$out-$label/time.txt" | tr -s ' ' | tr '\n' ';')"
    tail -n 1 "$out-$label/pytest.txt"
}
extra=()
run native
extra=(--no-circle-cache --no-export-cache)
run scalar ATEN_CPU_CAPABILITY=default
./scripts/env.sh python -m harness limits --profile "$profile" "$out-native/results.json" "$out-scalar/results.json"
