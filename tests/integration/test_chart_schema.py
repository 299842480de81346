#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The chart's CRDs and ValidatingAdmissionPolicy against SPEC §4 and the task API
(issue #12).

kubectl 1.33 cannot validate an object without a server (`--dry-run=client` still asks
the server's discovery and /openapi/v2), so the CRDs are checked here the way the API
server would: chart_helpers' structural-schema check (types, required, enums, limits,
patterns, unknown fields as with fieldValidation=Strict) plus every
x-kubernetes-validations rule and every ValidatingAdmissionPolicy expression evaluated
with a real CEL implementation (npm @marcbachmann/cel-js, pinned). Each object, valid and
invalid, is also POSTed to the real `diverge serve` task API: the cluster's verdict
(schema + CEL rules + admission policy) must be the task API's, for every case."""
import copy
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chart_helpers as ch  # noqa: E402
from harness import API, SOURCE_DIR, Server, run_tests  # noqa: E402

CHART = os.path.join(SOURCE_DIR, "charts", "diverge")
CRDS = os.path.join(CHART, "crds")

# SPEC §4's example, with real values where the SPEC shows "…".
SPEC_EXAMPLE = {
    "apiVersion": "divergedev.com/v1alpha1",
    "kind": "AgentTask",
    "metadata": {
        "name": "fix-checkout-latency", "namespace": "default",
        "uid": "3f1e2d4c-0000-4000-8000-000000000001", "resourceVersion": "17",
        "creationTimestamp": "2026-11-29T10:00:00Z",
        "annotations": {"divergedev.com/preview-enabled": "true"}
    },
    "spec": {
        "objective": "Diagnose and fix N+1 query in /api/v1/checkout",
        "draftPR": True,
        "repository": {"url": "https://github.com/myorg/checkout-service",
                       "baseBranch": "main", "workingBranch": "fix/checkout-n-plus-1"},
        "maxIterations": 8, "budgetUSD": "5.00", "budgetTokens": 200000,
        "capabilities": ["claude-3-7-sonnet", "gemini-2.5-pro"],
        "allowedTools": ["git", "go"],
        "sandbox": {"provider": "agent-sandbox", "timeoutSeconds": 1800},
        "suspended": False
    },
    "status": {
        "phase": "Active", "reason": "", "message": "",
        "iteration": 3, "tokensConsumed": 4500, "costUSD": "0.0675",
        "lastMeterRequestIds": ["fix-checkout-latency-u0"],
        "previewUrl": "https://preview.example.com/?_diverge_env=agent-preview-x",
        "startTime": "2026-11-29T10:00:05Z", "completionTime": None
    }
}


def spec_case(**spec):
    return {"spec": spec}


# (label, changes to a minimal task) — valid and invalid objects alike; the task API
# decides which is which, and the cluster must agree.
CASES = [
    ("minimal", spec_case()),
    ("budget integer dollars", spec_case(budgetUSD=5)),
    ("budget micro-dollars", spec_case(budgetUSD="0.000001")),
    ("runner and proxy network",
     spec_case(runner={"command": "make fix", "verifyCommand": "make test"},
               sandbox={"network": "proxy", "timeoutSeconds": 60,
                        "allowedHosts": ["api.github.com", "*.npmjs.org:443", "[::1]:8080",
                                         "10.0.0.1", "my_host.internal"]})),
    ("64 hosts", spec_case(sandbox={"allowedHosts": ["h%d.example.com" % i
                                                     for i in range(64)]})),
    ("objective 4000 bytes in 2000 characters", spec_case(objective="é" * 2000)),
    ("objective 4096 bytes", spec_case(objective="x" * 4096)),
    ("command 4096 bytes", spec_case(runner={"command": "y" * 4096})),
    ("guidance at the limit",
     {"metadata": {"annotations": {"divergedev.com/guidance": "g" * 16384}}}),
    # invalid
    ("no objective", {"spec": {"objective": None}}),
    ("empty objective", spec_case(objective="")),
    ("objective 4097 bytes", spec_case(objective="x" * 4097)),
    ("objective 4098 bytes in 2049 characters", spec_case(objective="é" * 2049)),
    ("budget too many decimals", spec_case(budgetUSD="5.0000001")),
    ("budget words", spec_case(budgetUSD="five")),
    ("budget negative string", spec_case(budgetUSD="-1")),
    ("budget negative integer", spec_case(budgetUSD=-1)),
    ("budget trailing dot", spec_case(budgetUSD="5.")),
    ("budget exponent", spec_case(budgetUSD="1e3")),
    ("budget float", spec_case(budgetUSD=5.5)),
    ("budgetTokens negative", spec_case(budgetTokens=-1)),
    ("budgetTokens string", spec_case(budgetTokens="100")),
    ("maxIterations negative", spec_case(maxIterations=-1)),
    ("maxIterations float", spec_case(maxIterations=2.5)),
    ("maxIterations string", spec_case(maxIterations="8")),
    ("provider unknown", spec_case(sandbox={"provider": "docker"})),
    ("network unknown", spec_case(sandbox={"network": "open"})),
    ("timeout negative", spec_case(sandbox={"timeoutSeconds": -5})),
    ("65 hosts", spec_case(sandbox={"allowedHosts": ["h%d.example.com" % i
                                                     for i in range(65)]})),
    ("host with a space", spec_case(sandbox={"allowedHosts": ["bad host"]})),
    ("host with a slash", spec_case(sandbox={"allowedHosts": ["evil.com/path"]})),
    ("host too long", spec_case(sandbox={"allowedHosts": ["a" * 271]})),
    ("host empty", spec_case(sandbox={"allowedHosts": [""]})),
    ("hosts not a list", spec_case(sandbox={"allowedHosts": "api.github.com"})),
    ("command with NUL", spec_case(runner={"command": "make\u0000fix"})),
    ("command 4097 bytes", spec_case(runner={"command": "y" * 4097})),
    ("verify 2049 two-byte characters", spec_case(runner={"verifyCommand": "é" * 2049})),
    ("command not a string", spec_case(runner={"command": 5})),
    ("runner unknown key", spec_case(runner={"shell": "bash"})),
    ("spec unknown key", spec_case(budget="5.00")),
    ("sandbox unknown key", spec_case(sandbox={"image": "x"})),
    ("capability empty", spec_case(capabilities=[""])),
    ("tool not a string", spec_case(allowedTools=["git", 3])),
    ("draftPR string", spec_case(draftPR="yes")),
    ("suspended string", spec_case(suspended="true")),
    ("repository url number", spec_case(repository={"url": 5})),
    ("name with capitals", {"metadata": {"name": "Bad-Name"}}),
    ("name 64 characters", {"metadata": {"name": "a" * 64}}),
    ("name ends with a dash", {"metadata": {"name": "bad-"}}),
    ("guidance over the limit",
     {"metadata": {"annotations": {"divergedev.com/guidance": "g" * 16385}}}),
]

_state = {}


def setup():
    if "js" not in _state:
        _state["js"] = ch.Js()
        crds = {}
        for name in sorted(os.listdir(CRDS)):
            with open(os.path.join(CRDS, name)) as f:
                (crd,) = _state["js"].yaml(f.read())
            crds[crd["spec"]["names"]["kind"]] = crd
        _state["crds"] = crds
    return _state


def policy():
    st = setup()
    if "policy" not in st:
        helm, _ = ch.tools()
        r = subprocess.run([helm, "template", "rel", CHART, "--namespace", "diverge",
                            "--show-only", "templates/admission-policy.yaml"],
                           capture_output=True, text=True, env=ch.offline_env(), timeout=120)
        assert r.returncode == 0, r.stderr
        docs = st["js"].yaml(r.stdout)
        st["policy"] = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"][0]
        st["binding"] = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"][0]
    return st["policy"]


def merge(base, patch):
    out = copy.deepcopy(base)
    for k, v in patch.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        elif v is None:
            out.pop(k, None)
        else:
            out[k] = v
    return out


def make(i, patch):
    base = {"apiVersion": "divergedev.com/v1alpha1", "kind": "AgentTask",
            "metadata": {"name": "case-%d" % i, "namespace": "default"},
            "spec": {"objective": "do it"}}
    return merge(base, patch)


def test_crds_are_structural_with_status_and_columns():
    crds = setup()["crds"]
    assert sorted(crds) == ["AgentTask", "Environment", "PreviewGroup", "SpendQuota"]
    for kind, crd in crds.items():
        assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
        assert crd["spec"]["group"] == "divergedev.com"
        assert crd["spec"]["scope"] == "Namespaced"
        (ver,) = crd["spec"]["versions"]
        assert ver["name"] == "v1alpha1" and ver["served"] and ver["storage"]
        assert ver["subresources"] == {"status": {}}, kind
        assert crd["metadata"]["name"] == crd["spec"]["names"]["plural"] + ".divergedev.com"
        problems = ch.structural_problems(ver["schema"]["openAPIV3Schema"])
        assert problems == [], (kind, problems)
    task = crds["AgentTask"]
    (ver,) = task["spec"]["versions"]
    cols = [(c["name"], c["jsonPath"]) for c in ver["additionalPrinterColumns"]
            if c.get("priority", 0) == 0]
    assert cols == [("Phase", ".status.phase"), ("Cost", ".status.costUSD"),
                    ("Iteration", ".status.iteration"), ("Age", ".metadata.creationTimestamp")]
    assert task["spec"]["names"]["shortNames"] == ["at"]
    spec = ver["schema"]["openAPIV3Schema"]["properties"]["spec"]
    # CEL rules for the budgets and maxIterations (issue #12).
    for field in ("budgetUSD", "budgetTokens", "maxIterations"):
        assert spec["properties"][field].get("x-kubernetes-validations"), field
    sb = spec["properties"]["sandbox"]["properties"]
    assert sb["network"]["enum"] == ["none", "proxy"]
    assert sb["provider"]["enum"] == ["local", "process", "none", "agent-sandbox"]
    assert set(spec["properties"]["runner"]["properties"]) == {"command", "verifyCommand"}


def test_spec_example_is_valid():
    st = setup()
    problems = ch.crd_verdict(st["js"], st["crds"]["AgentTask"], SPEC_EXAMPLE)
    assert problems == [], problems
    assert ch.vap_verdict(st["js"], policy(), SPEC_EXAMPLE) == []
    # A running task's status with a completion time, and a finished one.
    done = merge(SPEC_EXAMPLE, {"status": {"phase": "Completed",
                                           "completionTime": ch.now_rfc3339()}})
    assert ch.crd_verdict(st["js"], st["crds"]["AgentTask"], done) == []
    bad = merge(SPEC_EXAMPLE, {"status": {"phase": "Running"}})
    assert ch.crd_verdict(st["js"], st["crds"]["AgentTask"], bad) != []
    bad = merge(SPEC_EXAMPLE, {"status": {"costUSD": "0.06750001"}})
    assert ch.crd_verdict(st["js"], st["crds"]["AgentTask"], bad) != []
    bad = merge(SPEC_EXAMPLE, {"status": {"startTime": "yesterday"}})
    assert ch.crd_verdict(st["js"], st["crds"]["AgentTask"], bad) != []
    # The forecast the meter writes (SPEC §15) is kept, not pruned as unknown.
    fc = merge(SPEC_EXAMPLE, {"status": {
        "forecastUSD": "2.40", "forecastPerIterationUSD": "0.60", "forecastIterationsLeft": 4,
        "forecastBudgetHolds": False, "forecastRunsOutIteration": 6}})
    assert ch.crd_verdict(st["js"], st["crds"]["AgentTask"], fc) == []
    bad = merge(fc, {"status": {"forecastUSD": "2.4000001"}})
    assert ch.crd_verdict(st["js"], st["crds"]["AgentTask"], bad) != []
    env = {"apiVersion": "divergedev.com/v1alpha1", "kind": "Environment",
           "metadata": {"name": "agent-preview-fix-checkout-latency", "namespace": "default",
                        "annotations": {"divergedev.com/sandbox-ip": "10.1.2.3"}},
           "spec": {"repository": {"url": "https://github.com/myorg/checkout-service",
                                   "branch": "fix/checkout-n-plus-1"},
                    "taskRef": {"name": "fix-checkout-latency"}, "port": 8080},
           "status": {"phase": "Ready", "url": "https://preview.example.com/"}}
    assert ch.crd_verdict(st["js"], st["crds"]["Environment"], env) == []
    assert ch.crd_verdict(st["js"], st["crds"]["Environment"],
                          merge(env, {"spec": {"port": 70000}})) != []
    pg = {"apiVersion": "divergedev.com/v1alpha1", "kind": "PreviewGroup",
          "metadata": {"name": "checkout", "namespace": "default"},
          "spec": {"baseURL": "https://preview.example.com", "headerKey": "x-diverge-env"}}
    assert ch.crd_verdict(st["js"], st["crds"]["PreviewGroup"], pg) == []
    # SpendQuota (SPEC §15's example), and what the server refuses too.
    sq = {"apiVersion": "divergedev.com/v1alpha1", "kind": "SpendQuota",
          "metadata": {"name": "team", "namespace": "myorg-checkout"},
          "spec": {"monthlyUSD": "100.00", "monthlyTokens": 50000000, "maxRunningTasks": 2},
          "status": {"usedUSD": "12.50", "usedTokens": 123456,
                     "periodStart": "2026-12-01T00:00:00Z"}}
    assert ch.crd_verdict(st["js"], st["crds"]["SpendQuota"], sq) == []
    for bad in ({"monthlyUSD": "1.2345678"}, {"monthlyUSD": "-1"}, {"monthlyTokens": -1},
                {"maxRunningTasks": -1}):
        assert ch.crd_verdict(st["js"], st["crds"]["SpendQuota"],
                              merge(sq, {"spec": bad})) != [], bad
    assert ch.crd_verdict(st["js"], st["crds"]["PreviewGroup"],
                          merge(pg, {"spec": {"baseURL": "ftp://x"}})) != []


def test_cluster_verdict_is_the_task_api_verdict():
    st = setup()
    crd = st["crds"]["AgentTask"]
    pol = policy()
    objs = [make(i, patch) for i, (_, patch) in enumerate(CASES)]
    schemas = ch.crd_verdicts(st["js"], crd, objs)
    vaps = ch.vap_verdicts(st["js"], pol, objs)
    mismatches = []
    with Server(args=["--sandbox-provider", "none"]) as srv:
        status, _, _ = srv.request("POST", API + "/namespaces/default/agenttasks",
                                   body=make(999, {}))
        assert status == 201, status
        for (label, _), obj, schema, vap in zip(CASES, objs, schemas, vaps):
            status, _, body = srv.request("POST", API + "/namespaces/default/agenttasks",
                                          body=obj)
            # 422 names the field; a NUL inside a JSON string is already a 400.
            assert status in (201, 400, 422), (label, status, body)
            api_ok = status == 201
            # The API server runs the admission policy only on what the schema admitted.
            cluster_ok = not schema and not vap
            if api_ok != cluster_ok:
                mismatches.append((label, "api", status, body, "schema", schema, "vap", vap))
    assert not mismatches, mismatches


def test_policy_alone_refuses_what_the_task_api_refuses():
    """The admission policy also protects a CRD installed without this chart's schema:
    each of these is refused by CEL alone (the schema is not consulted)."""
    st = setup()
    pol = policy()
    alone = ["empty objective", "objective 4098 bytes in 2049 characters",
             "budget too many decimals", "budget words", "budget negative integer",
             "budgetTokens negative", "maxIterations negative", "provider unknown",
             "network unknown", "timeout negative", "65 hosts", "host with a space",
             "host too long", "command with NUL", "command 4097 bytes",
             "verify 2049 two-byte characters", "capability empty", "name with capitals",
             "guidance over the limit"]
    cases = dict(CASES)
    refused = ch.vap_verdicts(st["js"], pol, [make(0, cases[label]) for label in alone])
    for label, v in zip(alone, refused):
        assert v != [], label
    ok = ["minimal", "runner and proxy network", "64 hosts", "budget integer dollars",
          "guidance at the limit", "objective 4000 bytes in 2000 characters"]
    admitted = ch.vap_verdicts(st["js"], pol, [make(0, cases[label]) for label in ok])
    for label, v in zip(ok, admitted):
        assert v == [], (label, v)
    assert st["binding"]["spec"]["policyName"] == pol["metadata"]["name"]
    assert st["binding"]["spec"]["validationActions"] == ["Deny"]
    rules = pol["spec"]["matchConstraints"]["resourceRules"]
    assert rules == [{"apiGroups": ["divergedev.com"], "apiVersions": ["v1alpha1"],
                      "operations": ["CREATE", "UPDATE"], "resources": ["agenttasks"]}]


if __name__ == "__main__":
    try:
        setup()
        policy()
    except ch.Offline as e:
        print("SKIP test_chart_schema: %s" % e)
        sys.exit(0)
    run_tests([test_crds_are_structural_with_status_and_columns, test_spec_example_is_valid,
               test_cluster_verdict_is_the_task_api_verdict,
               test_policy_alone_refuses_what_the_task_api_refuses])
