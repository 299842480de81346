#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Reply latency of `/diverge status` (security review finding 13): the time from posting
the comment to the bot's reply being in the thread, with the offline `local` SCM provider
(no network), on an idle server and right after a meter call changed the task's spend
(when a spend-only sticky edit is throttled to --notifier-min-interval, 10 s by default).

usage: bench/reply_latency.py [build-dir] [-n N]     (N samples per mode, default 50;
one sample every 0.9 s, under the outbox's 80 content-creating calls per minute)
Prints p50/p90/p99/max per mode. Starts its own `diverge serve` on a free loopback port
with a fresh data dir and stops it at the end."""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

MARKER = "<!-- diverge-agent-task -->"
BOT = "diverge"
PROJECT, NUMBER = "bench/replies", 1
TASKS = "/apis/divergedev.com/v1alpha1/namespaces/bench-replies/agenttasks"


class Client:
    def __init__(self, url, token):
        self.url, self.token = url, token

    def call(self, method, path, body=None, token=None, raw=False):
        data = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
        req = urllib.request.Request(self.url + path, data=data, method=method, headers={
            "Authorization": "Bearer " + (token or self.token),
            "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            text = r.read().decode()
        return text if raw else json.loads(text)

    def comment(self, text):
        return self.call("POST", "/api/v1/local/comments",
                         {"project": PROJECT, "number": NUMBER, "body": text,
                          "author": "alice", "permission": "admin"})

    def replies(self):
        t = self.call("GET", "/api/v1/local/threads/%s/%d" % (PROJECT, NUMBER))
        return sum(1 for c in t["comments"]
                   if c["author"] == BOT and not c["body"].startswith(MARKER))


def wait(pred, timeout=30.0, interval=0.002):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(interval)
    raise SystemExit("bench: timed out")


# The outbox keeps content-creating calls under 80 per minute and provider (GitHub's
# secondary limits); one sample every PACE seconds stays under it with the sticky edits.
PACE = 0.9


def sample(c, before_comment=None):
    start = time.monotonic()
    n = c.replies()
    if before_comment is not None:
        before_comment()
    t0 = time.monotonic()
    c.comment("/diverge status")
    wait(lambda: c.replies() > n)
    took = time.monotonic() - t0
    time.sleep(max(0.0, PACE - (time.monotonic() - start)))
    return took * 1000.0


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))]


def report(name, xs):
    print("%-34s n=%-4d p50 %8.1f ms  p90 %8.1f ms  p99 %8.1f ms  max %8.1f ms" %
          (name, len(xs), pct(xs, 50), pct(xs, 90), pct(xs, 99), max(xs)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build", nargs="?", default="build")
    ap.add_argument("-n", type=int, default=50)
    a = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    binary = os.path.join(a.build if os.path.isabs(a.build) else os.path.join(root, a.build),
                          "diverge")
    data = tempfile.mkdtemp(prefix="diverge-bench-")
    proc = subprocess.Popen([binary, "serve", "--listen", "127.0.0.1:0", "--data-dir", data,
                             "--sandbox-provider", "none", "--log-format", "json"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={k: v for k, v in os.environ.items()
                                 if k not in ("GITHUB_TOKEN", "DIVERGE_NOTIFIER_TOKEN")})
    try:
        url = None
        for line in proc.stdout:
            m = re.search(r"http://127\.0\.0\.1:\d+", line)
            url = url or (m.group(0) if m else None)
            if "admin token" in line:
                break
        with open(os.path.join(data, "api-token")) as f:
            c = Client(url, f.read().strip())
        c.comment("/diverge fix the benchmark")

        def active():
            try:
                return c.call("GET", TASKS + "/fix-pr-1")["status"].get("phase") == "Active"
            except OSError:
                return False
        wait(active, interval=0.05)
        token = c.call("GET", TASKS + "/fix-pr-1/token", raw=True).strip()
        for _ in range(3):  # warm-up
            sample(c)
        idle = [sample(c) for _ in range(a.n)]
        k = [0]

        def spend():
            k[0] += 1
            c.call("POST", "/api/v1/agenttask/meter",
                   {"requestId": "bench-%d" % k[0], "iteration": 1, "tokensUsed": 100,
                    "costUSD": 0.001}, token=token)
        after = [sample(c, spend) for _ in range(a.n)]
        print("== %d cores; server and client on the same box; local SCM provider; "
              "--notifier-min-interval 10 s (default); one sample per %.1f s" % (os.cpu_count(), PACE))
        report("status reply, idle server", idle)
        report("status reply, right after spend", after)
        metrics = c.call("GET", "/metrics", raw=True)
        waits = [ln for ln in metrics.splitlines() if "diverge_scm_" in ln and not ln.startswith("#")]
        print("outbox: " + ", ".join(waits))
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(data, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
