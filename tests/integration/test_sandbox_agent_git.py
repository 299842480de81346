# SPDX-License-Identifier: Apache-2.0
"""A repository task with `serve --sandbox-provider agent-sandbox` against
tests/fakes/fake_kube.py, the test playing the sandbox pod: it reads the SandboxClaim's
spec.env and runs the real diverge-agent-runner with it (workspace in a temp dir, the demo
agent on the demo repo), which clones over the server's git smart HTTP
(/api/v1/git/<ns>/<task>.git), meters over HTTP and pushes over HTTP into the task's
staging repository; the fake then says the pod finished (exit 0) and the server pushes
`fix(<task>): …` to the working branch of the real bare repository. Hooks planted in the
staging repository never run.

Refused, with nothing changed in staging: a push to another branch, a non-fast-forward, a
delete, another task's token, no token; upload-pack with a revoked token (task paused)
answers 401; the resumed Sandbox's pod template carries the fresh token."""
import base64
import http.server
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import urllib.error
import urllib.request

from harness import API, run_tests
from runner_helpers import DEMO_AGENT, RUNNER_BIN, branch_log, make_bare_repo
from sandbox_helpers import create, patch, wait_phase, wait_until
from test_sandbox_agent import Cluster

TOKEN_ENV = "DIVERGE_MACAROON_TOKEN"


def claim_env(cl, name):
    claim = cl.wait_obj("sandboxclaims", "diverge-" + name)
    return {e["name"]: e["value"] for e in claim["spec"]["env"]}


def repo_task(name, url):
    return {"apiVersion": "divergedev.com/v1alpha1", "kind": "AgentTask",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"objective": "fix the greeting", "maxIterations": 4,
                     "repository": {"url": url, "baseBranch": "main",
                                    "workingBranch": "agent/" + name}}}


def pod_env(claim, tmp):
    """What the pod's runner sees: the claim's env plus what the chart's template sets."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DIVERGE_", "DEMO_", "GIT_"))}
    env.update(claim)
    env["DIVERGE_WORKSPACE_DIR"] = os.path.join(tmp, "workspace")
    env["DIVERGE_USAGE_FILE"] = os.path.join(tmp, "usage.jsonl")
    env["HOME"] = tmp
    return env


def git_as(token, *args, cwd=None):
    """git with TOKEN as the bearer header (None: no header); (returncode, output)."""
    cfg = [] if token is None else ["-c", "http.extraHeader=Authorization: Bearer " + token]
    env = dict(os.environ, GIT_TERMINAL_PROMPT="0", GIT_AUTHOR_NAME="t",
               GIT_AUTHOR_EMAIL="t@example.invalid", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@example.invalid")
    r = subprocess.run(["git"] + cfg + list(args), cwd=cwd, capture_output=True, text=True,
                       env=env, timeout=60)
    return r.returncode, r.stdout + r.stderr


def staging_refs(srv, name):
    d = os.path.join(srv.data_dir, "staging", "default", name + ".git")
    r = subprocess.run(["git", "--git-dir", d, "for-each-ref", "--format=%(refname) %(objectname)"],
                       capture_output=True, text=True, check=True)
    return r.stdout


def http_status(url, headers=None):
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_pod_clones_meters_and_pushes_over_http():
    tmp = tempfile.mkdtemp(prefix="diverge-agit-")
    origin = make_bare_repo(tmp)
    args = ["--agent-cmd", "sh " + DEMO_AGENT, "--verify-cmd", "sh test.sh"]
    try:
        with Cluster() as cl, cl.server(args=args) as srv:
            create(srv, repo_task("g1", origin))
            create(srv, repo_task("g2", origin))
            env1, env2 = claim_env(cl, "g1"), claim_env(cl, "g2")
            url = srv.url + "/api/v1/git/default/g1.git"
            assert env1["DIVERGE_REPO_URL"] == url and env1["DIVERGE_PUSH_URL"] == url, env1
            assert env1[TOKEN_ENV] and env1[TOKEN_ENV] != env2[TOKEN_ENV]
            wait_phase(srv, "g1", "Active")
            wait_phase(srv, "g2", "Active")
            cl.fake.agent_bind("default", "diverge-g1", "10.1.3.1")
            cl.fake.agent_bind("default", "diverge-g2", "10.1.3.2")

            # Hooks in the staging repository never run (core.hooksPath=/dev/null): one
            # that ran would leave a marker and refuse the push.
            marker = os.path.join(tmp, "hook-ran")
            hooks = os.path.join(srv.data_dir, "staging", "default", "g1.git", "hooks")
            os.makedirs(hooks, exist_ok=True)
            for h in ("pre-receive", "update", "post-receive", "post-update"):
                with open(os.path.join(hooks, h), "w") as f:
                    f.write("#!/bin/sh\ntouch '%s'\nexit 1\n" % marker)
                os.chmod(os.path.join(hooks, h), 0o755)

            # The pod: clone, meter and push over HTTP with the claim's env only.
            r = subprocess.run([RUNNER_BIN], env=pod_env(env1, tmp), capture_output=True,
                               text=True, timeout=180)
            assert r.returncode == 0, (r.stdout, r.stderr)
            assert env1[TOKEN_ENV] not in r.stdout + r.stderr
            pushed = staging_refs(srv, "g1")
            assert pushed.startswith("refs/heads/agent/g1 "), pushed
            assert len(pushed.splitlines()) == 1, pushed
            assert not os.path.exists(marker), "a staging hook ran"

            # Refusals: nothing changes in staging.
            ws = os.path.join(tmp, "workspace")
            tok1, tok2 = env1[TOKEN_ENV], env2[TOKEN_ENV]
            rc, out = git_as(tok1, "push", url, "HEAD:refs/heads/other", cwd=ws)
            assert rc != 0, out
            rc, out = git_as(tok1, "push", url, "HEAD:refs/heads/main", cwd=ws)
            assert rc != 0, out
            rc, out = git_as(tok1, "push", url, ":refs/heads/agent/g1", cwd=ws)
            assert rc != 0, out
            rc, out = git_as(None, "push", url, "HEAD:refs/heads/agent/g1", cwd=ws)
            assert rc != 0, out
            rc, out = git_as(tok2, "ls-remote", url)
            assert rc != 0, out
            with open(os.path.join(ws, "extra.txt"), "w") as f:
                f.write("rewritten\n")
            git_as(None, "add", "extra.txt", cwd=ws)
            git_as(None, "commit", "-q", "--amend", "-m", "rewritten", cwd=ws)
            rc, out = git_as(tok1, "push", url, "+HEAD:refs/heads/agent/g1", cwd=ws)
            assert rc != 0, out
            assert staging_refs(srv, "g1") == pushed, staging_refs(srv, "g1")
            # Another task's token, no token, a bad token: refused without the body.
            st, _ = http_status(url + "/info/refs?service=git-upload-pack")
            assert st == 401, st
            st, _ = http_status(url + "/info/refs?service=git-upload-pack",
                                {"Authorization": "Bearer " + tok2})
            assert st == 403, st
            basic = base64.b64encode(b"x:" + tok1.encode()).decode()
            st, body = http_status(url + "/info/refs?service=git-upload-pack",
                                   {"Authorization": "Basic " + basic})
            assert st == 200 and b"# service=git-upload-pack" in body, (st, body[:200])
            st, _ = http_status(url + "/info/refs", {"Authorization": "Bearer " + tok1})
            assert st == 403, st  # the dumb protocol is not served

            # The pod finished with exit 0: the server pushes from staging.
            cl.fake.agent_finish("default", "diverge-g1-sbx", True)
            body = wait_phase(srv, "g1", ("Completed", "Failed"), timeout=60)
            assert body["status"]["phase"] == "Completed", body["status"]
            assert body["status"]["costUSD"] not in (None, "0", "0.00"), body["status"]
            tip = branch_log(origin, "agent/g1")
            assert tip is not None and tip[0].startswith("fix(g1): "), tip
            assert branch_log(origin, "other") is None

            # A paused task's token is revoked: 401; the resumed pod gets the fresh one.
            url2 = srv.url + "/api/v1/git/default/g2.git"
            st, _ = http_status(url2 + "/info/refs?service=git-upload-pack",
                                {"Authorization": "Bearer " + tok2})
            assert st == 200, st
            patch(srv, "g2", {"suspended": True})
            wait_phase(srv, "g2", "Paused")
            st, _ = http_status(url2 + "/info/refs?service=git-upload-pack",
                                {"Authorization": "Bearer " + tok2})
            assert st == 401, st
            req = urllib.request.Request(
                url2 + "/git-upload-pack", data=b"0000", method="POST",
                headers={"Authorization": "Bearer " + tok2,
                         "Content-Type": "application/x-git-upload-pack-request"})
            try:
                urllib.request.urlopen(req, timeout=10)
                assert False, "upload-pack with a revoked token answered"
            except urllib.error.HTTPError as e:
                assert e.code == 401, e.code
                assert tok2.encode() not in e.read()
            patch(srv, "g2", {"suspended": False})
            wait_phase(srv, "g2", "Active")

            def fresh():
                sb = cl.obj("sandboxes", "diverge-g2-sbx")
                c = sb["spec"]["podTemplate"]["spec"]["containers"][0]
                v = {e["name"]: e["value"] for e in c["env"]}.get(TOKEN_ENV)
                return v if v and v != tok2 else None
            wait_until(lambda: fresh() is not None, what="fresh token in the pod template")
            st, _ = http_status(url2 + "/info/refs?service=git-upload-pack",
                                {"Authorization": "Bearer " + fresh()})
            assert st == 200, st
            srv.stop()
            err = srv.stderr()
            # Sanitizer builds: no report from the server; never a token in its log.
            assert "Sanitizer" not in err and "runtime error" not in err, err[-4000:]
            assert tok1 not in err and tok2 not in err
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_staging_refuses_the_base_branch():
    """A task whose working branch is its base branch cannot push into staging either (the
    server would refuse to push it on), also with the comment-made annotations set through
    the task API; the staging repository gets nothing."""
    tmp = tempfile.mkdtemp(prefix="diverge-agit-")
    origin = make_bare_repo(tmp)
    try:
        with Cluster() as cl, cl.server(args=["--agent-cmd", "true"]) as srv:
            t = repo_task("b1", origin)
            t["spec"]["repository"]["workingBranch"] = "main"
            t["metadata"]["annotations"] = {"divergedev.com/provider": "github",
                                            "divergedev.com/project": "octo/repo",
                                            "divergedev.com/pr-number": "7"}
            create(srv, t)
            env = claim_env(cl, "b1")
            wait_phase(srv, "b1", "Active")
            url = srv.url + "/api/v1/git/default/b1.git"
            auth = {"Authorization": "Bearer " + env[TOKEN_ENV]}
            st, _ = http_status(url + "/info/refs?service=git-upload-pack", auth)
            assert st == 200, st  # cloning is fine
            st, body = http_status(url + "/info/refs?service=git-receive-pack", auth)
            assert st == 403 and b"base branch" in body, (st, body[:300])
            ws = os.path.join(tmp, "ws")
            rc, out = git_as(env[TOKEN_ENV], "clone", "-q", "--branch", "main", url, ws)
            assert rc == 0, out
            with open(os.path.join(ws, "x.txt"), "w") as f:
                f.write("x\n")
            git_as(None, "add", "x.txt", cwd=ws)
            git_as(None, "commit", "-q", "-m", "x", cwd=ws)
            rc, out = git_as(env[TOKEN_ENV], "push", url, "HEAD:refs/heads/main", cwd=ws)
            assert rc != 0, out
            assert staging_refs(srv, "b1") == "", staging_refs(srv, "b1")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PreviewRouter:
    """A loopback stand-in for the preview router: 200 to every GET, records the
    x-diverge-env header of each."""

    def __init__(self):
        self.seen = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                outer.seen.append(self.headers.get("x-diverge-env"))
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d" % self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_pod_over_https_trusts_only_the_given_ca():
    """With the public URL on the TLS listener (as the chart runs it) the pod clones, meters
    and pushes over HTTPS trusting DIVERGE_CA_FILE (the chart mounts the server's CA);
    without it the server's self-signed certificate is refused and nothing is pushed."""
    tmp = tempfile.mkdtemp(prefix="diverge-agits-")
    origin = make_bare_repo(tmp)
    port = free_port()
    router = PreviewRouter()
    args = ["--agent-cmd", "sh " + DEMO_AGENT, "--verify-cmd", "sh test.sh",
            "--tls-listen", "127.0.0.1:%d" % port, "--public-url", "https://127.0.0.1:%d" % port,
            "--preview-base-url", router.url]
    try:
        with Cluster() as cl, cl.server(args=args) as srv:
            create(srv, repo_task("s1", origin))
            env = claim_env(cl, "s1")
            assert env["DIVERGE_REPO_URL"].startswith("https://127.0.0.1:%d/" % port), env
            assert env["DIVERGE_METER_URL"].startswith("https://127.0.0.1:%d/" % port), env
            wait_phase(srv, "s1", "Active")
            cl.fake.agent_bind("default", "diverge-s1", "10.1.4.1")

            # The linked preview Environment carries the sandbox pod's IP (SPEC §4, §11).
            def sandbox_ip():
                st, _, e = srv.request("GET", API + "/namespaces/default/environments/"
                                       "agent-preview-s1")
                return st == 200 and e["metadata"].get("annotations", {}).get(
                    "divergedev.com/sandbox-ip") == "10.1.4.1"
            wait_until(sandbox_ip, what="the pod IP on the Environment")
            assert env["DIVERGE_PREVIEW_HEADER_VALUE"] == "agent-preview-s1", env
            r = subprocess.run([RUNNER_BIN], env=pod_env(env, tmp), capture_output=True,
                               text=True, timeout=180)
            assert r.returncode != 0, "the runner trusted a self-signed certificate"
            assert "certificate" in (r.stdout + r.stderr).lower(), (r.stdout, r.stderr)
            assert staging_refs(srv, "s1") == "", staging_refs(srv, "s1")
            shutil.rmtree(os.path.join(tmp, "workspace"), ignore_errors=True)
            penv = pod_env(env, tmp)
            penv["DIVERGE_CA_FILE"] = os.path.join(srv.data_dir, "tls.crt")
            r = subprocess.run([RUNNER_BIN], env=penv, capture_output=True, text=True,
                               timeout=180)
            assert r.returncode == 0, (r.stdout, r.stderr)
            assert staging_refs(srv, "s1").startswith("refs/heads/agent/s1 ")
            cl.fake.agent_finish("default", "diverge-s1-sbx", True)
            body = wait_phase(srv, "s1", ("Completed", "Failed"), timeout=60)
            assert body["status"]["phase"] == "Completed", body["status"]
            assert body["status"]["costUSD"] not in (None, "0", "0.00"), body["status"]
            assert "agent-preview-s1" in router.seen, router.seen
    finally:
        router.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    run_tests([test_pod_clones_meters_and_pushes_over_http,
               test_staging_refuses_the_base_branch,
               test_pod_over_https_trusts_only_the_given_ca])
