#!/usr/bin/env bash
# Server start with many stored tasks: what the store's load at open costs (the SQLite
# store keeps every task's text in memory to answer GET and list). Seeds a fresh data dir
# with about TASKS tasks (wrk, 64 connections, bench/create.lua), stops the server, then
# starts it RUNS times on that data dir: per start, the seconds from exec to a /healthz
# answer, the server's RSS then, and how many tasks one list returns.
# usage: bench/start_with_tasks.sh [build-dir] [reference-build-dir]
#   (with a reference, its starts alternate with the build's on the same data dir)
# env: TASKS (default 50000), RUNS (default 4)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
binary() { if [[ $1 = /* ]]; then echo "$1/diverge"; else echo "$root/$1/diverge"; fi; }
bins=("$(binary "${1:-build}")")
[ $# -ge 2 ] && bins+=("$(binary "$2")")
tasks=${TASKS:-50000}
runs=${RUNS:-4}
for b in "${bins[@]}"; do [ -x "$b" ] || { echo "bench: $b not found" >&2; exit 1; }; done
command -v wrk >/dev/null || { echo "bench: installing wrk" >&2; apt-get install -y -qq wrk >/dev/null; }
data=$(mktemp -d)
out=$(mktemp)
pid=
trap '[ -n "$pid" ] && kill $pid 2>/dev/null; rm -rf "$data" "$out"' EXIT

start() { # start BINARY: sets pid, url, and ms (from exec to a /healthz answer)
    local t0 t1
    : >"$out"
    t0=$(date +%s%N)
    "$1" serve --listen 127.0.0.1:0 --data-dir "$data" --log-format json >"$out" 2>/dev/null &
    pid=$!
    url=
    for _ in $(seq 6000); do
        [ -z "$url" ] && url=$(grep -o 'http://127.0.0.1:[0-9]*' "$out" 2>/dev/null | head -n 1 || true)
        [ -n "$url" ] && curl -sf -o /dev/null "$url/healthz" && break
        sleep 0.005
    done
    t1=$(date +%s%N)
    ms=$(((t1 - t0) / 1000000))
}
stop() { kill "$pid"; wait "$pid" 2>/dev/null || true; pid=; }

start "${bins[0]}"
export DIVERGE_API_TOKEN=$(cat "$data/api-token")
# About 2,000 creates a second on 2 cores: run wrk until TASKS are stored.
secs=$(((tasks + 1499) / 1500))
wrk -t2 -c64 -d"${secs}s" -s "$root/bench/create.lua" "$url" >/dev/null
stop
echo "== machine: $(nproc) cores, $(uname -r); database $(du -m "$data/diverge.db" | cut -f1) MB"
for r in $(seq "$runs"); do
    for b in "${bins[@]}"; do
        start "$b"
        rss=$(awk '/VmRSS/ {print $2}' "/proc/$pid/status")
        n=$(curl -s -H "Authorization: Bearer $DIVERGE_API_TOKEN" \
            "$url/apis/divergedev.com/v1alpha1/agenttasks" | grep -o '"kind":"AgentTask"' | wc -l)
        stop
        echo "   start $r, $b: ready in $ms ms, RSS $((rss / 1024)) MB, $n tasks listed"
    done
done
