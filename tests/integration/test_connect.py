# SPDX-License-Identifier: Apache-2.0
"""ConnectRPC (SPEC §10): divergedev.agenttask.v1.AgentTaskService on the main listener.
The interop test generates a client from proto/ with the real `buf generate` and
protoc-gen-es and drives the server with @connectrpc/connect-node over both codecs; the
other tests speak the Connect protocol by hand (headers, errors, limits, chunked bodies,
binary protobuf written byte by byte)."""
import http.client
import json
import os
import shutil
import subprocess
import tempfile

import npm_pin
from harness import API, SOURCE_DIR, Server, run_tests

ARGS = ["--sandbox-provider", "none"]
SERVICE = "/divergedev.agenttask.v1.AgentTaskService/"
CONNECT_PKGS = npm_pin.NPM_GROUPS["connect-interop"]


def rpc(srv, method, body, ctype="application/json", token=None, headers=None):
    """POSTs BODY (a dict for JSON, bytes otherwise) to METHOD; (status, headers, body)."""
    h = {"Content-Type": ctype, "Connect-Protocol-Version": "1",
         "Authorization": "Bearer " + (token if token is not None else srv.token)}
    h.update(headers or {})
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    return srv.request("POST", SERVICE + method, body=data, headers=h, auth=False, raw=True)


def rpc_json(srv, method, body, **kw):
    st, h, data = rpc(srv, method, body, **kw)
    assert h.get("content-type", "").startswith("application/json"), (st, h, data)
    return st, json.loads(data)


def get(srv, name, ns="default"):
    st, _, t = srv.request("GET", "%s/namespaces/%s/agenttasks/%s" % (API, ns, name))
    assert st == 200, (st, t)
    return t


# --- the protocol by hand ------------------------------------------------------------

def test_json_methods_follow_the_mcp_tools():
    with Server(ARGS) as srv:
        st, r = rpc_json(srv, "CreateTask", {
            "name": "fix-a", "objective": "fix it", "budgetUSD": "2.5",
            "budgetTokens": "1000", "maxIterations": 4,
            "repository": {"url": "https://example.invalid/r"}})
        assert st == 200, r
        t = r["task"]
        assert t["name"] == "fix-a" and t["namespace"] == "default", t
        assert t["budgetUSD"] == "2.50" and t["budgetTokens"] == "1000", t
        assert t["maxIterations"] == "4" and t["phase"] == "Pending", t
        assert t["repository"] == {"url": "https://example.invalid/r", "baseBranch": "main",
                                   "workingBranch": "agent/fix-a"}, t
        assert "suspended" not in t and "iteration" not in t, t  # defaults are left out
        st, r = rpc_json(srv, "GuideTask", {"name": "fix-a", "guidance": "look at the db"})
        assert st == 200 and r["task"]["guidance"] == "look at the db", r
        st, r = rpc_json(srv, "PauseTask", {"name": "fix-a"})
        assert st == 200 and r["task"]["suspended"] is True, r
        st, r = rpc_json(srv, "ResumeTask", {"name": "fix-a", "budget": "+15.00",
                                             "tokens": 500})
        assert st == 200 and "suspended" not in r["task"], r
        assert r["task"]["budgetUSD"] == "17.50" and r["task"]["budgetTokens"] == "1500", r
        t = get(srv, "fix-a")
        assert t["spec"]["budgetUSD"] == "17.50" and t["spec"]["suspended"] is False, t
        assert t["metadata"]["annotations"]["divergedev.com/guidance"] == "look at the db", t
        st, r = rpc_json(srv, "GuideTask", {"name": "fix-a", "guidance": ""})
        assert st == 200 and "guidance" not in r["task"], r
        # Resume without a spec budget adds to the server default (5.00 USD).
        rpc_json(srv, "CreateTask", {"namespace": "team-b", "name": "b", "objective": "o"})
        st, r = rpc_json(srv, "ResumeTask", {"namespace": "team-b", "name": "b",
                                             "budget": "1"})
        assert st == 200 and r["task"]["budgetUSD"] == "6.00", r
        st, r = rpc_json(srv, "ListTasks", {})
        assert [x["name"] for x in r["tasks"]] == ["fix-a"], r
        st, r = rpc_json(srv, "ListTasks", {"allNamespaces": True})
        assert [(x["namespace"], x["name"]) for x in r["tasks"]] == [
            ("default", "fix-a"), ("team-b", "b")], r
        st, r = rpc_json(srv, "ListTasks", {"namespace": "empty"})
        assert st == 200 and r == {}, r  # an empty repeated field is left out


def test_connect_errors_have_codes_and_statuses():
    with Server(ARGS) as srv:
        cases = [
            ("GetTask", {"name": "missing"}, {}, 404, "not_found"),
            ("GetTask", {}, {}, 400, "invalid_argument"),
            ("GetTask", {"name": "Not_A_Label"}, {}, 400, "invalid_argument"),
            ("GetTask", {"name": "a", "bogus": 1}, {}, 400, "invalid_argument"),
            ("CreateTask", {"name": "a"}, {}, 400, "invalid_argument"),
            ("CreateTask", {"name": "a", "objective": "o", "budgetUSD": "x"}, {}, 400,
             "invalid_argument"),
            ("ResumeTask", {"name": "missing", "budget": "+1"}, {}, 404, "not_found"),
            ("NoSuchMethod", {}, {}, 404, "unimplemented"),
            ("GetTask", {"name": "a"}, {"Connect-Protocol-Version": "2"}, 400,
             "invalid_argument"),
            ("GetTask", {"name": "a"}, {"Content-Encoding": "gzip"}, 501, "unimplemented"),
        ]
        for method, body, headers, status, code in cases:
            st, r = rpc_json(srv, method, body, headers=headers)
            assert (st, r.get("code")) == (status, code), (method, body, st, r)
            assert isinstance(r.get("message"), str) and r["message"], r
        st, r = rpc_json(srv, "CreateTask", {"name": "dup", "objective": "o"})
        assert st == 200, r
        st, r = rpc_json(srv, "CreateTask", {"name": "dup", "objective": "o"})
        assert (st, r["code"]) == (409, "already_exists"), r
        st, r = rpc_json(srv, "GetTask", {"name": "dup"}, token="wrong")
        assert (st, r["code"]) == (401, "unauthenticated"), r
        st, h, r = rpc(srv, "GetTask", b"{}", ctype="text/plain")
        assert st == 415, (st, r)
        st, r = rpc_json(srv, "GetTask", b"{\"name\": ")
        assert (st, r["code"]) == (400, "invalid_argument"), r
        # Only POST: another method is 405 from the router.
        st, _, _ = srv.request("GET", SERVICE + "GetTask")
        assert st == 405


def varint(n):
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def field(num, wire, payload):
    if wire == 2:
        payload = varint(len(payload)) + payload
    return varint(num << 3 | wire) + payload


def parse_pb(data):
    """A tiny reader for the test: {field number: [values]} (varints as ints, bytes)."""
    out, i = {}, 0
    while i < len(data):
        tag, i = read_varint(data, i)
        num, wire = tag >> 3, tag & 7
        if wire == 0:
            v, i = read_varint(data, i)
        else:
            assert wire == 2, wire
            n, i = read_varint(data, i)
            v, i = data[i:i + n], i + n
        out.setdefault(num, []).append(v)
    return out


def read_varint(data, i):
    shift = v = 0
    while True:
        b = data[i]
        i += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return v, i


def test_binary_protobuf_by_hand():
    with Server(ARGS) as srv:
        repo = field(1, 2, b"https://example.invalid/r")
        body = (field(2, 2, b"bin") + field(3, 2, b"fix it") + field(4, 2, b"1.25") +
                field(5, 0, varint(0)) + field(7, 2, repo) +
                field(99, 2, b"unknown, skipped") + field(98, 0, varint(7)))
        st, h, data = rpc(srv, "CreateTask", body, ctype="application/proto")
        assert st == 200 and h["content-type"] == "application/proto", (st, h, data)
        task = parse_pb(parse_pb(data)[1][0])
        assert task[1] == [b"bin"] and task[2] == [b"default"], task
        assert task[11] == [b"1.25"] and task[4] == [b"Pending"], task
        repo = parse_pb(task[13][0])
        assert repo[2] == [b"main"] and repo[3] == [b"agent/bin"], repo
        assert get(srv, "bin")["spec"]["budgetTokens"] == 0  # optional 0 was sent
        # A negative int64 is a ten-byte varint.
        st, h, data = rpc(srv, "ResumeTask", field(2, 2, b"bin") + field(4, 0, varint(-1)),
                          ctype="application/proto")
        assert st == 400 and json.loads(data)["code"] == "invalid_argument", (st, data)
        for bad in (b"\x12\x05ab", b"\x12", b"\x0f", b"\x12\x02\xc3\x28"):
            st, h, data = rpc(srv, "GetTask", bad, ctype="application/proto")
            assert st == 400 and h["content-type"].startswith("application/json"), (st, h)
            assert json.loads(data)["code"] == "invalid_argument", data
        st, h, data = rpc(srv, "ListTasks", b"", ctype="application/proto")
        tasks = parse_pb(data)[1]
        assert st == 200 and len(tasks) == 1, (st, data)


def test_chunked_body_and_size_limit():
    with Server(ARGS) as srv:
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
        body = json.dumps({"name": "chunky", "objective": "x" * 3000}).encode()
        conn.putrequest("POST", SERVICE + "CreateTask")
        for k, v in (("Content-Type", "application/json"), ("Transfer-Encoding", "chunked"),
                     ("Authorization", "Bearer " + srv.token)):
            conn.putheader(k, v)
        conn.endheaders()
        for i in range(0, len(body), 1000):
            part = body[i:i + 1000]
            conn.send(b"%x\r\n%s\r\n" % (len(part), part))
        conn.send(b"0\r\n\r\n")
        resp = conn.getresponse()
        r = json.loads(resp.read())
        assert resp.status == 200 and r["task"]["name"] == "chunky", (resp.status, r)
        conn.close()
        st, h, data = rpc(srv, "CreateTask", b"{\"name\":\"" + b"a" * (1024 * 1024) + b"\"}")
        assert st == 413, st


# --- interop: a generated client and connect-node -------------------------------------

NODE_CLIENT = r"""
import { createClient, ConnectError, Code } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { AgentTaskService } from "./gen/divergedev/agenttask/v1/agenttask_pb.js";

const [url, token] = process.argv.slice(2);
const bearer = (tok) => (next) => async (req) => {
  req.header.set("Authorization", "Bearer " + tok);
  return next(req);
};
const client = (binary, tok) => createClient(AgentTaskService, createConnectTransport({
  baseUrl: url, httpVersion: "1.1", useBinaryFormat: binary, interceptors: [bearer(tok)],
}));
const codeOf = async (p) => {
  try { await p; return "ok"; } catch (e) { return Code[ConnectError.from(e).code]; }
};
const out = {};
for (const binary of [true, false]) {
  const c = client(binary, token);
  const name = binary ? "via-proto" : "via-json";
  const r = {};
  r.create = (await c.createTask({
    // protoc-gen-es names fields after the proto name (budget_usd: budgetUsd); the JSON
    // codec sends the json_name (budgetUSD).
    name, objective: "fix the flaky test", budgetUsd: "2.50", budgetTokens: 1000n,
    maxIterations: 4n, repository: { url: "https://example.invalid/r", baseBranch: "dev" },
  })).task;
  r.get = (await c.getTask({ name })).task;
  r.list = (await c.listTasks({})).tasks.map((t) => t.name);
  r.guide = (await c.guideTask({ name, guidance: "look at the retry loop" })).task;
  r.pause = (await c.pauseTask({ name })).task;
  r.resume = (await c.resumeTask({ name, budget: "+15.00", tokens: 500n })).task;
  r.notFound = await codeOf(c.getTask({ name: "no-such-task" }));
  r.unauthenticated = await codeOf(client(binary, "wrong-token").getTask({ name }));
  r.exists = await codeOf(c.createTask({ name, objective: "again" }));
  out[binary ? "proto" : "json"] = r;
}
console.log(JSON.stringify(out, (k, v) => (typeof v === "bigint" ? v.toString() : v)));
"""

BUF_GEN = """version: v2
inputs:
  - directory: %s
plugins:
  - local: %s
    out: gen
    opt:
      - target=js
      - import_extension=js
"""


def generate_client(modules, work):
    """Runs `buf generate` on proto/ with protoc-gen-es into WORK/gen."""
    bin_dir = os.path.join(modules, ".bin")
    with open(os.path.join(work, "buf.gen.yaml"), "w") as f:
        f.write(BUF_GEN % (os.path.join(SOURCE_DIR, "proto"),
                           os.path.join(bin_dir, "protoc-gen-es")))
    env = dict(os.environ, BUF_CACHE_DIR=os.path.join(work, "buf-cache"),
               PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""))
    r = subprocess.run([os.path.join(bin_dir, "buf"), "generate", "--template", "buf.gen.yaml"],
                       cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (r.stdout, r.stderr)
    gen = os.path.join(work, "gen", "divergedev", "agenttask", "v1", "agenttask_pb.js")
    assert os.path.exists(gen), os.listdir(work)


def test_connect_node_client_over_both_codecs():
    npm_pin.ensure_node()
    if npm_pin.node_major() < 20:
        # The pinned buf/protoc-gen-es/connect-node toolchain is the newest that runs on
        # Node 20; on Debian 12's own nodejs 18 with its npm 9 the install of these pins
        # never finishes (seen on a fresh Debian root). The hand-made JSON and protobuf
        # requests above still check the protocol there.
        print("SKIP test_connect_node_client_over_both_codecs: needs Node 20 or newer, "
              "found %d" % npm_pin.node_major())
        return
    modules = npm_pin.install_many("connect-interop", CONNECT_PKGS)
    work = tempfile.mkdtemp(prefix="diverge-connect-")
    try:
        # ESM resolves packages from the script's folder upwards.
        os.symlink(modules, os.path.join(work, "node_modules"))
        generate_client(modules, work)
        script = os.path.join(work, "client.mjs")
        with open(script, "w") as f:
            f.write(NODE_CLIENT)
        with Server(ARGS) as srv:
            r = subprocess.run(["node", script, srv.url, srv.token], capture_output=True,
                               text=True, timeout=120)
            assert r.returncode == 0, (r.stdout, r.stderr)
            out = json.loads(r.stdout.strip().splitlines()[-1])
            for codec, name in (("proto", "via-proto"), ("json", "via-json")):
                o = out[codec]
                assert o["create"]["name"] == name and o["create"]["phase"] == "Pending", o
                assert o["create"]["budgetUsd"] == "2.50", o
                assert o["create"]["budgetTokens"] == "1000", o
                assert o["create"]["maxIterations"] == "4", o
                assert o["create"]["costUsd"] == "0.00", o
                assert o["create"]["repository"]["baseBranch"] == "dev", o
                assert o["create"]["repository"]["workingBranch"] == "agent/" + name, o
                assert o["get"]["name"] == name and o["get"]["namespace"] == "default", o
                assert name in o["list"], o
                assert o["guide"]["guidance"] == "look at the retry loop", o
                assert o["pause"]["suspended"] is True, o
                assert o["resume"]["suspended"] is False, o
                assert o["resume"]["budgetUsd"] == "17.50", o
                assert o["resume"]["budgetTokens"] == "1500", o
                assert o["notFound"] == "NotFound", o
                assert o["unauthenticated"] == "Unauthenticated", o
                assert o["exists"] == "AlreadyExists", o
                t = get(srv, name)
                assert t["spec"]["budgetUSD"] == "17.50" and not t["spec"]["suspended"], t
                assert t["metadata"]["annotations"]["divergedev.com/guidance"] == \
                    "look at the retry loop", t
            assert out["json"]["list"] == ["via-json", "via-proto"], out
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    run_tests([test_json_methods_follow_the_mcp_tools,
               test_connect_errors_have_codes_and_statuses, test_binary_protobuf_by_hand,
               test_chunked_body_and_size_limit, test_connect_node_client_over_both_codecs])
