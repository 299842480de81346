# SPDX-License-Identifier: Apache-2.0
"""`diverge mcp` (SPEC §10) against the real `diverge serve --sandbox-provider none`: the
JSON-RPC 2.0 stdio transport (version negotiation, notifications, every error code, a line
over the 1 MiB limit), every tool with its effect checked through the task API, failures
as isError results, and the official MCP TypeScript SDK (npm @modelcontextprotocol/sdk,
pinned) spawning the binary as a real client would."""
import json
import os
import queue
import socket
import subprocess
import tempfile
import threading
import time

import npm_pin
from harness import API, DIVERGE_BIN, Server, run_tests

NS = API + "/namespaces/default/agenttasks"
ARGS = ["--sandbox-provider", "none"]
TOOLS = {"diverge_create_task", "diverge_list_tasks", "diverge_task_status",
         "diverge_guide_task", "diverge_pause_task", "diverge_resume_task",
         "diverge_delete_task", "diverge_quota_status"}


class Mcp:
    """A `diverge mcp` child speaking newline-delimited JSON-RPC on its stdin/stdout."""

    def __init__(self, srv=None, server_url=None, token=None, extra=(), env=None):
        e = {k: v for k, v in os.environ.items() if not k.startswith("DIVERGE_")}
        e["DIVERGE_SERVER"] = server_url or srv.url
        e["DIVERGE_API_TOKEN"] = token if token is not None else srv.token
        e.update(env or {})
        env = {k: v for k, v in e.items() if v is not None}
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([DIVERGE_BIN, "mcp"] + list(extra), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.stderr, env=env)
        self.lines = queue.Queue()
        self.raw = []
        threading.Thread(target=self._read, daemon=True).start()
        self.next_id = 100

    def _read(self):
        for line in self.proc.stdout:
            self.raw.append(line)
            self.lines.put(line)
        self.lines.put(None)

    def send_raw(self, data):
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def send(self, obj):
        self.send_raw(json.dumps(obj).encode() + b"\n")

    def recv(self, timeout=60):
        line = self.lines.get(timeout=timeout)
        assert line is not None, "diverge mcp closed stdout: %s" % self.err()
        assert line.endswith(b"\n"), line
        return json.loads(line)

    def request(self, method, params=None):
        self.next_id += 1
        msg = {"jsonrpc": "2.0", "id": self.next_id, "method": method}
        if params is not None:
            msg["params"] = params
        self.send(msg)
        reply = self.recv()
        assert reply.get("id") == self.next_id and reply.get("jsonrpc") == "2.0", reply
        return reply

    def call(self, tool, **arguments):
        r = self.request("tools/call", {"name": tool, "arguments": arguments})
        assert "result" in r, r
        res = r["result"]
        assert isinstance(res["content"], list) and res["content"][0]["type"] == "text", res
        assert isinstance(res["content"][0]["text"], str) and res["content"][0]["text"], res
        return res

    def ok(self, tool, **arguments):
        res = self.call(tool, **arguments)
        assert res["isError"] is False, res
        assert isinstance(res["structuredContent"], dict), res
        return res

    def fails(self, tool, reason=None, **arguments):
        res = self.call(tool, **arguments)
        assert res["isError"] is True, res
        if reason is not None:
            assert res["structuredContent"]["reason"] == reason, res
        return res["content"][0]["text"]

    def initialize(self, version="2025-06-18"):
        r = self.request("initialize", {"protocolVersion": version, "capabilities": {},
                                        "clientInfo": {"name": "test", "version": "1"}})
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return r

    def err(self):
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace")

    def close(self):
        """Closes stdin and returns the exit code."""
        if self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            rc = self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        return rc

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        rc = self.close()
        if exc[0] is None:
            # A clean exit (under ASan also: no leak, no error report), and stdout
            # carried nothing but protocol messages, one JSON value per line.
            assert rc == 0, (rc, self.err())
            for line in self.raw:
                json.loads(line)


def get(srv, name, ns="default"):
    st, _, b = srv.request("GET", API + "/namespaces/%s/agenttasks/%s" % (ns, name))
    assert st == 200, (st, b)
    return b


def wait_phase(srv, name, phase, ns="default", timeout=20):
    deadline = time.time() + timeout
    b = None
    while time.time() < deadline:
        b = get(srv, name, ns)
        if b.get("status", {}).get("phase") == phase:
            return b
        time.sleep(0.02)
    raise AssertionError("task %s never reached %s: %s" % (name, phase, b))


def closed_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_initialize_negotiates_the_version():
    with Server(ARGS) as srv:
        with Mcp(srv) as m:
            for v in ("2025-06-18", "2025-03-26", "2024-11-05"):
                r = m.request("initialize", {"protocolVersion": v, "capabilities": {},
                                             "clientInfo": {"name": "t", "version": "1"}})
                res = r["result"]
                assert res["protocolVersion"] == v, res
                assert res["serverInfo"]["name"] == "diverge", res
                assert res["serverInfo"]["version"], res
                assert "tools" in res["capabilities"], res
            # A version we do not speak: we answer our latest; the client decides.
            r = m.request("initialize", {"protocolVersion": "2099-01-01", "capabilities": {}})
            assert r["result"]["protocolVersion"] == "2025-06-18", r
            r = m.request("initialize", {"capabilities": {}})
            assert r["error"]["code"] == -32602, r
            assert m.request("ping")["result"] == {}
        assert m.proc.returncode == 0, m.err()
        assert "serving MCP on stdio" in m.err()


def test_delete_task():
    with Server(ARGS) as srv, Mcp(srv) as m:
        m.initialize()
        m.ok("diverge_create_task", name="mcp-del", objective="x")
        res = m.ok("diverge_delete_task", name="mcp-del")
        assert "deleted" in res["content"][0]["text"], res
        st, _, _ = srv.request("GET", NS + "/mcp-del")
        assert st == 404
        text = m.fails("diverge_delete_task", name="mcp-del")
        assert "not found" in text, text


def test_tools_list_has_the_schemas():
    with Server(ARGS) as srv, Mcp(srv) as m:
        m.initialize()
        tools = m.request("tools/list")["result"]["tools"]
        by_name = {t["name"]: t for t in tools}
        assert set(by_name) == TOOLS, by_name.keys()
        for t in tools:
            s = t["inputSchema"]
            assert s["type"] == "object" and s["additionalProperties"] is False, t
            assert s["properties"]["namespace"]["type"] == "string", t
            assert t["description"], t
        req = {n: set(t["inputSchema"].get("required", [])) for n, t in by_name.items()}
        assert req["diverge_create_task"] == {"name", "objective"}, req
        assert req["diverge_list_tasks"] == set(), req
        assert req["diverge_guide_task"] == {"name", "guidance"}, req
        for n in ("diverge_task_status", "diverge_pause_task", "diverge_resume_task"):
            assert req[n] == {"name"}, req
        props = by_name["diverge_create_task"]["inputSchema"]["properties"]
        assert {"budgetUSD", "budgetTokens", "maxIterations", "repository"} <= set(props)
        assert set(by_name["diverge_resume_task"]["inputSchema"]["properties"]) == {
            "namespace", "name", "budget", "tokens"}


def test_every_tool_against_the_server():
    with Server(ARGS) as srv, Mcp(srv) as m:
        m.initialize()
        res = m.ok("diverge_create_task", name="mcp-one", objective="fix the N+1 query",
                   budgetUSD="5.00", budgetTokens=200000, maxIterations=8,
                   repository="https://example.com/acme/shop.git")
        sc = res["structuredContent"]
        assert sc["name"] == "mcp-one" and sc["namespace"] == "default", sc
        assert sc["budgetUSD"] == "5.00" and sc["budgetTokens"] == 200000, sc
        t = get(srv, "mcp-one")
        assert t["spec"]["objective"] == "fix the N+1 query", t
        assert t["spec"]["budgetUSD"] == "5.00" and t["spec"]["maxIterations"] == 8, t
        assert t["spec"]["repository"]["url"] == "https://example.com/acme/shop.git", t
        # repository as an object, and another namespace
        m.ok("diverge_create_task", name="mcp-two", objective="other", namespace="team-b",
             repository={"url": "https://example.com/b.git", "baseBranch": "dev",
                         "workingBranch": "agent/two"})
        t2 = get(srv, "mcp-two", "team-b")
        assert t2["spec"]["repository"]["baseBranch"] == "dev", t2
        assert t2["spec"]["repository"]["workingBranch"] == "agent/two", t2
        wait_phase(srv, "mcp-one", "Active")

        res = m.ok("diverge_list_tasks")
        names = [x["name"] for x in res["structuredContent"]["tasks"]]
        assert names == ["mcp-one"], res
        assert "mcp-one" in res["content"][0]["text"], res
        res = m.ok("diverge_list_tasks", allNamespaces=True)
        assert sorted(x["name"] for x in res["structuredContent"]["tasks"]) == [
            "mcp-one", "mcp-two"], res
        res = m.ok("diverge_list_tasks", namespace="empty-ns")
        assert res["structuredContent"]["tasks"] == [], res

        res = m.ok("diverge_task_status", name="mcp-one")
        assert res["structuredContent"]["phase"] == "Active", res
        assert "Active" in res["content"][0]["text"], res

        res = m.ok("diverge_guide_task", name="mcp-one", guidance="use a JOIN")
        ann = get(srv, "mcp-one")["metadata"]["annotations"]
        assert ann["divergedev.com/guidance"] == "use a JOIN", ann
        assert res["structuredContent"]["guidance"] == "use a JOIN", res
        m.ok("diverge_guide_task", name="mcp-one", guidance="")
        ann = get(srv, "mcp-one")["metadata"].get("annotations") or {}
        assert "divergedev.com/guidance" not in ann, ann

        res = m.ok("diverge_pause_task", name="mcp-one")
        assert get(srv, "mcp-one")["spec"]["suspended"] is True
        wait_phase(srv, "mcp-one", "Paused")

        res = m.ok("diverge_resume_task", name="mcp-one", budget="+15.00", tokens=2000)
        t = get(srv, "mcp-one")
        assert t["spec"]["suspended"] is False, t
        assert t["spec"]["budgetUSD"] == "20.00" and t["spec"]["budgetTokens"] == 202000, t
        assert res["structuredContent"]["budgetUSD"] == "20.00", res
        wait_phase(srv, "mcp-one", "Active")
        # Without bumps: only spec.suspended changes; a token count as a string with "+".
        m.ok("diverge_pause_task", name="mcp-one")
        m.ok("diverge_resume_task", name="mcp-one")
        assert get(srv, "mcp-one")["spec"]["budgetUSD"] == "20.00"
        m.ok("diverge_resume_task", name="mcp-one", tokens="+1k")
        assert get(srv, "mcp-one")["spec"]["budgetTokens"] == 203000


def test_settings_like_diverge_task():
    """--server/--token flags, the data dir's api-token, and -n as the default namespace."""
    with Server(ARGS) as srv:
        with Mcp(srv, extra=["-n", "team-c", "--server", srv.url],
                 env={"DIVERGE_API_TOKEN": None, "DIVERGE_SERVER": None,
                      "DIVERGE_DATA_DIR": srv.data_dir}) as m:
            m.initialize()
            res = m.ok("diverge_create_task", name="in-c", objective="x")
            assert res["structuredContent"]["namespace"] == "team-c", res
            res = m.ok("diverge_list_tasks")
            assert res["structuredContent"]["namespace"] == "team-c", res
            assert [t["name"] for t in res["structuredContent"]["tasks"]] == ["in-c"]
            m.ok("diverge_task_status", name="in-c")
            m.fails("diverge_task_status", "NotFound", name="in-c", namespace="default")
        get(srv, "in-c", "team-c")
        with Mcp(srv, extra=["--server", srv.url, "--token", "nope"]) as m:
            m.initialize()
            m.fails("diverge_list_tasks", "Unauthorized")


def test_failures_are_tool_results():
    with Server(ARGS) as srv:
        with Mcp(srv) as m:
            m.initialize()
            m.ok("diverge_create_task", name="dup", objective="x")
            # the server said no
            msg = m.fails("diverge_create_task", "Conflict", name="dup", objective="x")
            assert "already exists" in msg, msg
            msg = m.fails("diverge_task_status", "NotFound", name="nope")
            assert "not found" in msg, msg
            m.fails("diverge_pause_task", "NotFound", name="nope")
            m.fails("diverge_resume_task", "NotFound", name="nope", budget="+1")
            m.fails("diverge_create_task", "Invalid", name="Bad_Name", objective="x")
            # bad arguments, checked before any request
            for tool, args in [
                    ("diverge_create_task", {"objective": "x"}),
                    ("diverge_create_task", {"name": "a", "objective": ""}),
                    ("diverge_create_task", {"name": "a", "objective": "x", "budgetUSD": 1.5}),
                    ("diverge_create_task", {"name": "a", "objective": "x", "budgetUSD": "+1"}),
                    ("diverge_create_task", {"name": "a", "objective": "x",
                                             "budgetUSD": "0.0000001"}),
                    ("diverge_create_task", {"name": "a", "objective": "x", "budgetTokens": -1}),
                    ("diverge_create_task", {"name": "a", "objective": "x", "repository": 5}),
                    ("diverge_create_task", {"name": "a", "objective": "x",
                                             "repository": {"url": "u", "evil": "x"}}),
                    ("diverge_create_task", {"name": "a", "objective": "x", "extra": 1}),
                    ("diverge_task_status", {}),
                    ("diverge_task_status", {"name": 7}),
                    ("diverge_task_status", {"name": "a", "namespace": ""}),
                    ("diverge_guide_task", {"name": "a"}),
                    ("diverge_list_tasks", {"allNamespaces": "yes"}),
                    ("diverge_resume_task", {"name": "a", "budget": "lots"}),
                    ("diverge_resume_task", {"name": "a", "tokens": "many"})]:
                msg = m.fails(tool, "Invalid", **args)
                assert msg.startswith(("argument ", "unknown argument")), (tool, args, msg)
            st, _, _ = srv.request("GET", NS + "/a")
            assert st == 404  # nothing was created by a refused call
            # unknown tool: a protocol error (MCP spec), not a result
            r = m.request("tools/call", {"name": "rm_rf", "arguments": {}})
            assert r["error"]["code"] == -32602, r
            r = m.request("tools/call", {"name": "diverge_list_tasks", "arguments": [1]})
            assert r["error"]["code"] == -32602, r
            r = m.request("tools/call", {"arguments": {}})
            assert r["error"]["code"] == -32602, r
        # a wrong token: the server's 401 as a result
        with Mcp(srv, token="wrong") as m:
            m.initialize()
            m.fails("diverge_list_tasks", "Unauthorized")
    # nothing listening
    with Mcp(server_url="http://127.0.0.1:%d" % closed_port(), token="x") as m:
        m.initialize()
        msg = m.fails("diverge_list_tasks", "Unreachable")
        assert "cannot reach the server" in msg, msg
        assert m.request("ping")["result"] == {}  # and the session goes on


def test_protocol_errors_and_notifications():
    with Server(ARGS) as srv, Mcp(srv) as m:
        m.initialize("2025-03-26")
        # Notifications are never answered: the next line is the ping's reply.
        m.send({"jsonrpc": "2.0", "method": "notifications/cancelled",
                "params": {"requestId": 3}})
        m.send({"jsonrpc": "2.0", "method": "no/such/notification"})
        m.send({"jsonrpc": "2.0", "method": "tools/list"})  # a request without id is one too
        m.send({"jsonrpc": "2.0", "id": 9, "result": {}})  # a response to nothing: ignored
        m.send_raw(b"\n   \n")  # blank lines are ignored
        assert m.request("ping")["result"] == {}
        # parse errors: -32700 with id null, and the session goes on
        for bad in (b"{not json", b'{"jsonrpc":"2.0","id":1,"method":"ping"', b"\xff\xfe{}",
                    b'{"jsonrpc":"2.0","id":1,"id":2,"method":"ping"}'):
            m.send_raw(bad + b"\n")
            r = m.recv()
            assert r["id"] is None and r["error"]["code"] == -32700, (bad, r)
        # invalid requests: -32600
        for bad in ({"id": 5, "method": "ping"}, {"jsonrpc": "1.0", "id": 5, "method": "ping"},
                    {"jsonrpc": "2.0", "id": 5, "method": 7},
                    {"jsonrpc": "2.0", "id": 5, "method": "ping", "params": "x"},
                    {"jsonrpc": "2.0", "id": None, "method": "ping"},
                    {"jsonrpc": "2.0", "id": {"a": 1}, "method": "ping"}, 42, "ping", []):
            m.send(bad)
            r = m.recv()
            assert r["error"]["code"] == -32600, (bad, r)
            assert r["id"] == (5 if isinstance(bad, dict) and bad.get("id") == 5 else None), r
        # unknown method: -32601 with the id, also for a string id
        m.send({"jsonrpc": "2.0", "id": "abc", "method": "resources/list"})
        r = m.recv()
        assert r == {"jsonrpc": "2.0", "id": "abc",
                     "error": {"code": -32601, "message": "method not found"}}, r
        # CRLF line endings are accepted
        m.send_raw(b'{"jsonrpc":"2.0","id":77,"method":"ping"}\r\n')
        assert m.recv() == {"jsonrpc": "2.0", "id": 77, "result": {}}
        # A batch: one reply array, notifications in it unanswered
        m.send([{"jsonrpc": "2.0", "id": 1, "method": "ping"},
                {"jsonrpc": "2.0", "method": "notifications/initialized"},
                {"jsonrpc": "2.0", "id": 2, "method": "nope"}])
        r = m.recv()
        assert isinstance(r, list) and [x["id"] for x in r] == [1, 2], r
        assert r[1]["error"]["code"] == -32601, r
        # A line at the limit is read; one byte more is refused and skipped whole.
        limit = 1 << 20
        pad = json.dumps({"jsonrpc": "2.0", "id": 501, "method": "ping", "params": {"p": ""}})
        line = pad.replace('"p": ""', '"p": "%s"' % ("x" * (limit - len(pad))))
        assert len(line) == limit
        m.send_raw(line.encode() + b"\n")
        assert m.recv()["id"] == 501
        line = line.replace('"p": "', '"p": "x', 1)
        m.send_raw(line.encode() + b"\n")
        r = m.recv()
        assert r["id"] is None and r["error"]["code"] == -32600, r
        assert "1 MiB" in r["error"]["message"], r
        m.send_raw(b"x" * (3 * limit) + b"\n")  # far over, in many reads
        assert m.recv()["error"]["code"] == -32600
        assert m.request("ping")["result"] == {}
        # A last message without its newline is still answered at end of input.
        m.send_raw(b'{"jsonrpc":"2.0","id":999,"method":"ping"}')
        m.proc.stdin.close()
        assert m.recv()["id"] == 999
        assert m.close() == 0, m.err()


NODE_CLIENT = r"""
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const [bin, server, token] = process.argv.slice(2);
const transport = new StdioClientTransport({
  command: bin, args: ["mcp"], stderr: "pipe",
  env: { PATH: process.env.PATH, DIVERGE_SERVER: server, DIVERGE_API_TOKEN: token },
});
const client = new Client({ name: "diverge-interop", version: "1.0.0" });
await client.connect(transport);
const out = { version: client.getServerVersion(), caps: client.getServerCapabilities() };
out.tools = (await client.listTools()).tools.map((t) => t.name).sort();
const call = (name, args) => client.callTool({ name, arguments: args });
out.create = await call("diverge_create_task",
  { name: "sdk-task", objective: "from the MCP SDK", budgetUSD: "2.50" });
out.status = await call("diverge_task_status", { name: "sdk-task" });
out.guide = await call("diverge_guide_task", { name: "sdk-task", guidance: "try harder" });
out.pause = await call("diverge_pause_task", { name: "sdk-task" });
out.resume = await call("diverge_resume_task", { name: "sdk-task", budget: "+1.25" });
out.list = await call("diverge_list_tasks", {});
out.missing = await call("diverge_task_status", { name: "no-such-task" });
await client.ping();
await client.close();
console.log(JSON.stringify(out));
"""


def test_official_mcp_sdk_client():
    modules = npm_pin.install(*npm_pin.MCP_SDK)
    # ESM resolves packages from the script's folder upwards: put it next to node_modules.
    script = npm_pin.write_file(os.path.join(os.path.dirname(modules), "diverge_mcp_client.mjs"),
                                NODE_CLIENT)
    with Server(ARGS) as srv:
        r = subprocess.run(["node", script, DIVERGE_BIN, srv.url, srv.token],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, (r.stdout, r.stderr)
        out = json.loads(r.stdout.strip().splitlines()[-1])
        assert out["version"]["name"] == "diverge", out
        assert out["caps"].get("tools") is not None, out
        assert set(out["tools"]) == TOOLS, out
        for step in ("create", "status", "guide", "pause", "resume", "list"):
            assert out[step].get("isError") is False, (step, out[step])
            assert out[step]["content"][0]["type"] == "text", out[step]
        assert out["create"]["structuredContent"]["budgetUSD"] == "2.50", out
        assert out["guide"]["structuredContent"]["guidance"] == "try harder", out
        assert out["resume"]["structuredContent"]["budgetUSD"] == "3.75", out
        assert [t["name"] for t in out["list"]["structuredContent"]["tasks"]] == ["sdk-task"]
        assert out["missing"]["isError"] is True, out
        t = get(srv, "sdk-task")
        assert t["spec"]["budgetUSD"] == "3.75" and t["spec"]["suspended"] is False, t
        assert t["metadata"]["annotations"]["divergedev.com/guidance"] == "try harder", t


if __name__ == "__main__":
    run_tests([test_initialize_negotiates_the_version, test_tools_list_has_the_schemas,
               test_every_tool_against_the_server, test_settings_like_diverge_task,
               test_failures_are_tool_results, test_delete_task,
               test_protocol_errors_and_notifications, test_official_mcp_sdk_client])
