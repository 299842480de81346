# SPDX-License-Identifier: Apache-2.0
"""The agent SDKs (sdk/python `diverge_sdk`, sdk/node `@divergedev/sdk`) and the two
examples against the real `diverge serve --sandbox-provider none` (SPEC §7, §9): exact
totals, idempotent retries with one requestId, token file re-read, 401/403/429, retry
after dropped connections, 503s and a refused connect, and HTTP over a unix socket (a
stdlib front end forwards to the server, which has no unix listener yet); the Node
type declarations checked by TypeScript (npm, pinned)."""
import decimal
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from decimal import Decimal

import npm_pin
from harness import SOURCE_DIR, Server, run_tests
from sdk_helpers import (COMPLETE, METER, Env, FrontEnd, current_token, set_suspended,
                         start_task, totals, wait_phase)

sys.path.insert(0, os.path.join(SOURCE_DIR, "sdk", "python", "src"))
import diverge_sdk  # noqa: E402
from diverge_sdk import (LLMMeterError, TaskCompleteError, complete_task,  # noqa: E402
                         meter_llm_usage)
from diverge_sdk import meter as sdk_meter  # noqa: E402

ARGS = ["--sandbox-provider", "none"]
CLEAN = {"DIVERGE_MACAROON_TOKEN": None, "DIVERGE_TOKEN_FILE": None,
         "DIVERGE_METER_URL": None, "DIVERGE_METER_SOCKET": None,
         "DIVERGE_METER_MAX_ATTEMPTS": None}


def sdk_env(srv, token=None, **more):
    e = dict(CLEAN)
    e["DIVERGE_METER_URL"] = srv.url + METER
    if token is not None:
        e["DIVERGE_MACAROON_TOKEN"] = token
    e.update(more)
    return Env(**e)


def closed_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def expect_error(fn, **kw):
    try:
        fn(**kw)
    except LLMMeterError as e:
        return e
    raise AssertionError("no LLMMeterError")


# --- Python ----------------------------------------------------------------------------


def test_python_totals_are_exact_decimals():
    with Server(ARGS) as srv:
        tok = start_task(srv, "py-totals", budgetUSD="5.00", maxIterations=8)
        with sdk_env(srv, tok):
            r = meter_llm_usage("claude-3-7-sonnet", 1500, "0.0225", iteration=1)
            assert r.allowed is True and r.suspended is False, r
            assert isinstance(r.total_cost_usd, Decimal) and r.total_cost_usd == Decimal("0.0225")
            assert r.total_tokens_used == 1500 and r.iteration == 1 and r.max_iterations == 8, r
            uuid.UUID(r.request_id)  # generated: a uuid4
            assert r.guidance is None and r.preview_url is None
            # floats go out by their shortest repr: 0.1 + 0.2 is exactly 0.3 here
            meter_llm_usage("m", 1, 0.1, iteration=2)
            r = meter_llm_usage("m", 1, 0.2, iteration=2)
            assert r.total_cost_usd == Decimal("0.3225"), r
            r = meter_llm_usage("m", 0, Decimal("0.000001"), iteration=2)
            assert r.total_cost_usd == Decimal("0.322501"), r
            assert str(r.total_cost_usd) == "0.322501"
            # guidance set by a reviewer arrives with the next heartbeat
            srv.cli("task", "guide", "py-totals", "use the index")
            r = meter_llm_usage("m", 0, 0, iteration=2)
            assert r.guidance == "use the index", r
        assert diverge_sdk.__version__


def test_python_same_request_id_is_charged_once():
    with Server(ARGS) as srv:
        tok = start_task(srv, "py-idem")
        with sdk_env(srv, tok):
            a = meter_llm_usage("m", 100, "0.10", request_id="call-1", iteration=1)
            b = meter_llm_usage("m", 100, "0.10", request_id="call-1", iteration=1)
            assert a.total_cost_usd == b.total_cost_usd == Decimal("0.10"), (a, b)
            assert b.duplicate is True and a.duplicate is False
        assert totals(srv, "py-idem")[:2] == (100, "0.10")


def test_python_retries_reuse_the_request_id():
    with Server(ARGS) as srv:
        tok = start_task(srv, "py-retry")
        # two dropped connections, two 503s, then the real meter
        with FrontEnd(srv.url, drop=2, fail=2) as fe, sdk_env(srv, tok, DIVERGE_METER_URL=fe.url):
            r = meter_llm_usage("m", 10, "0.01", iteration=1, backoff=0.001)
            ids = fe.request_ids()
            assert len(ids) == 5 and len(set(ids)) == 1 and ids[0] == r.request_id, ids
            assert r.total_tokens_used == 10
        assert totals(srv, "py-retry")[:2] == (10, "0.01")
        # attempts are bounded: 3 tries, all 503 -> the last 503
        with FrontEnd(srv.url, fail=10) as fe, sdk_env(srv, tok, DIVERGE_METER_URL=fe.url):
            e = expect_error(meter_llm_usage, model="m", tokens_used=1, cost_usd=0,
                             max_attempts=3, backoff=0.001)
            assert e.status == 503 and len(fe.seen) == 3, (e, fe.seen)
            with Env(DIVERGE_METER_MAX_ATTEMPTS="2"):
                expect_error(meter_llm_usage, model="m", tokens_used=1, cost_usd=0,
                             backoff=0.001)
            assert len(fe.seen) == 5
        # a 4xx is never retried
        with FrontEnd(srv.url) as fe, sdk_env(srv, "bad-token", DIVERGE_METER_URL=fe.url):
            e = expect_error(meter_llm_usage, model="m", tokens_used=1, cost_usd=0,
                             backoff=0.001)
            assert e.is_unauthenticated and len(fe.seen) == 1, fe.seen


def test_python_retries_after_connection_refused():
    with Server(ARGS) as srv:
        tok = start_task(srv, "py-refused")
        port = closed_port()
        started, delays = [], []
        real_sleep = sdk_meter.time.sleep

        def sleep_then_listen(d):
            # Deterministic: nothing listens on PORT for the first try; the proxy is
            # started during the first backoff, so the second try connects.
            delays.append(d)
            if not started:
                started.append(FrontEnd(srv.url, port=port))

        sdk_meter.time.sleep = sleep_then_listen
        try:
            with sdk_env(srv, tok, DIVERGE_METER_URL="http://127.0.0.1:%d%s" % (port, METER)):
                r = meter_llm_usage("m", 7, "0.07", request_id="refused-1", backoff=0.5)
        finally:
            sdk_meter.time.sleep = real_sleep
            for fe in started:
                fe.close()
        assert r.total_tokens_used == 7 and len(delays) == 1 and 0.25 <= delays[0] <= 0.5
        assert started[0].request_ids() == ["refused-1"]
        # nothing listening at all: every attempt fails, status 0 "unreachable"
        with sdk_env(srv, tok, DIVERGE_METER_URL="http://127.0.0.1:%d" % closed_port()):
            e = expect_error(meter_llm_usage, model="m", tokens_used=1, cost_usd=0,
                             max_attempts=2, backoff=0.001)
            assert e.status == 0 and e.reason == "unreachable", e
            assert isinstance(e.__cause__, OSError)
        with Env(**CLEAN):
            e = expect_error(meter_llm_usage, model="m", tokens_used=1, cost_usd=0)
            assert e.status == 0 and e.reason == "not configured", e


def test_python_token_file_is_read_on_every_call():
    with Server(ARGS) as srv:
        tok1 = start_task(srv, "py-tokfile")
        d = tempfile.mkdtemp(prefix="diverge-sdk-")
        path = os.path.join(d, "token")
        try:
            with open(path, "w") as f:
                f.write(tok1 + "\n")
            with sdk_env(srv, None, DIVERGE_TOKEN_FILE=path):
                assert meter_llm_usage("m", 1, 0).total_tokens_used == 1
                # pause + resume rotates the token; the old one is revoked
                set_suspended(srv, "py-tokfile", True)
                wait_phase(srv, "py-tokfile", "Paused")
                set_suspended(srv, "py-tokfile", False)
                wait_phase(srv, "py-tokfile", "Active")
                tok2 = current_token(srv, "py-tokfile")
                assert tok2 != tok1
                e = expect_error(meter_llm_usage, model="m", tokens_used=1, cost_usd=0)
                assert e.is_unauthenticated and e.status == 401, e
                with open(path, "w") as f:
                    f.write(tok2 + "\n")
                assert meter_llm_usage("m", 1, 0).total_tokens_used == 2
                # DIVERGE_MACAROON_TOKEN wins over the file; empty means "use the file"
                with Env(DIVERGE_MACAROON_TOKEN=tok1):
                    assert expect_error(meter_llm_usage, model="m", tokens_used=1,
                                        cost_usd=0).is_unauthenticated
                with Env(DIVERGE_MACAROON_TOKEN=""):
                    assert meter_llm_usage("m", 1, 0).total_tokens_used == 3
                os.unlink(path)  # no token at all: the server's 401
                e = expect_error(meter_llm_usage, model="m", tokens_used=1, cost_usd=0)
                assert e.is_unauthenticated and not e.is_budget_exceeded, e
        finally:
            shutil.rmtree(d, ignore_errors=True)


def test_python_refusals():
    with Server(ARGS) as srv:
        tok = start_task(srv, "py-models", capabilities=["gpt-4o", "claude-*"])
        with sdk_env(srv, tok):
            e = expect_error(meter_llm_usage, model="gemini-2.5-pro", tokens_used=1, cost_usd=0)
            assert e.status == 403 and e.is_model_disallowed and not e.is_unauthenticated, e
            assert meter_llm_usage("claude-3-opus", 1, 0).allowed
            e = expect_error(meter_llm_usage, model="gpt-4o", tokens_used=1, cost_usd="-1")
            assert e.status == 400, e
        tok = start_task(srv, "py-budget", budgetUSD="0.05")
        with sdk_env(srv, tok):
            meter_llm_usage("m", 10, "0.04", iteration=1)
            e = expect_error(meter_llm_usage, model="m", tokens_used=10, cost_usd="0.02",
                             iteration=2)
            assert e.status == 429 and e.is_budget_exceeded, e
            assert not e.is_max_iterations_exceeded and e.reason == "budget exceeded"
            assert e.result.suspended is True and e.result.total_cost_usd == Decimal("0.06")
        b = wait_phase(srv, "py-budget", "Paused")
        assert b["status"]["reason"] == "BudgetExceeded", b
        tok = start_task(srv, "py-iters", maxIterations=1)
        with sdk_env(srv, tok):
            meter_llm_usage("m", 1, 0, iteration=1)
            e = expect_error(meter_llm_usage, model="m", tokens_used=1, cost_usd=0, iteration=2)
            assert e.is_max_iterations_exceeded and not e.is_budget_exceeded, e
        wait_phase(srv, "py-iters", "Paused")
        for bad in (float("nan"), "abc", True):
            try:
                meter_llm_usage("m", 1, bad)
                raise AssertionError("accepted %r" % (bad,))
            except (ValueError, TypeError):
                pass


def test_python_unix_socket():
    with Server(ARGS) as srv:
        tok = start_task(srv, "py-unix")
        d = tempfile.mkdtemp(prefix="diverge-sock-")
        sock = os.path.join(d, "meter.sock")
        try:
            with FrontEnd(srv.url, unix_path=sock, drop=1) as fe, \
                    sdk_env(srv, tok, DIVERGE_METER_SOCKET=sock,
                            DIVERGE_METER_URL="http://127.0.0.1:%d" % closed_port()):
                # the socket is preferred over the (dead) URL, and retried like TCP
                r = meter_llm_usage("m", 5, "0.005", backoff=0.001)
                assert r.total_tokens_used == 5 and r.total_cost_usd == Decimal("0.005")
                assert [s["path"] for s in fe.seen] == [METER, METER], fe.seen
                assert fe.seen[1]["headers"]["Authorization"] == "Bearer " + tok
        finally:
            shutil.rmtree(d, ignore_errors=True)


def test_python_complete_task():
    """complete_task ends the token's task (SPEC §14) over the meter URL (its last segment
    swapped), a bare base URL and the unix socket; a retry after a lost answer is answered
    duplicate; refusals raise TaskCompleteError without retrying."""
    with Server(ARGS) as srv:
        tok = start_task(srv, "py-done")
        with FrontEnd(srv.url, lose=1) as fe, sdk_env(srv, tok, DIVERGE_METER_URL=fe.url):
            r = complete_task("succeeded", "fixed in abc123", backoff=0.001)
            assert r.phase == "Completed" and r.reason == "AgentReported", r
            assert r.message == "fixed in abc123" and r.duplicate is True, r
            assert [x["path"] for x in fe.seen] == [COMPLETE, COMPLETE], fe.seen
            assert fe.seen[0]["body"] == {"result": "succeeded", "message": "fixed in abc123"}
        b = wait_phase(srv, "py-done", "Completed")
        assert b["status"]["reason"] == "AgentReported", b["status"]
        with sdk_env(srv, tok):
            e = None
            try:
                complete_task("failed")
            except TaskCompleteError as err:
                e = err
            assert e is not None and e.status == 401 and e.is_unauthenticated, e
            assert isinstance(e, LLMMeterError) and str(e).startswith("complete: "), str(e)
            for bad in ("done", None, True):
                try:
                    complete_task(bad)
                    raise AssertionError("accepted %r" % (bad,))
                except ValueError:
                    pass
        tok = start_task(srv, "py-fail")
        with sdk_env(srv, tok, DIVERGE_METER_URL=srv.url):  # bare base URL
            r = complete_task("failed", "tests never passed")
            assert r.phase == "Failed" and r.duplicate is False, r
        tok = start_task(srv, "py-bad")
        with sdk_env(srv, tok):
            try:
                complete_task("succeeded", "x" * 5000)
                raise AssertionError("accepted a long message")
            except TaskCompleteError as err:
                assert err.status == 400 and err.reason == "BadRequest", err
        d = tempfile.mkdtemp(prefix="diverge-sock-")
        sock = os.path.join(d, "meter.sock")
        try:
            with FrontEnd(srv.url, unix_path=sock) as fe, \
                    sdk_env(srv, tok, DIVERGE_METER_SOCKET=sock,
                            DIVERGE_METER_URL="http://127.0.0.1:%d" % closed_port()):
                r = complete_task("succeeded")
                assert r.phase == "Completed" and [x["path"] for x in fe.seen] == [COMPLETE]
        finally:
            shutil.rmtree(d, ignore_errors=True)


def test_package_metadata():
    """The distributions are what the docs say: diverge-sdk with no dependencies, and
    @divergedev/sdk as ESM whose exports name the declarations and the module."""
    py = os.path.join(SOURCE_DIR, "sdk", "python")
    try:
        import tomllib
    except ImportError:  # Python < 3.11: the name is enough
        tomllib = None
    if tomllib is not None:
        with open(os.path.join(py, "pyproject.toml"), "rb") as f:
            meta = tomllib.load(f)
        assert meta["project"]["name"] == "diverge-sdk", meta
        assert meta["project"]["dependencies"] == [], meta
        assert meta["tool"]["setuptools"]["packages"]["find"]["where"] == ["src"], meta
    assert os.path.exists(os.path.join(py, "src", "diverge_sdk", "py.typed"))
    assert diverge_sdk.meter_llm_usage is meter_llm_usage
    node = os.path.join(SOURCE_DIR, "sdk", "node")
    with open(os.path.join(node, "package.json")) as f:
        pkg = json.load(f)
    assert pkg["name"] == "@divergedev/sdk" and pkg["type"] == "module", pkg
    assert not pkg.get("dependencies"), pkg
    exp = pkg["exports"]["."]
    assert list(exp) == ["types", "default"], exp  # "types" must come first
    for rel in (exp["types"], exp["default"]):
        assert os.path.exists(os.path.join(node, rel)), rel


# --- Node ------------------------------------------------------------------------------

NODE_DRIVER = r"""
import { writeFileSync } from "node:fs";
import { meterLLMUsage, completeTask, LLMMeterError, TaskCompleteError } from "@divergedev/sdk";
const steps = JSON.parse(process.argv[2]);
const out = [];
for (const s of steps) {
  if (s.write) { writeFileSync(s.write[0], s.write[1]); continue; }
  for (const [k, v] of Object.entries(s.env ?? {})) {
    if (v === null) delete process.env[k]; else process.env[k] = v;
  }
  try {
    out.push({ ok: s.complete ? await completeTask(s.complete) : await meterLLMUsage(s.call) });
  } catch (e) {
    if (e instanceof TypeError && s.complete) { out.push({ typeError: e.message }); continue; }
    if (!(e instanceof LLMMeterError)) throw e;
    if (s.complete && !(e instanceof TaskCompleteError)) throw e;
    out.push({ err: { status: e.status, reason: e.reason, isBudgetExceeded: e.isBudgetExceeded,
      isMaxIterationsExceeded: e.isMaxIterationsExceeded, isModelDisallowed: e.isModelDisallowed,
      isUnauthenticated: e.isUnauthenticated, result: e.result, requestId: e.requestId,
      message: e.message } });
  }
}
console.log(JSON.stringify(out));
"""


class NodeProject:
    """A temp folder whose node_modules/@divergedev/sdk links to sdk/node."""

    def __enter__(self):
        npm_pin.ensure_node()
        self.dir = tempfile.mkdtemp(prefix="diverge-node-")
        scope = os.path.join(self.dir, "node_modules", "@divergedev")
        os.makedirs(scope)
        os.symlink(os.path.join(SOURCE_DIR, "sdk", "node"), os.path.join(scope, "sdk"))
        self.driver = os.path.join(self.dir, "driver.mjs")
        with open(self.driver, "w") as f:
            f.write(NODE_DRIVER)
        return self

    def run(self, steps, env):
        e = {k: v for k, v in os.environ.items() if not k.startswith("DIVERGE_")}
        e.update(env)
        r = subprocess.run(["node", self.driver, json.dumps(steps)], capture_output=True,
                           text=True, env=e, timeout=120)
        assert r.returncode == 0, (r.stdout, r.stderr)
        return json.loads(r.stdout.strip().splitlines()[-1])

    def __exit__(self, *exc):
        shutil.rmtree(self.dir, ignore_errors=True)


def test_node_sdk():
    with Server(ARGS) as srv, NodeProject() as node:
        tok = start_task(srv, "node-a", budgetUSD="0.05", maxIterations=8)
        url = srv.url + METER
        out = node.run([
            {"call": {"model": "m", "tokensUsed": 1500, "costUSD": "0.0225", "iteration": 1}},
            {"call": {"model": "m", "tokensUsed": 1, "costUSD": 0.0000010, "iteration": 1,
                      "requestId": "n-1"}},
            {"call": {"model": "m", "tokensUsed": 1, "costUSD": 0.000001, "iteration": 1,
                      "requestId": "n-1"}},
            {"call": {"model": "m", "tokensUsed": 1, "costUSD": "0.04", "iteration": 2}},
        ], {"DIVERGE_METER_URL": url, "DIVERGE_MACAROON_TOKEN": tok})
        a = out[0]["ok"]
        assert a["totalCostUSD"] == "0.0225" and a["totalTokensUsed"] == 1500, a
        assert a["allowed"] is True and a["maxIterations"] == 8 and a["guidance"] is None, a
        uuid.UUID(a["requestId"])
        assert out[1]["ok"]["totalCostUSD"] == "0.022501", out  # exact, as a string
        assert out[2]["ok"]["duplicate"] is True and out[2]["ok"]["totalTokensUsed"] == 1501
        err = out[3]["err"]
        assert err["status"] == 429 and err["isBudgetExceeded"] is True, err
        assert err["isMaxIterationsExceeded"] is False and err["reason"] == "budget exceeded"
        assert err["result"]["totalCostUSD"] == "0.062501", err
        b = wait_phase(srv, "node-a", "Paused")
        assert b["status"]["reason"] == "BudgetExceeded" and b["status"]["costUSD"] == "0.062501"

        tok = start_task(srv, "node-b", capabilities=["gpt-4o"], maxIterations=1)
        d = tempfile.mkdtemp(prefix="diverge-sdk-")
        path = os.path.join(d, "token")
        try:
            with open(path, "w") as f:
                f.write("junk\n")
            out = node.run([
                {"call": {"model": "gpt-4o", "tokensUsed": 1, "costUSD": 0}},   # junk token
                {"write": [path, tok + "\n"]},
                {"call": {"model": "gpt-4o", "tokensUsed": 1, "costUSD": 0}},   # re-read
                {"call": {"model": "claude-3", "tokensUsed": 1, "costUSD": 0}},
                {"call": {"model": "gpt-4o", "tokensUsed": 1, "costUSD": 0, "iteration": 2}},
            ], {"DIVERGE_METER_URL": srv.url, "DIVERGE_TOKEN_FILE": path})
        finally:
            shutil.rmtree(d, ignore_errors=True)
        assert out[0]["err"]["isUnauthenticated"] is True and out[0]["err"]["status"] == 401
        assert out[1]["ok"]["totalTokensUsed"] == 1, out
        assert out[2]["err"]["isModelDisallowed"] is True and out[2]["err"]["status"] == 403
        assert out[3]["err"]["isMaxIterationsExceeded"] is True, out
        wait_phase(srv, "node-b", "Paused")


def test_node_sdk_retries_and_unix_socket():
    with Server(ARGS) as srv, NodeProject() as node:
        tok = start_task(srv, "node-retry")
        with FrontEnd(srv.url, drop=2, fail=2) as fe:
            out = node.run([{"call": {"model": "m", "tokensUsed": 3, "costUSD": "0.03",
                                      "backoffMs": 1}}],
                           {"DIVERGE_METER_URL": fe.url, "DIVERGE_MACAROON_TOKEN": tok})
            ids = fe.request_ids()
            assert len(ids) == 5 and len(set(ids)) == 1 and ids[0] == out[0]["ok"]["requestId"]
        assert totals(srv, "node-retry")[:2] == (3, "0.03")
        with FrontEnd(srv.url, fail=10) as fe:
            out = node.run([
                {"call": {"model": "m", "tokensUsed": 1, "costUSD": 0, "backoffMs": 1,
                          "maxAttempts": 3}},
                {"env": {"DIVERGE_MACAROON_TOKEN": "bad"},
                 "call": {"model": "m", "tokensUsed": 1, "costUSD": 0, "backoffMs": 1}},
            ], {"DIVERGE_METER_URL": fe.url, "DIVERGE_MACAROON_TOKEN": tok,
                "DIVERGE_METER_MAX_ATTEMPTS": "4"})
            assert out[0]["err"]["status"] == 503 and out[1]["err"]["status"] == 503, out
            assert len(fe.seen) == 3 + 4, len(fe.seen)
        with FrontEnd(srv.url) as fe:  # a 4xx is not retried
            out = node.run([{"call": {"model": "m", "tokensUsed": 1, "costUSD": 0,
                                      "backoffMs": 1}}],
                           {"DIVERGE_METER_URL": fe.url, "DIVERGE_MACAROON_TOKEN": "bad"})
            assert out[0]["err"]["isUnauthenticated"] and len(fe.seen) == 1
        out = node.run([{"call": {"model": "m", "tokensUsed": 1, "costUSD": 0, "backoffMs": 1,
                                  "maxAttempts": 2}}],
                       {"DIVERGE_METER_URL": "http://127.0.0.1:%d" % closed_port(),
                        "DIVERGE_MACAROON_TOKEN": tok})
        assert out[0]["err"]["status"] == 0 and out[0]["err"]["reason"] == "unreachable", out
        d = tempfile.mkdtemp(prefix="diverge-sock-")
        sock = os.path.join(d, "meter.sock")
        try:
            with FrontEnd(srv.url, unix_path=sock, drop=1) as fe:
                out = node.run([{"call": {"model": "m", "tokensUsed": 2, "costUSD": "0.002",
                                          "backoffMs": 1}}],
                               {"DIVERGE_METER_SOCKET": sock, "DIVERGE_MACAROON_TOKEN": tok,
                                "DIVERGE_METER_URL": "http://127.0.0.1:%d" % closed_port()})
                assert out[0]["ok"]["totalTokensUsed"] == 5, out
                assert out[0]["ok"]["totalCostUSD"] == "0.032", out
                assert [s["path"] for s in fe.seen] == [METER, METER], fe.seen
        finally:
            shutil.rmtree(d, ignore_errors=True)


def test_node_complete_task():
    with Server(ARGS) as srv, NodeProject() as node:
        tok = start_task(srv, "node-done")
        with FrontEnd(srv.url, lose=1) as fe:
            out = node.run([
                {"complete": {"result": "succeeded", "message": "all green", "backoffMs": 1}},
                {"complete": {"result": "failed", "backoffMs": 1}},
                {"complete": {"result": "maybe"}},
            ], {"DIVERGE_METER_URL": fe.url, "DIVERGE_MACAROON_TOKEN": tok})
            assert [x["path"] for x in fe.seen] == [COMPLETE, COMPLETE, COMPLETE], fe.seen
        assert out[0]["ok"] == {"phase": "Completed", "reason": "AgentReported",
                                "message": "all green", "duplicate": True}, out
        assert out[1]["err"]["status"] == 401 and out[1]["err"]["isUnauthenticated"], out
        assert out[1]["err"]["message"].startswith("complete: "), out
        assert "typeError" in out[2], out
        b = wait_phase(srv, "node-done", "Completed")
        assert b["status"]["message"] == "all green", b["status"]
        tok = start_task(srv, "node-fail")
        d = tempfile.mkdtemp(prefix="diverge-sock-")
        sock = os.path.join(d, "meter.sock")
        try:
            with FrontEnd(srv.url, unix_path=sock) as fe:
                out = node.run([{"complete": {"result": "failed", "message": "gave up"}}],
                               {"DIVERGE_METER_SOCKET": sock, "DIVERGE_MACAROON_TOKEN": tok})
                assert [x["path"] for x in fe.seen] == [COMPLETE], fe.seen
        finally:
            shutil.rmtree(d, ignore_errors=True)
        assert out[0]["ok"]["phase"] == "Failed" and out[0]["ok"]["duplicate"] is False, out
        b = wait_phase(srv, "node-fail", "Failed")
        assert b["status"]["reason"] == "AgentReported", b["status"]


TS_OK = r"""
import { meterLLMUsage, completeTask, LLMMeterError, METER_PATH, COMPLETE_PATH,
  type MeterResult, type CompleteResult } from "@divergedev/sdk";
const path: "/api/v1/agenttask/meter" = METER_PATH;
const done: "/api/v1/agenttask/complete" = COMPLETE_PATH;
async function finish(): Promise<boolean> {
  const r: CompleteResult = await completeTask({ result: "succeeded", message: done });
  return r.duplicate && r.phase === "Completed";
}
void finish();
async function step(): Promise<string | null> {
  try {
    const r: MeterResult = await meterLLMUsage({ model: "m", tokensUsed: 1, costUSD: "0.01" });
    const cost: string = r.totalCostUSD;
    return r.guidance ?? cost + path;
  } catch (e) {
    if (e instanceof LLMMeterError && (e.isBudgetExceeded || e.isMaxIterationsExceeded)) {
      const s: number = e.status;
      return e.reason + s;
    }
    throw e;
  }
}
void step();
"""
TS_BAD = r"""
import { meterLLMUsage } from "@divergedev/sdk";
const r = await meterLLMUsage({ model: "m", tokensUsed: "1", costUSD: 0 });
const cost: number = r.totalCostUSD;
await completeTask({ result: "ok" });
"""


def test_node_type_declarations():
    """index.d.ts is found through package.json "exports" (types condition) and types
    the API: a correct program compiles under --strict, a wrong one does not."""
    modules = npm_pin.install(*npm_pin.TYPESCRIPT)
    tsc = os.path.join(modules, "typescript", "bin", "tsc")
    with NodeProject() as node:
        with open(os.path.join(node.dir, "package.json"), "w") as f:
            json.dump({"type": "module"}, f)
        opts = ["--strict", "--noEmit", "--module", "nodenext", "--moduleResolution",
                "nodenext", "--target", "es2022"]
        for name, text in (("ok.ts", TS_OK), ("bad.ts", TS_BAD)):
            with open(os.path.join(node.dir, name), "w") as f:
                f.write(text)
        r = subprocess.run(["node", tsc] + opts + ["ok.ts"], cwd=node.dir,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, (r.stdout, r.stderr)
        r = subprocess.run(["node", tsc] + opts + ["bad.ts"], cwd=node.dir,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode != 0, r.stdout
        # every mistake found: tokensUsed (line 3), totalCostUSD (line 4) and the result
        # of completeTask (line 5) are typed
        assert "bad.ts(3," in r.stdout and "bad.ts(4," in r.stdout, r.stdout
        assert "bad.ts(5," in r.stdout, r.stdout


# --- the examples, as written ----------------------------------------------------------


def test_readme_metering_blocks():
    """The README's "Metering from your agent" blocks, word for word (readme_walk.py: a
    fresh copy of examples/ and sdk/, `diverge` on PATH, its own server and port): the
    Python line with PYTHONPATH and the Node line with its `npm install --no-save` both
    meter, and npm leaves nothing but node_modules/ (git-ignored) behind."""
    import readme_walk

    npm_pin.ensure_node()
    blocks = [b for b in readme_walk.shell_blocks()
              if b.section.startswith("Metering from your agent")]
    assert len(blocks) == 2 and not any(b.skip for b in blocks), blocks
    with readme_walk.Walk() as walk:
        before = set(os.listdir(walk.dir))
        out = "".join(walk.run(b) for b in blocks)
        walk.stop()
        assert "metered: 1500 tokens, 0.0225 USD in total" in out, out
        assert "metered: 3000 tokens, 0.045 USD in total" in out, out
        added = set(os.listdir(walk.dir)) - before
        # var/ (the data dir); nothing of npm but node_modules/
        assert added == {"var", "node_modules"}, added
        assert "node_modules" in added
    with open(os.path.join(SOURCE_DIR, ".gitignore")) as f:
        assert "node_modules/" in f.read().split()


def test_examples_run_as_written():
    examples = os.path.join(SOURCE_DIR, "examples")
    with Server(ARGS) as srv, NodeProject() as node:
        shutil.copy(os.path.join(examples, "agent.mjs"), node.dir)
        py_env = {k: v for k, v in os.environ.items() if not k.startswith("DIVERGE_")}
        py_env["PYTHONPATH"] = os.path.join(SOURCE_DIR, "sdk", "python", "src")

        def run(cmd, tok, *args):
            e = dict(py_env, DIVERGE_METER_URL=srv.url + METER, DIVERGE_MACAROON_TOKEN=tok)
            return subprocess.run(cmd + list(args), capture_output=True, text=True, env=e,
                                  timeout=120)

        for lang, cmd in (("py", [sys.executable, os.path.join(examples, "agent.py")]),
                          ("js", ["node", os.path.join(node.dir, "agent.mjs")])):
            tok = start_task(srv, "ex-" + lang, budgetUSD="0.03",
                             capabilities=["claude-*"])
            srv.cli("task", "guide", "ex-" + lang, "check the cache first")
            r = run(cmd, tok)
            assert r.returncode == 0, (lang, r.stdout, r.stderr)
            assert "1500 tokens, 0.0225 USD" in r.stdout, (lang, r.stdout)
            assert "guidance: check the cache first" in r.stdout, (lang, r.stdout)
            r = run(cmd, tok, "gpt-4o")
            assert r.returncode == 3 and "metering failed" in r.stderr, (lang, r.stdout, r.stderr)
            r = run(cmd, tok, "claude-3-opus", "100", "0.01")  # 0.0325 > 0.03
            assert r.returncode == 0 and "the task is paused" in r.stdout, (lang, r.stdout,
                                                                           r.stderr)
            wait_phase(srv, "ex-" + lang, "Paused")
            r = run(cmd, tok)  # revoked now: another error, non-zero
            assert r.returncode == 1 and "metering failed" in r.stderr, (lang, r.stdout,
                                                                         r.stderr)


if __name__ == "__main__":
    decimal.getcontext().prec = 40
    run_tests([test_python_totals_are_exact_decimals, test_python_same_request_id_is_charged_once,
               test_python_retries_reuse_the_request_id,
               test_python_retries_after_connection_refused,
               test_python_token_file_is_read_on_every_call, test_python_refusals,
               test_python_unix_socket, test_python_complete_task, test_package_metadata,
               test_node_sdk, test_node_sdk_retries_and_unix_socket, test_node_complete_task,
               test_node_type_declarations, test_examples_run_as_written,
               test_readme_metering_blocks])
