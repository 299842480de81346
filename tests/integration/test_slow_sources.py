# SPDX-License-Identifier: Apache-2.0
"""Slow clients from many source addresses (2026-12-01 security review): 1200 connections
from ten loopback addresses, each sending a partial request head one byte per second and
reopening as soon as it is cut, must not keep /healthz or a meter call (from 127.0.0.1, in
the same /24 as the flood) from being answered. The server bounds the head with a short
deadline, limits connections per address and per /24, and keeps a reserve of connection
slots for the health and meter routes."""
import collections
import json
import resource
import selectors
import socket
import threading
import time

from harness import Server, run_tests
from test_security_http import read_response, start_task_token

SOURCES = ["127.0.0.%d" % i for i in range(2, 12)]  # ten addresses of one /24
FLOOD = 1200
HEAD = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: "
FLOOD_SECONDS = 18
# Answered at all, not how fast: unprotected, every probe was reset or left unanswered for
# the flood's whole length. Normal builds answer well under a second (the slowest probe is
# printed); under ThreadSanitizer on a loaded 2-core box a few took more than 1 s.
PROBE_TIMEOUT = 5.0


class Flood(threading.Thread):
    """FLOOD sockets that never finish their request head: one more byte per second on
    each, and a cut socket is reopened at once from the same source address."""

    def __init__(self, port):
        super().__init__(daemon=True)
        self.port = port
        self.sel = selectors.DefaultSelector()
        self.slots = [None] * FLOOD  # socket or None
        self.sent = [0] * FLOOD
        self.stop = threading.Event()
        self.reopened = 0

    def open(self, i):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.bind((SOURCES[i % len(SOURCES)], 0))
            s.connect_ex(("127.0.0.1", self.port))
        except OSError:
            s.close()
            self.slots[i] = None
            return
        self.slots[i] = s
        self.sent[i] = 0
        self.sel.register(s, selectors.EVENT_READ, i)

    def close(self, i):
        s = self.slots[i]
        if s is not None:
            self.sel.unregister(s)
            s.close()
            self.slots[i] = None

    def reopen(self, i):
        self.close(i)
        self.open(i)
        self.reopened += 1

    def trickle(self, i):
        s = self.slots[i]
        if s is None:
            self.open(i)
            return
        n = self.sent[i]
        byte = HEAD[n:n + 1] if n < len(HEAD) else b"a"
        try:
            if s.send(byte) == 1:
                self.sent[i] = n + 1
        except (BlockingIOError, InterruptedError):
            pass  # still connecting
        except OSError:
            self.reopen(i)

    def run(self):
        for i in range(FLOOD):
            self.open(i)
        next_tick = time.monotonic()
        while not self.stop.is_set():
            now = time.monotonic()
            if now >= next_tick:
                for i in range(FLOOD):
                    self.trickle(i)
                next_tick = now + 1.0
            for key, _ in self.sel.select(timeout=max(0.0, min(0.2, next_tick - now))):
                i = key.data
                try:
                    gone = self.slots[i].recv(4096) == b""
                except (BlockingIOError, InterruptedError):
                    gone = False
                except OSError:
                    gone = True
                if gone:  # cut by the server: back at once
                    self.reopen(i)
        for i in range(FLOOD):
            self.close(i)


def probe(port, data):
    """Sends DATA on a new connection from 127.0.0.1; (status, body) within PROBE_TIMEOUT
    seconds, or raises."""
    s = socket.create_connection(("127.0.0.1", port), timeout=PROBE_TIMEOUT)
    try:
        s.settimeout(PROBE_TIMEOUT)
        s.sendall(data)
        st, _, body = read_response(s)
        return st, body
    finally:
        s.close()


def healthz_request():
    return b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"


def meter_request(token, rid):
    body = json.dumps({"requestId": rid, "iteration": 1, "tokensUsed": 1,
                       "costUSD": 0.0}).encode()
    return (b"POST /api/v1/agenttask/meter HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            b"Authorization: Bearer " + token.encode() + b"\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)


def metric(text, name):
    for line in text.splitlines():
        if line.startswith(name + " "):
            return int(line.split()[1])
    raise AssertionError("no metric %s" % name)


def test_many_slow_sources_do_not_starve_health_and_meter():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 2 * FLOOD + 1000  # the flood here, and as many sockets and threads' files there
    if soft < want:
        assert hard >= want, "RLIMIT_NOFILE hard limit %d is below %d" % (hard, want)
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))  # the server inherits it
    with Server(["--sandbox-provider", "none"]) as srv:
        token = start_task_token(srv, "slow-sources")
        flood = Flood(srv.port)
        flood.start()
        failures = []
        probes = 0
        slowest = 0.0
        try:
            time.sleep(2)  # every flood socket connected once
            end = time.monotonic() + FLOOD_SECONDS
            while time.monotonic() < end:
                for what, data in (("healthz", healthz_request()),
                                   ("meter", meter_request(token, "r-%d" % probes))):
                    t0 = time.monotonic()
                    try:
                        st, body = probe(srv.port, data)
                    except (OSError, AssertionError) as e:
                        st, body = None, repr(e)
                    slowest = max(slowest, time.monotonic() - t0)
                    probes += 1
                    if st != 200:
                        failures.append((round(FLOOD_SECONDS - (end - time.monotonic()), 1),
                                         what, st, body[:200]))
                time.sleep(0.5)
        finally:
            flood.stop.set()
            flood.join(30)
        print("%d probes, slowest answered in %.3f s" % (probes, slowest))
        assert not failures, "%d of %d probes failed under the flood: %r" % (
            len(failures), probes, failures[:10])
        st, _, text = srv.request("GET", "/metrics", auth=False)
        assert st == 200, st
        # The flood really was held off: heads cut at their deadline, connections refused.
        assert metric(text, "diverge_http_request_deadline_exceeded_total") > 0, text
        assert metric(text, "diverge_http_connections_refused_total") > 0, text
        assert flood.reopened > FLOOD, flood.reopened
        st, _, b = srv.request("GET", "/healthz", auth=False, timeout=5)
        assert st == 200 and b == {"status": "ok"}, (st, b)
        # libmicrohttpd's messages about the cut connections are rate-limited (20 a second,
        # then a count of those dropped): unlimited, the flood wrote about 400 lines a second.
        lib = [json.loads(line) for line in srv.stderr().splitlines()
               if line.startswith("{") and '"http_library' in line]
        per_s = collections.Counter(e["ts"][:19] for e in lib if e["event"] == "http_library")
        # a wall-clock second may hold parts of two of the limit's (monotonic) seconds
        assert per_s and max(per_s.values()) <= 40, per_s.most_common(3)
        dropped = sum(int(e["messages"]) for e in lib if e["event"] == "http_library_suppressed")
        print("libmicrohttpd messages: %d logged, %d dropped" % (sum(per_s.values()), dropped))
        assert dropped > 0, len(lib)


if __name__ == "__main__":
    run_tests([test_many_slow_sources_do_not_starve_health_and_meter])
