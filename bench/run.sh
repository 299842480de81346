#!/usr/bin/env bash
# Task-API benchmark: starts `diverge serve` on a free loopback port with a fresh data dir,
# then runs wrk (64 connections, 2 threads, DURATION seconds) against /healthz, task create
# (durable: fsync'd before 201) and task get. Then reads under write load (issue 8): GET
# with READ_CONNECTIONS while the create benchmark runs (and the controller writes), and
# the latency of listing LIST_TASKS tasks of one namespace (LISTS lists, one at a time),
# with the create benchmark running and without. Prints wrk's summaries.
# usage: bench/run.sh [build-dir]      env: DURATION (default 10), CONNECTIONS (default 64),
#        READ_CONNECTIONS (default 8), LIST_TASKS (default 10000), LISTS (default 20)
set -euo pipefail
build=${1:-build}
root=$(cd "$(dirname "$0")/.." && pwd)
dur=${DURATION:-10}
conns=${CONNECTIONS:-64}
rconns=${READ_CONNECTIONS:-8}
export LIST_TASKS=${LIST_TASKS:-10000}
lists=${LISTS:-20}
api=/apis/divergedev.com/v1alpha1
command -v wrk >/dev/null || { echo "bench: installing wrk" >&2; apt-get install -y -qq wrk >/dev/null; }
data=$(mktemp -d)
out=$(mktemp)
bin=$build/diverge; [[ $build = /* ]] || bin=$root/$build/diverge
"$bin" serve --listen 127.0.0.1:0 --data-dir "$data" --log-format json \
    >"$out" 2>/dev/null &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$data" "$out" "$out.create"' EXIT
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
echo "== GET agenttasks/{name} (${rconns} connections) while POST agenttasks runs (${conns} connections, ${dur}s)"
wrk -t1 -c"$conns" -d"${dur}s" --latency -s "$root/bench/create.lua" "$url" >"$out.create" &
wpid=$!
wrk -t1 -c"$rconns" -d"${dur}s" --latency -s "$root/bench/get.lua" "$url" | grep -E 'Requests/sec|Latency|99%|50%|Non-2xx'
wait $wpid
echo "-- the concurrent create:"; grep -E 'Requests/sec|Latency|99%|50%|Non-2xx' "$out.create"
echo "== seeding $LIST_TASKS tasks in namespace list10k"
python3 - "$url" <<'PY'
import http.client, json, os, sys, threading, urllib.parse
u = urllib.parse.urlparse(sys.argv[1])
n, tok = int(os.environ["LIST_TASKS"]), os.environ["DIVERGE_API_TOKEN"]
def work(k):
    c = http.client.HTTPConnection(u.hostname, u.port)
    for i in range(k, n, 16):
        body = json.dumps({"metadata": {"name": "l%05d" % i}, "spec": {
            "objective": "list target", "budgetUSD": "5.00", "budgetTokens": 200000}})
        c.request("POST", "/apis/divergedev.com/v1alpha1/namespaces/list10k/agenttasks", body,
                  {"Authorization": "Bearer " + tok, "Content-Type": "application/json"})
        r = c.getresponse()
        r.read()
        assert r.status == 201, r.status
ts = [threading.Thread(target=work, args=(k,)) for k in range(16)]
[t.start() for t in ts]
[t.join() for t in ts]
PY
list_url="$url$api/namespaces/list10k/agenttasks"
echo "-- items in one list: $(curl -s -H "Authorization: Bearer $DIVERGE_API_TOKEN" "$list_url" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["items"]))'), bytes: $(curl -s -o /dev/null -w '%{size_download}' -H "Authorization: Bearer $DIVERGE_API_TOKEN" "$list_url")"
# LISTS lists one after another; curl's time_total (request sent to last byte read).
list_latency() {
    for _ in $(seq "$lists"); do
        curl -s -o /dev/null -w '%{time_total}\n' -H "Authorization: Bearer $DIVERGE_API_TOKEN" "$list_url"
    done | sort -n | awk '{a[NR] = $1 * 1000} END {
        i99 = int(NR * 0.99); if (i99 < NR * 0.99) i99++;
        printf "   %d lists: p50 %.1f ms, p99 %.1f ms, max %.1f ms\n", NR, a[int((NR + 1) / 2)], a[i99], a[NR] }'
}
echo "== list $LIST_TASKS tasks (GET namespaces/list10k/agenttasks) while POST agenttasks runs (${conns} connections)"
wrk -t1 -c"$conns" -d"${dur}s" -s "$root/bench/create.lua" "$url" >/dev/null &
wpid=$!
sleep 1
list_latency
wait $wpid
echo "== list $LIST_TASKS tasks, no other client (the controller may still be catching up)"
list_latency
echo "== WAL after the run: $(stat -c %s "$data/diverge.db-wal" 2>/dev/null || echo none) bytes"
echo "== tasks stored: $(curl -s -H "Authorization: Bearer $DIVERGE_API_TOKEN" "$url/apis/divergedev.com/v1alpha1/namespaces/bench/agenttasks" | grep -o '"kind":"AgentTask"' | wc -l)"
