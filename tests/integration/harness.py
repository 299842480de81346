# SPDX-License-Identifier: Apache-2.0
"""The one integration-test harness: starts the real `diverge serve` on a free loopback
port with a temporary data dir, waits until it is ready, and stops it.

Usage:
    from harness import Server, run_tests
    with Server() as srv:
        status, headers, body = srv.request("GET", "/healthz")
"""
import atexit
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.request
import urllib.error

BUILD_DIR = os.environ.get("DIVERGE_BUILD_DIR") or os.path.join(
    os.path.dirname(__file__), "..", "..", "build")
DIVERGE_BIN = os.environ.get("DIVERGE_BIN") or os.path.join(BUILD_DIR, "diverge")
SOURCE_DIR = os.environ.get("DIVERGE_SOURCE_DIR") or os.path.abspath(
    os.path.join(os.path.dirname(__file__), "..", ".."))
API = "/apis/divergedev.com/v1alpha1"

LISTEN_RE = re.compile(r"listening on (http://[0-9.]+:(\d+))")


def scratch_dir(prefix):
    """A new folder (mkdtemp, PREFIX) removed with everything in it when the test process
    exits, however the test ended: nothing a test makes is left in the temporary dir."""
    d = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, d, True)
    return d


class Server:
    """A `diverge serve` child process. data_dir survives stop()/kill() so a test can
    restart on the same data (pass data_dir= to the next Server)."""

    def __init__(self, args=(), env=None, data_dir=None, log_format="json", pass_fds=()):
        self.own_dir = data_dir is None
        # Also gone at the test's exit when cleanup() never ran (a restart on the same
        # data, a scratch dir, a server never started).
        self.data_dir = data_dir or scratch_dir("diverge-test-")
        self.args = list(args)
        self.env = dict(os.environ)
        # Tests start several tasks at once on small machines: no queue (--max-running-tasks
        # defaults to the CPUs) unless a test asks for one with the flag, which wins.
        self.env.setdefault("DIVERGE_MAX_RUNNING_TASKS", "0")
        for k, v in (env or {}).items():
            # A value of None removes the variable.
            if v is None:
                self.env.pop(k, None)
            else:
                self.env[k] = v
        self.log_format = log_format
        self.pass_fds = tuple(pass_fds)  # descriptors the server inherits from us
        self.proc = None
        self.url = None
        self.port = None
        self.token = None
        self.lines = []
        self.stderr_path = os.path.join(self.data_dir, "server-stderr.log")

    def start(self, timeout=20):
        cmd = [DIVERGE_BIN, "serve", "--listen", "127.0.0.1:0", "--data-dir", self.data_dir,
               "--log-format", self.log_format] + self.args
        self._stderr = open(self.stderr_path, "ab")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._stderr,
                                     env=self.env, text=True, pass_fds=self.pass_fds)
        deadline = time.time() + timeout
        while time.time() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.lines.append(line.rstrip("\n"))
            m = LISTEN_RE.search(line)
            if m and self.url is None:
                self.url = m.group(1)
                self.port = int(m.group(2))
            if line.startswith("admin token:") or "admin token" in line:
                break
        if self.url is None:
            self.kill()
            raise RuntimeError("server did not start: %r\nstderr:\n%s" %
                               (self.lines, self.stderr()))
        # Keep draining stdout so the child never blocks on a full pipe.
        threading.Thread(target=self._drain, daemon=True).start()
        with open(os.path.join(self.data_dir, "api-token")) as f:
            self.token = f.read().strip()
        self.wait_ready()
        return self

    def _drain(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def stderr(self):
        """The server's stderr so far (kept after cleanup() removed the data dir)."""
        try:
            with open(self.stderr_path, errors="replace") as f:
                self._stderr_text = f.read()
        except OSError:
            pass
        return getattr(self, "_stderr_text", "")

    def wait_ready(self, timeout=10):
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                st, _, _ = self.request("GET", "/readyz", auth=False)
                if st == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError("server not ready")

    def request(self, method, path, body=None, headers=None, auth=True, raw=False,
                timeout=30):
        """Returns (status, headers dict lower-cased, parsed JSON or text/bytes)."""
        hdrs = {}
        data = None
        if body is not None:
            if isinstance(body, (bytes, bytearray)):
                data = bytes(body)
            elif isinstance(body, str):
                data = body.encode()
            else:
                data = json.dumps(body).encode()
            hdrs["Content-Type"] = "application/json"
        if auth and self.token:
            hdrs["Authorization"] = "Bearer " + self.token
        hdrs.update(headers or {})
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=hdrs)
        try:
            resp = urllib.request.urlopen(req, timeout=timeout)
            status, rh, payload = resp.status, resp.headers, resp.read()
        except urllib.error.HTTPError as e:
            status, rh, payload = e.code, e.headers, e.read()
        rh = {k.lower(): v for k, v in rh.items()}
        if raw:
            return status, rh, payload
        text = payload.decode("utf-8", errors="replace")
        if rh.get("content-type", "").startswith("application/json") and text:
            try:
                return status, rh, json.loads(text)
            except ValueError:
                pass
        return status, rh, text

    def cli(self, *args, input=None, env=None, timeout=30, cwd=None):
        """Runs `diverge ARGS` against this server (in directory CWD when given); returns
        CompletedProcess (text). An env value of None removes that variable."""
        e = dict(os.environ)
        e.update({"DIVERGE_SERVER": self.url, "DIVERGE_API_TOKEN": self.token})
        e.update(env or {})
        e = {k: v for k, v in e.items() if v is not None}
        return subprocess.run([DIVERGE_BIN] + list(args), capture_output=True, text=True,
                              input=input, env=e, timeout=timeout, cwd=cwd)

    def stop(self, sig=signal.SIGTERM, timeout=20):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        rc = self.proc.returncode if self.proc else None
        return rc

    def kill(self):
        return self.stop(signal.SIGKILL)

    def cleanup(self):
        self.stop()
        self.stderr()
        if self.own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.cleanup()


def task_obj(name, objective="do it", ns="default", **spec):
    s = {"objective": objective}
    s.update(spec)
    return {"apiVersion": "divergedev.com/v1alpha1", "kind": "AgentTask",
            "metadata": {"name": name, "namespace": ns}, "spec": s}


def run_tests(tests):
    """Runs the given test functions (name -> fn); exits 1 if any failed. A test
    name given on the command line runs just that test."""
    only = set(sys.argv[1:])
    failed = 0
    for fn in tests:
        if only and fn.__name__ not in only:
            continue
        t0 = time.time()
        try:
            fn()
            print("PASS %s (%.2fs)" % (fn.__name__, time.time() - t0), flush=True)
        except Exception:
            failed += 1
            print("FAIL %s" % fn.__name__, flush=True)
            traceback.print_exc()
    sys.exit(1 if failed else 0)
