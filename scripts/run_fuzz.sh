#!/usr/bin/env bash
# Runs every libFuzzer target in BUILD_DIR/tests for SECONDS each, seeded from
# tests/fuzz/corpus/<target>/ (copied, so the committed seeds are never modified).
set -euo pipefail
build=${1:-build-fuzz}
secs=${2:-10}
root=$(cd "$(dirname "$0")/.." && pwd)
shopt -s nullglob
targets=("$build"/tests/fuzz_*)
if [ "${#targets[@]}" -eq 0 ]; then
    echo "run_fuzz: no fuzz targets in $build/tests" >&2
    exit 1
fi
for t in "${targets[@]}"; do
    name=$(basename "$t")
    work=$(mktemp -d)
    if [ -d "$root/tests/fuzz/corpus/$name" ]; then
        cp -r "$root/tests/fuzz/corpus/$name/." "$work/"
    fi
    echo "fuzz: $name for ${secs}s"
    if ! "$t" -max_total_time="$secs" -rss_limit_mb=2048 -print_final_stats=0 "$work" \
        >"$work.log" 2>&1; then
        tail -n 40 "$work.log" >&2
        echo "fuzz: $name FAILED" >&2
        exit 1
    fi
    grep -E '^#[0-9]+.*DONE' "$work.log" | tail -n 1 || true
    rm -rf "$work" "$work.log"
done
