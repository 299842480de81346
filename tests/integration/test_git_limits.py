# SPDX-License-Identifier: Apache-2.0
"""Limits of the git smart HTTP endpoint (/api/v1/git/<ns>/<task>.git) with
`serve --sandbox-provider agent-sandbox` against tests/fakes/fake_kube.py, the test playing
the sandbox pods with their task tokens: receive-pack bodies are spooled to disk as they
arrive, so four large pushes at once leave the server's resident memory far below their
size, and a body over the cap (--git-push-max) is cut (chunked) or refused before it is
read (Content-Length); a task runs at most two git requests at once: a third gets 429
with Retry-After (git reports the 429) while other tasks go on, and the slots come back
when the requests end."""
import os
import shutil
import socket
import tempfile
import threading

from harness import run_tests
from runner_helpers import make_bare_repo
from sandbox_helpers import create, wait_phase, wait_until
from test_sandbox_agent import Cluster
from test_sandbox_agent_git import TOKEN_ENV, claim_env, git_as, http_status, repo_task

MIB = 1 << 20


def vm_rss(pid):
    """Resident memory of PID in bytes."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS for %d" % pid)


def head(port, path, token, extra=""):
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    s.sendall(("POST %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
               "Content-Type: application/x-git-receive-pack-request\r\n%s\r\n"
               % (path, token, extra)).encode())
    return s


def read_status(s):
    """The status of the response on S (skipping a 100 Continue); None when cut."""
    data = b""
    try:
        while True:
            while b"\r\n\r\n" not in data:
                chunk = s.recv(4096)
                if not chunk:
                    return None
                data += chunk
            line, _, data = data.partition(b"\r\n")
            status = int(line.split()[1])
            hdrs, _, data = data.partition(b"\r\n\r\n")
            if status != 100:
                return status, hdrs.decode(errors="replace")
    except OSError:
        return None


def chunked_push(port, path, token, total, on_chunk):
    """Sends TOTAL bytes of zeros as a chunked receive-pack body; (status or None, sent)."""
    s = head(port, path, token, "Transfer-Encoding: chunked\r\n")
    chunk = b"%x\r\n" % MIB + b"\0" * MIB + b"\r\n"
    sent = 0
    try:
        while sent < total:
            s.sendall(chunk)
            sent += MIB
            on_chunk()
        s.sendall(b"0\r\n\r\n")
    except OSError:
        pass  # the server answered and closed: the rest is not read
    r = read_status(s)
    s.close()
    return (r[0] if r else None), sent


def two_tasks(cl, srv, origin):
    create(srv, repo_task("m1", origin))
    create(srv, repo_task("m2", origin))
    toks = {n: claim_env(cl, n)[TOKEN_ENV] for n in ("m1", "m2")}
    wait_phase(srv, "m1", "Active")
    wait_phase(srv, "m2", "Active")
    return toks


def test_large_pushes_do_not_grow_memory():
    tmp = tempfile.mkdtemp(prefix="diverge-glim-")
    origin = make_bare_repo(tmp)
    try:
        with Cluster() as cl, cl.server() as srv:
            toks = two_tasks(cl, srv, origin)
            pid = srv.proc.pid
            base = vm_rss(pid)
            peak = [base]

            def sample():
                peak[0] = max(peak[0], vm_rss(pid))

            # Two pushes of each task at once, 150 MiB each (chunked: no length known).
            results = []
            jobs = [(n, toks[n]) for n in ("m1", "m2", "m1", "m2")]

            def push(name, tok):
                results.append(chunked_push(srv.port, "/api/v1/git/default/%s.git/"
                                            "git-receive-pack" % name, tok, 150 * MIB, sample))
            threads = [threading.Thread(target=push, args=j) for j in jobs]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=600)
            sample()
            grew = peak[0] - base
            assert grew < 100 * MIB, "server RSS grew by %d MiB while 4 x 150 MiB were " \
                "pushed (%r)" % (grew // MIB, results)
            # Each was cut soon after the cap (64 MiB by default): a 413, whose connection
            # is closed with the rest of the body unread (the client may see a reset).
            assert len(results) == 4, results
            assert all(st in (413, None) and sent < 150 * MIB for st, sent in results), results
            st, _ = http_status(srv.url + "/healthz")
            assert st == 200, st
            # A length over the cap is refused before any body byte is read.
            s = head(srv.port, "/api/v1/git/default/m1.git/git-receive-pack", toks["m1"],
                     "Content-Length: %d\r\nExpect: 100-continue\r\n" % (65 * MIB))
            r = read_status(s)
            s.close()
            assert r is not None and r[0] == 413, r
            # Nothing is left in the spool directory.
            spool = os.path.join(srv.data_dir, "spool")
            wait_until(lambda: not os.path.isdir(spool) or os.listdir(spool) == [],
                       what="an empty spool")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_third_git_request_of_a_task_is_refused():
    tmp = tempfile.mkdtemp(prefix="diverge-glim-")
    origin = make_bare_repo(tmp)
    try:
        with Cluster() as cl, cl.server() as srv:
            toks = two_tasks(cl, srv, origin)
            url = srv.url + "/api/v1/git/default/m1.git"
            refs = url + "/info/refs?service=git-upload-pack"
            auth = {"Authorization": "Bearer " + toks["m1"]}
            # Two pushes of m1 in flight: each holds its slot once the server said
            # 100 Continue (the headers were taken).
            held = []
            for _ in range(2):
                s = head(srv.port, "/api/v1/git/default/m1.git/git-receive-pack", toks["m1"],
                         "Transfer-Encoding: chunked\r\nExpect: 100-continue\r\n")
                line = s.recv(64)
                assert line.startswith(b"HTTP/1.1 100"), line
                s.sendall(b"4\r\n0000\r\n")
                held.append(s)
            st, body = http_status(refs, auth)
            assert st == 429, (st, body)
            req_hdrs = read_refusal(srv.port, "/api/v1/git/default/m1.git/info/refs?"
                                    "service=git-upload-pack", toks["m1"])
            assert req_hdrs[0] == 429 and "retry-after: " in req_hdrs[1].lower(), req_hdrs
            # git says so.
            rc, out = git_as(toks["m1"], "ls-remote", url)
            assert rc != 0 and "429" in out, out
            # Another task is not held up.
            st, _ = http_status(srv.url + "/api/v1/git/default/m2.git/info/refs?"
                                "service=git-upload-pack",
                                {"Authorization": "Bearer " + toks["m2"]})
            assert st == 200, st
            for s in held:
                s.close()
            wait_until(lambda: http_status(refs, auth)[0] == 200, what="the slots back")
            rc, out = git_as(toks["m1"], "ls-remote", url)
            assert rc == 0, out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def read_refusal(port, path, token):
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(("GET %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n"
               % (path, token)).encode())
    r = read_status(s)
    s.close()
    return r


if __name__ == "__main__":
    run_tests([test_large_pushes_do_not_grow_memory,
               test_third_git_request_of_a_task_is_refused])
