# SPDX-License-Identifier: Apache-2.0
"""A fake Kubernetes API server on loopback for the tests (Python 3 stdlib only).

It implements the API semantics the kube/ client and kubectl rely on, as the real API
server does them:
  - resourceVersion: one global counter; every write bumps it; an update (PUT, or a merge
    patch carrying metadata.resourceVersion) with a stale one is 409 Conflict; a no-op
    patch keeps the object (and its resourceVersion) unchanged; create of an existing name
    is 409 AlreadyExists; CRDs require resourceVersion on PUT (422 without).
  - list: {"kind":"<Kind>List","metadata":{"resourceVersion":...},"items":[...]}, with
    labelSelector (k=v, k!=v, k) and fieldSelector (metadata.name=, metadata.namespace=).
  - watch (?watch=true): resourceVersion "" or "0" starts with synthetic ADDED events; N
    replays the kept history after N; an N older than the bounded history gets one
    {"type":"ERROR","object":<Status 410 Expired>} and the stream ends. allowWatchBookmarks
    adds BOOKMARK events; timeoutSeconds ends the stream (default: kept open).
  - delete honours DeleteOptions.preconditions.resourceVersion (409 Conflict when stale);
  - merge patch (RFC 7386, application/merge-patch+json); strategic merge patch is 415 on
    custom resources, as there.
  - the status subresource of the CRDs: PUT/PATCH …/status change only status; the main
    resource ignores status (also on create).
  - JSON only: a protobuf or CBOR request body is 415 (kubectl's typed commands such as
    `create secret` send protobuf; `create -f` sends JSON);
  - metav1.Status errors; bearer token auth (401); discovery and the minimal OpenAPI v3
    documents kubectl 1.33 needs (KUBECTL-PROTOCOL.md).
Audit: FakeKube(users={token: name}) accepts each token too and keeps every request as
(name, method, path, query) in .audit (the chart test checks them against its RBAC).
Test controls: POST /fake/freeze (open watches stop delivering), POST /fake/compact (drop
the history, end every watch: resuming from before it is 410).
Simulated agent-sandbox controller (kubernetes-sigs/agent-sandbox v1beta1, as its types
describe it; only what a test asks for, nothing runs):
  - POST /fake/agent-sandbox/bind {"namespace","claim","podIP"[,"sandbox"]}: a Sandbox
    (default name <claim>-sbx, ownerReference to the claim) with operatingMode Running,
    status podIPs [podIP] and Ready True (DependenciesReady); the claim gets
    status.sandbox {name, podIPs} and the annotation agents.x-k8s.io/sandbox-name.
    Its pod (a Pod named like the Sandbox, status.podIP) is created with it.
  - POST /fake/agent-sandbox/finish {"namespace","sandbox","succeeded"[,"exitCode"]}: the
    pod reached a terminal phase: Finished True (PodSucceeded | PodFailed), Ready False,
    podIPs gone; the pod's container "runner" terminated with exitCode (default 0 or 1).
  - a bound Sandbox whose spec.operatingMode is patched to Suspended: Ready False
    (SandboxSuspended), Suspended True (PodTerminated), podIPs cleared (also the claim's),
    the pod deleted; back to Running: a pod again, Ready True and the pod IP (a real
    resume makes a new pod, whose IP may differ).
  - deleting a SandboxClaim deletes the Sandboxes it owns and their pods (the garbage
    collector).
Resources (namespaced): divergedev.com/v1alpha1 agenttasks, environments, spendquotas; v1 secrets,
configmaps, pods (only the simulated agent-sandbox pods), events (core/v1: what kubectl
describe lists, with fieldSelector involvedObject.*); events.k8s.io/v1 events (kept apart
from the core ones, unlike a real server); coordination.k8s.io/v1 leases;
extensions.agents.x-k8s.io/v1beta1 sandboxclaims;
agents.x-k8s.io/v1beta1 sandboxes.

Run: fake_kube.py [--port 0] [--token T] [--history N] [--bookmark-seconds S]
[--tls-cert F --tls-key F]; it prints its base URL on the first line of stdout.
"""
import argparse
import collections
import datetime
import json
import re
import os
import signal
import ssl
import sys
import threading
import time
import urllib.parse
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["FakeKube", "RESOURCES"]

# key -> (group, version, kind, has status subresource, is a custom resource); the key is
# the plural, or "<plural>@<group>/<version>" for a second group serving that plural.
RESOURCES = {
    "agenttasks": ("divergedev.com", "v1alpha1", "AgentTask", True, True),
    "environments": ("divergedev.com", "v1alpha1", "Environment", True, True),
    "spendquotas": ("divergedev.com", "v1alpha1", "SpendQuota", True, True),
    "secrets": ("", "v1", "Secret", False, False),
    "configmaps": ("", "v1", "ConfigMap", False, False),
    "pods": ("", "v1", "Pod", True, False),
    "events": ("events.k8s.io", "v1", "Event", False, False),
    "events@v1": ("", "v1", "Event", False, False),
    "leases": ("coordination.k8s.io", "v1", "Lease", False, False),
    "sandboxclaims": ("extensions.agents.x-k8s.io", "v1beta1", "SandboxClaim", True, True),
    "sandboxes": ("agents.x-k8s.io", "v1beta1", "Sandbox", True, True),
}
BODY_MAX = 3 << 20
NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
PATH_RE = re.compile(r"^/(?:api/(?P<cv>v1)|apis/(?P<g>[a-z0-9.-]+)/(?P<v>v[a-z0-9]+))"
                     r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[a-z]+)"
                     r"(?:/(?P<name>[^/]+)(?:/(?P<sub>status))?)?$")


def merge_patch(target, patch):
    """RFC 7386."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def now_rfc3339():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class ApiError(Exception):
    def __init__(self, code, reason, message, details=None):
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def status(self):
        st = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
              "message": self.message, "reason": self.reason, "code": self.code}
        if self.details is not None:
            st["details"] = self.details
        return st


def gone(rv):
    return ApiError(410, "Expired", "too old resource version: %s" % rv)


class FakeKube:
    def __init__(self, host="127.0.0.1", port=0, token=None, history=100,
                 bookmark_seconds=1.0, tls_cert=None, tls_key=None, users=None):
        self.token, self.history_max = token, history
        # bearer token -> user name: each also accepted, and its requests audited by name
        self.users = dict(users or {})
        self.audit = []  # (user or None, method, path, query dict): what each client asked
        self.bookmark_seconds = bookmark_seconds
        self.lock = threading.Condition()
        # A serving API server's resourceVersion (etcd's revision) is never 0, and a list's
        # "0" would make the informer's next watch a "start anywhere" one (synthetic ADDED
        # of the current state), which drops the changes made before it connects.
        self.rv = 1
        self.objects = {}  # (plural, ns, name) -> object
        self.history = collections.deque(maxlen=history)  # (rv, plural, ns, type, obj)
        self.compacted = 0  # events with rv <= this may be gone from the history
        self.requests = []  # (method, path) log for tests
        self.agent_pods = {}  # (ns, sandbox) -> (claim, pod IP): simulated agent-sandbox
        self.stopping = False
        self.frozen = False  # watch streams deliver nothing while set (test control)
        self.epoch = 0  # bumped by compact(): every open watch stream ends
        # test hook: called as after_create(plural, ns, obj) under the lock right after an
        # object is made, before its creator's answer (another writer that comes first)
        self.after_create = None
        self.httpd = _Server((host, port), _Handler)
        self.httpd.fake = self
        scheme = "http"
        if tls_cert:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(tls_cert, tls_key)
            self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
            scheme = "https"
        self.url = "%s://%s:%d" % (scheme, host, self.httpd.server_address[1])

    def start(self):
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()

    def stop(self):
        with self.lock:
            self.stopping = True
            self.lock.notify_all()
        self.httpd.shutdown()

    # ---- storage (call with self.lock held) ----
    def _record(self, plural, ns, typ, obj):
        if len(self.history) == self.history.maxlen:
            self.compacted = self.history[0][0]
        self.history.append((self.rv, plural, ns, typ, json.loads(json.dumps(obj))))
        self.lock.notify_all()

    def _bump(self, obj):
        self.rv += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.rv)

    def create(self, plural, ns, obj):
        group, version, kind, has_status, _ = RESOURCES[plural]
        md = obj.get("metadata")
        if not isinstance(md, dict) or not isinstance(md.get("name"), str):
            raise ApiError(422, "Invalid", "metadata.name: Required value",
                           {"kind": _plural(plural), "causes": [{"reason": "FieldValueRequired",
                                                        "field": "metadata.name"}]})
        name = md["name"]
        if not NAME_RE.match(name):
            raise ApiError(422, "Invalid", "%s %r is invalid: metadata.name" % (kind, name))
        if md.get("namespace", ns) != ns:
            raise ApiError(400, "BadRequest", "the namespace of the provided object does "
                           "not match the namespace sent on the request")
        if (plural, ns, name) in self.objects:
            raise ApiError(409, "AlreadyExists", '%s "%s" already exists' %
                           (self._gr(plural), name),
                           {"name": name, "group": group, "kind": _plural(plural)})
        obj = dict(obj)
        obj["apiVersion"] = "%s/%s" % (group, version) if group else version
        obj["kind"] = kind
        md = dict(md)
        md.pop("resourceVersion", None)
        md.update(namespace=ns, uid=str(uuid.uuid4()), creationTimestamp=now_rfc3339(),
                  generation=1)
        obj["metadata"] = md
        if has_status:
            obj.pop("status", None)
        self._bump(obj)
        self.objects[(plural, ns, name)] = obj
        self._record(plural, ns, "ADDED", obj)
        if self.after_create is not None:
            made = json.loads(json.dumps(obj))  # the creator's answer: as made, before it
            self.after_create(plural, ns, json.loads(json.dumps(obj)))
            return made
        return obj

    def _gr(self, plural):
        group = RESOURCES[plural][0]
        return "%s.%s" % (_plural(plural), group) if group else _plural(plural)

    def get(self, plural, ns, name):
        obj = self.objects.get((plural, ns, name))
        if obj is None:
            raise ApiError(404, "NotFound", '%s "%s" not found' % (self._gr(plural), name),
                           {"name": name, "group": RESOURCES[plural][0], "kind": _plural(plural)})
        return obj

    def write(self, plural, ns, name, new, sub, rv_required):
        """Stores NEW for the main resource (sub=None) or status; checks resourceVersion."""
        _, _, _, has_status, custom = RESOURCES[plural]
        old = self.get(plural, ns, name)
        md = new.get("metadata") if isinstance(new.get("metadata"), dict) else {}
        want = md.get("resourceVersion")
        if want in (None, "") and rv_required and custom:
            raise ApiError(422, "Invalid", "metadata.resourceVersion: Invalid value: 0x0: "
                           "must be specified for an update")
        if want not in (None, "") and want != old["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict", 'Operation cannot be fulfilled on %s "%s": the '
                           "object has been modified; please apply your changes to the "
                           "latest version and try again" % (self._gr(plural), name),
                           {"name": name, "group": RESOURCES[plural][0], "kind": _plural(plural)})
        if md.get("name", name) != name:
            raise ApiError(400, "BadRequest", "the name of the object does not match the "
                           "name on the URL")
        if sub == "status":
            merged = dict(old)
            if "status" in new:
                merged["status"] = new["status"]
            else:
                merged.pop("status", None)
        else:
            merged = dict(new)
            keep = {k: old["metadata"][k] for k in
                    ("uid", "creationTimestamp", "namespace", "generation", "resourceVersion")
                    if k in old["metadata"]}
            merged["metadata"] = dict(md, **keep)
            merged["apiVersion"], merged["kind"] = old["apiVersion"], old["kind"]
            if has_status:
                if "status" in old:
                    merged["status"] = old["status"]
                else:
                    merged.pop("status", None)
            if merged.get("spec") != old.get("spec"):
                merged["metadata"]["generation"] = old["metadata"].get("generation", 1) + 1
        if merged == old:
            return old
        self._bump(merged)
        self.objects[(plural, ns, name)] = merged
        self._record(plural, ns, "MODIFIED", merged)
        if sub is None:
            self._agent_after_write(plural, ns, name, old, merged)
            return self.objects[(plural, ns, name)]
        return merged

    def delete(self, plural, ns, name, expect_rv=None):
        obj = self.get(plural, ns, name)
        if expect_rv is not None and expect_rv != obj["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict", "Precondition failed: ResourceVersion in "
                           "precondition: %s, ResourceVersion in object meta: %s" %
                           (expect_rv, obj["metadata"]["resourceVersion"]),
                           {"name": name, "group": RESOURCES[plural][0], "kind": _plural(plural)})
        del self.objects[(plural, ns, name)]
        obj = json.loads(json.dumps(obj))
        self._bump(obj)
        self._record(plural, ns, "DELETED", obj)
        self._agent_after_delete(plural, ns, obj)
        return obj

    # ---- simulated agent-sandbox controller (see the module docstring) ----
    def _set_status(self, plural, ns, name, status):
        obj = json.loads(json.dumps(self.get(plural, ns, name)))
        obj["status"] = status
        obj["metadata"].pop("resourceVersion", None)
        return self.write(plural, ns, name, obj, "status", False)

    def agent_bind(self, ns, claim, pod_ip, sandbox=None):
        with self.lock:
            c = self.get("sandboxclaims", ns, claim)
            sb = sandbox or claim + "-sbx"
            self.create("sandboxes", ns, {
                "metadata": {"name": sb, "ownerReferences": [{
                    "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
                    "kind": "SandboxClaim", "name": claim, "uid": c["metadata"]["uid"],
                    "controller": True}]},
                # As agent-sandbox's createSandbox: the claim's env goes into the first
                # container of the Sandbox's pod template (the pod is made from it, also
                # again on resume).
                "spec": {"podTemplate": {"spec": {"containers": [{
                    "name": "runner",
                    "env": json.loads(json.dumps((c.get("spec") or {}).get("env") or []))}]}},
                         "operatingMode": "Running"}})
            self.agent_pods[(ns, sb)] = (claim, pod_ip)
            self._agent_pod(ns, sb, True)
            self._agent_sandbox_status(ns, sb, "Running")
            c = json.loads(json.dumps(self.get("sandboxclaims", ns, claim)))
            c["metadata"].setdefault("annotations", {})["agents.x-k8s.io/sandbox-name"] = sb
            c["metadata"].pop("resourceVersion", None)
            self.write("sandboxclaims", ns, claim, c, None, False)
            return self.get("sandboxes", ns, sb)

    def _agent_sandbox_status(self, ns, sb, mode, finished=None):
        claim, ip = self.agent_pods[(ns, sb)]
        t = now_rfc3339()
        if finished is not None:
            conds = [{"type": "Ready", "status": "False", "reason": finished,
                      "message": "", "lastTransitionTime": t},
                     {"type": "Finished", "status": "True", "reason": finished,
                      "message": "", "lastTransitionTime": t}]
            ips = []
        elif mode == "Suspended":
            conds = [{"type": "Ready", "status": "False", "reason": "SandboxSuspended",
                      "message": "", "lastTransitionTime": t},
                     {"type": "Suspended", "status": "True", "reason": "PodTerminated",
                      "message": "", "lastTransitionTime": t}]
            ips = []
        else:
            conds = [{"type": "Ready", "status": "True", "reason": "DependenciesReady",
                      "message": "", "lastTransitionTime": t}]
            ips = [ip]
        self._set_status("sandboxes", ns, sb, {"conditions": conds, "podIPs": ips})
        if ("sandboxclaims", ns, claim) in self.objects:
            st = {"sandbox": {"name": sb}}
            if ips:
                st["sandbox"]["podIPs"] = ips
            self._set_status("sandboxclaims", ns, claim, st)

    def _agent_pod(self, ns, sb, present, exit_code=None):
        if not present:
            if ("pods", ns, sb) in self.objects:
                self.delete("pods", ns, sb)
            return
        if ("pods", ns, sb) not in self.objects:
            self.create("pods", ns, {"metadata": {"name": sb}, "spec": {
                "containers": [{"name": "runner", "image": "diverge-agent-runner"}]}})
        if exit_code is None:
            st = {"phase": "Running", "podIP": self.agent_pods[(ns, sb)][1],
                  "containerStatuses": [{"name": "runner", "state": {"running": {}}}]}
        else:
            st = {"phase": "Succeeded" if exit_code == 0 else "Failed",
                  "containerStatuses": [{"name": "runner", "state": {
                      "terminated": {"exitCode": exit_code}}}]}
        self._set_status("pods", ns, sb, st)

    def agent_finish(self, ns, sandbox, succeeded, exit_code=None):
        with self.lock:
            self.get("sandboxes", ns, sandbox)
            self._agent_pod(ns, sandbox, True,
                            exit_code if exit_code is not None else (0 if succeeded else 1))
            self._agent_sandbox_status(ns, sandbox, None,
                                       "PodSucceeded" if succeeded else "PodFailed")

    def _agent_after_write(self, plural, ns, name, old, new):
        if plural == "sandboxes" and (ns, name) in self.agent_pods:
            mode = (new.get("spec") or {}).get("operatingMode")
            if mode != (old.get("spec") or {}).get("operatingMode"):
                self._agent_pod(ns, name, mode != "Suspended")
                self._agent_sandbox_status(ns, name, mode)

    def _agent_after_delete(self, plural, ns, obj):
        if plural != "sandboxclaims":
            return
        uid = obj["metadata"].get("uid")
        for (p, n, name), o in list(self.objects.items()):
            refs = o.get("metadata", {}).get("ownerReferences") or []
            if p == "sandboxes" and n == ns and any(r.get("uid") == uid for r in refs):
                self._agent_pod(ns, name, False)
                self.agent_pods.pop((ns, name), None)
                self.delete("sandboxes", ns, name)

    def freeze_watches(self):
        """Test control: open watches stop delivering (a partitioned watch cache)."""
        with self.lock:
            self.frozen = True

    def compact(self):
        """Test control: drop the event history (etcd compaction) and end every watch, so a
        client resuming from an older resourceVersion gets 410 Expired and must relist."""
        with self.lock:
            self.compacted = self.rv
            self.history.clear()
            self.frozen = False
            self.epoch += 1
            self.lock.notify_all()

    def put_object(self, plural, ns, obj):
        """Test helper: create or overwrite without checks."""
        with self.lock:
            key = (plural, ns, obj["metadata"]["name"])
            if key in self.objects:
                return self.write(plural, ns, key[2], obj, None, False)
            return self.create(plural, ns, obj)


def _selector_match(obj, label_sel, field_sel):
    labels = obj.get("metadata", {}).get("labels") or {}
    for term in filter(None, (label_sel or "").split(",")):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k.strip()) == v.strip():
                return False
        elif "=" in term:
            k, v = term.replace("==", "=").split("=", 1)
            if labels.get(k.strip()) != v.strip():
                return False
        elif term.strip() not in labels:
            return False
    md = obj.get("metadata", {})
    for term in filter(None, (field_sel or "").split(",")):
        k, _, v = term.replace("==", "=").partition("=")
        if k == "metadata.name" and md.get("name") != v:
            return False
        if k == "metadata.namespace" and md.get("namespace") != v:
            return False
        if k.startswith("involvedObject.") and \
                str((obj.get("involvedObject") or {}).get(k.split(".", 1)[1], "")) != v:
            return False
    return True


def _plural(key):
    """The URL plural of the RESOURCES key KEY."""
    return key.split("@", 1)[0]


def _resolve(plural, group, version):
    """The RESOURCES key of PLURAL in GROUP/VERSION, or None."""
    for key, (g, v, _, _, _) in RESOURCES.items():
        if _plural(key) == plural and g == group and v == version:
            return key
    return None


def _discovery_groups():
    groups = {}
    for plural, (group, version, kind, has_status, _) in RESOURCES.items():
        if group:
            groups.setdefault(group, version)
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
        {"name": g, "versions": [{"groupVersion": "%s/%s" % (g, v), "version": v}],
         "preferredVersion": {"groupVersion": "%s/%s" % (g, v), "version": v}}
        for g, v in sorted(groups.items())]}


def _discovery_resources(group, version):
    res = []
    for plural, (g, v, kind, has_status, _) in RESOURCES.items():
        if g == group and v == version:
            res.append({"name": _plural(plural), "singularName": kind.lower(),
                        "namespaced": True,
                        "kind": kind, "verbs": ["create", "delete", "get", "list", "patch",
                                                "update", "watch"]})
            if has_status:
                res.append({"name": plural + "/status", "singularName": "",
                            "namespaced": True, "kind": kind,
                            "verbs": ["get", "patch", "update"]})
    if not res:
        return None
    gv = "%s/%s" % (group, version) if group else version
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv,
            "resources": res}


def _openapi_doc(group, version):
    paths = {}
    for plural, (g, v, kind, _, _) in RESOURCES.items():
        if g == group and v == version:
            prefix = "/apis/%s/%s" % (g, v) if g else "/api/v1"
            paths[prefix + "/namespaces/{namespace}/%s/{name}" % _plural(plural)] = {"patch": {
                "x-kubernetes-group-version-kind": {"group": g, "version": v, "kind": kind},
                "parameters": [{"name": "fieldValidation", "in": "query"}]}}
    return {"openapi": "3.0.0", "info": {"title": "fake_kube", "version": "v1"},
            "paths": paths} if paths else None


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # as a real API server: a burst of connects must not stall

    def handle_error(self, request, client_address):
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError, ssl.SSLError)):
            return  # the client went away (a timed-out call): nothing to report
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def _send_json(self, code, obj):
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, e):
        self._send_json(e.code, e.status())

    def _body(self):
        n = int(self.headers.get("Content-Length") or 0)
        ctype = (self.headers.get("Content-Type") or "application/json").split(";")[0].strip()
        if n and n <= BODY_MAX and ctype not in ("application/json",
                                                 "application/merge-patch+json"):
            self.rfile.read(n)  # keep the connection in step before refusing
            # protobuf and CBOR are not spoken here; client-go falls back to JSON on 415
            raise ApiError(415, "UnsupportedMediaType", "the body of the request was in an "
                           "unknown format - accepted media types include: application/json, "
                           "application/merge-patch+json")
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            raise ApiError(400, "BadRequest", "chunked request bodies are not supported here")
        if n > BODY_MAX:
            raise ApiError(413, "RequestEntityTooLarge", "request entity too large")
        raw = self.rfile.read(n) if n else b""
        try:
            obj = json.loads(raw or b"null")
        except ValueError:
            raise ApiError(400, "BadRequest", "the body is not valid JSON")
        return obj

    def _handle(self):
        fake = self.server.fake
        u = urllib.parse.urlsplit(self.path)
        q = dict(urllib.parse.parse_qsl(u.query))
        auth = self.headers.get("Authorization") or ""
        user = fake.users.get(auth[len("Bearer "):]) if auth.startswith("Bearer ") else None
        with fake.lock:
            fake.requests.append((self.command, u.path))
            fake.audit.append((user, self.command, u.path, q))
        try:
            if fake.token is not None and user is None and auth != "Bearer " + fake.token:
                raise ApiError(401, "Unauthorized", "Unauthorized")
            if self.command == "POST" and u.path in ("/fake/freeze", "/fake/compact"):
                self._body()
                (fake.freeze_watches if u.path == "/fake/freeze" else fake.compact)()
                return self._send_json(200, {"kind": "Status", "apiVersion": "v1",
                                             "metadata": {}, "status": "Success"})
            if self.command == "POST" and u.path in ("/fake/agent-sandbox/bind",
                                                     "/fake/agent-sandbox/finish"):
                return self._agent_control(fake, u.path)
            if self.command == "GET" and self._discovery(u.path):
                return
            m = PATH_RE.match(u.path)
            plural = m and _resolve(m.group("plural"), m.group("g") or "",
                                    m.group("v") or m.group("cv"))
            if not plural:
                raise ApiError(404, "NotFound", "the server could not find the requested "
                               "resource")
            self._resource(fake, plural, m.group("ns"), m.group("name"), m.group("sub"), q)
        except ApiError as e:
            self._error(e)

    def _agent_control(self, fake, path):
        b = self._body()
        if not isinstance(b, dict) or not isinstance(b.get("namespace"), str):
            raise ApiError(400, "BadRequest", "namespace is required")
        if path.endswith("/bind"):
            obj = fake.agent_bind(b["namespace"], str(b.get("claim")), str(b.get("podIP")),
                                  b.get("sandbox"))
        else:
            code = b.get("exitCode")
            fake.agent_finish(b["namespace"], str(b.get("sandbox")), bool(b.get("succeeded")),
                              code if isinstance(code, int) else None)
            with fake.lock:
                obj = fake.get("sandboxes", b["namespace"], str(b.get("sandbox")))
        return self._send_json(200, obj)

    def _discovery(self, path):
        if path == "/api":
            self._send_json(200, {"kind": "APIVersions", "versions": ["v1"]})
        elif path == "/apis":
            self._send_json(200, _discovery_groups())
        elif path == "/api/v1":
            self._send_json(200, _discovery_resources("", "v1"))
        elif path == "/openapi/v3":
            gvs = sorted({(g, v) for g, v, _, _, _ in RESOURCES.values()})
            self._send_json(200, {"paths": {
                ("apis/%s/%s" % (g, v) if g else "api/v1"):
                {"serverRelativeURL": "/openapi/v3/" + ("apis/%s/%s" % (g, v) if g else
                                                        "api/v1")} for g, v in gvs}})
        else:
            m = re.match(r"^(?:/openapi/v3)?/apis/([a-z0-9.-]+)/(v[a-z0-9]+)$", path)
            m1 = re.match(r"^/openapi/v3/api/v1$", path)
            if m1:
                doc = _openapi_doc("", "v1")
            elif m and path.startswith("/openapi/v3"):
                doc = _openapi_doc(m.group(1), m.group(2))
            elif m:
                doc = _discovery_resources(m.group(1), m.group(2))
            else:
                return False
            if doc is None:
                raise ApiError(404, "NotFound", "the server could not find the requested "
                               "resource")
            self._send_json(200, doc)
        return True

    def _resource(self, fake, plural, ns, name, sub, q):
        method = self.command
        has_status = RESOURCES[plural][3]
        if sub == "status" and not has_status:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if name is None:
            if method == "GET" and q.get("watch") in ("true", "1"):
                return self._watch(fake, plural, ns, q)
            if method == "GET":
                return self._list(fake, plural, ns, q)
            if method == "POST" and ns is not None:
                obj = self._body()
                if not isinstance(obj, dict):
                    raise ApiError(400, "BadRequest", "the body is not a JSON object")
                with fake.lock:
                    return self._send_json(201, fake.create(plural, ns, obj))
            raise ApiError(405, "MethodNotAllowed", "the server does not allow this method")
        if ns is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if method == "GET":
            with fake.lock:
                return self._send_json(200, fake.get(plural, ns, name))
        if method == "PUT":
            obj = self._body()
            if not isinstance(obj, dict):
                raise ApiError(400, "BadRequest", "the body is not a JSON object")
            with fake.lock:
                return self._send_json(200, fake.write(plural, ns, name, obj, sub, True))
        if method == "PATCH":
            return self._patch(fake, plural, ns, name, sub)
        if method == "DELETE" and sub is None:
            opts = self._body()
            pre = (opts.get("preconditions") or {}) if isinstance(opts, dict) else {}
            with fake.lock:
                return self._send_json(200, fake.delete(plural, ns, name,
                                                        pre.get("resourceVersion")))
        raise ApiError(405, "MethodNotAllowed", "the server does not allow this method")

    def _patch(self, fake, plural, ns, name, sub):
        ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip()
        if ctype != "application/merge-patch+json":
            raise ApiError(415, "UnsupportedMediaType", "the body of the request was in an "
                           "unknown format - accepted media types include: "
                           "application/merge-patch+json")
        patch = self._body()
        if not isinstance(patch, dict):
            raise ApiError(400, "BadRequest", "a merge patch must be a JSON object")
        with fake.lock:
            old = json.loads(json.dumps(fake.get(plural, ns, name)))
            new = merge_patch(old, patch)
            md = new.setdefault("metadata", {})
            want = (patch.get("metadata") or {}).get("resourceVersion") \
                if isinstance(patch.get("metadata"), dict) else None
            md["resourceVersion"] = want if want else old["metadata"]["resourceVersion"]
            self._send_json(200, fake.write(plural, ns, name, new, sub, False))

    def _list(self, fake, plural, ns, q):
        with fake.lock:
            items = [json.loads(json.dumps(o)) for (p, n, _), o in sorted(fake.objects.items())
                     if p == plural and (ns is None or n == ns) and
                     _selector_match(o, q.get("labelSelector"), q.get("fieldSelector"))]
            group, version, kind, _, _ = RESOURCES[plural]
            self._send_json(200, {"kind": kind + "List",
                                  "apiVersion": "%s/%s" % (group, version) if group else version,
                                  "metadata": {"resourceVersion": str(fake.rv)},
                                  "items": items})

    def _chunk(self, obj):
        data = json.dumps(obj).encode() + b"\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _watch(self, fake, plural, ns, q):
        rv = q.get("resourceVersion", "")
        bookmarks = q.get("allowWatchBookmarks") in ("true", "1")
        timeout = float(q.get("timeoutSeconds") or 0)
        lsel, fsel = q.get("labelSelector"), q.get("fieldSelector")
        if rv not in ("", "0") and not rv.isdigit():
            raise ApiError(400, "BadRequest", "invalid resourceVersion")
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            self._watch_loop(fake, plural, ns, rv, bookmarks, timeout, lsel, fsel)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError, OSError):
            pass
        self.close_connection = True

    def _watch_loop(self, fake, plural, ns, rv, bookmarks, timeout, lsel, fsel):
        deadline = time.monotonic() + timeout if timeout > 0 else None
        next_bookmark = time.monotonic() + fake.bookmark_seconds
        with fake.lock:
            epoch = fake.epoch
            if rv in ("", "0"):
                pending = [{"type": "ADDED", "object": o} for (p, n, _), o in
                           sorted(fake.objects.items()) if p == plural and
                           (ns is None or n == ns) and _selector_match(o, lsel, fsel)]
                cursor = fake.rv
            else:
                cursor = int(rv)
                if cursor < fake.compacted:
                    pending, cursor = [{"type": "ERROR", "object": gone(rv).status()}], None
                else:
                    pending = []
        while True:
            for ev in pending:
                self._chunk(ev)
            if cursor is None:
                return
            with fake.lock:
                pending = []
                while not pending:
                    if fake.stopping or fake.epoch != epoch:
                        return
                    if fake.frozen:
                        fake.lock.wait(0.1)
                        continue
                    now = time.monotonic()
                    if deadline is not None and now >= deadline:
                        return
                    if cursor < fake.compacted:
                        self._chunk({"type": "ERROR", "object": gone(str(cursor)).status()})
                        return
                    for erv, p, n, typ, obj in fake.history:
                        if erv > cursor and p == plural and (ns is None or n == ns) and \
                                _selector_match(obj, lsel, fsel):
                            pending.append({"type": typ, "object": obj})
                    if fake.history and fake.history[-1][0] > cursor:
                        cursor = fake.history[-1][0]
                    if pending:
                        break
                    if bookmarks and now >= next_bookmark:
                        g, v, kind, _, _ = RESOURCES[plural]
                        pending.append({"type": "BOOKMARK", "object": {
                            "kind": kind, "apiVersion": "%s/%s" % (g, v) if g else v,
                            "metadata": {"resourceVersion": str(fake.rv)}}})
                        cursor = max(cursor, fake.rv)
                        next_bookmark = now + fake.bookmark_seconds
                        break
                    wait = next_bookmark - now if bookmarks else 0.5
                    if deadline is not None:
                        wait = min(wait, deadline - now)
                    fake.lock.wait(max(0.01, min(wait, 0.5)))

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle


def _main(argv=None):
    ap = argparse.ArgumentParser(description="Fake Kubernetes API server on loopback")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--token", default=None, help="require this bearer token")
    ap.add_argument("--history", type=int, default=100, help="watch events kept")
    ap.add_argument("--bookmark-seconds", type=float, default=1.0)
    ap.add_argument("--tls-cert")
    ap.add_argument("--tls-key")
    a = ap.parse_args(argv)
    fake = FakeKube(a.host, a.port, token=a.token, history=a.history,
                    bookmark_seconds=a.bookmark_seconds, tls_cert=a.tls_cert,
                    tls_key=a.tls_key)
    done = threading.Event()
    # Before the URL is printed: a caller may stop the fake as soon as it has read it.
    signal.signal(signal.SIGTERM, lambda *x: done.set())
    fake.start()
    print(fake.url, flush=True)
    try:
        while not done.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    # A graceful stop, bounded: a handler thread stuck on a client that went away (a test
    # SIGSTOPs the fake to simulate an unreachable API server) must not keep the process
    # alive, or the test that started it waits forever.
    t = threading.Thread(target=fake.stop, daemon=True)
    t.start()
    t.join(2.0)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(_main())
