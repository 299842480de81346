# SPDX-License-Identifier: Apache-2.0
"""Many LLM streams at once through the gateway (SPEC §13) of the real `diverge serve`: a
streamed call holds four descriptors in the server (the client's connection, the
upstream's, libcurl's wake-up pair), so the server raises its soft RLIMIT_NOFILE at start
(hosts and container runtimes often give a soft 1024 under a much higher hard limit).
Started here with a soft limit of 256, it still carries 100 concurrent streams (about 400
descriptors) to their end, each charged exactly once. And a stream whose upstream falls
silent for longer than the listener's idle timeout (reasoning models can think for
minutes between events) is relayed to its end and charged its real usage, not cut when
the next event arrives and charged its reservation."""
import concurrent.futures
import http.client
import json
import os
import resource
import socket
import sys
import threading
import time
from decimal import Decimal

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "fakes"))

from fake_llm import FakeLLM  # noqa: E402
from harness import API, Server, run_tests  # noqa: E402
from llm_helpers import wait_charges, wait_for  # noqa: E402
from sdk_helpers import start_task  # noqa: E402

NS = API + "/namespaces/default/agenttasks"
MSG = "/api/v1/llm/anthropic/v1/messages"
KEY = "sk-ant-server-key-streams-51a7"
MODEL = "claude-sonnet-4-5-20250929"
STREAMS = 100


def stream(srv, token):
    """One streamed Messages call; returns (status, bytes, error or None)."""
    body = {"model": MODEL, "max_tokens": 100, "stream": True,
            "messages": [{"role": "user", "content": "say hello"}]}
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
    data, err = b"", None
    try:
        conn.request("POST", MSG, json.dumps(body).encode(),
                     {"Content-Type": "application/json", "x-api-key": token})
        resp = conn.getresponse()
        while True:
            chunk = resp.read1(65536)
            if not chunk:
                break
            data += chunk
        return resp.status, data, None
    except (http.client.HTTPException, OSError) as e:
        err = e
    finally:
        conn.close()
    return None, data, err


def nofile_of(pid):
    """(soft, hard) 'Max open files' of process PID."""
    with open("/proc/%d/limits" % pid) as f:
        for line in f:
            if line.startswith("Max open files"):
                soft, hard = line.split()[3:5]
                return int(soft), int(hard)
    raise AssertionError("no Max open files in /proc/%d/limits" % pid)


def test_soft_fd_limit_raised_and_concurrent_streams_served():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1024:
        raise AssertionError("this test needs a hard RLIMIT_NOFILE of 1024 or more, not %d"
                             % hard)
    want = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
    fake = FakeLLM().start()
    srv = Server(["--sandbox-provider", "none", "--llm-upstream", "anthropic=" + fake.url],
                 env={"DIVERGE_ANTHROPIC_API_KEY": KEY})
    try:
        # The server inherits a soft limit of 256 (restored here right after its start).
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
        try:
            srv.start()
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        assert nofile_of(srv.proc.pid)[0] == want, (nofile_of(srv.proc.pid), want)
        log = srv.stderr()
        if want >= 4 * (1024 + 64 + 128) + 1024:
            raised = [ln for ln in log.splitlines() if "fd_limit_raised" in ln]
            assert len(raised) == 1 and '"from":"256"' in raised[0], raised
            assert '"to":"%d"' % want in raised[0], raised
        else:  # a hard limit under what the connection limits want: the server says so
            assert "fd_limit_low" in log, log
        tok = start_task(srv, "many", budgetUSD="50.00")
        # Every stream waits at the fake until all of them reached it: all are open at once.
        go = threading.Event()
        fake.script += [{"delay_event": go} for _ in range(STREAMS)]

        def one(_):
            return stream(srv, tok)

        with concurrent.futures.ThreadPoolExecutor(STREAMS) as ex:
            futures = [ex.submit(one, i) for i in range(STREAMS)]
            try:
                wait_for(lambda: len(fake.requests) == STREAMS,
                         "%d streams at the fake (%d)" % (STREAMS, len(fake.requests)))
                fds = len(os.listdir("/proc/%d/fd" % srv.proc.pid))
                assert fds > 256, fds  # more than the soft limit it was started with
            finally:
                go.set()
            results = [f.result() for f in futures]
        for st, data, err in results:
            assert st == 200 and err is None, (st, data[:300], err)
            assert data.decode().count("event: ") == 8 and b"message_stop" in data, data
        wait_charges(srv, "many", STREAMS)
        st, _, t = srv.request("GET", NS + "/many")
        # Each call: 100 input x $3 + 50 output x $15 per million tokens = $0.00105.
        assert fake.usage == {"input": 100, "output": 50, "cache_write": 0, "cache_read": 0}
        assert Decimal(t["status"]["costUSD"]) == STREAMS * Decimal("0.00105"), t["status"]
        assert all(r["headers"]["x-api-key"] == KEY for r in fake.requests)
        assert json.dumps(fake.requests).count(tok) == 0
    finally:
        srv.cleanup()
        fake.stop()


def read_log(srv, name):
    with open(os.path.join(srv.data_dir, "logs", "default", name + ".log")) as f:
        return f.read()


def test_stream_silent_past_the_idle_timeout_is_relayed_to_its_end():
    fake = FakeLLM().start()
    # An idle timeout of 1 s (the listener's is 120 s, a task socket's 30 s).
    srv = Server(["--sandbox-provider", "none", "--llm-upstream", "anthropic=" + fake.url],
                 env={"DIVERGE_ANTHROPIC_API_KEY": KEY, "DIVERGE_IDLE_TIMEOUT_S": "1",
                      "DIVERGE_HEAD_DEADLINE_MS": "60000"})
    try:
        srv.start()
        tok = start_task(srv, "silent", budgetUSD="5.00")
        paused, resume = threading.Event(), threading.Event()
        # message_start, block start, ping, a delta; then silence until resume.
        fake.script.append({"pause_after": 4, "paused": paused, "resume": resume})
        with concurrent.futures.ThreadPoolExecutor(1) as ex:
            f = ex.submit(stream, srv, tok)
            assert paused.wait(30), "the stream never reached the fake"
            # The stimulus, not a wait for a result: the upstream stays silent for three
            # times the idle timeout (libmicrohttpd counts whole seconds of no activity).
            time.sleep(3)
            resume.set()
            st, data, err = f.result()
        assert st == 200 and err is None, (st, data, err)
        text = data.decode()
        assert text.count("event: ") == 8 and "message_stop" in text, text
        # Charged its real usage (100 in, 50 out), not its reservation.
        wait_charges(srv, "silent", 1)
        st, _, t = srv.request("GET", NS + "/silent")
        assert Decimal(t["status"]["costUSD"]) == Decimal("0.00105"), t["status"]
        log = read_log(srv, "silent")
        assert "input=100 output=50" in log and "before its usage arrived" not in log, log
        # Once a stream ended, its connection has the listener's idle timeout again: kept
        # alive and idle, the server closes it (the guard's 60 s head deadline here is not
        # what closes it).
        sock = socket.create_connection(("127.0.0.1", srv.port), timeout=25)
        body = json.dumps({"model": MODEL, "max_tokens": 100, "stream": True,
                           "messages": [{"role": "user", "content": "hi"}]}).encode()
        sock.sendall(("POST %s HTTP/1.1\r\nHost: x\r\nx-api-key: %s\r\n"
                      "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                      % (MSG, tok, len(body))).encode() + body)
        data = b""
        while not data.endswith(b"\r\n0\r\n\r\n"):
            chunk = sock.recv(65536)
            assert chunk, data
            data += chunk
        assert b"message_stop" in data and b"connection: close" not in data.lower(), data
        assert sock.recv(1) == b"", "the idle connection was not closed"
        sock.close()
    finally:
        srv.cleanup()
        fake.stop()


def test_stream_silent_before_its_end_gets_its_final_chunk():
    """Every event relayed, then the upstream stays silent past the listener's idle timeout
    before it ends the stream (as a slow end or charge can): the client still gets the
    stream's final chunk. The idle timeout the ended stream gets back counts from its end,
    not from its last event (the connection was closed before the final chunk)."""
    fake = FakeLLM().start()
    srv = Server(["--sandbox-provider", "none", "--llm-upstream", "anthropic=" + fake.url],
                 env={"DIVERGE_ANTHROPIC_API_KEY": KEY, "DIVERGE_IDLE_TIMEOUT_S": "1",
                      "DIVERGE_HEAD_DEADLINE_MS": "60000"})
    try:
        srv.start()
        tok = start_task(srv, "late-end", budgetUSD="5.00")
        paused, resume = threading.Event(), threading.Event()
        fake.script.append({"pause_after": 8, "paused": paused, "resume": resume})
        with concurrent.futures.ThreadPoolExecutor(1) as ex:
            f = ex.submit(stream, srv, tok)
            assert paused.wait(30), "the stream never reached its end at the fake"
            time.sleep(3)  # the stimulus: three idle timeouts of silence before the end
            resume.set()
            st, data, err = f.result()
        assert st == 200 and err is None, (st, data, err)
        text = data.decode()
        assert text.count("event: ") == 8 and "message_stop" in text, text
        wait_charges(srv, "late-end", 1)
    finally:
        srv.cleanup()
        fake.stop()


if __name__ == "__main__":
    run_tests([test_soft_fd_limit_raised_and_concurrent_streams_served,
               test_stream_silent_past_the_idle_timeout_is_relayed_to_its_end,
               test_stream_silent_before_its_end_gets_its_final_chunk])
