#!/usr/bin/env bash
# Meter benchmark (issue: durable metering >= 25,000 req/s, p99 <= 10 ms): starts
# `diverge serve --sandbox-provider none` on a free port with a fresh data dir, creates
# TASKS Active tasks with large budgets, then runs wrk (64 connections, 2 threads,
# DURATION s) against /healthz and the meter, each call with a unique requestId.
# usage: bench/meter.sh [build-dir]    env: DURATION (10), CONNECTIONS (64), TASKS (64)
set -euo pipefail
build=${1:-build}
root=$(cd "$(dirname "$0")/.." && pwd)
dur=${DURATION:-10}
conns=${CONNECTIONS:-64}
ntasks=${TASKS:-64}
bin=$build/diverge; [[ $build = /* ]] || bin=$root/$build/diverge
command -v wrk >/dev/null || { echo "bench: installing wrk" >&2; apt-get install -y -qq wrk >/dev/null; }
data=$(mktemp -d)
out=$(mktemp)
export TOKENS_FILE=$(mktemp)
"$bin" serve --listen 127.0.0.1:0 --data-dir "$data" --sandbox-provider none \
    --log-format json >"$out" 2>/dev/null &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$data" "$out" "$TOKENS_FILE"' EXIT
for _ in $(seq 100); do grep -q "admin token" "$out" 2>/dev/null && break; sleep 0.05; done
url=$(grep -o 'http://127.0.0.1:[0-9]*' "$out" | head -n 1)
tok=$(cat "$data/api-token")
api="$url/apis/divergedev.com/v1alpha1/namespaces/bench/agenttasks"
for i in $(seq "$ntasks"); do
    curl -sf -o /dev/null -X POST -H "Authorization: Bearer $tok" -H 'Content-Type: application/json' \
        -d "{\"metadata\":{\"name\":\"m$i\"},\"spec\":{\"objective\":\"bench\",\"budgetUSD\":\"1000000.00\",\"budgetTokens\":100000000000,\"capabilities\":[\"claude-*\"]}}" "$api"
done
for i in $(seq "$ntasks"); do
    for _ in $(seq 100); do
        t=$(curl -sf -H "Authorization: Bearer $tok" "$api/m$i/token" || true)
        [ -n "$t" ] && break
        sleep 0.02
    done
    echo "$t" >>"$TOKENS_FILE"
done
echo "== machine: $(nproc) cores; server and wrk on the same box; $ntasks Active tasks"
echo "== GET /healthz (${conns} connections, ${dur}s)"
wrk -t2 -c"$conns" -d"${dur}s" --latency "$url/healthz" | grep -E 'Requests/sec|Latency  |99%|50%'
echo "== POST /api/v1/agenttask/meter, durable (${conns} connections, ${dur}s)"
wrk -t2 -c"$conns" -d"${dur}s" --latency -s "$root/bench/meter.lua" "$url" | grep -E 'Requests/sec|Latency  |99%|50%|Non-2xx'
curl -s "$url/metrics" >"$out.metrics"
echo "== charged: $(curl -s -H "Authorization: Bearer $tok" "$api" | python3 -c 'import json,sys; print(sum(i["status"]["tokensConsumed"] for i in json.load(sys.stdin)["items"])//150)') meter calls"
rm -f "$out.metrics"
