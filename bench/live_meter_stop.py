#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Live-metering stop latency (SPEC §14 "spend is live"): how long after an agent appends
the usage line that crosses the budget the runner has stopped it.

The real diverge-agent-runner runs against a scripted meter on a unix socket that answers
429 from the Kth usage line on; the agent appends one line (carrying its own write time)
every INTERVAL seconds for a long iteration. The latency is the runner's exit time minus
the write time of the line the meter refused. Prints min / median / max over RUNS runs.

usage: python3 bench/live_meter_stop.py [RUNS] [INTERVAL]   (from the source tree, built
in ./build)"""
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
from runner_helpers import FakeMeter, make_bare_repo, run_runner, runner_env  # noqa: E402

AGENT = """i=0
while [ $i -lt 600 ]; do
  i=$((i + 1))
  printf '{"model":"m","tokensUsed":1,"costUSD":0.001,"t":%s}\\n' "$(date +%s.%N)" \
    >>"$DIVERGE_USAGE_FILE"
  sleep INTERVAL
done
"""


def one(interval, k=3):
    tmp = tempfile.mkdtemp(prefix="bench-live-")
    try:
        repo = make_bare_repo(tmp)
        agent = os.path.join(tmp, "agent.sh")
        with open(agent, "w") as f:
            f.write(AGENT.replace("INTERVAL", str(interval)))
        refused = []

        def answer(body, headers):
            if "-u" not in body["requestId"]:
                return 200, {"allowed": True}
            refused.append(body["requestId"])
            if len(refused) >= k:
                return 429, {"allowed": False, "reason": "budget exceeded"}
            return 200, {"allowed": True}

        sock = os.path.join(tmp, "m.sock")
        meter = FakeMeter(sock, answer)
        env = runner_env(tmp, "bench", repo, DIVERGE_METER_SOCKET=sock,
                         DIVERGE_MACAROON_TOKEN="t", DIVERGE_MAX_ITERATIONS="1",
                         DIVERGE_AGENT_CMD="sh " + agent)
        r = run_runner(env)
        end = time.time()
        meter.close()
        assert r.returncode == 0, r.stdout
        offset = int(refused[k - 1].rsplit("-u", 1)[1])
        with open(env["DIVERGE_USAGE_FILE"], "rb") as f:
            f.seek(offset)
            line = json.loads(f.readline())
        return end - float(line["t"])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    interval = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
    lat = sorted(one(interval) for _ in range(runs))
    print("live metering stop latency over %d runs (a usage line every %gs, default "
          "DIVERGE_USAGE_FOLLOW_MS=250): min %.0f ms, median %.0f ms, max %.0f ms"
          % (runs, interval, lat[0] * 1000, statistics.median(lat) * 1000, lat[-1] * 1000))


if __name__ == "__main__":
    main()
