#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Dashboard streams next to the task API (issue 14): GET latency of one AgentTask (wrk,
CONNECTIONS connections, DURATION s) with no event stream open, then with SUBSCRIBERS
open `GET /api/v1/events` streams (spread over 127.0.0.2-5: the per-address connection
cap is 128) while a writer changes a task every WRITE_MS ms, so that every stream
carries events. Also the fan-out delay: time from a PATCH's answer to the last of the
streams seeing that change.
usage: python3 bench/events_load.py [build-dir]
env: DURATION (10), CONNECTIONS (8), SUBSCRIBERS (200), WRITE_MS (50)"""
import os
import re
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
build = sys.argv[1] if len(sys.argv) > 1 else "build"
os.environ.setdefault("DIVERGE_BIN", os.path.join(ROOT, build, "diverge"))

from harness import API, Server, task_obj  # noqa: E402
from test_events import SSE, rv_of  # noqa: E402

DUR = int(os.environ.get("DURATION", "10"))
CONNS = int(os.environ.get("CONNECTIONS", "8"))
SUBS = int(os.environ.get("SUBSCRIBERS", "200"))
WRITE_MS = int(os.environ.get("WRITE_MS", "50"))
NS = API + "/namespaces/default/agenttasks"


def wrk(srv):
    lua = os.path.join(ROOT, "bench", "get.lua")
    env = dict(os.environ, DIVERGE_API_TOKEN=srv.token)
    out = subprocess.run(["wrk", "-t2", "-c%d" % CONNS, "-d%ds" % DUR, "--latency", "-s", lua,
                          srv.url], capture_output=True, text=True, env=env).stdout
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)
    p50 = re.search(r"\s50%\s+(\S+)", out).group(1)
    p99 = re.search(r"\s99%\s+(\S+)", out).group(1)
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return rps, p50, p99, non2xx.group(1) if non2xx else "0"


def main():
    with Server(args=["--sandbox-provider", "none"]) as srv:
        for name in ("bench-get", "churn"):
            obj = task_obj(name, ns="bench")
            assert srv.request("POST", API + "/namespaces/bench/agenttasks", obj)[0] == 201
        print("== machine: %d cores, %s; server, wrk and the %d streams on the same box" %
              (os.cpu_count(), os.uname().release, SUBS))
        print("| streams open | writes | GET req/s | p50 | p99 | non-2xx |")
        print("| ---: | --- | ---: | ---: | ---: | ---: |")
        print("| 0 | none | %s | %s | %s | %s |" % wrk(srv))
        subs = [SSE(srv, source_ip="127.0.0.%d" % (2 + i % 4)) for i in range(SUBS)]
        assert all(s.status == 200 for s in subs), [s.status for s in subs]
        print("| %d | none | %s | %s | %s | %s |" % ((SUBS,) + wrk(srv)))
        stop = threading.Event()

        def writer():
            i = 0
            while not stop.is_set():
                srv.request("PATCH", API + "/namespaces/bench/agenttasks/churn",
                            {"metadata": {"annotations": {"bench/i": str(i)}}},
                            headers={"Content-Type": "application/merge-patch+json"})
                i += 1
                time.sleep(WRITE_MS / 1000)

        t = threading.Thread(target=writer)
        t.start()
        print("| %d | every %d ms | %s | %s | %s | %s |" % ((SUBS, WRITE_MS) + wrk(srv)))
        stop.set()
        t.join()
        # Drain what the churn queued, then time single changes to the last stream.
        for s in subs:
            while not s.q.empty():
                s.q.get()
        delays = []
        for i in range(10):
            t0 = time.time()
            st, _, body = srv.request("PATCH", NS.replace("default", "bench") + "/churn",
                                      {"metadata": {"annotations": {"bench/f": str(i)}}},
                                      headers={"Content-Type": "application/merge-patch+json"})
            rv = int(body["metadata"]["resourceVersion"])
            for s in subs:
                while True:
                    ev = s.next(timeout=30, kinds=("task",))
                    if rv_of(ev) >= rv:
                        break
            delays.append((time.time() - t0) * 1000)
        print("\nfan-out: PATCH sent to the last of %d streams seeing it: median %.1f ms, "
              "max %.1f ms (10 changes)" % (SUBS, statistics.median(delays), max(delays)))
        for s in subs:
            s.close()


if __name__ == "__main__":
    main()
