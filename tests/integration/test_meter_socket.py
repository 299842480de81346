# SPDX-License-Identifier: Apache-2.0
"""The meter's unix sockets (SPEC §9, DIVERGE_METER_SOCKET). Every one serves the meter
route only: health, git smart HTTP, the task API and the rest answer 404 there, while a
meter call with the task's token is charged. Local sandboxes each get a socket of their own
under <data-dir>/meter/ (bound at /diverge/sock inside), capped at a few connections and
removed when the sandbox goes away: a task whose agent holds more connections to its socket
than the server's whole connection cap does not keep a task of another project, run by the
real diverge-agent-runner, from metering and completing. Skipped without bubblewrap."""
import http.client
import json
import os
import shutil
import socket
import sys

from harness import API, Server, run_tests
from sandbox_helpers import bare_repo, git, task_log, wait_until
from test_sandbox_local import usable

HOLD = r'''import os, resource, select, socket, sys, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
path, want = os.environ["DIVERGE_METER_SOCKET"], int(sys.argv[1])
held, said, best, flat = [], False, 0, 0
def opened():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(0.2)
    try:
        s.connect(path)
        s.send(b"POST /api/v1/agenttask/meter HTTP/1.1\r\nHost: x\r\nX-Hold: ")
        return s
    except OSError:
        s.close()
        return None
def alive(s):
    p = select.poll()
    p.register(s, select.POLLIN)
    if not p.poll(0):
        return True
    s.close()
    return False
while not os.path.exists("stop"):
    held = [s for s in held if alive(s)]
    full = False
    for _ in range(want - len(held)):
        s = opened()
        if s is None:
            full = True
            break
        held.append(s)
    # Full once three rounds in a row could not add to the most ever held.
    flat = flat + 1 if full and len(held) <= best else 0
    best = max(best, len(held))
    if (flat >= 3 or len(held) >= want) and not said:
        print("socket full: holding %d connections to it" % len(held), flush=True)
        said = True
    time.sleep(0.2)
'''


class UnixHTTP(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("localhost", timeout=30)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(30)
        self.sock.connect(self.path)


def over(sock, method, path, token=None, body=None):
    c = UnixHTTP(sock)
    hdrs = {"Content-Type": "application/json"}
    if token:
        hdrs["Authorization"] = "Bearer " + token
    c.request(method, path, body=json.dumps(body) if body is not None else None, headers=hdrs)
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data


def task_doc(name, ns, url=None, **spec):
    s = {"objective": "fix the thing"}
    if url:
        s["repository"] = {"url": url}
    s.update(spec)
    return {"apiVersion": "divergedev.com/v1alpha1", "kind": "AgentTask",
            "metadata": {"name": name, "namespace": ns}, "spec": s}


def create_in(srv, ns, doc):
    st, _, body = srv.request("POST", API + "/namespaces/%s/agenttasks" % ns, doc)
    assert st == 201, (st, body)


def phase(srv, ns, name):
    st, _, body = srv.request("GET", API + "/namespaces/%s/agenttasks/%s" % (ns, name))
    assert st == 200, (st, body)
    return body["status"]


def token_of(srv, ns, name):
    def get():
        st, _, body = srv.request("GET", API + "/namespaces/%s/agenttasks/%s/token" % (ns, name))
        return body if st == 200 else None
    tok = wait_until(get, what="the token of " + name)
    return tok if isinstance(tok, str) else tok.decode()


def only_meter(sock, srv, ns, name, token):
    """The socket at SOCK answers 404 to everything but the meter, which charges."""
    for method, path, tok in (("GET", "/healthz", None), ("GET", "/metrics", None),
                              ("GET", "/api/v1/git/%s/%s.git/info/refs?service=git-upload-pack"
                               % (ns, name), token),
                              ("POST", "/api/v1/git/%s/%s.git/git-receive-pack" % (ns, name),
                               token),
                              ("GET", API + "/namespaces/%s/agenttasks" % ns, srv.token),
                              ("GET", API + "/namespaces/%s/agenttasks/%s/token" % (ns, name),
                               srv.token)):
        st, body = over(sock, method, path, tok)
        assert st == 404, (method, path, st, body)
    st, body = over(sock, "GET", "/api/v1/agenttask/meter", token)
    assert st == 405, (st, body)
    st, body = over(sock, "POST", "/api/v1/agenttask/meter", token,
                    {"requestId": name + "-sock-1", "iteration": 1, "tokensUsed": 3,
                     "costUSD": "0.01"})
    assert st == 200, (st, body)


def test_shared_socket_serves_only_the_meter():
    with Server(args=["--sandbox-provider", "none"]) as srv:
        create_in(srv, "default", task_doc("ext", "default"))
        wait_until(lambda: phase(srv, "default", "ext")["phase"] == "Active", what="Active")
        tok = token_of(srv, "default", "ext")
        only_meter(os.path.join(srv.data_dir, "sock", "meter.sock"), srv, "default", "ext", tok)
        assert phase(srv, "default", "ext").get("tokensConsumed") == 3, phase(srv, "default", "ext")


def repo_with_hold():
    bare = bare_repo()
    top = os.path.dirname(bare)
    os.chmod(top, 0o755)
    work = os.path.join(top, "work")
    with open(os.path.join(work, "hold.py"), "w") as f:
        f.write(HOLD)
    git("add", "hold.py", cwd=work)
    git("commit", "-q", "-m", "hold", cwd=work)
    git("push", "-q", bare, "main", cwd=work)
    return bare


def socket_dirs(srv):
    root = os.path.join(srv.data_dir, "meter")
    return sorted(os.listdir(root)) if os.path.isdir(root) else []


# The tasks' own sockets, counted: no warm sandbox (test_sandbox_slots) holds one of its own.
SANDBOXED = ["--sandbox-provider", "local", "--sandbox-warm-slots", "0"]


def test_sandbox_socket_is_its_own():
    """A task's socket: only the meter there, a new one per sandbox, gone with it; a task
    that holds more connections than the shared cap (1024) to its own socket leaves
    another project's task unharmed."""
    bare = repo_with_hold()
    try:
        with Server(args=SANDBOXED) as srv:
            create_in(srv, "default", task_doc("hog", "default", "file://" + bare,
                                               maxIterations=1,
                                               runner={"command": "python3 hold.py 1100"}))
            wait_until(lambda: "socket full" in task_log(srv, "hog") or
                       phase(srv, "default", "hog")["phase"] in ("Failed", "Completed"),
                       timeout=120, what="the hog holding every connection it can")
            assert phase(srv, "default", "hog")["phase"] == "Active", task_log(srv, "hog")
            dirs = socket_dirs(srv)

            # Another project's task, with the real runner, meters and completes.
            create_in(srv, "other-project", task_doc(
                "victim", "other-project", "file://" + bare, maxIterations=1,
                runner={"command": "echo fixed > fixed.txt"}))
            log = os.path.join(srv.data_dir, "logs", "other-project", "victim.log")
            st = wait_until(lambda: phase(srv, "other-project", "victim")
                            if phase(srv, "other-project", "victim")["phase"]
                            in ("Completed", "Failed") else None,
                            timeout=120, what="the victim finished")
            with open(log, errors="replace") as f:
                vlog = f.read()
            assert st["phase"] == "Completed", (st, vlog)
            assert git("--git-dir", bare, "show", "agent/victim:fixed.txt") == "fixed\n"
            # Each had a socket of its own; the victim's went with its sandbox, the hog's
            # is still there.
            assert len(dirs) == 1, dirs
            wait_until(lambda: socket_dirs(srv) == dirs, what="the victim's socket removed")
            assert os.path.exists(os.path.join(srv.data_dir, "meter", dirs[0], "meter.sock"))

            # Stop the hog: its socket goes too.
            with open(os.path.join(srv.data_dir, "workspaces", "default", "hog", "stop"),
                      "w") as f:
                f.write("stop\n")
            wait_until(lambda: phase(srv, "default", "hog")["phase"] in ("Completed", "Failed"),
                       timeout=120, what="the hog finished")
            wait_until(lambda: socket_dirs(srv) == [], what="the hog's socket removed")
    finally:
        shutil.rmtree(os.path.dirname(bare), ignore_errors=True)


def test_sandbox_socket_serves_only_the_meter():
    bare = bare_repo()
    os.chmod(os.path.dirname(bare), 0o755)
    try:
        with Server(args=SANDBOXED) as srv:
            create_in(srv, "default", task_doc("probe", "default", "file://" + bare,
                                               maxIterations=1,
                                               runner={"command": "echo waiting; while [ ! "
                                                       "-f stop ]; do sleep 0.1; done"}))
            wait_until(lambda: "waiting" in task_log(srv, "probe") or
                       phase(srv, "default", "probe")["phase"] in ("Failed", "Completed"),
                       timeout=60, what="the agent running")
            assert phase(srv, "default", "probe")["phase"] == "Active", task_log(srv, "probe")
            sock = os.path.join(srv.data_dir, "meter", socket_dirs(srv)[0], "meter.sock")
            tok = token_of(srv, "default", "probe")
            only_meter(sock, srv, "default", "probe", tok)
            with open(os.path.join(srv.data_dir, "workspaces", "default", "probe", "stop"),
                      "w") as f:
                f.write("stop\n")
            wait_until(lambda: phase(srv, "default", "probe")["phase"] in ("Completed",
                                                                           "Failed"),
                       timeout=60, what="the probe finished")
            assert phase(srv, "default", "probe")["phase"] == "Completed", task_log(srv, "probe")
            wait_until(lambda: socket_dirs(srv) == [], what="the socket removed")
    finally:
        shutil.rmtree(os.path.dirname(bare), ignore_errors=True)


if __name__ == "__main__":
    tests = [test_shared_socket_serves_only_the_meter]
    why = usable()
    if why:
        print("SKIP the sandbox tests of test_meter_socket: " + why)
    else:
        tests += [test_sandbox_socket_serves_only_the_meter, test_sandbox_socket_is_its_own]
    run_tests(tests)
