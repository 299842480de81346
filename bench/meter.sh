#!/usr/bin/env bash
# Meter benchmark (issue: durable metering >= 25,000 req/s, p99 <= 10 ms): starts
# `diverge serve --sandbox-provider none` on a free port with a fresh data dir, creates
# TASKS Active tasks with large budgets, then runs wrk (64 connections, 2 threads,
# DURATION s) against /healthz and the meter, each call with a unique requestId.
# The reference of the same run: the minimal group-commit prototype (bench/meter_proto:
# one SQLite transaction per batch, fsync'd, a keyed table of request ids, no tokens or
# budgets) on a fresh file in the same data dir's file system, the same wrk script; the
# script prints ours/prototype. PROTO=0 skips it.
# AB=<other build dir>: after the usual runs, starts a second server from that build (fresh
# data dir, same tasks) and meters both at the same time (one wrk each, CONNECTIONS each):
# on a shared box both see the same load, so "this / other" moves far less between runs
# than either's ratio to the prototype.
# usage: bench/meter.sh [build-dir]    env: DURATION (10), CONNECTIONS (64), TASKS (64), PROTO (1), AB
set -euo pipefail
build=${1:-build}
root=$(cd "$(dirname "$0")/.." && pwd)
dur=${DURATION:-10}
conns=${CONNECTIONS:-64}
ntasks=${TASKS:-64}
bin=$build/diverge; [[ $build = /* ]] || bin=$root/$build/diverge
command -v wrk >/dev/null || { echo "bench: installing wrk" >&2; apt-get install -y -qq wrk >/dev/null; }
out=$(mktemp)
export TOKENS_FILE=$(mktemp)
pids=()
datas=()
trap 'kill ${pids[*]} 2>/dev/null; wait ${pids[*]} 2>/dev/null; rm -rf ${datas[*]} "$out"* "$TOKENS_FILE"*' EXIT
# usage: start_server BINARY TOKENS_OUT -> sets srv_pid, url, tok, api, data (TASKS tasks
# created, each one's meter token a line of TOKENS_OUT)
start_server() {
    local log=$out.$RANDOM
    data=$(mktemp -d)
    datas+=("$data")
    "$1" serve --listen 127.0.0.1:0 --data-dir "$data" --sandbox-provider none \
        --log-format json >"$log" 2>/dev/null &
    srv_pid=$!
    pids+=("$srv_pid")
    for _ in $(seq 100); do grep -q "admin token" "$log" 2>/dev/null && break; sleep 0.05; done
    url=$(grep -o 'http://127.0.0.1:[0-9]*' "$log" | head -n 1)
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
        echo "$t" >>"$2"
    done
}
start_server "$bin" "$TOKENS_FILE"
pid=$srv_pid
# Server CPU (user+system, all threads) in µs per call over a wrk run: robust to a shared
# box, where req/s mostly measures what the other jobs leave.
hz=$(getconf CLK_TCK)
ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo -1; }
# usage: per_call TICKS_BEFORE TICKS_AFTER REQ_PER_S ("?" when the process was gone)
per_call() { awk -v a="$1" -v b="$2" -v hz="$hz" -v r="$3" -v d="$dur" 'BEGIN { if (a >= 0 && b >= 0 && r > 0) printf "%.1f", (b - a) * 1e6 / hz / (r * d); else print "?" }'; }
proto_rps=
proto_us=
if [ "${PROTO:-1}" != 0 ]; then
    make -s -C "$root/bench/meter_proto" OUT="$data/meter_proto" >/dev/null
    pport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    "$data/meter_proto" "$data/proto.db" "$pport" "$ntasks" >"$out.proto" 2>&1 &
    ppid=$!
    pids+=("$ppid")
    for _ in $(seq 100); do grep -q listening "$out.proto" 2>/dev/null && break; sleep 0.05; done
    seq -f 'm%g' "$ntasks" >"$TOKENS_FILE.proto"
    echo "== reference: minimal group-commit prototype, POST /api/v1/agenttask/meter (${conns} connections, ${dur}s)"
    t0=$(ticks "$ppid")
    res=$(TOKENS_FILE="$TOKENS_FILE.proto" wrk -t2 -c"$conns" -d"${dur}s" --latency -s "$root/bench/meter.lua" "http://127.0.0.1:$pport" | grep -E 'Requests/sec|Latency  |99%|50%|Non-2xx')
    t1=$(ticks "$ppid")
    echo "$res"
    proto_rps=$(echo "$res" | awk '/Requests\/sec/ {print $2}')
    proto_us=$(per_call "$t0" "$t1" "$proto_rps")
    echo "-- prototype CPU: $proto_us us per call"
    echo "-- prototype charged: $(sqlite3 "$data/proto.db" 'SELECT count(*) FROM charges' 2>/dev/null || echo '?') calls"
    kill $ppid 2>/dev/null; wait $ppid 2>/dev/null || true
fi
echo "== machine: $(nproc) cores; server and wrk on the same box; $ntasks Active tasks; load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== GET /healthz (${conns} connections, ${dur}s)"
wrk -t2 -c"$conns" -d"${dur}s" --latency "$url/healthz" | grep -E 'Requests/sec|Latency  |99%|50%'
echo "== POST /api/v1/agenttask/meter, durable (${conns} connections, ${dur}s)"
t0=$(ticks "$pid")
res=$(wrk -t2 -c"$conns" -d"${dur}s" --latency -s "$root/bench/meter.lua" "$url" | grep -E 'Requests/sec|Latency  |99%|50%|Non-2xx')
t1=$(ticks "$pid")
echo "$res"
ours_us=$(per_call "$t0" "$t1" "$(echo "$res" | awk '/Requests\/sec/ {print $2}')")
echo "-- server CPU: $ours_us us per call"
if [ -n "$proto_rps" ]; then
    echo "== ours / prototype: $(echo "$res" | awk -v p="$proto_rps" '/Requests\/sec/ {printf "%.2fx", $2 / p}') (req/s); CPU per call $(awk -v a="$ours_us" -v b="$proto_us" 'BEGIN { if (a > 0 && b > 0) printf "%.2fx", a / b; else print "?" }') the prototype's"
fi
curl -s "$url/metrics" >"$out.metrics"
echo "== charged: $(curl -s -H "Authorization: Bearer $tok" "$api" | python3 -c 'import json,sys; print(sum(i["status"]["tokensConsumed"] for i in json.load(sys.stdin)["items"])//150)') meter calls"
rm -f "$out.metrics"
if [ -n "${AB:-}" ]; then
    obin=$AB/diverge; [[ $AB = /* ]] || obin=$root/$AB/diverge
    # Two fresh servers (neither has the ids of the runs above), this build's first.
    start_server "$bin" "$TOKENS_FILE.a"
    apid=$srv_pid aurl=$url
    start_server "$obin" "$TOKENS_FILE.b"
    bpid=$srv_pid burl=$url
    echo "== A/B: $build and $AB metered at the same time (${conns} connections each, ${dur}s); load average $(cut -d' ' -f1-3 /proc/loadavg)"
    a0=$(ticks "$apid") b0=$(ticks "$bpid")
    TOKENS_FILE="$TOKENS_FILE.a" wrk -t2 -c"$conns" -d"${dur}s" --latency -s "$root/bench/meter.lua" "$aurl" >"$out.a" &
    wa=$!
    TOKENS_FILE="$TOKENS_FILE.b" wrk -t2 -c"$conns" -d"${dur}s" --latency -s "$root/bench/meter.lua" "$burl" >"$out.b" &
    wb=$!
    wait $wa $wb
    a1=$(ticks "$apid") b1=$(ticks "$bpid")
    arps=$(awk '/Requests\/sec/ {print $2}' "$out.a")
    brps=$(awk '/Requests\/sec/ {print $2}' "$out.b")
    aus=$(per_call "$a0" "$a1" "$arps")
    bus=$(per_call "$b0" "$b1" "$brps")
    echo "-- $build: $arps req/s, p99 $(awk '/ 99%/ {print $2}' "$out.a"), server CPU $aus us per call$(grep -h 'Non-2xx' "$out.a" || true)"
    echo "-- $AB: $brps req/s, p99 $(awk '/ 99%/ {print $2}' "$out.b"), server CPU $bus us per call$(grep -h 'Non-2xx' "$out.b" || true)"
    echo "== $build / $AB: $(awk -v a="$arps" -v b="$brps" 'BEGIN { if (b > 0) printf "%.3fx", a / b; else print "?" }') (req/s); CPU per call $(awk -v a="$aus" -v b="$bus" 'BEGIN { if (a > 0 && b > 0) printf "%.3fx", a / b; else print "?" }')"
fi
