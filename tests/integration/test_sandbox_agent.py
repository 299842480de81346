# SPDX-License-Identifier: Apache-2.0
"""`serve --sandbox-provider agent-sandbox` against tests/fakes/fake_kube.py, whose
simulated agent-sandbox controller binds a claim to a Sandbox with a pod IP and ends the
runner when the test says so (fake_kube.py docstring): the SandboxClaim diverge-<task>
with warmPoolRef, the SPEC §9 environment and lifecycle.shutdownTime; the token Secret
task-token-<task>; pause/resume patch the bound Sandbox's spec.operatingMode; the runner's
end completes or fails the task and deletes the claim (and with it the Sandbox) and the
Secret; deleting a task deletes its claim; a repository that cannot be mirrored fails
with SandboxError before any claim (repositories: test_sandbox_agent_git.py)."""
import base64
import datetime
import json
import os
import shutil
import sys
import tempfile
import time
import urllib.request

from harness import API, Server, run_tests, scratch_dir
from sandbox_helpers import create, get, patch, task, task_log, wait_phase, wait_until

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "fakes"))
from fake_kube import FakeKube  # noqa: E402

TOKEN = "agent-sandbox-test-token"
POOL = "diverge-sandbox"


class Cluster:
    def __init__(self):
        self.fake = FakeKube(token=TOKEN)
        self.dir = scratch_dir("diverge-agent-")
        self.kubeconfig = os.path.join(self.dir, "kubeconfig")
        with open(self.kubeconfig, "w") as f:
            f.write("apiVersion: v1\nkind: Config\n"
                    "clusters:\n- name: fake\n  cluster:\n    server: %s\n"
                    "users:\n- name: u\n  user:\n    token: %s\n"
                    "contexts:\n- name: c\n  context:\n    cluster: fake\n    user: u\n"
                    "current-context: c\n" % (self.fake.url, TOKEN))

    def __enter__(self):
        self.fake.start()
        return self

    def __exit__(self, *exc):
        self.fake.stop()

    def server(self, data_dir=None, args=()):
        return Server(args=["--sandbox-provider", "agent-sandbox", "--kubeconfig",
                            self.kubeconfig, "--sandbox-warm-pool", POOL] + list(args),
                      env={"DIVERGE_SANDBOX_POLL_MS": "100", "KUBECONFIG": None},
                      data_dir=data_dir)

    def control(self, what, **body):
        req = urllib.request.Request(
            self.fake.url + "/fake/agent-sandbox/" + what, data=json.dumps(body).encode(),
            headers={"Authorization": "Bearer " + TOKEN, "Content-Type": "application/json"},
            method="POST")
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())

    def obj(self, plural, name, ns="default"):
        with self.fake.lock:
            o = self.fake.objects.get((plural, ns, name))
            return None if o is None else dict(o)

    def wait_obj(self, plural, name, present=True):
        wait_until(lambda: (self.obj(plural, name) is not None) == present,
                   what="%s %s %s" % (plural, name, "present" if present else "gone"))
        return self.obj(plural, name)


def parse_time(s):
    return datetime.datetime.strptime(s, "%Y-%m-%dT%H:%M:%SZ").replace(
        tzinfo=datetime.timezone.utc)


def secret_token(cl, name):
    s = cl.obj("secrets", "task-token-" + name)
    return base64.b64decode(s["data"]["token"]).decode() if s else None


def test_claim_pause_resume_complete():
    with Cluster() as cl, cl.server() as srv:
        create(srv, task("a1", sandbox={"timeoutSeconds": 1800}))
        before = datetime.datetime.now(datetime.timezone.utc)
        claim = cl.wait_obj("sandboxclaims", "diverge-a1")
        body = wait_phase(srv, "a1", "Active")
        spec = claim["spec"]
        assert spec["warmPoolRef"] == {"name": POOL}, spec
        assert claim["metadata"]["labels"]["divergedev.com/agenttask"] == "a1", claim
        env = {e["name"]: e["value"] for e in spec["env"]}
        assert env["DIVERGE_METER_URL"] == srv.url + "/api/v1/agenttask/meter", env
        assert env["DIVERGE_TASK_NAME"] == "a1" and env["DIVERGE_NAMESPACE"] == "default"
        assert env["DIVERGE_OBJECTIVE"] == "fix the thing", env
        for k in ("DIVERGE_MAX_ITERATIONS", "DIVERGE_AGENT_CMD", "DIVERGE_VERIFY_CMD",
                  "DIVERGE_START_ITERATION", "DIVERGE_BASE_BRANCH", "DIVERGE_WORKING_BRANCH"):
            assert k in env, (k, env)
        assert env["DIVERGE_USAGE_FILE"].startswith("/tmp/"), env
        # The template's own (envVarsInjectionPolicy Allowed refuses overrides) and the
        # server's host paths are not in the claim.
        for k in ("DIVERGE_TOKEN_FILE", "DIVERGE_WORKSPACE_DIR", "HOME", "PATH",
                  "DIVERGE_METER_SOCKET", "DIVERGE_PUSH_URL"):
            assert k not in env, (k, env)
        shut = parse_time(spec["lifecycle"]["shutdownTime"])
        delta = (shut - before).total_seconds()
        assert 1800 <= delta <= 1800 + 60 + 30, (delta, spec["lifecycle"])
        assert spec["lifecycle"]["shutdownPolicy"] == "Delete", spec
        first = secret_token(cl, "a1")
        assert first, "no token Secret"
        assert body["status"]["phase"] == "Active"

        # Paused before agent-sandbox bound the claim: suspended once it is.
        create(srv, task("a2"))
        cl.wait_obj("sandboxclaims", "diverge-a2")
        wait_phase(srv, "a2", "Active")
        patch(srv, "a2", {"suspended": True})
        wait_phase(srv, "a2", "Paused")
        cl.fake.agent_bind("default", "diverge-a2", "10.1.2.9")
        wait_until(lambda: cl.obj("sandboxes", "diverge-a2-sbx")["spec"]["operatingMode"]
                   == "Suspended", what="late operatingMode Suspended")
        assert cl.obj("pods", "diverge-a2-sbx") is None  # the fake's controller removed it

        # The simulated agent-sandbox controller binds a pod.
        cl.fake.agent_bind("default", "diverge-a1", "10.1.2.3")
        cl.wait_obj("sandboxes", "diverge-a1-sbx")

        patch(srv, "a1", {"suspended": True})
        wait_phase(srv, "a1", "Paused")
        wait_until(lambda: cl.obj("sandboxes", "diverge-a1-sbx")["spec"]["operatingMode"]
                   == "Suspended", what="operatingMode Suspended")
        time.sleep(1.1)  # the wall clock passes a second: a moved shutdownTime shows
        resumed = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
        patch(srv, "a1", {"suspended": False})
        wait_phase(srv, "a1", "Active")
        wait_until(lambda: cl.obj("sandboxes", "diverge-a1-sbx")["spec"]["operatingMode"]
                   == "Running", what="operatingMode Running")
        # Paused time does not count: the claim's shutdownTime moved on with the resume.
        shut2 = parse_time(cl.obj("sandboxclaims", "diverge-a1")["spec"]["lifecycle"]
                           ["shutdownTime"])
        assert (shut2 - resumed).total_seconds() >= 1800 and shut2 > shut, (shut2, shut)
        second = secret_token(cl, "a1")
        assert second and second != first, "the resumed sandbox must get the fresh token"

        cl.fake.agent_finish("default", "diverge-a1-sbx", True)
        body = wait_phase(srv, "a1", ("Completed", "Failed"))
        assert body["status"]["phase"] == "Completed", (body["status"], task_log(srv, "a1"))
        cl.wait_obj("sandboxclaims", "diverge-a1", present=False)
        cl.wait_obj("sandboxes", "diverge-a1-sbx", present=False)
        cl.wait_obj("secrets", "task-token-a1", present=False)
        log = task_log(srv, "a1")
        assert "sandbox claim default/diverge-a1 (warm pool %s)" % POOL in log, log
        assert "sandbox claim diverge-a1 deleted" in log, log
        assert "operatingMode Suspended" in log, log


def test_runner_failure_delete_and_repository():
    with Cluster() as cl, cl.server() as srv:
        create(srv, task("b1"))
        cl.wait_obj("sandboxclaims", "diverge-b1")
        # Through the fake's HTTP test controls this time.
        cl.control("bind", namespace="default", claim="diverge-b1", podIP="10.1.2.4",
                   sandbox="warm-x7k2")
        assert cl.obj("pods", "warm-x7k2")["status"]["podIP"] == "10.1.2.4"
        cl.control("finish", namespace="default", sandbox="warm-x7k2", succeeded=False,
                   exitCode=3)
        body = wait_phase(srv, "b1", ("Completed", "Failed"))
        assert body["status"]["reason"] == "RunnerFailed", body["status"]
        # The exact status from the pod (Finished only says PodFailed).
        assert body["status"]["message"] == "the runner exited with status 3", body["status"]
        cl.wait_obj("sandboxclaims", "diverge-b1", present=False)
        cl.wait_obj("sandboxes", "warm-x7k2", present=False)
        cl.wait_obj("pods", "warm-x7k2", present=False)

        # A claim deleted under a running task: the sandbox is gone, the task fails.
        create(srv, task("b2"))
        cl.wait_obj("sandboxclaims", "diverge-b2")
        wait_phase(srv, "b2", "Active")
        with cl.fake.lock:
            cl.fake.delete("sandboxclaims", "default", "diverge-b2")
        body = wait_phase(srv, "b2", ("Completed", "Failed"))
        assert body["status"]["phase"] == "Failed", body["status"]

        # Deleting a task deletes its claim and token Secret.
        create(srv, task("b3"))
        cl.wait_obj("sandboxclaims", "diverge-b3")
        wait_phase(srv, "b3", "Active")
        st, _, _ = srv.request("DELETE", API + "/namespaces/default/agenttasks/b3")
        assert st in (200, 202), st
        cl.wait_obj("sandboxclaims", "diverge-b3", present=False)
        cl.wait_obj("secrets", "task-token-b3", present=False)

        # A repository is served to the pod over git smart HTTP
        # (test_sandbox_agent_git.py); one that cannot be mirrored fails before any claim.
        create(srv, task("b4", "file:///nonexistent/repo.git"))
        body = wait_phase(srv, "b4", ("Completed", "Failed"))
        assert body["status"]["reason"] == "SandboxError", body["status"]
        assert "agent-sandbox cannot" not in body["status"]["message"], body["status"]
        assert cl.obj("sandboxclaims", "diverge-b4") is None
        assert cl.obj("sandboxclaims", "diverge-b4") is None


def test_restarted_server_adopts_claims():
    """Pods outlive the server: a restarted one (or the next leader) goes on with the
    claims it finds instead of deleting and re-creating them."""
    data = tempfile.mkdtemp(prefix="diverge-agent-data-")
    with Cluster() as cl:
        with cl.server(data) as srv:
            create(srv, task("r1", sandbox={"timeoutSeconds": 1800}))
            cl.wait_obj("sandboxclaims", "diverge-r1")
            wait_phase(srv, "r1", "Active")
            cl.fake.agent_bind("default", "diverge-r1", "10.1.2.5")
            uid = cl.obj("sandboxclaims", "diverge-r1")["metadata"]["uid"]
        assert cl.obj("sandboxclaims", "diverge-r1") is not None, "shutdown left it alone"
        with cl.server(data) as srv:
            wait_until(lambda: "sandbox claim default/diverge-r1 adopted" in
                       task_log(srv, "r1"), what="adopted")
            assert get(srv, "r1")["status"]["phase"] == "Active"
            assert cl.obj("sandboxclaims", "diverge-r1")["metadata"]["uid"] == uid
            # Paused and resumed under the new server: the adopted Sandbox is patched.
            patch(srv, "r1", {"suspended": True})
            wait_phase(srv, "r1", "Paused")
            wait_until(lambda: cl.obj("sandboxes", "diverge-r1-sbx")["spec"]
                       ["operatingMode"] == "Suspended", what="Suspended")
            patch(srv, "r1", {"suspended": False})
            wait_phase(srv, "r1", "Active")
            # The pod finishes only after the resume made it (the fake, as agent-sandbox,
            # starts a new pod when operatingMode goes back to Running).
            wait_until(lambda: cl.obj("sandboxes", "diverge-r1-sbx")["spec"]
                       ["operatingMode"] == "Running", what="Running")
            cl.fake.agent_finish("default", "diverge-r1-sbx", True)
            body = wait_phase(srv, "r1", ("Completed", "Failed"))
            assert body["status"]["phase"] == "Completed", body["status"]
            cl.wait_obj("sandboxclaims", "diverge-r1", present=False)
    shutil.rmtree(data, ignore_errors=True)


def test_no_cluster_configuration_waits():
    home = scratch_dir("diverge-home-")
    with Server(args=["--sandbox-provider", "agent-sandbox"],
                env={"KUBECONFIG": None, "KUBERNETES_SERVICE_HOST": None,
                     "HOME": home}) as srv:
        create(srv, task("c1"))
        deadline = time.time() + 10
        while time.time() < deadline:
            body = get(srv, "c1")
            if "Kubernetes configuration" in (body["status"].get("message") or ""):
                break
            time.sleep(0.05)
        assert body["status"]["phase"] == "Pending", body["status"]
        assert "no Kubernetes configuration" in body["status"]["message"], body["status"]


if __name__ == "__main__":
    run_tests([test_claim_pause_resume_complete, test_runner_failure_delete_and_repository,
               test_restarted_server_adopts_claims, test_no_cluster_configuration_waits])
