# SPDX-License-Identifier: Apache-2.0
"""Helpers for the diverge-agent-runner tests: a bare git repository made from
examples/demo-repo, the runner's SPEC §9 environment, and a scripted fake meter served
over a unix socket (all loopback or file://)."""
import http.server
import json
import os
import shutil
import socketserver
import subprocess
import threading

from harness import API, BUILD_DIR, SOURCE_DIR

RUNNER_BIN = os.path.join(BUILD_DIR, "diverge-agent-runner")
DEMO_AGENT = os.path.join(SOURCE_DIR, "examples", "agents", "demo-agent.sh")
DEMO_REPO = os.path.join(SOURCE_DIR, "examples", "demo-repo")
NS = API + "/namespaces/default/agenttasks"
METER = "/api/v1/agenttask/meter"


def git(*args, cwd=None):
    r = subprocess.run(["git"] + list(args), cwd=cwd, capture_output=True, text=True)
    assert r.returncode == 0, (args, r.stdout, r.stderr)
    return r.stdout


def make_bare_repo(tmp):
    """A bare repository at TMP/origin.git whose main holds examples/demo-repo; returns
    its file:// URL."""
    src = os.path.join(tmp, "src")
    shutil.copytree(DEMO_REPO, src)
    git("init", "-q", "-b", "main", cwd=src)
    git("-c", "user.name=t", "-c", "user.email=t@example.invalid", "add", "-A", cwd=src)
    git("-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-q", "-m",
        "demo", cwd=src)
    bare = os.path.join(tmp, "origin.git")
    git("init", "-q", "--bare", "-b", "main", bare)
    git("push", "-q", bare, "main", cwd=src)
    return "file://" + bare


def runner_env(tmp, task, repo_url, **extra):
    """The sandbox environment of SPEC §9 for TASK (no token or meter yet: pass them)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DIVERGE_", "DEMO_"))}
    env.update({
        "DIVERGE_TASK_NAME": task,
        "DIVERGE_NAMESPACE": "default",
        "DIVERGE_OBJECTIVE": "fix the greeting",
        "DIVERGE_REPO_URL": repo_url,
        "DIVERGE_BASE_BRANCH": "main",
        "DIVERGE_WORKING_BRANCH": "agent/" + task,
        "DIVERGE_MAX_ITERATIONS": "5",
        "DIVERGE_AGENT_CMD": "sh " + DEMO_AGENT,
        "DIVERGE_VERIFY_CMD": "sh test.sh",
        "DIVERGE_WORKSPACE_DIR": os.path.join(tmp, "workspace"),
        "DIVERGE_USAGE_FILE": os.path.join(tmp, "usage.jsonl"),
        # Retries of a meter call wait 10 ms, 20 ms, ... 500 ms instead of 100 ms ... 5 s:
        # the same attempts, in a tenth of the time.
        "DIVERGE_METER_BACKOFF_MS": "10",
    })
    for k, v in extra.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = str(v)
    return env


def run_runner(env, timeout=120):
    r = subprocess.run([RUNNER_BIN], env=env, capture_output=True, text=True,
                       timeout=timeout)
    return r


def usage_lines(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]


def branch_log(bare_url, branch):
    """(subject, author) of the tip of BRANCH in the bare repository, or None."""
    bare = bare_url[len("file://"):]
    r = subprocess.run(["git", "--git-dir", bare, "log", "-1", "--format=%s%x00%an <%ae>",
                        "refs/heads/" + branch], capture_output=True, text=True)
    if r.returncode != 0:
        return None
    subject, author = r.stdout.rstrip("\n").split("\0")
    return subject, author


def show_file(bare_url, branch, path):
    bare = bare_url[len("file://"):]
    return git("--git-dir", bare, "show", "refs/heads/%s:%s" % (branch, path))


class FakeMeter:
    """A meter over a unix socket. ANSWER(body_dict, headers) returns (status, dict); the
    default answers 200 with totals. Every request is recorded in .calls as
    (headers, body_dict)."""

    def __init__(self, path, answer=None):
        self.path = path
        self.calls = []
        self.answer = answer or (lambda body, headers: (200, {"allowed": True}))
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def address_string(self):
                return "unix"

            def log_message(self, *args):
                pass

            def do_POST(self):
                n = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(n).decode())
                headers = {k.lower(): v for k, v in self.headers.items()}
                fake.calls.append((self.path, headers, body))
                status, out = fake.answer(body, headers)
                data = json.dumps(out).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        class Srv(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
            daemon_threads = True

        self.srv = Srv(path, Handler)
        threading.Thread(target=self.srv.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()

    def ids(self):
        return [c[2]["requestId"] for c in self.calls]
