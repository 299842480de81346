# SPDX-License-Identifier: Apache-2.0
"""A git remote on loopback over smart HTTP (git http-backend: clone, fetch and push of
the bare repositories under one folder) that can hold requests until released: a remote
that takes its time, or hangs without sending a byte. Python 3 stdlib and git only.

    with HeldGit(folder) as remote:        # serves FOLDER/<name>.git at remote.url + "/<name>.git"
        remote.hold_pushes()               # every receive-pack request waits (sends nothing)
        ...
        remote.wait_held()                 # a push reached the remote and waits
        remote.release()                   # held requests go on, later ones are served

Nothing is held until hold_pushes(); `requests` lists (method, path) of
every request in arrival order; `held` counts requests waiting now."""
import http.server
import os
import subprocess
import threading
import time

__all__ = ["HeldGit", "serve_http_backend"]


def serve_http_backend(h, root, path_info, method, query, body, headers, user="git"):
    """Answers the request of handler H with `git http-backend` on the repositories under
    ROOT (PATH_INFO names the repository and service; HEADERS maps lower-case names, e.g.
    content-type). Pushes are allowed (REMOTE_USER)."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/"),
           "GIT_PROJECT_ROOT": root, "GIT_HTTP_EXPORT_ALL": "1", "PATH_INFO": path_info,
           "REQUEST_METHOD": method, "QUERY_STRING": query, "REMOTE_USER": user,
           "REMOTE_ADDR": "127.0.0.1", "CONTENT_TYPE": headers.get("content-type", ""),
           "CONTENT_LENGTH": str(len(body))}
    for header, var in (("content-encoding", "HTTP_CONTENT_ENCODING"),
                        ("git-protocol", "GIT_PROTOCOL")):
        if headers.get(header):
            env[var] = headers[header]
    p = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True)
    head, sep, payload = p.stdout.partition(b"\r\n\r\n")
    if not sep:
        head, _, payload = p.stdout.partition(b"\n\n")
    status, out = 200, []
    for line in head.decode("latin-1").splitlines():
        k, _, v = line.partition(":")
        if k.strip().lower() == "status":
            status = int(v.split()[0])
        elif k.strip():
            out.append((k.strip(), v.strip()))
    h.send_response(status)
    for k, v in out:
        h.send_header(k, v)
    h.send_header("Content-Length", str(len(payload)))
    h.end_headers()
    h.wfile.write(payload)


class HeldGit:
    def __init__(self, root):
        self.root = os.path.realpath(root)
        self.requests = []
        self.held = 0
        self._what = None  # None or "push"
        self._gate = threading.Event()
        self._gate.set()
        self._lock = threading.Lock()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_GET(self):
                outer._serve(self, "GET")

            def do_POST(self):
                outer._serve(self, "POST")

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = "http://127.0.0.1:%d" % self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def hold_pushes(self):
        """From now on every push request waits until release()."""
        self._what = "push"
        self._gate.clear()

    def release(self):
        self._what = None
        self._gate.set()

    def wait_held(self, timeout=60):
        """Waits until a request is held; AssertionError after TIMEOUT seconds."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.held > 0:
                return
            time.sleep(0.02)
        raise AssertionError("no request reached the remote: %r" % self.requests)

    def close(self):
        self.release()
        self.httpd.shutdown()
        self.httpd.server_close()

    def _holds(self, path):
        return self._what == "push" and "git-receive-pack" in path

    @staticmethod
    def _body(h):
        if h.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = b""
            while True:
                size = int(h.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    h.rfile.readline()
                    return out
                out += h.rfile.read(size)
                h.rfile.readline()
        return h.rfile.read(int(h.headers.get("Content-Length") or 0))

    def _serve(self, h, method):
        body = self._body(h) if method == "POST" else b""
        path, _, query = h.path.partition("?")
        with self._lock:
            self.requests.append((method, h.path))
        if self._holds(h.path):
            with self._lock:
                self.held += 1
            self._gate.wait()
            with self._lock:
                self.held -= 1
        try:
            serve_http_backend(h, self.root, path, method, query, body, h.headers)
        except OSError:
            pass  # the client went (killed, or its low-speed limit)
