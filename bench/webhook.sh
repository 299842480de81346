#!/usr/bin/env bash
# Webhook benchmark (issue: signed 8 KB issue_comment deliveries, ours vs a Node 20 server
# using @octokit/webhooks verifyAndReceive; goal >= 3x Node for comments without a command,
# >= 1.5x for comments with a command, durably in the inbox before 202).
#
# Builds bench/loadgen (a C, epoll, keep-alive load generator that signs a different body
# per request: every comment id and X-GitHub-Delivery is unique), installs the Node
# baseline's pinned dependencies (bench/webhook_node), starts `diverge serve` (no GitHub
# credentials: commands are accepted into the inbox and the bot logs that it cannot
# answer) and the Node server on free loopback ports, then runs, for each server, comments
# without a command (nocmd) and with "/diverge help" (cmd): CONNECTIONS connections,
# THREADS loadgen threads, WARMUP s discarded, then DURATION s measured.
# usage: bench/webhook.sh [build-dir]
# env: DURATION (10), CONNECTIONS (64), THREADS (2), WARMUP (2),
#      PAYLOAD_BYTES (8192; 0 = the untrimmed fixture, about 14 KB), ONLY (ours|node),
#      PERF_DIR (a folder: `perf record` of our server during each of its runs, from 1 s
#      in, written there as ours-nocmd.data and ours-cmd.data; read with perf report -i FILE),
#      PERF_CALLGRAPH (perf record --call-graph; fp, or dwarf,8192 for a build without
#      frame pointers)
set -euo pipefail
build=${1:-build}
root=$(cd "$(dirname "$0")/.." && pwd)
dur=${DURATION:-10}
conns=${CONNECTIONS:-64}
threads=${THREADS:-2}
warm=${WARMUP:-2}
size=${PAYLOAD_BYTES:-8192}
only=${ONLY:-}
secret="bench-webhook-secret-$$"
bin=$build/diverge; [[ $build = /* ]] || bin=$root/$build/diverge
fixture=$root/tests/fixtures/github/DERIVED.issue_comment.created.pr.with-installation.json
nodedir=$root/bench/webhook_node
hook=/api/v1/webhooks/github

[ -x "$bin" ] || { echo "bench: $bin not found (build the project first)" >&2; exit 1; }
command -v node >/dev/null || { echo "bench: node (>= 20) is required" >&2; exit 1; }
nodemajor=$(node -p 'process.versions.node.split(".")[0]')
[ "$nodemajor" -ge 20 ] || { echo "bench: node >= 20 is required, have $(node --version)" >&2; exit 1; }

busy() { # % of all CPUs busy over one second (measured before anything of ours starts)
    local a b
    a=($(head -n 1 /proc/stat)); sleep 1; b=($(head -n 1 /proc/stat))
    awk -v a="${a[*]}" -v b="${b[*]}" 'BEGIN{n = split(a, x); split(b, y); t = 0
        for (i = 2; i <= n; i++) t += y[i] - x[i]; idle = (y[5] - x[5]) + (y[6] - x[6])
        printf "%.0f", t ? 100 * (t - idle) / t : 0}'
}
pre=$(busy)
[ "$pre" -le 10 ] || echo "bench: WARNING: the machine was ${pre}% busy before the benchmark; numbers will be low and noisy" >&2
tmp=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- the load generator (built into the temp dir: nothing lands in the source tree) ---
make -s -C "$root/bench/loadgen" OUT="$tmp/loadgen" CFLAGS="-O2 -Wall -Wextra"
lg=$tmp/loadgen

# --- the Node baseline's dependencies (pinned; node_modules/ is git-ignored) ---
npm_install() {
    local sub=install log=$tmp/npm.log
    [ -f "$nodedir/package-lock.json" ] && sub=ci
    if ! (cd "$nodedir" && npm "$sub" --no-audit --no-fund >"$log" 2>&1); then
        if grep -qiE 'SELF_SIGNED_CERT|certificate|UNABLE_TO_GET_ISSUER' "$log"; then
            echo "bench: npm: TLS interception; retrying with --strict-ssl=false" >&2
            (cd "$nodedir" && npm "$sub" --no-audit --no-fund --strict-ssl=false >"$log" 2>&1) ||
                { cat "$log" >&2; exit 1; }
        else
            cat "$log" >&2; exit 1
        fi
    fi
}
octokit_version() {
    node -e 'try{console.log(JSON.parse(require("fs").readFileSync(process.argv[1])).version)}catch{}' \
        "$nodedir/node_modules/@octokit/webhooks/package.json"
}
want=$(node -e 'console.log(JSON.parse(require("fs").readFileSync(process.argv[1])).dependencies["@octokit/webhooks"])' \
    "$nodedir/package.json")
if [ "$(octokit_version)" != "$want" ]; then
    echo "bench: installing the Node baseline's dependencies (npm)" >&2
    npm_install
fi

# --- the payload template: the real PR comment fixture, compact, comment last ---
# Placeholders: __COMMENT_ID__ (unique per request) and __BODY__ (the comment text). The
# comment object is moved last (JSON key order carries no meaning) so the load generator
# only re-hashes the last block or two of each body. The fixture is about 14 KB compact; to
# reach PAYLOAD_BYTES it drops API URL fields (other than url/html_url) of the objects the
# bot never reads, then pads issue.body.
meta=$(python3 - "$fixture" "$tmp/template.json" "$size" <<'EOF'
import json, sys
fixture, out, target = sys.argv[1], sys.argv[2], int(sys.argv[3])
p = json.load(open(fixture))
c = p.pop("comment")
c.pop("body"); c.pop("id")
c["body"] = "@@BODY@@"; c["id"] = "@@ID@@"
p["comment"] = c
def render(p):
    s = json.dumps(p, separators=(",", ":"), ensure_ascii=False)
    return s.replace('"@@BODY@@"', '"__BODY__"').replace('"@@ID@@"', "__COMMENT_ID__")
def size(p):  # a delivery: 16-digit comment id, "/diverge help"
    return len(render(p).replace("__COMMENT_ID__", "1" * 16).replace("__BODY__", "/diverge help").encode())
dropped = 0
if target:
    for path in (["organization"], ["sender"], ["repository", "owner"], ["repository"],
                 ["issue", "user"], ["comment", "user"], ["installation"]):
        o = p
        for k in path: o = o[k]
        for k in [k for k in o if k.endswith("_url") and k not in ("url", "html_url")]:
            if size(p) <= target: break
            del o[k]; dropped += 1
    if size(p) > target:
        sys.exit(f"bench: cannot trim the fixture to {target} bytes")
    filler = ("This pull request changes the retry policy of the outbox worker and adds tests for "
              "the backoff, the per-minute budget and Retry-After handling. ")
    base = p["issue"].get("body") or ""
    need = target - size(p)
    pad = ("\n\n" + filler * (need // len(filler) + 1))[:max(need, 0)] if need > 2 else ""
    while True:
        p["issue"]["body"] = base + pad
        d = size(p) - target
        if d <= 0: break
        pad = pad[:-d]
t = render(p)
assert "/diverge" not in t and t.count("__COMMENT_ID__") == 1
open(out, "w").write(t)
print(f"{size(p)} {dropped}")
EOF
)
read -r body_bytes dropped <<<"$meta"

# --- the servers ---
wait_line() { # file pattern
    for _ in $(seq 200); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.05; done
    echo "bench: server did not start ($1):" >&2; cat "$1" >&2; exit 1
}
env -u GITHUB_TOKEN -u DIVERGE_NOTIFIER_TOKEN -u DIVERGE_GITHUB_APP_ID -u DIVERGE_GITHUB_APP_KEY_FILE \
    "$bin" serve --listen 127.0.0.1:0 --data-dir "$tmp/data" --github-webhook-secret "$secret" \
    --log-format json --sandbox-provider none >"$tmp/ours.out" 2>/dev/null &
ours_pid=$!
pids+=("$ours_pid")
(cd "$nodedir" && WEBHOOK_SECRET="$secret" exec node server.mjs 0) >"$tmp/node.out" 2>"$tmp/node.err" &
node_pid=$!
pids+=("$node_pid")
wait_line "$tmp/ours.out" "GitHub webhook:"
wait_line "$tmp/node.out" "listening on"
ours_url=$(grep -o 'http://127.0.0.1:[0-9]*' "$tmp/ours.out" | head -n 1)
node_url=$(grep -o 'http://127.0.0.1:[0-9]*' "$tmp/node.out" | head -n 1)

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
busy_ticks() { awk '/^cpu /{print $2 + $3 + $4 + $7 + $8 + $9}' /proc/stat; } # all CPUs, not idle
hz=$(getconf CLK_TCK)

[ "$pre" -le 10 ] || echo "== WARNING: the machine was ${pre}% busy before the benchmark started"
echo "== machine: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')), $(uname -r)"
echo "== both servers and the load generator share these cores; everything on 127.0.0.1"
echo "== ours: $bin (source $(git -C "$root" describe --always --dirty 2>/dev/null || echo unknown), binary built $(date -r "$bin" '+%F %T')), $ours_url"
echo "== node: $(node --version), @octokit/webhooks $(octokit_version), one process (no cluster), $node_url"
echo "== payload: issue_comment on a PR, $body_bytes bytes ($dropped API URL fields of the fixture dropped), signed per request;" \
     "$conns connections, $threads loadgen threads, ${warm}s warm-up + ${dur}s measured"

# sanity: both answer 401 to a bad signature (and store nothing)
for s in ours node; do
    url=${s}_url; url=${!url}
    bad=$("$lg" --url "$url$hook" --secret "$secret" --template "$tmp/template.json" --mode cmd \
        --bad-signature --requests 2 --connections 1 --threads 1 2>/dev/null | grep '^RESULT' | grep -o ' s[0-9]*=' | tr -d ' s=' | tr '\n' ' ')
    [ "$bad" = "401 " ] || { echo "bench: $s answered '$bad' to a bad signature, want 401" >&2; exit 1; }
done

# CALIBRATE=1: is the load generator the bottleneck? (1) wrk vs loadgen --raw-get on GET
# /healthz of ours; (2) wrk posting one static signed comment without a command (ours answers
# 204 to every repeat: nocmd deliveries are not deduplicated) vs loadgen nocmd, same server,
# same path, same body size. Similar req/s and client CPU per request = not the bottleneck.
if [ "${CALIBRATE:-0}" = 1 ] && [ "$only" != node ]; then
    command -v wrk >/dev/null || { echo "bench: installing wrk" >&2; apt-get install -y -qq wrk >/dev/null; }
    [ -x /usr/bin/time ] || { echo "bench: installing time" >&2; apt-get install -y -qq time >/dev/null; }
    python3 - "$tmp/template.json" "$secret" "$tmp/static.json" "$tmp/static.lua" <<'EOF'
import hashlib, hmac, sys
t, secret, body, lua = sys.argv[1:]
b = open(t).read().replace("__COMMENT_ID__", "4242424242424242").replace("__BODY__", "LGTM, thanks").encode()
open(body, "wb").write(b)
sig = "sha256=" + hmac.new(secret.encode(), b, hashlib.sha256).hexdigest()
open(lua, "w").write(f"""wrk.method = "POST"
local f = io.open("{body}", "rb"); wrk.body = f:read("*a"); f:close()
wrk.headers["Content-Type"] = "application/json"
wrk.headers["X-GitHub-Event"] = "issue_comment"
wrk.headers["X-GitHub-Delivery"] = "00000000-0000-4000-8000-000000000000"
wrk.headers["X-Hub-Signature-256"] = "{sig}"
""")
EOF
    cal() { # label, then the command: req/s, client CPU (user+sys) per request, non-2xx
        local label=$1 out; shift
        out=$( { /usr/bin/time -f 'CPU %U %S' "$@"; } 2>&1 )
        echo "$out" | awk -v label="$label" -v d="$dur" '
            /^Requests\/sec/ {r = $2}
            /Non-2xx/ {bad = $NF}
            /^RESULT/ {for (i = 2; i <= NF; i++) {split($i, kv, "="); if (kv[1] == "rps") r = kv[2]; if (kv[1] == "non2xx") bad = kv[2]}}
            /^CPU / {c = $2 + $3}
            END {printf "   %-52s %8.0f req/s  client CPU %5.2f us/request  non-2xx %d\n", label, r, c * 1e6 / (r * d), bad}'
    }
    echo "-- calibration (CALIBRATE=1): ${dur}s each, $conns connections, $threads threads"
    cal "wrk      GET  /healthz" wrk -t"$threads" -c"$conns" -d"${dur}s" "$ours_url/healthz"
    cal "loadgen  GET  /healthz" "$lg" --url "$ours_url/healthz" --raw-get --connections "$conns" --threads "$threads" --duration "$dur"
    cal "wrk      POST static signed nocmd (same body every time)" wrk -t"$threads" -c"$conns" -d"${dur}s" -s "$tmp/static.lua" "$ours_url$hook"
    cal "loadgen  POST unique signed nocmd (midstate HMAC)" "$lg" --url "$ours_url$hook" --secret "$secret" --template "$tmp/template.json" --mode nocmd --connections "$conns" --threads "$threads" --duration "$dur"
    cal "loadgen  POST unique signed nocmd (--full-hmac)" "$lg" --url "$ours_url$hook" --secret "$secret" --template "$tmp/template.json" --mode nocmd --full-hmac --connections "$conns" --threads "$threads" --duration "$dur"
fi

results=$tmp/results
: >"$results"
run() { # server mode
    local s=$1 mode=$2 url pid c0 c1 m0 m1 out lgcpu
    url=${s}_url; url=${!url}
    pid=${s}_pid; pid=${!pid}
    local perfpid=
    if [ -n "${PERF_DIR:-}" ] && [ "$s" = ours ]; then
        mkdir -p "$PERF_DIR"
        # from 1 s into the run: the connections' threads exist by then (-p attaches to
        # the threads that exist when it starts)
        (sleep 1; exec perf record -q --call-graph "${PERF_CALLGRAPH:-fp}" -p "$pid" \
            -o "$PERF_DIR/ours-$mode.data" -- sleep "$((warm + dur - 1))") >/dev/null 2>&1 &
        perfpid=$!
    fi
    c0=$(cpu_ticks "$pid")
    m0=$(busy_ticks)
    out=$("$lg" --url "$url$hook" --secret "$secret" --template "$tmp/template.json" --mode "$mode" \
        --connections "$conns" --threads "$threads" --duration "$dur" --warmup "$warm" 2>/dev/null)
    c1=$(cpu_ticks "$pid")
    m1=$(busy_ticks)
    [ -z "$perfpid" ] || wait "$perfpid" || true
    echo "-- $s $mode"
    echo "$out" | grep -v '^RESULT' | sed 's/^/   /'
    lgcpu=$(echo "$out" | grep '^RESULT' | tr ' ' '\n' | sed -n 's/^cpu_s=//p')
    # cores used during the run by the server, and by anything that is neither the server
    # nor the load generator (another job on the box: the numbers are then not clean)
    echo "$s $(echo "$out" | grep '^RESULT' | cut -d' ' -f2-) $(awk -v a="$c0" -v b="$c1" -v m0="$m0" \
        -v m1="$m1" -v l="$lgcpu" -v h="$hz" -v d="$dur" -v w="$warm" 'BEGIN{t = d + w
        o = ((m1 - m0) - (b - a)) / h - l; if (o < 0) o = 0
        printf "srvcpu=%.2f other=%.2f", (b - a) / h / t, o / t}')" >>"$results"
}
# Node first; ours last, cmd last of all: the bot worker drains the accepted commands
# after the run and must not steal CPU from another measurement.
[ "$only" = ours ] || { run node nocmd; run node cmd; }
[ "$only" = node ] || {
    run ours nocmd
    run ours cmd
    echo "-- ours: inbox pending right after the cmd run: $(curl -s "$ours_url/metrics" | awk '/^diverge_inbox_pending/{print $2}') (the bot worker applies them after the 202)"
}

echo
python3 - "$results" "$dur" <<'EOF'
import sys
rows = []
for line in open(sys.argv[1]):
    f = line.split()
    d = dict(kv.split("=", 1) for kv in f[1:])
    d["server"] = f[0]
    rows.append(d)
print(f"{'server':7} {'mode':6} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'non-2xx':>8} {'errors':>7}  {'srv cores':>9} {'other':>5}  statuses")
noisy = False
for d in rows:
    st = " ".join(f"{k[1:]}:{v}" for k, v in d.items() if k.startswith("s") and k[1:].isdigit())
    print(f"{d['server']:7} {d['mode']:6} {float(d['rps']):9.0f} {float(d['p50_ms']):8.2f} {float(d['p99_ms']):8.2f} "
          f"{float(d['max_ms']):8.1f} {d['non2xx']:>8} {d['errors']:>7}  {d['srvcpu']:>9} {d['other']:>5}  {st}")
    noisy |= float(d["other"]) > 0.15
print("(srv cores: CPU of the server during the run; other: cores used by processes other than the"
      " server and the load generator)")
if noisy:
    print("WARNING: other processes used more than 0.15 cores during a run: the numbers are not clean")
by = {(d["server"], d["mode"]): float(d["rps"]) for d in rows}
for mode, goal in (("nocmd", 3.0), ("cmd", 1.5)):
    if ("ours", mode) in by and by.get(("node", mode)):
        r = by[("ours", mode)] / by[("node", mode)]
        print(f"ratio ours/node {mode:5}: {r:5.2f}x  (goal >= {goal:g}x: {'met' if r >= goal else 'NOT met'})")
EOF
