# SPDX-License-Identifier: Apache-2.0
"""Cluster mode with sandbox pods (docs/cluster-mode.md "Together"): two replicas
`serve --store kubernetes --sandbox-provider agent-sandbox` against one
tests/fakes/fake_kube.py (one macaroon root key, short Lease knobs as in
test_cluster_mode.py), a repository task (a real bare repository on disk, the demo agent).

What a cluster has and this test builds from loopback pieces:
- a Service in front of the replicas: `--public-url` of both is a TCP forwarder that
  spreads connections over the live replicas (round robin), so the pod's meter and git
  calls reach the leader and the follower;
- one volume for the git repositories: `<data-dir>/mirrors` and `<data-dir>/staging` of
  both replicas are the same directory (symlinks here; a ReadWriteMany volume mounted at
  both paths in a cluster). Without it a follower answers the pod's git calls with 404
  "the task's repository is not prepared" and a new leader has no staging to push from
  (test_follower_without_the_shared_volume).

The leader creates exactly one SandboxClaim; the test plays the pod (the real
diverge-agent-runner with the claim's env: clone, meter, push over HTTP through the
Service); the leader is SIGKILLed before the pod finishes; the new leader adopts the claim
(same uid, never deleted or created again); the fake says the pod finished; the task
Completes once and the new leader pushes `fix(<task>): ...` to the bare repository's
working branch. A second task's pod runs right after the kill (the survivor alone serves
it), the new leader pauses and resumes it (fresh token) and completes it too. The token Secret task-token-<task>, written by the store and by the
provider, holds the token of the claim's env, and is gone with the claim at the end."""
import base64
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading

from github_helpers import wait
from harness import API, Server, run_tests
from runner_helpers import DEMO_AGENT, RUNNER_BIN, branch_log, make_bare_repo
from test_cluster_mode import LEASE_ENV, Cluster as KubeCluster, phase, reconciled
from sandbox_helpers import patch, task_log
from test_sandbox_agent import POOL
from test_sandbox_agent_git import TOKEN_ENV, http_status, pod_env, repo_task

NS = API + "/namespaces/default/agenttasks"
METER = "/api/v1/agenttask/meter"


class Service:
    """A loopback stand-in for a Kubernetes Service: each connection goes to the next live
    backend (round robin); a backend that refuses is skipped."""

    def __init__(self):
        self.backends = []  # (host, port)
        self.next = 0
        self.lock = threading.Lock()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = "http://127.0.0.1:%d" % self.sock.getsockname()[1]
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.closed:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _connect(self):
        with self.lock:
            order = [self.backends[(self.next + i) % len(self.backends)]
                     for i in range(len(self.backends))]
            self.next += 1
        for addr in order:
            try:
                return socket.create_connection(addr, timeout=5)
            except OSError:
                continue
        return None

    @staticmethod
    def _pump(src, dst):
        try:
            while True:
                b = src.recv(65536)
                if not b:
                    break
                dst.sendall(b)
        except OSError:
            pass
        for s in (dst, src):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _serve(self, c):
        b = self._connect()
        if b is None:
            c.close()
            return
        b.settimeout(None)
        t = threading.Thread(target=self._pump, args=(b, c), daemon=True)
        t.start()
        self._pump(c, b)
        t.join(timeout=300)
        c.close()
        b.close()

    def close(self):
        self.closed = True
        self.sock.close()


class Cluster(KubeCluster):
    def __init__(self, shared=True):
        super().__init__()
        self.service = Service()
        self.shared = shared
        self.volume = os.path.join(self.dir, "volume")
        for d in ("mirrors", "staging"):
            os.makedirs(os.path.join(self.volume, d))
        self.args = []

    def replica(self, name):
        data = tempfile.mkdtemp(prefix="diverge-replica-")
        if self.shared:
            for d in ("mirrors", "staging"):
                os.symlink(os.path.join(self.volume, d), os.path.join(data, d))
        env = dict(LEASE_ENV, POD_NAME=name, DIVERGE_SANDBOX_POLL_MS="100", KUBECONFIG=None,
                   GITHUB_TOKEN=None)
        srv = Server(["--store", "kubernetes", "--kubeconfig", self.kubeconfig,
                      "--macaroon-root-key-file", self.root_key,
                      "--sandbox-provider", "agent-sandbox", "--sandbox-warm-pool", POOL,
                      "--public-url", self.service.url] + self.args, env=env, data_dir=data)
        srv.own_dir = True  # removed by cleanup()
        srv.start()
        srv.name = name
        self.replicas.append(srv)
        self.service.backends.append(("127.0.0.1", srv.port))
        return srv

    def obj(self, plural, name, ns="default"):
        with self.kube.lock:
            o = self.kube.objects.get((plural, ns, name))
            return None if o is None else dict(o)

    def events_of(self, plural, name, ns="default"):
        """(type, uid) of every change of NAME in the API server's history."""
        with self.kube.lock:
            return [(typ, obj["metadata"].get("uid")) for _, p, hns, typ, obj in
                    self.kube.history if p == plural and hns == ns and
                    obj["metadata"]["name"] == name]

    def close(self):
        self.service.close()
        super().close()


def claim_env(c, name):
    wait(lambda: c.obj("sandboxclaims", "diverge-" + name) is not None, what="the claim")
    claim = c.obj("sandboxclaims", "diverge-" + name)
    return {e["name"]: e["value"] for e in claim["spec"]["env"]}


def secret_token(c, name):
    s = c.obj("secrets", "task-token-" + name)
    return base64.b64decode(s["data"]["token"]).decode() if s else None


def pod_requests(srv):
    """The git and meter requests SRV answered (from its request log)."""
    out = []
    for line in srv.stderr().splitlines():
        try:
            j = json.loads(line)
        except ValueError:
            continue
        p = j.get("path") or ""
        if j.get("event") == "request" and p.startswith(("/api/v1/git/", METER)):
            out.append((p, j.get("status")))
    return out


def test_leader_dies_while_the_pod_runs():
    tmp = tempfile.mkdtemp(prefix="diverge-kcombo-")
    origin = make_bare_repo(tmp)
    c = Cluster()
    c.args = ["--agent-cmd", "sh " + DEMO_AGENT, "--verify-cmd", "sh test.sh"]
    try:
        a = c.replica("replica-a")
        wait(lambda: c.holder() == "replica-a", what="replica-a leads")
        b = c.replica("replica-b")
        st, _, body = b.request("POST", NS, repo_task("k1", origin))
        assert st == 201, body
        env = claim_env(c, "k1")
        git_url = c.service.url + "/api/v1/git/default/k1.git"
        assert env["DIVERGE_REPO_URL"] == git_url and env["DIVERGE_PUSH_URL"] == git_url, env
        assert env["DIVERGE_METER_URL"] == c.service.url + "/api/v1/agenttask/meter", env
        wait(lambda: phase(b, NS + "/k1") == "Active", what="k1 Active")
        tok = env[TOKEN_ENV]
        # One token: the store's Secret and the provider's carry the claim's.
        wait(lambda: secret_token(c, "k1") == tok, what="task-token-k1 holds the claim's token")
        c.kube.agent_bind("default", "diverge-k1", "10.1.5.1")
        uid = c.obj("sandboxclaims", "diverge-k1")["metadata"]["uid"]
        # A second task: its pod runs while nobody leads; paused and resumed after the
        # handover.
        st, _, body = a.request("POST", NS, repo_task("k3", origin))
        assert st == 201, body
        tok3 = claim_env(c, "k3")[TOKEN_ENV]
        wait(lambda: phase(b, NS + "/k3") == "Active", what="k3 Active")
        c.kube.agent_bind("default", "diverge-k3", "10.1.5.3")

        # Both replicas serve the task's git endpoint (the shared volume).
        for srv in (a, b):
            st, _ = http_status(srv.url + "/api/v1/git/default/k1.git/info/refs"
                                "?service=git-upload-pack", {"Authorization": "Bearer " + tok})
            assert st == 200, (srv.name, st)

        # The pod: clone, meter, push over HTTP through the Service (both replicas).
        r = subprocess.run([RUNNER_BIN], env=pod_env(env, tmp), capture_output=True,
                           text=True, timeout=180)
        assert r.returncode == 0, (r.stdout, r.stderr)
        staging = os.path.join(c.volume, "staging", "default", "k1.git")
        refs = subprocess.run(["git", "--git-dir", staging, "for-each-ref",
                               "--format=%(refname)"], capture_output=True, text=True,
                              check=True).stdout
        assert refs.strip() == "refs/heads/agent/k1", refs
        consumed = b.request("GET", NS + "/k1")[2]["status"]["tokensConsumed"]
        assert consumed > 0
        # The Service spread the pod's calls: both replicas served some of them.
        for srv in (a, b):
            assert pod_requests(srv), (srv.name, srv.stderr()[-2000:])

        # The leader dies before the pod finished; the follower takes over and adopts.
        a.kill()
        c.service.backends.remove(("127.0.0.1", a.port))
        # k3's pod runs right after the kill (the dead leader's Lease has likely not expired:
        # nobody leads): the survivor alone serves its clone, meter calls and push.
        env3 = claim_env(c, "k3")
        tmp3 = os.path.join(tmp, "pod3")
        os.makedirs(tmp3)
        r = subprocess.run([RUNNER_BIN], env=pod_env(env3, tmp3), capture_output=True,
                           text=True, timeout=180)
        assert r.returncode == 0, (r.stdout, r.stderr)
        wait(lambda: c.holder() == "replica-b", timeout=30, what="replica-b takes over")
        wait(lambda: "diverge-k1 adopted" in task_log(b, "k1"), what="claim adopted")
        assert "no staging repository" not in task_log(b, "k1")
        # The new leader pauses and resumes the adopted k3: the old token is revoked, the
        # resumed pod's template carries a fresh one that works through the Service.
        patch(b, "k3", {"suspended": True})
        wait(lambda: phase(b, NS + "/k3") == "Paused", what="k3 Paused")
        wait(lambda: c.obj("sandboxes", "diverge-k3-sbx")["spec"]["operatingMode"] ==
             "Suspended", what="k3 Suspended")
        git3 = c.service.url + "/api/v1/git/default/k3.git/info/refs?service=git-upload-pack"
        st, _ = http_status(git3, {"Authorization": "Bearer " + tok3})
        assert st == 401, st
        patch(b, "k3", {"suspended": False})
        wait(lambda: phase(b, NS + "/k3") == "Active", what="k3 Active again")

        def fresh():
            sb = c.obj("sandboxes", "diverge-k3-sbx")
            ct = sb["spec"]["podTemplate"]["spec"]["containers"][0]
            v = {e["name"]: e["value"] for e in ct["env"]}.get(TOKEN_ENV)
            return v if v and v != tok3 else None
        wait(fresh, what="fresh token in k3's pod template")
        st, _ = http_status(git3, {"Authorization": "Bearer " + fresh()})
        assert st == 200, st
        wait(lambda: secret_token(c, "k3") == fresh(), what="task-token-k3 holds the fresh token")
        assert [t for t, _ in c.events_of("sandboxclaims", "diverge-k3")].count("ADDED") == 1
        c.kube.agent_finish("default", "diverge-k3-sbx", True)
        wait(lambda: phase(b, NS + "/k3") in ("Completed", "Failed"), timeout=60,
             what="k3 ends")
        st3 = b.request("GET", NS + "/k3")[2]["status"]
        assert st3["phase"] == "Completed", st3
        tip = branch_log(origin, "agent/k3")
        assert tip is not None and tip[0].startswith("fix(k3): "), tip

        c.kube.agent_finish("default", "diverge-k1-sbx", True)
        wait(lambda: phase(b, NS + "/k1") in ("Completed", "Failed"), timeout=60,
             what="k1 ends")
        body = b.request("GET", NS + "/k1")[2]
        assert body["status"]["phase"] == "Completed", (body["status"], b.stderr()[-4000:])
        tip = branch_log(origin, "agent/k1")
        assert tip is not None and tip[0].startswith("fix(k1): "), tip

        # Exactly one claim, adopted: created once, the same uid, deleted only at the end.
        ev = c.events_of("sandboxclaims", "diverge-k1")
        assert [t for t, _ in ev].count("ADDED") == 1, ev
        assert all(u == uid for _, u in ev), ev
        wait(lambda: c.obj("sandboxclaims", "diverge-k1") is None, what="claim deleted")
        assert [t for t, _ in c.events_of("sandboxclaims", "diverge-k1")].count("DELETED") == 1
        # Completed once; no action reconciled twice across the replicas.
        ph = c.phases("default", "k1")
        assert ph.count("Completed") == 1 and len(ph) == len(set(ph)), ph
        actions = reconciled((a, b), "k1")
        assert actions and len(actions) == len(set(actions)), actions
        # The token Secret goes with the claim; the index entry is revoked.
        wait(lambda: c.obj("secrets", "task-token-k1") is None, what="token Secret deleted")
        st, _ = http_status(b.url + "/api/v1/git/default/k1.git/info/refs"
                            "?service=git-upload-pack", {"Authorization": "Bearer " + tok})
        assert st == 401, st
        for srv in (a, b):
            err = srv.stderr()
            assert tok not in err and "Sanitizer" not in err and "runtime error" not in err, \
                (srv.name, err[-4000:])
    finally:
        c.close()
        shutil.rmtree(tmp, ignore_errors=True)


def test_follower_without_the_shared_volume():
    """Each replica with only its own data dir: the follower has no mirror or staging for
    the leader's task and says so (404, not a 5xx or an empty repository)."""
    tmp = tempfile.mkdtemp(prefix="diverge-kcombo-")
    origin = make_bare_repo(tmp)
    c = Cluster(shared=False)
    try:
        a = c.replica("replica-a")
        wait(lambda: c.holder() == "replica-a", what="replica-a leads")
        b = c.replica("replica-b")
        st, _, body = a.request("POST", NS, repo_task("k2", origin))
        assert st == 201, body
        tok = claim_env(c, "k2")[TOKEN_ENV]
        wait(lambda: phase(a, NS + "/k2") == "Active", what="k2 Active")
        path = "/api/v1/git/default/k2.git/info/refs?service=git-upload-pack"
        st, _ = http_status(a.url + path, {"Authorization": "Bearer " + tok})
        assert st == 200, st
        st, body = http_status(b.url + path, {"Authorization": "Bearer " + tok})
        assert st == 404 and b"not prepared" in body, (st, body)
        # The leader dies; the new one adopts the claim but has no staging to push from.
        c.kube.agent_bind("default", "diverge-k2", "10.1.5.2")
        a.kill()
        wait(lambda: c.holder() == "replica-b", timeout=30, what="replica-b takes over")
        c.kube.agent_finish("default", "diverge-k2-sbx", True)
        wait(lambda: phase(b, NS + "/k2") in ("Completed", "Failed"), timeout=60,
             what="k2 ends")
        body = b.request("GET", NS + "/k2")[2]
        assert body["status"]["phase"] == "Failed", body["status"]
        assert body["status"]["reason"] == "PushFailed", body["status"]
        assert "no staging repository for this task on this replica" in task_log(b, "k2")
        assert "sandbox_staging_missing" in b.stderr()
    finally:
        c.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    run_tests([test_leader_dies_while_the_pod_runs, test_follower_without_the_shared_volume])
