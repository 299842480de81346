#!/usr/bin/env bash
# Webhook benchmark for GitLab Note Hook deliveries (issue 10), the GitLab twin of
# bench/webhook.sh: ours only (no Node baseline). Builds bench/loadgen into a temp dir,
# starts `diverge serve --gitlab-webhook-token T` (no GitLab API token: commands are
# accepted into the inbox and the bot logs that it cannot answer), then runs notes without
# a command (nocmd: 204) and with "/diverge help" (cmd: 202, durable in the inbox):
# CONNECTIONS connections, THREADS loadgen threads, WARMUP s discarded, DURATION s
# measured. Every request has a unique note id and X-Gitlab-Event-UUID.
# The payload is the GitLab docs Note Hook fixture, compact, object_attributes last (the
# note id and text are its placeholders), padded to PAYLOAD_BYTES with the MR description.
# usage: bench/webhook_gitlab.sh [build-dir]
# env: DURATION (10), CONNECTIONS (64), THREADS (2), WARMUP (2), PAYLOAD_BYTES (8192)
set -euo pipefail
build=${1:-build}
root=$(cd "$(dirname "$0")/.." && pwd)
dur=${DURATION:-10}
conns=${CONNECTIONS:-64}
threads=${THREADS:-2}
warm=${WARMUP:-2}
size=${PAYLOAD_BYTES:-8192}
token="bench-gitlab-token-$$"
bin=$build/diverge; [[ $build = /* ]] || bin=$root/$build/diverge
fixture=$root/tests/fixtures/gitlab/note_hook.merge_request.gitlab-docs.json
hook=/api/v1/webhooks/gitlab

[ -x "$bin" ] || { echo "bench: $bin not found (build the project first)" >&2; exit 1; }
tmp=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

make -s -C "$root/bench/loadgen" OUT="$tmp/loadgen" CFLAGS="-O2 -Wall -Wextra"
lg=$tmp/loadgen

body_bytes=$(python3 - "$fixture" "$tmp/template.json" "$size" <<'EOF'
import json, sys
fixture, out, target = sys.argv[1], sys.argv[2], int(sys.argv[3])
p = json.load(open(fixture))
a = p.pop("object_attributes")
a["id"] = "@@ID@@"; a["note"] = "@@BODY@@"
p["object_attributes"] = a
p["merge_request"]["description"] = ""
def render(p):
    s = json.dumps(p, separators=(",", ":"), ensure_ascii=False)
    return s.replace('"@@BODY@@"', '"__BODY__"').replace('"@@ID@@"', "__COMMENT_ID__")
def size(p):
    return len(render(p).replace("__COMMENT_ID__", "1" * 16).replace("__BODY__", "/diverge help").encode())
filler = ("This merge request changes the retry policy of the outbox worker and adds tests for "
          "the backoff, the per-minute budget and Retry-After handling. ")
need = target - size(p)
if need > 0:
    p["merge_request"]["description"] = (filler * (need // len(filler) + 1))[:need]
t = render(p)
assert "/diverge" not in t and t.count("__COMMENT_ID__") == 1
open(out, "w").write(t)
print(size(p))
EOF
)

env -u DIVERGE_GITLAB_TOKEN -u GITLAB_TOKEN -u DIVERGE_NOTIFIER_TOKEN -u GITHUB_TOKEN \
    "$bin" serve --listen 127.0.0.1:0 --data-dir "$tmp/data" --gitlab-webhook-token "$token" \
    --log-format json --sandbox-provider none >"$tmp/ours.out" 2>/dev/null &
pid=$!
pids+=("$pid")
for _ in $(seq 200); do grep -q "GitLab webhook:" "$tmp/ours.out" 2>/dev/null && break; sleep 0.05; done
url=$(grep -o 'http://127.0.0.1:[0-9]*' "$tmp/ours.out" | head -n 1)
[ -n "$url" ] || { echo "bench: server did not start" >&2; cat "$tmp/ours.out" >&2; exit 1; }

echo "== machine: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')), $(uname -r)"
echo "== ours: $bin (source $(git -C "$root" describe --always --dirty 2>/dev/null || echo unknown)), $url"
echo "== payload: Note Hook on an MR, $body_bytes bytes, X-Gitlab-Token; $conns connections," \
     "$threads loadgen threads, ${warm}s warm-up + ${dur}s measured"

bad=$("$lg" --gitlab --url "$url$hook" --secret "$token" --template "$tmp/template.json" --mode cmd \
    --bad-signature --requests 2 --connections 1 --threads 1 2>/dev/null | grep '^RESULT' | grep -o ' s[0-9]*=' | tr -d ' s=' | tr '\n' ' ')
[ "$bad" = "401 " ] || { echo "bench: a wrong X-Gitlab-Token got '$bad', want 401" >&2; exit 1; }

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)
for mode in nocmd cmd; do
    c0=$(cpu_ticks "$pid")
    out=$("$lg" --gitlab --url "$url$hook" --secret "$token" --template "$tmp/template.json" \
        --mode "$mode" --connections "$conns" --threads "$threads" --duration "$dur" --warmup "$warm" 2>/dev/null)
    c1=$(cpu_ticks "$pid")
    echo "-- gitlab $mode"
    echo "$out" | grep -v '^RESULT' | sed 's/^/   /'
    echo "   $(echo "$out" | grep '^RESULT') srvcpu=$(awk -v a="$c0" -v b="$c1" -v h="$hz" -v t="$((dur + warm))" 'BEGIN{printf "%.2f", (b - a) / h / t}')"
done
echo "-- inbox pending right after the cmd run: $(curl -s "$url/metrics" | awk '/^diverge_inbox_pending/{print $2}')"
