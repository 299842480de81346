#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The LLM gateway's overhead (SPEC §13) against calling the same fake upstream directly,
in the same run: `diverge serve --sandbox-provider none --llm-upstream anthropic=FAKE`,
one Active task with a large budget, and a fast fake Anthropic upstream (asyncio, its own
process) that streams Messages SSE events with a controlled pause between them.

1. Latency, one call at a time, direct and through the gateway alternating (the same
   fake, the same client, keep-alive connections): for a streamed call the time to the
   first event byte, to the last event (message_stop) and to the end of the stream (the
   final chunk); for a non-streamed call the time to the whole answer. p50/p99 of each,
   and the gateway's added latency (gateway percentile minus direct percentile). Also
   direct calls on a new TCP connection each (what a gateway without kept-alive upstream
   connections pays),
   and the server's CPU time per gateway call (/proc/PID/stat around each call).
2. CONCURRENT streams held open through the gateway at once (the fake sends message_start
   and the first delta, then holds every stream until all are open): the server's RSS,
   threads and descriptors while they are held, then all released and checked to end
   well and be charged exactly. Clients are spread over source addresses so that no
   address and no /24 passes the listener's per-address (128) and per-prefix (256)
   connection caps, as many sandboxes/pods would. Then the same number of streams from
   ONE address (one client machine) to show which limit it meets.

usage: python3 bench/llm_gateway.py [build-dir]
env: N (300 calls of each kind and path), WARMUP (30), PAUSE_MS (2, between SSE
events), DELTAS (8 text deltas per stream), CONCURRENT (500), HOLD_S (5, how long the
streams are held open once all are), PERF (1: `perf record` the server during the
streamed gateway calls and print its top symbols), BASE_BIN (another build's `diverge`,
e.g. main's: its gateway is called in turn with this one's in the latency part, so both
are compared in the same run; rows marked "(BASE_BIN)")"""
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from decimal import Decimal, ROUND_CEILING

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))

N = int(os.environ.get("N", "300"))
WARMUP = int(os.environ.get("WARMUP", "30"))
PAUSE_MS = float(os.environ.get("PAUSE_MS", "2"))
DELTAS = int(os.environ.get("DELTAS", "8"))
CONCURRENT = int(os.environ.get("CONCURRENT", "500"))
HOLD_S = float(os.environ.get("HOLD_S", "5"))
PERF = os.environ.get("PERF", "0") == "1"
BASE_BIN = os.environ.get("BASE_BIN", "")
MODEL = "claude-sonnet-4-5-20250929"
# Input within the request body's bytes (a call's charge is capped at its reservation,
# whose input bound is the body's byte count).
USAGE = {"input_tokens": 100, "output_tokens": 200, "cache_creation_input_tokens": 0,
         "cache_read_input_tokens": 0}
# The built-in price of claude-sonnet-4*: $3 in, $15 out per million tokens.
CALL_MICROS = int((Decimal(100) * 3 + Decimal(200) * 15).to_integral_value(ROUND_CEILING))
KEY = "sk-ant-bench-server-key"
MSG = "/v1/messages"
GW = "/api/v1/llm/anthropic"

# --- the fake upstream (its own process) ----------------------------------------------


def sse_events():
    start = {"type": "message_start", "message": {
        "id": "msg_bench", "type": "message", "role": "assistant", "model": MODEL,
        "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": dict(USAGE, output_tokens=1)}}
    ev = [("message_start", start),
          ("content_block_start", {"type": "content_block_start", "index": 0,
                                   "content_block": {"type": "text", "text": ""}}),
          ("ping", {"type": "ping"})]
    for i in range(DELTAS):
        ev.append(("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {
            "type": "text_delta", "text": "word%d " % i}}))
    ev += [("content_block_stop", {"type": "content_block_stop", "index": 0}),
           ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn",
                                                                  "stop_sequence": None},
                              "usage": {"output_tokens": USAGE["output_tokens"]}}),
           ("message_stop", {"type": "message_stop"})]
    out = []
    for name, data in ev:
        text = ("event: %s\ndata: %s\n\n" % (name, json.dumps(data))).encode()
        out.append(b"%x\r\n%s\r\n" % (len(text), text))
    return out


WHOLE = json.dumps({"id": "msg_bench", "type": "message", "role": "assistant", "model": MODEL,
                    "content": [{"type": "text", "text": "hello"}], "stop_reason": "end_turn",
                    "stop_sequence": None, "usage": USAGE}).encode()


class Fake:
    """Anthropic Messages on loopback. POST /_bench/hold {"on": bool} makes streams stop
    after their first text delta (non-streamed answers: before they start) until POST
    /_bench/release; POST /_bench/stats."""

    def __init__(self):
        self.events = sse_events()
        self.hold = False
        self.release = asyncio.Event()
        self.held = 0
        self.served = 0

    async def handle(self, reader, writer):
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                path = lines[0].split(" ")[1]
                hdrs = {}
                for line in lines[1:]:
                    if ":" in line:
                        k, v = line.split(":", 1)
                        hdrs[k.strip().lower()] = v.strip()
                n = int(hdrs.get("content-length") or 0)
                body = await reader.readexactly(n) if n else b""
                await self.answer(writer, path, body)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    def whole(self, writer, status, data):
        writer.write(b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nrequest-id: req_bench"
                     b"\r\nContent-Length: %d\r\n\r\n%s" % (status, len(data), data))

    async def answer(self, writer, path, body):
        if path.startswith("/_bench/"):
            if path == "/_bench/hold":
                self.hold = json.loads(body)["on"]
                self.release = asyncio.Event()
            elif path == "/_bench/release":
                self.release.set()
            self.whole(writer, 200, json.dumps({"held": self.held, "served": self.served})
                       .encode())
            return
        req = json.loads(body)
        if not req.get("stream"):
            if self.hold:
                self.held += 1
                await self.release.wait()
                self.held -= 1
            self.served += 1
            self.whole(writer, 200, WHOLE)
            return
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Cache-Control: no-cache\r\nrequest-id: req_bench\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n" + self.events[0])
        await writer.drain()
        hold, release = self.hold, self.release
        for i, chunk in enumerate(self.events[1:], 1):
            if hold and i == 4:  # after message_start, block start, ping, first delta
                self.held += 1
                await release.wait()
                self.held -= 1
            elif PAUSE_MS > 0:
                await asyncio.sleep(PAUSE_MS / 1000)
            writer.write(chunk)
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        self.served += 1


def fake_main():
    async def run():
        fake = Fake()
        server = await asyncio.start_server(fake.handle, "127.0.0.1", 0, backlog=2048)
        print(server.sockets[0].getsockname()[1], flush=True)
        await server.serve_forever()

    asyncio.run(run())


# --- a minimal keep-alive HTTP/1.1 client with per-phase times -------------------------


class Conn:
    def __init__(self, port, src="127.0.0.1"):
        self.port, self.src = port, src
        self.sock = None
        self.buf = b""

    def connect(self):
        self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=60,
                                             source_address=(self.src, 0))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def close(self):
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def _more(self):
        d = self.sock.recv(65536)
        if not d:
            raise ConnectionError("closed")
        self.buf += d
        return time.perf_counter()

    def call(self, path, body, headers):
        """POSTs BODY; returns (status, t_first_body_byte, t_message_stop, t_end) in seconds
        after the send (t_message_stop None for a non-streamed answer)."""
        if self.sock is None:
            self.connect()
        req = ("POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
               "Content-Length: %d\r\n%s\r\n" % (path, len(body), "".join(
                   "%s: %s\r\n" % kv for kv in headers.items()))).encode() + body
        t0 = time.perf_counter()
        self.sock.sendall(req)
        while b"\r\n\r\n" not in self.buf:
            t = self._more()
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        hdrs = {k.strip().lower(): v.strip() for k, v in
                (ln.split(":", 1) for ln in lines[1:] if ":" in ln)}
        t = time.perf_counter()
        if not self.buf:
            t = self._more()
        t_first, t_stop = t, None
        if hdrs.get("transfer-encoding", "").lower() == "chunked":
            while True:
                while b"\r\n" not in self.buf:
                    t = self._more()
                size_line, rest = self.buf.split(b"\r\n", 1)
                size = int(size_line.split(b";")[0], 16)
                while len(rest) < size + 2:
                    t = self._more()
                    size_line, rest = self.buf.split(b"\r\n", 1)
                chunk, self.buf = rest[:size], rest[size + 2:]
                if t_stop is None and b"message_stop" in chunk:
                    t_stop = t
                if size == 0:
                    break
        else:
            n = int(hdrs.get("content-length", "0"))
            while len(self.buf) < n:
                t = self._more()
            self.buf = self.buf[n:]
        if hdrs.get("connection", "").lower() == "close":
            self.close()
        return status, t_first - t0, (t_stop - t0) if t_stop else None, t - t0


def pct(xs, p):
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p / 100.0 * (len(s) - 1))))]


def ms(x):
    return "%.3f" % (x * 1000)


# --- the server -------------------------------------------------------------------------


def proc_status(pid):
    out = {}
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            k, v = line.split(":", 1)
            out[k] = v.strip()
    out["fds"] = len(os.listdir("/proc/%d/fd" % pid))
    return out


def cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench_body(stream):
    return json.dumps({"model": MODEL, "max_tokens": 1024, "stream": stream,
                       "messages": [{"role": "user", "content": "say hello"}]}).encode()


def latency(srv, fake_port, token, base=None):
    direct, fresh, gw = Conn(fake_port), Conn(fake_port), Conn(srv.port)
    dh = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
    gh = {"x-api-key": token, "anthropic-version": "2023-06-01"}
    extra = ()
    if base is not None:  # BASE_BIN: the same calls through another build's gateway, in turn
        extra = (("baseline", Conn(base[0].port), GW + MSG,
                  {"x-api-key": base[1], "anthropic-version": "2023-06-01"}),)
    rows = {}
    perf = None
    for stream in (True, False):
        body = bench_body(stream)
        res = {"direct": [], "gateway": [], "fresh": [], "baseline": []}
        cpu = 0.0
        if stream and PERF:
            perf = subprocess.Popen(["perf", "record", "-g", "-o", PERF_DATA, "-p",
                                     str(srv.proc.pid)], stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
            time.sleep(0.5)
        for i in range(WARMUP + N):
            order = (("direct", direct, MSG, dh), ("gateway", gw, GW + MSG, gh),
                     ("fresh", fresh, MSG, dh)) + extra
            for name, conn, path, h in (order if i % 2 else order[::-1]):
                if name == "gateway":
                    c0 = cpu_seconds(srv.proc.pid)
                st, first, stop, end = conn.call(path, body, h)
                assert st == 200, (name, st)
                if name == "fresh":
                    conn.close()  # a new connection for every call, as the gateway's upstream
                if i >= WARMUP:
                    res[name].append((first, stop, end))
                if name == "gateway":
                    cpu += cpu_seconds(srv.proc.pid) - c0
        if perf is not None:
            perf.send_signal(2)
            perf.wait()
            perf = None
        rows[stream] = (res, cpu / (WARMUP + N))
    direct.close()
    gw.close()
    for _, conn, _, _ in extra:
        conn.close()
    t0, c0 = time.perf_counter(), cpu_seconds(srv.proc.pid)
    time.sleep(2)
    rows["idle"] = (cpu_seconds(srv.proc.pid) - c0) / (time.perf_counter() - t0)
    return rows


def print_latency(rows):
    print("\n## Latency, one call at a time (N=%d each, after %d warm-up; %d SSE events, "
          "%.1f ms apart)" % (N, WARMUP, DELTAS + 6, PAUSE_MS))
    print("| call | measure | direct p50 | gateway p50 | **added p50** | direct p99 | "
          "gateway p99 | **added p99** |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for stream, label, cols in ((True, "streamed", ((0, "first event byte"),
                                                    (1, "message_stop event"),
                                                    (2, "end of stream"))),
                                (False, "not streamed", ((2, "whole answer"),))):
        res, _ = rows[stream]
        for idx, what in cols:
            d = [x[idx] for x in res["direct"]]
            for path in ("gateway", "baseline") if res["baseline"] else ("gateway",):
                g = [x[idx] for x in res[path]]
                print("| %s | %s | %s | %s | **%s** | %s | %s | **%s** |" % (
                    label, what + (" (BASE_BIN)" if path == "baseline" else ""),
                    ms(pct(d, 50)), ms(pct(g, 50)), ms(pct(g, 50) - pct(d, 50)),
                    ms(pct(d, 99)), ms(pct(g, 99)), ms(pct(g, 99) - pct(d, 99))))
    print("\nDirect with a new TCP connection per call (the gateway keeps its upstream "
          "connections alive since 2026-12-01; before, it opened one per call):")
    for stream, idx, what in ((True, 0, "streamed, first event byte"),
                              (False, 2, "not streamed, whole answer")):
        res, _ = rows[stream]
        f = [x[idx] for x in res["fresh"]]
        d = [x[idx] for x in res["direct"]]
        print("- %s: p50 %s ms (+%s over keep-alive), p99 %s ms" % (
            what, ms(pct(f, 50)), ms(pct(f, 50) - pct(d, 50)), ms(pct(f, 99))))
    res, _ = rows[True]
    for path in ("gateway", "baseline") if res["baseline"] else ("gateway",):
        tail = [g[2] - g[1] for g in res[path]]
        print("\nThrough the %s, message_stop to the final chunk (the stream ends once the "
              "call's reservation record is durable; in older builds, once its charge is): "
              "p50 %s ms, p99 %s ms; direct: p50 %s ms"
              % ("gateway" if path == "gateway" else "BASE_BIN gateway", ms(pct(tail, 50)),
                 ms(pct(tail, 99)), ms(pct([d[2] - d[1] for d in res["direct"]], 50))))
    for stream in (True, False):
        print("Server CPU per gateway call (%s, counted over each call): %.3f ms" % (
            "streamed" if stream else "not streamed", rows[stream][1] * 1000))
    print("Server CPU when idle: %.3f ms per second" % (rows["idle"] * 1000))


# --- concurrent streams ----------------------------------------------------------------


async def one_stream(port, src, token, opened, results):
    body = bench_body(True)
    req = ("POST %s%s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
           "x-api-key: %s\r\nanthropic-version: 2023-06-01\r\nContent-Length: %d\r\n\r\n"
           % (GW, MSG, token, len(body))).encode() + body
    status, data = None, b""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(src, 0))
    except OSError as e:
        results.append(("connect: %s" % e.__class__.__name__, b""))
        opened.release()
        return
    try:
        writer.write(req)
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ")[1])
        if status != 200:
            opened.release()
            results.append((status, b""))
            return
        while b"text_delta" not in data and b"0\r\n\r\n" not in data:
            d = await reader.read(65536)
            if not d:
                break
            data += d
        opened.release()
        while not data.endswith(b"0\r\n\r\n"):
            d = await reader.read(65536)
            if not d:
                break
            data += d
    except (OSError, asyncio.IncompleteReadError) as e:
        status = status or "error: %s" % e.__class__.__name__
        opened.release()
    finally:
        writer.close()
    results.append((status, data))


def fake_ctl(port, path, body=b"{}"):
    c = Conn(port)
    try:
        st, _, _, _ = c.call(path, body, {})
        return st
    finally:
        c.close()


def fake_stats(port):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"POST /_bench/stats HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
    data = b""
    while not data.endswith(b"}"):
        data += s.recv(4096)
    s.close()
    return json.loads(data.split(b"\r\n\r\n", 1)[1])


async def concurrent(srv, fake_port, token, sources):
    fake_ctl(fake_port, "/_bench/hold", b'{"on": true}')
    opened = asyncio.Semaphore(0)
    results = []
    base = proc_status(srv.proc.pid)
    t0 = time.perf_counter()
    tasks = [asyncio.ensure_future(one_stream(srv.port, sources[i % len(sources)], token,
                                              opened, results)) for i in range(CONCURRENT)]
    for _ in range(CONCURRENT):
        await opened.acquire()
    t_open = time.perf_counter() - t0
    held = await asyncio.get_running_loop().run_in_executor(None, fake_stats, fake_port)
    samples = []
    end = time.perf_counter() + HOLD_S
    while time.perf_counter() < end:
        samples.append(proc_status(srv.proc.pid))
        await asyncio.sleep(0.25)
    fake_ctl(fake_port, "/_bench/release")
    await asyncio.gather(*tasks)
    fake_ctl(fake_port, "/_bench/hold", b'{"on": false}')
    after = proc_status(srv.proc.pid)
    return {"open_s": t_open, "held": held["held"], "base": base, "samples": samples,
            "after": after, "results": results}


def kb(s):
    return int(s.split()[0])


def summarize(label, r):
    ok = sum(1 for st, d in r["results"] if st == 200 and d.endswith(b"0\r\n\r\n")
             and b"message_stop" in d)
    others = {}
    for st, d in r["results"]:
        if not (st == 200 and d.endswith(b"0\r\n\r\n")):
            key = str(st)
            others[key] = others.get(key, 0) + 1
    rss = max(kb(s["VmRSS"]) for s in r["samples"])
    thr = max(int(s["Threads"]) for s in r["samples"])
    fds = max(s["fds"] for s in r["samples"])
    print("| %s | %d | %d | %s | %d / %d | %.1f | %.1f | %d | %d | %.2f |" % (
        label, CONCURRENT, r["held"], ", ".join("%s: %d" % kv for kv in sorted(others.items()))
        or "—", ok, CONCURRENT, kb(r["base"]["VmRSS"]) / 1024, rss / 1024, thr, fds,
        r["open_s"]))
    return ok


# --- main ---------------------------------------------------------------------------------

PERF_DATA = os.path.join(tempfile.gettempdir(), "diverge-llm-bench-perf.data")


def bench_task(srv, ns, task_obj):
    """Creates the Active task of the run in SRV; returns its token."""
    st, _, b = srv.request("POST", ns, task_obj("llm-bench", ns="bench", budgetUSD="100000",
                                                budgetTokens=10 ** 12))
    assert st == 201, b
    deadline = time.time() + 20
    while time.time() < deadline:
        st, _, b = srv.request("GET", ns + "/llm-bench")
        if b["status"].get("phase") == "Active":
            break
        time.sleep(0.05)
    st, _, token = srv.request("GET", ns + "/llm-bench/token")
    assert st == 200, token
    return token.strip()


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    os.environ.setdefault("DIVERGE_BIN", os.path.join(ROOT, build, "diverge"))
    sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
    import harness
    from harness import API, Server, task_obj

    fake = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--fake"],
                            stdout=subprocess.PIPE, text=True)
    fake_port = int(fake.stdout.readline())
    ns = API + "/namespaces/bench/agenttasks"
    try:
        with Server(["--sandbox-provider", "none", "--llm-upstream",
                     "anthropic=http://127.0.0.1:%d" % fake_port],
                    env={"DIVERGE_ANTHROPIC_API_KEY": KEY}) as srv:
            token = bench_task(srv, ns, task_obj)
            print("== %s UTC, %d cores, kernel %s; server, fake upstream and client on the "
                  "same box" % (time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
                                os.cpu_count(), os.uname().release))
            if BASE_BIN:
                harness.DIVERGE_BIN = BASE_BIN
                try:
                    with Server(["--sandbox-provider", "none", "--llm-upstream",
                                 "anthropic=http://127.0.0.1:%d" % fake_port],
                                env={"DIVERGE_ANTHROPIC_API_KEY": KEY}) as bsrv:
                        harness.DIVERGE_BIN = os.environ["DIVERGE_BIN"]
                        rows = latency(srv, fake_port, token,
                                       (bsrv, bench_task(bsrv, ns, task_obj)))
                finally:
                    harness.DIVERGE_BIN = os.environ["DIVERGE_BIN"]
            else:
                rows = latency(srv, fake_port, token)
            print_latency(rows)
            if PERF:
                rep = subprocess.run(["perf", "report", "-i", PERF_DATA, "--no-children",
                                      "--sort", "dso,sym", "--stdio", "-g", "none"],
                                     capture_output=True, text=True)
                top = [ln for ln in rep.stdout.splitlines() if ln.strip() and
                       not ln.startswith("#")][:25]
                print("\nperf (server, streamed gateway calls), top symbols:\n" +
                      "\n".join(top))
            calls = 2 * (WARMUP + N)
            print("\n## %d concurrent streams held open through the gateway for %.0f s"
                  % (CONCURRENT, HOLD_S))
            print("| clients from | streams | held at the fake | not served (status: n) | "
                  "ended well | RSS before MB | RSS held MB (max) | threads (max) | fds (max) "
                  "| all open after s |")
            print("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
            per_prefix = 125  # under the per-address cap (128) with one address per /24
            spread = ["127.0.%d.%d" % (1 + i, 1) for i in range((CONCURRENT + per_prefix - 1)
                                                                // per_prefix)]
            r = asyncio.run(concurrent(srv, fake_port, token, spread))
            ok = summarize("%d addresses, one per /24" % len(spread), r)
            calls += ok
            r = asyncio.run(concurrent(srv, fake_port, token, ["127.0.0.1"]))
            ok1 = summarize("one address (127.0.0.1)", r)
            calls += ok1
            want = Decimal(calls * CALL_MICROS) / 1000000
            # A call's charge commits just after its answer ended: wait for the last ones.
            deadline = time.time() + 30
            while True:
                st, _, b = srv.request("GET", ns + "/llm-bench")
                cost = Decimal(b["status"]["costUSD"])
                if cost >= want or time.time() > deadline:
                    break
                time.sleep(0.05)
            print("\nSpend check: %d good calls x $%s = $%s; the task's costUSD: $%s (%s)"
                  % (calls, Decimal(CALL_MICROS) / 1000000, want, cost,
                     "equal" if cost == want else "DIFFERENT"))
            if ok1 < CONCURRENT:
                with open(srv.stderr_path, errors="replace") as f:
                    lines = [ln.strip() for ln in f if "conn" in ln and "limit" in ln.lower()]
                if lines:
                    print("server log on the refused connections (last): " + lines[-1][:300])
    finally:
        fake.kill()
        fake.wait()
        if os.path.exists(PERF_DATA):
            os.unlink(PERF_DATA)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--fake"]:
        fake_main()
    else:
        main()
