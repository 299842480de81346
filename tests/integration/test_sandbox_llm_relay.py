# SPDX-License-Identifier: Apache-2.0
"""The runner's LLM relay (SPEC §13, last bullet) with the real diverge-agent-runner and
an agent that calls it as agent CLIs do, with the placeholder keys of its environment.

- Pod path (DIVERGE_METER_URL, the runner outside any sandbox): a fake server on
  127.0.0.1 stands in for the LLM routes and records what arrives: every key header and
  Gemini's ?key= carry the token from the token file, never the placeholder; the token
  file rewritten during the first call puts the new token on the next ones; a chunked
  request body arrives whole; a streamed answer reaches the agent event by event (the
  fake sends the rest only after the agent, through the relay, said it has the first
  event); an upstream 529 comes back unchanged; paths outside /api/v1/llm/, garbage and
  an oversized head are refused by the relay, which keeps serving.
- Local socket path (bubblewrap sandbox, the real server): the call reaches the server
  over the task's own socket (the server's own 404 "no such path" until the gateway's
  routes exist, never the relay's), and the agent's variables are SPEC's.
- A frozen agent and a rotated token (local sandbox, the real gateway, a fake OpenAI
  upstream): the agent makes a call, then blocks; the task is paused (every process
  frozen, token revoked) and resumed (thawed, a fresh token); the same agent process then
  calls again through the relay with the placeholder it always had, and the call is
  charged to the task; the old token, shown to the gateway directly, is refused.
Skipped when bubblewrap cannot run here."""
import http.server
import json
import os
import shutil
import sys
import tempfile
import threading
from decimal import Decimal

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fakes"))

from fake_llm import FakeLLM  # noqa: E402
from llm_helpers import wait_charges  # noqa: E402
from harness import API, Server, run_tests  # noqa: E402
from runner_helpers import METER, make_bare_repo, run_runner, runner_env  # noqa: E402
from sandbox_helpers import (create, get, git, patch, task, task_log, wait_log,  # noqa: E402
                             wait_phase)
from test_agent_claude_code import runner_path  # noqa: E402
from test_sandbox_local import usable  # noqa: E402

AGENT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "llm_relay_agent.py")
TOKEN1 = "tok-one.MDAyNGxvY2F0aW9u"
TOKEN2 = "tok-two.ZGl2ZXJnZS10ZXN0"
PLACEHOLDER = "diverge-sandbox"


class FakeServer:
    """The server's public URL: the meter (200) and /api/v1/llm/* recorded."""

    def __init__(self, token_file):
        self.calls = []
        self.meter = []
        self.acked = threading.Event()
        self.stream_acked = None
        fake = self

        class H(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def body(self):
                if self.headers.get("Transfer-Encoding"):
                    return b"<chunked: the relay should have sent a length>"
                return self.rfile.read(int(self.headers.get("Content-Length", "0")))

            def send(self, status, data, ctype="application/json"):
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/api/v1/llm/ack":
                    fake.acked.set()
                    return self.send(200, b'{"ack":true}')
                self.send(404, b"{}")

            def do_POST(self):
                body = self.body()
                if self.path == METER:
                    fake.meter.append(body)
                    return self.send(200, b'{"allowed":true}')
                fake.calls.append((self.path, {k.lower(): v for k, v in self.headers.items()},
                                   body))
                if len(fake.calls) == 1:
                    # A resume rotated the token while the agent was running.
                    with open(token_file, "w") as f:
                        f.write(TOKEN2 + "\n")
                if b'"overloaded"' in body:
                    return self.send(529, b'{"type":"error","error":{"type":"overloaded_error"}}')
                if b'"stream":true' in body:
                    return self.stream()
                self.send(200, json.dumps({"echo": body.decode()}).encode())

            def stream(self):
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()  # HTTP/1.0: the body ends when the connection closes
                self.wfile.write(b"event: response.created\ndata: {\"n\":1}\n\n")
                self.wfile.flush()
                fake.stream_acked = fake.acked.wait(30)
                self.wfile.write(b"event: response.completed\ndata: {\"n\":2}\n\n")
                self.wfile.flush()

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.srv.server_address[1]
        threading.Thread(target=self.srv.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


def check_env(env):
    url = env["DIVERGE_LLM_URL"]
    assert url.startswith("http://127.0.0.1:") and url.endswith("/api/v1/llm"), env
    assert env["ANTHROPIC_BASE_URL"] == url + "/anthropic", env
    assert env["OPENAI_BASE_URL"] == url + "/openai/v1", env
    assert env["GOOGLE_GEMINI_BASE_URL"] == url + "/gemini", env
    for k in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "GEMINI_API_KEY"):
        assert env[k] == PLACEHOLDER, env


def test_pod_path_tokens_rotation_streaming():
    tmp = tempfile.mkdtemp(prefix="diverge-llm-relay-")
    token_file = os.path.join(tmp, "token")
    with open(token_file, "w") as f:
        f.write(TOKEN1 + "\n")
    fake = FakeServer(token_file)
    out = os.path.join(tmp, "out.json")
    try:
        repo = make_bare_repo(tmp)
        env = runner_env(tmp, "llm", repo,
                         DIVERGE_METER_URL="http://127.0.0.1:%d%s" % (fake.port, METER),
                         DIVERGE_TOKEN_FILE=token_file, DIVERGE_MAX_ITERATIONS=1,
                         DIVERGE_AGENT_CMD="python3 %s pod" % AGENT,
                         DIVERGE_VERIFY_CMD="true", LLM_TEST_OUT=out,
                         ANTHROPIC_API_KEY="sk-real-key-must-not-reach-the-agent")
        r = run_runner(env)
        assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
        assert "llm relay: 127.0.0.1:" in r.stdout, r.stdout
        with open(out) as f:
            got = json.load(f)
        check_env(got["env"])
        # What reached the server: the token on every call, the rotated one after the
        # rotation, never the placeholder; bodies and provider headers unchanged.
        paths = [c[0] for c in fake.calls]
        assert paths[:3] == [
            "/api/v1/llm/anthropic/v1/messages?beta=true",
            "/api/v1/llm/openai/v1/responses",
            "/api/v1/llm/gemini/v1beta/models/gemini-test:generateContent?key=" + TOKEN2,
        ], paths
        (_, h1, b1), (_, h2, _), (_, h3, _) = fake.calls[:3]
        assert h1["x-api-key"] == TOKEN1, h1
        assert h1["anthropic-version"] == "2023-06-01", h1
        assert b1 == b'{"model":"claude-test","max_tokens":5}', b1
        assert h2["authorization"] == "Bearer " + TOKEN2, h2
        assert h3["x-goog-api-key"] == TOKEN2, h3
        for path, headers, _ in fake.calls:
            assert PLACEHOLDER not in path, path
            assert all(PLACEHOLDER not in v for v in headers.values()), headers
        assert got["anthropic"][0] == 200 and json.loads(got["anthropic"][1])["echo"], got
        assert got["openai"][0] == 200 and got["gemini"][0] == 200, got
        # The chunked request body arrived whole, with a length.
        stream_call = [c for c in fake.calls if c[0] == "/api/v1/llm/openai/v1/responses"][1]
        assert stream_call[2] == b'{"model":"gpt-test","stream":true,"input":"hi"}', stream_call
        # Streamed: the agent had the first event while the rest did not exist yet.
        s = got["stream"]
        assert s["status"] == 200 and s["type"] == "text/event-stream", s
        assert s["first"] == 'event: response.created\ndata: {"n":1}\n\n', s
        assert s["ack"][0] == 200, s
        assert fake.stream_acked is True, "the first event was held back until the end"
        assert s["rest"] == 'event: response.completed\ndata: {"n":2}\n\n', s
        # An upstream error passes through unchanged.
        assert got["overloaded"] == [529, '{"type":"error","error":{"type":"overloaded_error"}}']
        # Outside /api/v1/llm/ nothing is relayed; hostile bytes get an answer, and the
        # relay goes on serving.
        assert got["meter"][0] == 404 and "diverge relay" in got["meter"][1], got["meter"]
        assert all(b"agent-smuggle" not in m for m in fake.meter)
        assert got["garbage"].startswith("HTTP/1.1 400 "), got["garbage"]
        assert got["huge"].startswith("HTTP/1.1 431 "), got["huge"]
        assert got["dotdot"].startswith("HTTP/1.1 404 "), got["dotdot"]
        assert got["after"][0] == 200, got["after"]
        assert TOKEN1 not in r.stdout + r.stderr and TOKEN2 not in r.stdout + r.stderr
    finally:
        fake.close()
        shutil.rmtree(tmp, ignore_errors=True)


def socket_repo():
    """A bare repository whose main holds the agent script; returns (top dir, bare)."""
    top = tempfile.mkdtemp(prefix="diverge-llm-sock-")
    os.chmod(top, 0o755)
    bare = os.path.join(top, "repo.git")
    work = os.path.join(top, "work")
    git("init", "-q", "--bare", "-b", "main", bare)
    git("init", "-q", "-b", "main", work)
    shutil.copy(AGENT, os.path.join(work, "agent.py"))
    git("add", "agent.py", cwd=work)
    git("commit", "-q", "-m", "agent", cwd=work)
    git("push", "-q", bare, "main", cwd=work)
    return top, bare


def test_local_sandbox_reaches_the_task_socket():
    why = usable()
    if why:
        print("SKIP: " + why)
        return
    top, bare = socket_repo()
    data = tempfile.mkdtemp(prefix="diverge-test-")
    srv = Server(args=["--sandbox-provider", "local", "--agent-cmd", "python3 agent.py socket"],
                 data_dir=data)
    try:
        with srv:
            create(srv, task("llmsock", "file://" + bare))
            body = wait_phase(srv, "llmsock", ("Completed", "Failed"), timeout=90)
            log = task_log(srv, "llmsock")
            assert body["status"]["phase"] == "Completed", (body["status"], log)
            lines = [l.split("llmprobe ", 1)[1] for l in log.splitlines() if "llmprobe " in l]
            assert len(lines) == 1, log
            got = json.loads(lines[0])
            check_env(got["env"])
            # Inside its own network namespace the relay has SPEC's port.
            assert got["env"]["DIVERGE_LLM_URL"] == "http://127.0.0.1:3129/api/v1/llm", got
            # The call crossed the task's socket to the server: its answer, not the
            # relay's (404 "no such path" while the gateway's routes are not there).
            status, text = got["anthropic"]
            assert "diverge relay" not in text and status != 502, got
            if status == 404:
                assert "no such path" in text, got
            assert got["meter"][0] == 404 and "diverge relay" in got["meter"][1], got
            assert "llm relay: 127.0.0.1:3129 to the server's socket" in log, log
    finally:
        shutil.rmtree(top, ignore_errors=True)
        shutil.rmtree(data, ignore_errors=True)


SERVER_KEY = "sk-proj-SERVERKEY-0b7e52c9d13a"
PRICES = ('version: "1"\nmodels:\n  - match: "gpt-relay-*"\n    inputPerMTok: "1.00"\n'
          '    outputPerMTok: "10.00"\n    cacheWritePerMTok: "1.00"\n'
          '    cacheReadPerMTok: "0.10"\n    maxOutputTokens: 1000\n')


def token_of(srv, name):
    st, _, tok = srv.request("GET", API + "/namespaces/default/agenttasks/%s/token" % name)
    assert st == 200, (st, tok)
    return tok.strip()


def test_frozen_agent_calls_with_the_rotated_token():
    why = usable()
    runner = runner_path()
    if why is None and runner is None:
        why = "the runner is a sanitized build, which cannot run under the sandbox's seccomp " \
              "filter, and there is no plain build/diverge-agent-runner to use instead"
    if why:
        print("SKIP: " + why)
        return
    top, bare = socket_repo()
    data = tempfile.mkdtemp(prefix="diverge-test-")
    prices = os.path.join(top, "prices.yaml")
    with open(prices, "w") as f:
        f.write(PRICES)
    fake = FakeLLM().start()
    fake.usage = {"input": 100, "output": 50, "cache_write": 0, "cache_read": 0}  # 600 µ$
    srv = Server(args=["--sandbox-provider", "local", "--agent-cmd", "python3 agent.py frozen",
                       "--verify-cmd", "true", "--llm-upstream", "openai=" + fake.url,
                       "--llm-prices", prices],
                 env={"DIVERGE_OPENAI_API_KEY": SERVER_KEY, "DIVERGE_RUNNER_PATH": runner},
                 data_dir=data)
    name = "llmfrozen"
    try:
        with srv:
            create(srv, task(name, "file://" + bare, budgetUSD="1.00"))
            wait_phase(srv, name, "Active", timeout=60)
            tok1 = token_of(srv, name)
            wait_log(srv, name, "llmfrozen 1 ", timeout=60)
            assert "llmfrozen 1 200 " in task_log(srv, name), task_log(srv, name)
            assert len(fake.requests) == 1
            # Pause: every process frozen (the agent among them, blocked), token revoked.
            patch(srv, name, {"suspended": True})
            wait_phase(srv, name, "Paused")
            assert "[diverge] paused (every process frozen, token revoked)" in \
                task_log(srv, name), task_log(srv, name)
            # Resume: thawed, with a fresh token the agent never sees.
            patch(srv, name, {"suspended": False})
            wait_phase(srv, name, ("Active", "Completed", "Failed"))
            wait_log(srv, name, "[diverge] resumed (thawed, fresh token)")
            tok2 = token_of(srv, name)
            assert tok2 != tok1
            # The same agent process calls again.
            with open(os.path.join(data, "workspaces", "default", name, "go"), "w") as f:
                f.write("go\n")
            body = wait_phase(srv, name, ("Completed", "Failed"), timeout=60)
            log = task_log(srv, name)
            assert body["status"]["phase"] == "Completed", (body["status"], log)
            assert "llmfrozen 2 200 " in log, log
            # Both calls reached the upstream with the server's key, charged to the task:
            # the second after the thaw.
            assert len(fake.requests) == 2, fake.requests
            for r in fake.requests:
                assert r["headers"]["authorization"] == "Bearer " + SERVER_KEY, r["headers"]
                assert tok1 not in json.dumps(r) and tok2 not in json.dumps(r)
            line = "llm openai gpt-relay-1 input=100 output=50 cache_write=0 cache_read=0 " \
                "usd=0.0006"
            wait_charges(srv, name, 2)
            log = task_log(srv, name)
            assert log.count(line) == 2, log
            assert line in log[log.index("resumed (thawed, fresh token)"):], log
            # One agent process throughout: thawed, not started again.
            assert log.count("llmfrozen 1 ") == 1 and log.count("running the agent") == 1, log
            body = get(srv, name)
            st = body["status"]
            assert Decimal(st["costUSD"]) == Decimal("0.0012") and st["tokensConsumed"] == 300, st
            # The old token, shown to the gateway directly, is refused (and not charged).
            st, _, raw = srv.request(
                "POST", "/api/v1/llm/openai/v1/responses",
                b'{"model":"gpt-relay-1","input":"say hello","max_output_tokens":50}',
                headers={"Authorization": "Bearer " + tok1,
                         "Content-Type": "application/json"}, auth=False, raw=True)
            err = json.loads(raw)["error"]
            assert st == 401 and err["code"] == "invalid_api_key" and \
                err["message"] == "diverge: token revoked", (st, raw)
            assert len(fake.requests) == 2
            assert get(srv, name)["status"]["costUSD"] == body["status"]["costUSD"]
            assert tok1 not in log and tok2 not in log and SERVER_KEY not in log
    finally:
        fake.stop()
        shutil.rmtree(top, ignore_errors=True)
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    run_tests([test_pod_path_tokens_rotation_streaming, test_local_sandbox_reaches_the_task_socket,
               test_frozen_agent_calls_with_the_rotated_token])
