# SPDX-License-Identifier: Apache-2.0
"""An agent ends its own task (SPEC §14): `POST /api/v1/agenttask/complete` with the task
token and `{"result": "succeeded"|"failed", "message": …}` → 200, the task Completed or
Failed with reason AgentReported and the message, its token revoked; every refusal (no or
bad token, bad body, a task that is not Active) changes nothing; a retry of a completion
that went through answers again with "duplicate"; an agent inside a sandbox (process
provider) ends its task through its meter socket and the sandbox is stopped."""
import json
import os
import shutil

from harness import API, Server, run_tests, task_obj
from sandbox_helpers import FAKE_RUNNER, bare_repo, create, proc_state, task, wait_until

NS = API + "/namespaces/default/agenttasks"
COMPLETE = "/api/v1/agenttask/complete"
METER = "/api/v1/agenttask/meter"
ARGS = ["--sandbox-provider", "none"]


def get(srv, name):
    st, _, b = srv.request("GET", NS + "/" + name)
    assert st == 200, b
    return b


def wait_phase(srv, name, phase):
    return wait_until(lambda: (lambda b: b if b["status"]["phase"] == phase else None)(
        get(srv, name)), what="%s %s" % (name, phase))


def start_task(srv, name, **spec):
    st, _, b = srv.request("POST", NS, task_obj(name, **spec))
    assert st == 201, b
    wait_phase(srv, name, "Active")
    st, _, tok = srv.request("GET", NS + "/" + name + "/token")
    assert st == 200, tok
    return tok.strip()


def complete(srv, token, body):
    h = {"Authorization": "Bearer " + token} if token is not None else {}
    if not isinstance(body, (bytes, str)):
        body = json.dumps(body)
    return srv.request("POST", COMPLETE, body, headers=h, auth=False)


def test_succeeded_completes_and_revokes():
    with Server(ARGS) as srv:
        tok = start_task(srv, "ext-ok", budgetUSD="5.00")
        st, _, b = srv.request("POST", METER, json.dumps({"requestId": "r1", "tokensUsed": 10,
                                                           "costUSD": "0.01"}),
                               headers={"Authorization": "Bearer " + tok}, auth=False)
        assert st == 200, b
        st, h, b = complete(srv, tok, {"result": "succeeded", "message": "pushed fix/abc"})
        assert st == 200 and h["content-type"].startswith("application/json"), (st, b)
        assert b == {"phase": "Completed", "reason": "AgentReported",
                     "message": "pushed fix/abc"}, b
        task_ = get(srv, "ext-ok")
        s = task_["status"]
        assert s["phase"] == "Completed" and s["reason"] == "AgentReported", s
        assert s["message"] == "pushed fix/abc" and s["completionTime"], s
        assert s["costUSD"] == "0.01" and s["tokensConsumed"] == 10, s  # spend kept
        # the token is revoked: no more metering, no token to read
        st, _, _ = srv.request("GET", NS + "/ext-ok/token")
        assert st == 404
        st, _, b = srv.request("POST", METER, json.dumps({"requestId": "r2"}),
                               headers={"Authorization": "Bearer " + tok}, auth=False)
        assert st == 401, b
        # a retry of the same completion (its answer lost) is answered again, unchanged
        st, _, b = complete(srv, tok, {"result": "succeeded", "message": "other text"})
        assert st == 200 and b["duplicate"] is True and b["phase"] == "Completed", b
        assert b["message"] == "pushed fix/abc", b
        # ... but the token cannot turn it around
        st, _, b = complete(srv, tok, {"result": "failed"})
        assert st == 401 and b["reason"] == "Unauthorized", b
        assert get(srv, "ext-ok")["status"]["phase"] == "Completed"
        assert get(srv, "ext-ok")["metadata"]["resourceVersion"] == \
            task_["metadata"]["resourceVersion"]


def test_failed_and_message_optional():
    with Server(ARGS) as srv:
        tok = start_task(srv, "ext-fail")
        st, _, b = complete(srv, tok, {"result": "failed"})
        assert st == 200 and b["phase"] == "Failed" and b["reason"] == "AgentReported", b
        s = get(srv, "ext-fail")["status"]
        assert s["phase"] == "Failed" and s["reason"] == "AgentReported", s
        assert s["message"] == "" and s["completionTime"], s


def test_refusals_change_nothing():
    with Server(ARGS) as srv:
        tok = start_task(srv, "ext-no")
        other = start_task(srv, "ext-other")
        rv = get(srv, "ext-no")["metadata"]["resourceVersion"]
        cases = [
            (None, {"result": "succeeded"}, 401),
            ("garbage", {"result": "succeeded"}, 401),
            (tok[:-4] + "AAAA", {"result": "succeeded"}, 401),
            (tok, "not json", 400),
            (tok, [], 400),
            (tok, {}, 400),
            (tok, {"result": "done"}, 400),
            (tok, {"result": True}, 400),
            (tok, {"result": "succeeded", "message": 5}, 400),
            (tok, {"result": "succeeded", "message": "x" * 4097}, 400),
            (tok, {"result": "succeeded", "message": "bell\u0007"}, 400),
            (tok, '{"result": "failed", "result": "succeeded"}', 400),
        ]
        for token, body, want in cases:
            st, _, b = complete(srv, token, body)
            assert st == want, (token and token[:8], body, st, b)
            assert b["reason"] == ("Unauthorized" if want == 401 else "BadRequest"), b
            assert b["error"], b
        b = get(srv, "ext-no")
        assert b["status"]["phase"] == "Active" and b["metadata"]["resourceVersion"] == rv, b
        # wrong method
        st, _, _ = srv.request("GET", COMPLETE, auth=False)
        assert st == 405
        # a multi-line message with tabs is fine, and only the token's own task ends
        st, _, b = complete(srv, tok, {"result": "succeeded", "message": "a\n\tb"})
        assert st == 200 and b["message"] == "a\n\tb", b
        assert get(srv, "ext-other")["status"]["phase"] == "Active"
        st, _, b = complete(srv, other, {"result": "succeeded"})
        assert st == 200, b


def test_paused_task_cannot_complete():
    with Server(ARGS) as srv:
        tok = start_task(srv, "ext-paused")
        st, _, b = srv.request("PATCH", NS + "/ext-paused", {"spec": {"suspended": True}},
                               headers={"Content-Type": "application/merge-patch+json"})
        assert st == 200, b
        wait_phase(srv, "ext-paused", "Paused")
        st, _, b = complete(srv, tok, {"result": "succeeded"})
        assert st == 401, b
        assert get(srv, "ext-paused")["status"]["phase"] == "Paused"


AGENT = ('sleep 300 & echo $! > sleep.pid; '
         'curl -sS --unix-socket "$DIVERGE_METER_SOCKET" '
         '-H "Authorization: Bearer $(cat "$DIVERGE_TOKEN_FILE")" '
         '-H "Content-Type: application/json" '
         '-d \'{"result":"succeeded","message":"done from the sandbox"}\' '
         'http://localhost/api/v1/agenttask/complete > answer.json; wait')


def test_agent_in_sandbox_completes_through_its_socket():
    """The agent ends its task while its runner would go on: the task is Completed with
    the agent's message and the sandbox is stopped (no 300 s wait). Only a runner exit 0
    pushes: an agent that reports success pushes its own work."""
    repo = bare_repo()
    try:
        with Server(["--sandbox-provider", "process", "--agent-cmd", AGENT],
                    env={"DIVERGE_RUNNER_PATH": FAKE_RUNNER}) as srv:
            create(srv, task("in-box", "file://" + repo))
            b = wait_until(lambda: (lambda x: x if x["status"]["phase"] in (
                "Completed", "Failed") else None)(get(srv, "in-box")), what="finished",
                timeout=60)
            s = b["status"]
            assert s["phase"] == "Completed" and s["reason"] == "AgentReported", s
            assert s["message"] == "done from the sandbox", s
            ws = os.path.join(srv.data_dir, "workspaces", "default", "in-box")
            # The answer reaches the agent unless the sandbox's stop (which the Completed
            # phase starts at once) killed curl first: when it arrived, it says Completed.
            with open(os.path.join(ws, "answer.json")) as f:
                answer = f.read()
            assert answer == "" or json.loads(answer)["phase"] == "Completed", answer

            # the agent's sleep, started before it completed, is gone with its sandbox
            with open(os.path.join(ws, "sleep.pid")) as f:
                pid = int(f.read())
            wait_until(lambda: proc_state(pid) in (None, "Z"), what="sandbox stopped",
                       timeout=30)
    finally:
        shutil.rmtree(os.path.dirname(repo), ignore_errors=True)


if __name__ == "__main__":
    run_tests([v for k, v in sorted(globals().items()) if k.startswith("test_")])
