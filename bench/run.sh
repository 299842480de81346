#!/usr/bin/env bash
# Task-API benchmark: starts `diverge serve` on a free loopback port with a fresh data dir,
# then runs wrk (64 connections, 2 threads, DURATION seconds) against /healthz, task create
# (durable: fsync'd before 201) and task get. Prints wrk's summaries.
# usage: bench/run.sh [build-dir]      env: DURATION (default 10), CONNECTIONS (default 64)
set -euo pipefail
build=${1:-build}
root=$(cd "$(dirname "$0")/.." && pwd)
dur=${DURATION:-10}
conns=${CONNECTIONS:-64}
command -v wrk >/dev/null || { echo "bench: installing wrk" >&2; apt-get install -y -qq wrk >/dev/null; }
data=$(mktemp -d)
out=$(mktemp)
bin=$build/diverge; [[ $build = /* ]] || bin=$root/$build/diverge
"$bin" serve --listen 127.0.0.1:0 --data-dir "$data" --log-format json \
    >"$out" 2>/dev/null &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$data" "$out"' EXIT
for _ in $(seq 100); do grep -q "admin token" "$out" 2>/dev/null && break; sleep 0.05; done
url=$(grep -o 'http://127.0.0.1:[0-9]*' "$out" | head -n 1)
export DIVERGE_API_TOKEN=$(cat "$data/api-token")
curl -sf -o /dev/null -X POST -H "Authorization: Bearer $DIVERGE_API_TOKEN" \
    -H 'Content-Type: application/json' \
    -d '{"metadata":{"name":"bench-get"},"spec":{"objective":"get target"}}' \
    "$url/apis/divergedev.com/v1alpha1/namespaces/bench/agenttasks"
echo "== machine: $(nproc) cores, $(uname -r); server and wrk on the same box"
echo "== GET /healthz (${conns} connections, ${dur}s)"
wrk -t2 -c"$conns" -d"${dur}s" --latency "$url/healthz" | grep -E 'Requests/sec|Latency|99%|50%'
echo "== POST agenttasks (create, durable) (${conns} connections, ${dur}s)"
wrk -t2 -c"$conns" -d"${dur}s" --latency -s "$root/bench/create.lua" "$url" | grep -E 'Requests/sec|Latency|99%|50%|Non-2xx'
echo "== GET agenttasks/{name} (${conns} connections, ${dur}s)"
wrk -t2 -c"$conns" -d"${dur}s" --latency -s "$root/bench/get.lua" "$url" | grep -E 'Requests/sec|Latency|99%|50%|Non-2xx'
echo "== tasks stored: $(curl -s -H "Authorization: Bearer $DIVERGE_API_TOKEN" "$url/apis/divergedev.com/v1alpha1/namespaces/bench/agenttasks" | grep -o '"kind":"AgentTask"' | wc -l)"
