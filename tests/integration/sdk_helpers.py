# SPDX-License-Identifier: Apache-2.0
"""Helpers for test_sdk.py: a task with its token, and small stdlib HTTP servers that
stand between an SDK and the real meter (a flaky proxy that fails on purpose before
forwarding, and a unix-socket front end, because `diverge serve` does not listen on a
unix socket yet)."""
import http.server
import json
import os
import socketserver
import threading
import time
import urllib.error
import urllib.request

from harness import API, task_obj

NS = API + "/namespaces/default/agenttasks"
METER = "/api/v1/agenttask/meter"
COMPLETE = "/api/v1/agenttask/complete"


def wait_phase(srv, name, phase, timeout=20):
    deadline = time.time() + timeout
    b = None
    while time.time() < deadline:
        st, _, b = srv.request("GET", NS + "/" + name)
        if st == 200 and b["status"]["phase"] == phase:
            return b
        time.sleep(0.02)
    raise AssertionError("task %s never reached %s: %s" % (name, phase, b))


def start_task(srv, name, **spec):
    """Creates task NAME, waits until it is Active, returns its capability token."""
    st, _, b = srv.request("POST", NS, task_obj(name, **spec))
    assert st == 201, b
    wait_phase(srv, name, "Active")
    return current_token(srv, name)


def current_token(srv, name):
    st, _, tok = srv.request("GET", NS + "/" + name + "/token")
    assert st == 200, (st, tok)
    return tok.strip()


def set_suspended(srv, name, value):
    st, _, b = srv.request("PATCH", NS + "/" + name, {"spec": {"suspended": value}},
                           headers={"Content-Type": "application/merge-patch+json"})
    assert st == 200, b


def totals(srv, name):
    st, _, b = srv.request("GET", NS + "/" + name)
    return b["status"]["tokensConsumed"], b["status"]["costUSD"], b


def forward(upstream, path, headers, body):
    """POSTs BODY to UPSTREAM+PATH with the Authorization of HEADERS; (status, body)."""
    h = {"Content-Type": "application/json"}
    if headers.get("Authorization"):
        h["Authorization"] = headers["Authorization"]
    req = urllib.request.Request(upstream + path, data=body, method="POST", headers=h)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        fe = self.server.front
        with fe.lock:
            n = len(fe.seen)
            fe.seen.append({"path": self.path, "headers": dict(self.headers),
                            "body": json.loads(body) if body else None})
        if n < fe.drop:
            # Close without an answer: the client sees a reset / disconnect.
            self.close_connection = True
            self.connection.shutdown(2)
            return
        if n < fe.drop + fe.fail:
            self._send(503, b'{"error":"try later","reason":"ServiceUnavailable"}')
            return
        status, payload = forward(fe.upstream, self.path, self.headers, body)
        if n < fe.drop + fe.fail + fe.lose:
            # Forwarded, then the answer is lost: the client retries what went through.
            self.close_connection = True
            self.connection.shutdown(2)
            return
        self._send(status, payload)

    def _send(self, status, payload):
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(payload)
        self.close_connection = True


class _TcpServer(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


class _UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def get_request(self):
        conn, _ = super().get_request()
        return conn, ("unix", 0)  # BaseHTTPRequestHandler wants a (host, port) pair


class FrontEnd:
    """Receives meter requests, records them (path, headers, parsed body), drops the
    connection of the first DROP, answers 503 to the next FAIL, forwards the next LOSE and
    drops their answers, and forwards the rest to UPSTREAM (the real server). With UNIX_PATH it listens on that unix socket instead of
    a loopback port (`diverge serve` has no unix listener yet)."""

    def __init__(self, upstream, drop=0, fail=0, unix_path=None, port=0, lose=0):
        self.upstream, self.drop, self.fail, self.lose = upstream, drop, fail, lose
        self.seen = []
        self.lock = threading.Lock()
        if unix_path:
            self.httpd = _UnixServer(unix_path, _Handler)
            self.url = None
        else:
            self.httpd = _TcpServer(("127.0.0.1", port), _Handler)
            self.url = "http://127.0.0.1:%d%s" % (self.httpd.server_address[1], METER)
        self.httpd.front = self
        self.thread = threading.Thread(target=self.httpd.serve_forever,
                                       kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def request_ids(self):
        return [s["body"]["requestId"] for s in self.seen]

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Env:
    """Sets environment variables (None removes) for the block, then restores them."""

    def __init__(self, **values):
        self.values = values
        self.saved = {}

    def __enter__(self):
        for k, v in self.values.items():
            self.saved[k] = os.environ.get(k)
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        return self

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
