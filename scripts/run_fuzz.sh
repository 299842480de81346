#!/usr/bin/env bash
# Runs every libFuzzer target in BUILD_DIR/tests for SECONDS each, seeded from
# tests/fuzz/corpus/<target>/ (copied, so the committed seeds are never modified),
# JOBS targets at a time (default: the number of CPUs; each target is one process on one
# core, so every target still gets its SECONDS of a whole core).
set -euo pipefail
build=${1:-build-fuzz}
secs=${2:-10}
jobs=${3:-$(nproc 2>/dev/null || echo 2)}
root=$(cd "$(dirname "$0")/.." && pwd)
shopt -s nullglob
targets=("$build"/tests/fuzz_*)
if [ "${#targets[@]}" -eq 0 ]; then
    echo "run_fuzz: no fuzz targets in $build/tests" >&2
    exit 1
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# One target: its report goes to $out/<name>.log, its exit status to $out/<name>.rc.
one() {
    local t=$1 name work rc=0
    name=$(basename "$t")
    work=$(mktemp -d)
    if [ -d "$root/tests/fuzz/corpus/$name" ]; then
        cp -r "$root/tests/fuzz/corpus/$name/." "$work/"
    fi
    "$t" -max_total_time="$secs" -rss_limit_mb=2048 -print_final_stats=0 "$work" \
        >"$out/$name.log" 2>&1 || rc=$?
    echo "$rc" >"$out/$name.rc"
    rm -rf "$work"
}

echo "fuzz: ${#targets[@]} targets, ${secs}s each, $jobs at a time"
running=0
for t in "${targets[@]}"; do
    if [ "$running" -ge "$jobs" ]; then
        wait -n || true
        running=$((running - 1))
    fi
    one "$t" &
    running=$((running + 1))
done
wait

failed=0
for t in "${targets[@]}"; do
    name=$(basename "$t")
    if [ "$(cat "$out/$name.rc" 2>/dev/null || echo 1)" != 0 ]; then
        tail -n 40 "$out/$name.log" >&2
        echo "fuzz: $name FAILED" >&2
        failed=1
    else
        echo "fuzz: $name $(grep -E '^#[0-9]+.*DONE' "$out/$name.log" | tail -n 1 || true)"
    fi
done
exit "$failed"
