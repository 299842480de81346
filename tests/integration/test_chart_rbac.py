# SPDX-License-Identifier: Apache-2.0
"""The chart's RBAC against what the binary really does (SPEC §11, docs/cluster-mode.md).

Both Deployments of the rendered chart (`serve --store kubernetes`, the server with
--leader-elect=false, the controller with --leader-elect=true and the Lease the RBAC names)
run against tests/fakes/fake_kube.py, each with its own bearer token, through a task's
life: created through the server's API, activated by the controller, metered until its
budget stops it, a `/diverge fix` comment delivered to the server (inbox ConfigMap, the
leader's bot, sticky comment), a pause from a comment, and deleted through the API. Every
(verb, resource, namespace, name) the fake saw from a role must be allowed by the Roles and
ClusterRoles the rendered bindings give that role's service account; the server role must
also have been granted nothing it never used (least privilege shown by a run)."""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "fakes"))
import chart_helpers as ch  # noqa: E402
import test_chart as tc  # noqa: E402
from fake_kube import FakeKube, PATH_RE  # noqa: E402
from github_helpers import comment_payload, deliver, new_fake, wait, SECRET, TOKEN  # noqa: E402
from harness import API, DIVERGE_BIN, Server, run_tests  # noqa: E402

RELEASE, RNS = "rel", "diverge"
FN = "rel-diverge"
NS = API + "/namespaces/default/agenttasks"
GH_NS = API + "/namespaces/octo-repo/agenttasks"
METER = "/api/v1/agenttask/meter"
LEASE_ENV = {"DIVERGE_LEASE_DURATION_MS": "3000", "DIVERGE_LEASE_RENEW_DEADLINE_MS": "2500",
             "DIVERGE_LEASE_RETRY_MS": "300"}
VERB = {"POST": "create", "PUT": "update", "PATCH": "patch"}


def request_attrs(method, path, q):
    """(group, resource, verb, namespace, name) as the API server's authorizer sees it."""
    m = PATH_RE.match(path)
    assert m, "not a resource request: %s %s" % (method, path)
    res = m.group("plural") + ("/" + m.group("sub") if m.group("sub") else "")
    name = m.group("name")
    if method == "GET":
        verb = "get" if name else ("watch" if q.get("watch") in ("true", "1") else "list")
    elif method == "DELETE":
        verb = "delete" if name else "deletecollection"
    else:
        verb = VERB[method]
    return (m.group("g") or "", res, verb, m.group("ns"), name)


def grants(objs, sa):
    """[(namespace or None for every namespace, rules)] the bindings give SA."""
    roles = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o["rules"]
             for o in objs if o.get("kind") in ("Role", "ClusterRole")}
    out = []
    for b in objs:
        if b.get("kind") not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not any(s["kind"] == "ServiceAccount" and s["name"] == sa and
                   s["namespace"] == RNS for s in b["subjects"]):
            continue
        ref, bns = b["roleRef"], b["metadata"].get("namespace")
        rules = roles[(ref["kind"], None if ref["kind"] == "ClusterRole" else bns, ref["name"])]
        out.append((None if b["kind"] == "ClusterRoleBinding" else bns, rules))
    return out


def allowed(g, attrs):
    group, res, verb, ns, name = attrs
    for scope, rules in g:
        if scope is not None and scope != ns:
            continue
        for r in rules:
            if group not in r["apiGroups"] or res not in r["resources"] or \
                    verb not in r["verbs"]:
                continue
            names = r.get("resourceNames")
            if names and (name is None or name not in names):
                continue
            return True
    return False


def granted(g):
    """Every (group, resource, verb) the grants G name."""
    return {(grp, res, v) for _, rules in g for r in rules for grp in r["apiGroups"]
            for res in r["resources"] for v in r["verbs"]}


def lay_out(objs, deployment, root):
    """The pod's files below ROOT (as tc.pod_files) for one of the two Deployments."""
    keep = [o for o in objs if o.get("kind") != "Deployment"] + [deployment]
    args, secrets = tc.pod_files(keep, root)
    data = os.path.join(root, "data")
    os.makedirs(data, mode=0o700)
    with open(os.open(os.path.join(data, "api-token"), os.O_WRONLY | os.O_CREAT, 0o600),
              "wb") as f:
        f.write(secrets["api-token"])  # where the harness reads the admin token
    argv = []
    for a in args[1:]:
        name, _, value = a.partition("=")
        if name in ("--listen", "--tls-listen"):
            value = "127.0.0.1:0"
        argv.append("%s=%s" % (name, value.replace("/var/lib/diverge", root)))
    return argv, data


def run_roles(objs, tmp):
    """Runs both Deployments through a task's life; returns (fake, {role: server})."""
    kube = FakeKube(history=100000, users={"tok-server": "server",
                                           "tok-controller": "controller"})
    kube.start()
    gh = new_fake()
    srvs = {}
    try:
        for role in ("controller", "server"):
            ds = [d for d in tc.by_kind(objs, "Deployment")
                  if d["metadata"]["name"] == "%s-%s" % (FN, role)]
            if not ds:  # server.enabled=false
                continue
            d = ds[0]
            root = os.path.join(tmp, role)
            os.makedirs(root)
            argv, data = lay_out(objs, d, root)
            kc = os.path.join(tmp, role + ".kubeconfig")
            with open(kc, "w") as f:
                f.write("current-context: c\n"
                        "clusters: [{name: k, cluster: {server: '%s'}}]\n"
                        "contexts: [{name: c, context: {cluster: k, user: u, namespace: %s}}]\n"
                        "users: [{name: u, user: {token: tok-%s}}]\n" % (kube.url, RNS, role))
            env = dict(LEASE_ENV, POD_NAME="%s-%s-0" % (FN, role), KUBECONFIG=kc,
                       DIVERGE_GITHUB_WEBHOOK_SECRET=SECRET, DIVERGE_GITHUB_API_URL=gh.url,
                       DIVERGE_NOTIFIER_TOKEN=TOKEN, DIVERGE_NOTIFIER_MIN_INTERVAL="1",
                       GITHUB_TOKEN=None)
            srvs[role] = Server(argv, env=env, data_dir=data).start()
            if role == "controller":
                wait(lambda: lease_holder(kube) == "%s-controller-0" % FN, what="lease")
        drive(srvs.get("server", srvs["controller"]), gh,  # the Service's pods
              srvs["controller"] if "server" in srvs else None)
        for role in ("server", "controller"):  # SIGTERM: a clean exit (the Lease released)
            if role in srvs:
                assert srvs[role].stop() == 0, role
        assert lease_holder(kube) == "", "the controller released the Lease"
    except BaseException:
        for role, s in srvs.items():
            print("--- %s stderr (tail) ---\n%s" % (role, "\n".join(
                s.stderr().splitlines()[-30:])), file=sys.stderr)
        raise
    finally:
        for s in srvs.values():
            s.stop()
            s.stderr()  # kept after the directory goes
        gh.stop()
        kube.stop()
    return kube, srvs


def lease_holder(kube):
    with kube.lock:
        try:
            return kube.get("leases", RNS, FN + "-leader")["spec"].get("holderIdentity")
        except Exception:  # noqa: BLE001 - not created yet
            return None


def phase(srv, path):
    st, _, b = srv.request("GET", path)
    return b["status"]["phase"] if st == 200 else None


def drive(srv, gh, controller=None):
    """What users and sandboxes do with the server Deployment (the Service's pods). With
    CONTROLLER (a Deployment of its own), it is stopped (SIGSTOP) while the server answers
    the charge over the budget: that charge's transaction revokes the task's token, and a
    controller reconciling the pause it sees first would revoke it before the server's
    commit, which then finds nothing to update (the server's `secrets update` unused)."""
    st, _, b = srv.request("POST", NS, {
        "apiVersion": "divergedev.com/v1alpha1", "kind": "AgentTask",
        "metadata": {"name": "t1"}, "spec": {"objective": "do it", "budgetUSD": "5.00",
                                             "budgetTokens": 1000}})
    assert st == 201, b
    wait(lambda: phase(srv, NS + "/t1") == "Active", what="t1 Active")
    st, _, tok = srv.request("GET", NS + "/t1/token")
    assert st == 200, tok
    hdr = {"Authorization": "Bearer " + tok.strip()}
    for i, n in enumerate((100, 100, 5000)):  # the last one exceeds the budget: 429
        body = json.dumps({"requestId": "r%d" % i, "iteration": 1, "tokensUsed": n,
                           "costUSD": 0.01})
        if i == 2 and controller is not None:
            os.kill(controller.proc.pid, signal.SIGSTOP)
        try:
            st, _, ans = srv.request("POST", METER, body, headers=hdr, auth=False)
        finally:
            if i == 2 and controller is not None:
                os.kill(controller.proc.pid, signal.SIGCONT)
        assert st == (429 if i == 2 else 200), (st, ans)
    wait(lambda: phase(srv, NS + "/t1") == "Paused", what="t1 paused by its budget")
    st, _, ans = srv.request("GET", API + "/namespaces/default/environments")
    assert st == 200, (st, ans)
    cm = gh.add_comment("octo/repo", 7, user="alice", body="/diverge fix the flaky test")
    st, _, ans = deliver(srv, comment_payload("octo/repo", 7, cm["id"],
                                              "/diverge fix the flaky test"))
    assert st == 202, (st, ans)
    wait(lambda: phase(srv, GH_NS + "/fix-pr-7") == "Active", what="task from the comment")
    cm2 = gh.add_comment("octo/repo", 7, user="alice", body="/diverge pause")
    st, _, ans = deliver(srv, comment_payload("octo/repo", 7, cm2["id"], "/diverge pause"))
    assert st == 202, (st, ans)
    wait(lambda: phase(srv, GH_NS + "/fix-pr-7") == "Paused", what="paused from a comment")
    for path in (NS + "/t1", GH_NS + "/fix-pr-7"):
        st, _, ans = srv.request("DELETE", path)
        assert st == 200, (st, ans)
        wait(lambda: phase(srv, path) is None, what="deleted")


# Granted but not reached by this run, with the reason each is needed.
UNEXERCISED = {
    "server": {
        ("divergedev.com", "environments", "delete"): "a deleted task's own preview "
        "Environment (this run has no previews)",
        **{("divergedev.com", "spendquotas", v): "the SpendQuota API (this run makes no "
           "quota)" for v in ("create", "update", "delete")},
        ("divergedev.com", "spendquotas/status", "update"): "a charge added to a quota",
    },
    "controller": {
        **{("divergedev.com", "environments", v): "the task's preview Environment (no "
           "previews here)" for v in ("get", "list", "create", "update", "delete")},
        ("divergedev.com", "environments/status", "update"): "its preview's status",
        **{("divergedev.com", "spendquotas", v): "server.enabled=false: the SpendQuota API"
           for v in ("create", "update", "delete")},
        ("divergedev.com", "spendquotas/status", "update"): "a charge added to a quota (this "
        "run makes no quota)",
        ("divergedev.com", "agenttasks", "delete"): "server.enabled=false only",
        ("", "configmaps", "delete"): "done queue entries after an hour / 7 days",
        ("", "secrets", "patch"): "agent-sandbox: a fresh token on resume",
        ("", "secrets", "delete"): "agent-sandbox: the token Secret with the claim",
        ("extensions.agents.x-k8s.io", "sandboxclaims", "create"): "agent-sandbox",
        ("extensions.agents.x-k8s.io", "sandboxclaims", "get"): "agent-sandbox",
        ("extensions.agents.x-k8s.io", "sandboxclaims", "list"): "agent-sandbox",
        ("extensions.agents.x-k8s.io", "sandboxclaims", "patch"): "agent-sandbox",
        ("extensions.agents.x-k8s.io", "sandboxclaims", "delete"): "agent-sandbox",
        ("agents.x-k8s.io", "sandboxes", "get"): "agent-sandbox",
        ("agents.x-k8s.io", "sandboxes", "patch"): "agent-sandbox",
    },
}


def check_run(sets):
    objs = tc.render(sets + ["sandbox.provider=none"], release=RELEASE, namespace=RNS)
    ctl_args = tc.one(objs, "Deployment", FN + "-controller")["spec"]["template"]["spec"][
        "containers"][0]["args"]
    assert "--leader-elect=true" in ctl_args
    for d in tc.by_kind(objs, "Deployment"):
        if d["metadata"]["name"] == FN + "-server":
            assert "--leader-elect=false" in d["spec"]["template"]["spec"]["containers"][0][
                "args"]
    assert "--lease-name=%s-leader" % FN in ctl_args
    tmp = tempfile.mkdtemp(prefix="diverge-chart-rbac-")
    try:
        kube, srvs = run_roles(objs, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    seen = {"server": set(), "controller": set()}
    with kube.lock:
        for user, method, path, q in kube.audit:
            assert user in seen, "a request without a role's token: %s %s" % (method, path)
            seen[user].add(request_attrs(method, path, q))
    if "server" in srvs:
        assert "leader_election_disabled" in srvs["server"].stderr()
        assert not [a for a in seen["server"] if a[1] == "leases"], "the server never elects"
    for role, attrs in seen.items():
        print("%s used: %s" % (role, sorted({(a[0], a[1], a[2], a[3] == RNS, a[4])
                                             for a in attrs}, key=str)))
    for role, attrs in seen.items():
        if role not in srvs:
            assert not attrs, role
            continue
        g = grants(objs, "%s-%s" % (FN, role))
        denied = sorted((a for a in attrs if not allowed(g, a)), key=str)
        assert not denied, "%s: the chart's RBAC forbids what it does: %s" % (role, denied)
    # Each role holds nothing it did not use, but for what UNEXERCISED explains (sandbox
    # rights are agent-sandbox's, which this run does not use).
    for role in srvs:
        g = grants(objs, "%s-%s" % (FN, role))
        unused = granted(g) - {(a[0], a[1], a[2]) for a in seen[role]} - set(UNEXERCISED[role])
        assert not unused, "%s: granted but never used: %s" % (role, sorted(unused))


def test_leader_elect_takes_true_or_false():
    r = subprocess.run([DIVERGE_BIN, "serve", "--store", "kubernetes", "--leader-elect=maybe"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "--leader-elect must be true or false" in r.stderr, r
    h = subprocess.run([DIVERGE_BIN, "serve", "--help"], capture_output=True, text=True,
                       timeout=30).stdout
    assert "--leader-elect" in h and "DIVERGE_LEADER_ELECT" in h


def test_rbac_allows_what_each_role_does():
    check_run([])


def test_rbac_with_task_namespaces():
    """RoleBindings in the listed namespaces, plus the cluster-wide reads the store makes."""
    check_run(["rbac.taskNamespaces={default,octo-repo}"])


def test_rbac_without_the_server_deployment():
    """server.enabled=false: the controller's pods answer the Service and do both jobs."""
    check_run(["server.enabled=false"])


if __name__ == "__main__":
    try:
        tc.setup()
    except ch.Offline as e:
        print("SKIP test_chart_rbac: %s" % e)
        sys.exit(0)
    run_tests([test_leader_elect_takes_true_or_false, test_rbac_allows_what_each_role_does,
               test_rbac_with_task_namespaces, test_rbac_without_the_server_deployment])
