# SPDX-License-Identifier: Apache-2.0
"""Limits shown as enforced (SPEC §14): status.effectiveBudgetUSD / effectiveBudgetTokens /
effectiveMaxIterations are what the meter, the gateway and the runner apply (spec, else
the token's caveat, else the server default), set when the server decides them (the mint,
a charge, a spec change) and shown by `task status`, `task list`, MCP and Connect instead
of "-" where a limit exists; the meter stops a task without spec budgets at the shown
default; a task whose runner the server starts shows (and its runner gets) the server's
--default-max-iterations."""
import json
import os
import shutil
import subprocess

from harness import API, DIVERGE_BIN, Server, run_tests, task_obj
from sandbox_helpers import FAKE_RUNNER, bare_repo, create, task, task_log, wait_until

NS = API + "/namespaces/default/agenttasks"
METER = "/api/v1/agenttask/meter"
DEFAULTS = ["--default-budget-usd", "0.30", "--default-budget-tokens", "1234",
            "--default-max-iterations", "3"]


def get(srv, name):
    st, _, b = srv.request("GET", NS + "/" + name)
    assert st == 200, b
    return b


def wait_phase(srv, name, phase):
    return wait_until(lambda: (lambda b: b if b["status"]["phase"] == phase else None)(
        get(srv, name)), what="%s %s" % (name, phase))


def start(srv, name, **spec):
    st, _, b = srv.request("POST", NS, task_obj(name, **spec))
    assert st == 201, b
    b = wait_phase(srv, name, "Active")
    st, _, tok = srv.request("GET", NS + "/" + name + "/token")
    assert st == 200, tok
    return b, tok.strip()


def meter(srv, tok, rid, tokens, cost, iteration=1):
    return srv.request("POST", METER, json.dumps({"requestId": rid, "tokensUsed": tokens,
                                                   "costUSD": cost, "iteration": iteration}),
                       headers={"Authorization": "Bearer " + tok}, auth=False)


def cli(srv, *args):
    r = srv.cli(*args)
    assert r.returncode == 0, (r.stdout, r.stderr)
    return r.stdout


def test_server_defaults_are_shown_and_enforced():
    with Server(["--sandbox-provider", "none"] + DEFAULTS) as srv:
        b, tok = start(srv, "plain")
        s = b["status"]
        assert s["effectiveBudgetUSD"] == "0.30" and s["effectiveBudgetTokens"] == 1234, s
        # no runner under provider none and no spec.maxIterations: no iteration limit
        assert "effectiveMaxIterations" not in s, s
        out = cli(srv, "task", "status", "plain")
        assert "0.00/0.30" in out and "0/1234" in out, out
        out = cli(srv, "task", "list")
        line = [x for x in out.splitlines() if x.startswith("plain")][0]
        assert "0.30" in line and "0/1234" in line, out
        st, _, m = meter(srv, tok, "a", 100, "0.10")
        assert st == 200 and m["budgetUSD"] == 0.3 and m["budgetTokens"] == 1234, m
        # the meter stops it at the limit shown
        st, _, m = meter(srv, tok, "b", 100, "0.25")
        assert st == 429 and m["reason"] == "budget exceeded", m
        s = wait_phase(srv, "plain", "Paused")["status"]
        assert s["effectiveBudgetUSD"] == "0.30", s
        # a bump raises the spec from the effective value; the status follows at once
        r = srv.cli("task", "resume", "plain", "--budget", "+1.00")
        assert r.returncode == 0, r.stderr
        s = get(srv, "plain")["status"]
        assert s["effectiveBudgetUSD"] == "1.30", s
        assert get(srv, "plain")["spec"]["budgetUSD"] == "1.30"

        # spec values win, also over the defaults, and show as they are
        b, tok = start(srv, "specd", budgetUSD="2.00", budgetTokens=500, maxIterations=4)
        s = b["status"]
        assert (s["effectiveBudgetUSD"], s["effectiveBudgetTokens"],
                s["effectiveMaxIterations"]) == ("2.00", 500, 4), s
        out = cli(srv, "task", "status", "specd")
        assert "0.00/2.00" in out and "0/500" in out and "0/4" in out, out
        st, _, b = srv.request("PATCH", NS + "/specd", {"spec": {"budgetTokens": 900}},
                               headers={"Content-Type": "application/merge-patch+json"})
        assert st == 200 and b["status"]["effectiveBudgetTokens"] == 900, b


def test_mcp_and_connect_show_effective_limits():
    with Server(["--sandbox-provider", "none"] + DEFAULTS) as srv:
        start(srv, "viewed")
        msgs = [
            {"jsonrpc": "2.0", "id": 1, "method": "initialize",
             "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                        "clientInfo": {"name": "t", "version": "1"}}},
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
             "params": {"name": "diverge_task_status", "arguments": {"name": "viewed"}}},
            {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
             "params": {"name": "diverge_list_tasks", "arguments": {}}},
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith("DIVERGE_")}
        env.update({"DIVERGE_SERVER": srv.url, "DIVERGE_API_TOKEN": srv.token})
        p = subprocess.run([DIVERGE_BIN, "mcp"], input="".join(json.dumps(m) + "\n"
                                                               for m in msgs),
                           capture_output=True, text=True, env=env, timeout=60)
        answers = {m.get("id"): m for m in map(json.loads, p.stdout.splitlines())}
        res = answers[2]["result"]
        assert res["isError"] is False, res
        sc = res["structuredContent"]["task"] if "task" in res["structuredContent"] \
            else res["structuredContent"]
        assert sc["effectiveBudgetUSD"] == "0.30" and sc["effectiveBudgetTokens"] == 1234, sc
        text = res["content"][0]["text"]
        assert "tokens 0/1234" in text and "cost 0.00/0.30" in text, text
        text = answers[3]["result"]["content"][0]["text"]
        assert "0.30" in text and "0/1234" in text, text

        st, _, b = srv.request("POST", "/divergedev.agenttask.v1.AgentTaskService/GetTask",
                               {"name": "viewed"}, headers={"Connect-Protocol-Version": "1"})
        assert st == 200, b
        t = b["task"]
        assert t["effectiveBudgetUSD"] == "0.30" and t["effectiveBudgetTokens"] == "1234", t
        assert "effectiveMaxIterations" not in t, t  # 0: no limit applies (proto3 JSON)


def test_runner_gets_the_default_max_iterations():
    """A sandboxed task without spec.maxIterations runs at most --default-max-iterations
    iterations, and shows that limit."""
    repo = bare_repo()
    try:
        with Server(["--sandbox-provider", "process", "--agent-cmd",
                     "echo DIVERGE_MAX_ITERATIONS=$DIVERGE_MAX_ITERATIONS"] + DEFAULTS,
                    env={"DIVERGE_RUNNER_PATH": FAKE_RUNNER}) as srv:
            create(srv, task("sbx", "file://" + repo))
            b = wait_until(lambda: (lambda x: x if x["status"]["phase"] in (
                "Active", "Completed", "Failed") else None)(get(srv, "sbx")), what="started")
            assert b["status"]["effectiveMaxIterations"] == 3, b["status"]
            assert b["status"]["effectiveBudgetUSD"] == "0.30", b["status"]
            wait_until(lambda: "DIVERGE_MAX_ITERATIONS=3" in task_log(srv, "sbx"),
                       what="runner environment")
    finally:
        shutil.rmtree(os.path.dirname(repo), ignore_errors=True)


if __name__ == "__main__":
    run_tests([test_server_defaults_are_shown_and_enforced,
               test_mcp_and_connect_show_effective_limits,
               test_runner_gets_the_default_max_iterations])
