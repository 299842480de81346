#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Where `diverge serve`'s CPU goes during the meter benchmark, by thread name.

    python3 bench/meter_threads.py [build-dir] [--duration 10] [--perf FILE]

Starts the build's server (`--sandbox-provider none`, a fresh data dir), creates 64 Active
tasks with large budgets, and runs wrk (2 threads, 64 connections, bench/meter.lua: each
call a unique requestId, as bench/meter.sh). Every thread's user+system time is read from
/proc/<pid>/task/*/stat every 20 ms, so that threads which end with wrk's connections
still count. Prints req/s, the server's CPU per call (the threads' sum and the process's
own figure, which should agree), and the share and µs per call of each thread name
(MHD-connection: libmicrohttpd's connection threads; meter-commit: the meter's group
committer; meter-archive; controller; notifier; ...). --perf FILE also records a profile of
the server (perf record -g) over the run, e.g. for
`perf report -i FILE --sort comm,dso --stdio`.
"""
import argparse
import collections
import os
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import harness  # noqa: E402  (the test harness starts and stops the server)

API = "/apis/divergedev.com/v1alpha1/namespaces/bench/agenttasks"
HZ = os.sysconf("SC_CLK_TCK")


def threads(pid):
    """{tid: (name, user+system ticks)} of the process's threads now."""
    out = {}
    try:
        tids = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return out
    for tid in tids:
        try:
            with open("/proc/%d/task/%s/stat" % (pid, tid)) as f:
                st = f.read()
        except OSError:
            continue
        fields = st[st.rindex(")") + 2:].split()
        out[tid] = (st[st.index("(") + 1:st.rindex(")")], int(fields[11]) + int(fields[12]))
    return out


def process_ticks(pid):
    with open("/proc/%d/stat" % pid) as f:
        st = f.read()
    fields = st[st.rindex(")") + 2:].split()
    return int(fields[11]) + int(fields[12])


def tokens(srv, n):
    out = []
    for i in range(n):
        st, _, b = srv.request("POST", API, {
            "metadata": {"name": "m%d" % i},
            "spec": {"objective": "bench", "budgetUSD": "1000000.00",
                     "budgetTokens": 10 ** 11, "capabilities": ["claude-*"]}})
        if st != 201:
            raise SystemExit("bench: creating task m%d: %s %r" % (i, st, b))
    for i in range(n):
        for _ in range(200):
            st, _, t = srv.request("GET", API + "/m%d/token" % i)
            if st == 200 and t:
                break
            time.sleep(0.02)
        else:
            raise SystemExit("bench: no token for task m%d" % i)
        out.append((t.decode() if isinstance(t, bytes) else t).strip())
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build", nargs="?", default="build")
    ap.add_argument("--duration", type=int, default=10)
    ap.add_argument("--perf", metavar="FILE")
    a = ap.parse_args()
    build = a.build if os.path.isabs(a.build) else os.path.join(ROOT, a.build)
    harness.DIVERGE_BIN = os.path.join(build, "diverge")
    if subprocess.run(["sh", "-c", "command -v wrk"], stdout=subprocess.DEVNULL).returncode:
        subprocess.run(["apt-get", "install", "-y", "-qq", "wrk"], check=True,
                       stdout=subprocess.DEVNULL)
    with harness.Server(["--sandbox-provider", "none"]) as srv, \
            tempfile.NamedTemporaryFile("w", suffix=".tokens") as tf:
        tf.write("\n".join(tokens(srv, 64)) + "\n")
        tf.flush()
        pid = srv.proc.pid
        before = threads(pid)
        last, stop = {}, threading.Event()

        def sample():
            while not stop.is_set():
                last.update(threads(pid))
                time.sleep(0.02)
        sampler = threading.Thread(target=sample)
        p0 = process_ticks(pid)
        sampler.start()
        perf = None
        if a.perf:
            perf = subprocess.Popen(["perf", "record", "-F", "999", "-g", "-p", str(pid),
                                     "-o", a.perf, "--", "sleep", str(max(1, a.duration - 1))],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        out = subprocess.run(["wrk", "-t2", "-c64", "-d%ds" % a.duration, "--latency",
                              "-s", os.path.join(ROOT, "bench", "meter.lua"), srv.url],
                             env=dict(os.environ, TOKENS_FILE=tf.name),
                             capture_output=True, text=True, check=True).stdout
        if perf:
            perf.wait()
        stop.set()
        sampler.join()
        last.update(threads(pid))
        p1 = process_ticks(pid)
    rps = float(next(ln for ln in out.splitlines() if "Requests/sec" in ln).split()[1])
    p99 = next((ln.split()[1] for ln in out.splitlines() if ln.strip().startswith("99%")), "?")
    calls = rps * a.duration
    by = collections.Counter()
    for tid, (name, ticks) in last.items():
        by[name] += ticks - before.get(tid, (name, 0))[1]
    total = sum(by.values())
    print("== meter, 64 connections, %d s, load average %s" % (
        a.duration, " ".join(open("/proc/loadavg").read().split()[:3])))
    print("req/s %.0f, p99 %s; server CPU per call: %.1f us (threads' sum), %.1f us (process)"
          % (rps, p99, total * 1e6 / HZ / calls, (p1 - p0) * 1e6 / HZ / calls))
    for name, ticks in by.most_common():
        if ticks > 0:
            print("  %-16s %5.1f %%  %6.1f us per call" % (
                name, 100.0 * ticks / total, ticks * 1e6 / HZ / calls))


if __name__ == "__main__":
    main()
