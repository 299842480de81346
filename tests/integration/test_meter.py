# SPDX-License-Identifier: Apache-2.0
"""Metering and the token lifecycle against the real `diverge serve --sandbox-provider
none` (SPEC §7, §8): every status code of the meter, idempotency, budgets, pause/resume
token rotation, attenuation, and a kill -9 in the middle of concurrent metering."""
import concurrent.futures
import http.client
import json
import os
import random
import sqlite3
import subprocess
import threading
import time

from harness import API, BUILD_DIR, DIVERGE_BIN, Server, run_tests, task_obj

NS = API + "/namespaces/default/agenttasks"
METER = "/api/v1/agenttask/meter"
TOKEN_TOOL = os.path.join(BUILD_DIR, "tests", "interop", "token_tool")
ARGS = ["--sandbox-provider", "none"]


def merge(srv, name, patch, sub=""):
    return srv.request("PATCH", NS + "/" + name + sub, patch,
                       headers={"Content-Type": "application/merge-patch+json"})


def wait_phase(srv, name, phase, timeout=10):
    deadline = time.time() + timeout
    while time.time() < deadline:
        st, _, b = srv.request("GET", NS + "/" + name)
        if st == 200 and b["status"]["phase"] == phase:
            return b
        time.sleep(0.02)
    raise AssertionError("task %s never reached %s: %s" % (name, phase, b))


def start_task(srv, name, **spec):
    st, _, b = srv.request("POST", NS, task_obj(name, **spec))
    assert st == 201, b
    wait_phase(srv, name, "Active")
    st, h, tok = srv.request("GET", NS + "/" + name + "/token")
    assert st == 200 and h["content-type"].startswith("text/plain"), (st, tok)
    return tok.strip()


def meter(srv, token, body, headers=None):
    h = {"Authorization": "Bearer " + token} if token is not None else {}
    h.update(headers or {})
    if not isinstance(body, (bytes, str)):
        body = json.dumps(body)
    return srv.request("POST", METER, body, headers=h, auth=False)


def call(rid, tokens=100, cost="0.01", iteration=1, model=None):
    b = {"requestId": rid, "iteration": iteration, "tokensUsed": tokens}
    if cost is not None:
        b["costUSD"] = json.loads(cost) if isinstance(cost, str) else cost
    if model is not None:
        b["model"] = model
    return b


def totals(srv, name):
    st, _, b = srv.request("GET", NS + "/" + name)
    return b["status"]["tokensConsumed"], b["status"]["costUSD"], b


def test_lifecycle_pause_resume_rotates_token():
    with Server(ARGS) as srv:
        tok1 = start_task(srv, "life", budgetUSD="5.00")
        st, _, b = meter(srv, tok1, call("a1"))
        assert st == 200 and b["allowed"] is True and b["suspended"] is False, b
        # The token file the sandbox would read holds the same token.
        with open(os.path.join(srv.data_dir, "tokens", "default", "life", "token")) as f:
            assert f.read() == tok1
        merge(srv, "life", {"spec": {"suspended": True}})
        b = wait_phase(srv, "life", "Paused")
        assert b["status"]["reason"] == "Suspended"
        st, _, _ = srv.request("GET", NS + "/life/token")
        assert st == 404
        r = srv.cli("task", "token", "life")
        assert r.returncode == 1 and "revoked" in r.stderr, r
        st, _, b = meter(srv, tok1, call("a2"))
        assert st == 401, b
        merge(srv, "life", {"spec": {"suspended": False}})
        wait_phase(srv, "life", "Active")
        st, _, tok2 = srv.request("GET", NS + "/life/token")
        tok2 = tok2.strip()
        assert tok2 != tok1
        assert meter(srv, tok1, call("a3"))[0] == 401  # the old token stays revoked
        st, _, b = meter(srv, tok2, call("a3"))
        assert st == 200 and b["totalTokensUsed"] == 200, b
        # Deleting the task revokes its token.
        srv.request("DELETE", NS + "/life")
        assert meter(srv, tok2, call("a4"))[0] == 401


def test_status_codes_in_order():
    with Server(ARGS) as srv:
        tok = start_task(srv, "codes", budgetUSD="1.00", capabilities=["claude-*", "gpt-4o"])
        ok = call("c1", model="claude-3-7-sonnet")
        # 401: missing, not bearer, malformed, tampered, duplicated header
        assert meter(srv, None, ok)[0] == 401
        assert meter(srv, tok, ok, headers={"Authorization": "Basic abc"})[0] == 401
        assert meter(srv, "not-a-token", ok)[0] == 401
        tampered = tok[:-3] + ("A" if tok[-3] != "A" else "B") + tok[-2:]
        assert meter(srv, tampered, ok)[0] == 401
        st, _, b = dup_auth(srv, tok, json.dumps(ok))
        assert st == 401, b
        # A token minted with another root key.
        other = subprocess.run([TOKEN_TOOL, "mint-task", "11" * 32, "codes", "default", "1", "",
                                "", "", "", "1.00", "0", ""], capture_output=True, text=True)
        assert other.returncode == 0 and other.stdout.strip(), other
        assert meter(srv, other.stdout.split()[0], ok)[0] == 401
        # 401 beats 400: a bad body with a bad token is 401.
        assert meter(srv, "junk", "not json")[0] == 401
        # 400: every malformed body, nothing charged
        bad = ["not json", "[]", "{}", json.dumps({"requestId": ""}),
               json.dumps({"requestId": 5}),
               json.dumps({"requestId": "x", "tokensUsed": -1, "model": "gpt-4o"}),
               json.dumps({"requestId": "x", "costUSD": -0.5, "model": "gpt-4o"}),
               json.dumps({"requestId": "x", "costUSD": "abc", "model": "gpt-4o"}),
               json.dumps({"requestId": "x", "tokensUsed": 1.5, "model": "gpt-4o"}),
               '{"requestId":"x","costUSD":1e999,"model":"gpt-4o"}',
               '{"requestId":"x","costUSD":NaN,"model":"gpt-4o"}',
               '{"requestId":"x","tokensUsed":123456789012345678901234567890}',
               '{"requestId":"x","requestId":"y","model":"gpt-4o"}',
               b'{"requestId":"\xff\xfe","model":"gpt-4o"}',
               ]
        for body in bad:
            st, _, b = meter(srv, tok, body)
            assert st == 400 and b["reason"] == "BadRequest" and b["error"], (body, st, b)
        st, _, b = meter(srv, tok, b"x" * (2 * 1024 * 1024))
        assert st == 413, st
        assert totals(srv, "codes")[:2] == (0, "0.00")
        # 403: model missing or not matching; exact and wildcard pass
        assert meter(srv, tok, call("m0"))[0] == 403
        assert meter(srv, tok, call("m1", model="gemini-2.5-pro"))[0] == 403
        assert meter(srv, tok, call("m2", model="gpt-4o-mini"))[0] == 403
        assert meter(srv, tok, call("m3", model="gpt-4o"))[0] == 200
        assert meter(srv, tok, call("m4", model="claude-3-opus"))[0] == 200
        # 200 idempotent: a retry adds nothing
        st, _, b1 = meter(srv, tok, call("r1", tokens=10, cost="0.10", model="gpt-4o"))
        st2, _, b2 = meter(srv, tok, call("r1", tokens=10, cost="0.10", model="gpt-4o"))
        assert st == st2 == 200 and b1["totalCostUSD"] == b2["totalCostUSD"], (b1, b2)
        assert b2.get("duplicate") is True
        assert totals(srv, "codes")[:2] == (210, "0.12")
        # A float amount finer than a micro-dollar is rounded to the nearest one, and a
        # positive one never to nothing (SPEC §7: only negative or non-numeric is 400).
        for rid, cost in (("f1", 0.1 + 0.2), ("f2", 1500 * 0.000015), ("f3", 0.0000001)):
            body = {"requestId": rid, "tokensUsed": 0, "costUSD": cost, "model": "gpt-4o"}
            assert meter(srv, tok, body)[0] == 200, (rid, cost)
        assert totals(srv, "codes")[:2] == (210, "0.442501")


def dup_auth(srv, tok, body):
    import http.client
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    c.putrequest("POST", METER)
    c.putheader("Authorization", "Bearer " + tok)
    c.putheader("Authorization", "Bearer " + tok)
    c.putheader("Content-Type", "application/json")
    c.putheader("Content-Length", str(len(body)))
    c.endheaders(body.encode())
    r = c.getresponse()
    out = (r.status, None, json.loads(r.read()))
    c.close()
    return out


def test_budget_exact_boundary_pauses_and_revokes():
    with Server(ARGS) as srv:
        tok = start_task(srv, "edge", budgetUSD="1.00", budgetTokens=1000)
        st, _, b = meter(srv, tok, call("e1", tokens=1000, cost="1.00"))
        assert st == 200 and b["totalCostUSD"] == 1.0, b  # equal to the budget: allowed
        st, _, b = meter(srv, tok, call("e2", tokens=0, cost="0.000001"))
        assert st == 429, b  # one micro-dollar over
        assert b["allowed"] is False and b["suspended"] is True
        assert b["reason"] == "budget exceeded"
        t = totals(srv, "edge")[2]
        assert t["status"]["phase"] == "Paused" and t["status"]["reason"] == "BudgetExceeded"
        assert t["spec"]["suspended"] is True
        assert t["status"]["costUSD"] == "1.000001"
        assert meter(srv, tok, call("e3", tokens=0, cost="0"))[0] == 401
        # budget bump + resume: a fresh token with the raised budget
        merge(srv, "edge", {"spec": {"budgetUSD": "16.00", "suspended": False}})
        wait_phase(srv, "edge", "Active")
        st, _, tok2 = srv.request("GET", NS + "/edge/token")
        st, _, b = meter(srv, tok2.strip(), call("e4", tokens=0, cost="2.50"))
        assert st == 200 and b["budgetUSD"] == 16.0, b


def test_max_iterations_and_both_at_once():
    with Server(ARGS) as srv:
        tok = start_task(srv, "iters", maxIterations=2, budgetUSD="1.00")
        assert meter(srv, tok, call("i1", iteration=2))[0] == 200
        st, _, b = meter(srv, tok, call("i2", iteration=3))
        assert st == 429 and b["reason"] == "max iterations exceeded", b
        t = totals(srv, "iters")[2]
        assert t["status"]["reason"] == "MaxIterationsExceeded"
        tok = start_task(srv, "both", maxIterations=1, budgetUSD="1.00")
        st, _, b = meter(srv, tok, call("b1", iteration=5, cost="2.00"))
        assert st == 429 and b["reason"] == "budget exceeded", b


def test_iteration_never_goes_back():
    """The review's repro (2026-12-01 finding 11): 3, 1, 1, 2 on maxIterations 3 used to take
    status.iteration 3 -> 1 -> 1 -> 2. Lower iterations are charged, the counter stays at 3,
    and iteration 4 is over the limit."""
    with Server(ARGS) as srv:
        tok = start_task(srv, "back", maxIterations=3, budgetUSD="1.00")
        seen = []
        for i, it in enumerate((3, 1, 1, 2)):
            st, _, b = meter(srv, tok, call("k%d" % i, iteration=it))
            assert st == 200 and b["iteration"] == 3, (st, b)
            seen.append(totals(srv, "back")[2]["status"]["iteration"])
        assert seen == [3, 3, 3, 3], seen
        assert totals(srv, "back")[0] == 400  # every call was charged
        st, _, b = meter(srv, tok, call("k4", iteration=4))
        assert st == 429 and b["reason"] == "max iterations exceeded", b


def test_guidance_preview_and_caveat_budget():
    with Server(ARGS + ["--default-budget-usd", "0.50"]) as srv:
        tok = start_task(srv, "g")
        merge(srv, "g", {"metadata": {"annotations": {"divergedev.com/guidance": "try the ORM"}}})
        merge(srv, "g", {"status": {"previewUrl": "http://p.test/?_diverge_env=agent-preview-g"}},
              "/status")
        st, _, b = meter(srv, tok, call("g1", cost="0.25"))
        assert st == 200 and b["guidance"] == "try the ORM", b
        assert b["previewUrl"] == "http://p.test/?_diverge_env=agent-preview-g"
        # The answer carried the guidance: the task records its delivery (sticky comment).
        st, _, doc = srv.request("GET", NS + "/g")
        assert doc["status"]["guidanceDeliveredAt"].endswith("Z"), doc["status"]
        assert len(doc["status"]["guidanceHash"]) == 16, doc["status"]
        # No spec budget: the server default went into the max_cost_usd caveat.
        r = subprocess.run([DIVERGE_BIN, "token", "inspect", tok], capture_output=True, text=True)
        assert r.returncode == 0, r
        assert "location: diverge" in r.stdout and "identifier: default/g/1/" in r.stdout
        assert "caveat: max_cost_usd = 0.50" in r.stdout, r.stdout
        assert "caveat: task_id = g" in r.stdout
        # `diverge task token` prints the same current token (admin API).
        r = srv.cli("task", "token", "g")
        assert r.returncode == 0 and r.stdout.strip() == tok, r
        r = subprocess.run([DIVERGE_BIN, "token", "inspect", "%%%"], capture_output=True,
                           text=True)
        assert r.returncode == 1 and r.stderr.startswith("diverge: "), r
        assert b["budgetUSD"] == 0.5
        st, _, b = meter(srv, tok, call("g2", cost="0.26"))
        assert st == 429, b


def test_attenuated_token_narrows():
    with Server(ARGS) as srv:
        tok = start_task(srv, "att", budgetUSD="5.00")
        r = subprocess.run([TOKEN_TOOL, "attenuate", tok, "models = claude-*"],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        narrowed = r.stdout.strip()
        assert meter(srv, narrowed, call("n1", model="gpt-4o"))[0] == 403
        assert meter(srv, narrowed, call("n2", model="claude-x"))[0] == 200
        r = subprocess.run([TOKEN_TOOL, "attenuate", tok, "flavour = vanilla"],
                           capture_output=True, text=True)
        assert meter(srv, r.stdout.strip(), call("n3"))[0] == 401  # unknown caveat
        r = subprocess.run([TOKEN_TOOL, "attenuate", tok, "task_id = other"],
                           capture_output=True, text=True)
        assert meter(srv, r.stdout.strip(), call("n4"))[0] == 401  # repeated caveat narrows


def test_request_id_rules_charge_nothing():
    """SPEC §7 step 2: an empty, all-whitespace, over-long or control-character requestId
    is 400 and charges nothing, like a missing one."""
    with Server(ARGS) as srv:
        tok = start_task(srv, "rid", budgetUSD="5.00")
        bad = [{"requestId": ""}, {"requestId": " "}, {"requestId": "   "},
               {"requestId": "\t"}, {"requestId": " \n "}, {"requestId": "\u00a0"},
               {"requestId": "a\u0000b"}, {"requestId": "a\u0001"},
               {"requestId": "a\u001b[2J"}, {"requestId": "a\u007f"},
               {"requestId": "a" * 257}, {"requestId": "a" * 255 + "\u00e9"}]
        for body in bad:
            body.update({"tokensUsed": 5, "costUSD": 0.5})
            st, _, b = meter(srv, tok, body)
            assert st == 400 and b["reason"] == "BadRequest", (body["requestId"][:20], st, b)
        t = totals(srv, "rid")
        assert t[:2] == (0, "0.00") and t[2]["status"]["phase"] == "Active", t[2]["status"]
        assert not t[2]["status"].get("lastMeterRequestIds"), t[2]["status"]
        # 256 bytes exactly is fine.
        st, _, b = meter(srv, tok, call("a" * 256, tokens=5, cost="0.5"))
        assert st == 200 and b["totalCostUSD"] == 0.5, b


def attenuate(tok, *caveats):
    r = subprocess.run([TOKEN_TOOL, "attenuate", tok] + list(caveats), capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_budget_caveats_are_budgets_not_401():
    """SPEC §7 step 5, §8: max_cost_usd / max_tokens never fail verification. A positive
    spec budget replaces them; where the spec field is unset or zero the (smallest) caveat
    is the budget and crossing it is 429 with the task Paused, never 401."""
    with Server(ARGS + ["--default-budget-usd", "0.30",
                        "--default-budget-tokens", "1000"]) as srv:
        # A $0.10 caveat on a $5.00 task stops at $5.00.
        tok = attenuate(start_task(srv, "spec5", budgetUSD="5.00", budgetTokens=100000),
                        "max_cost_usd = 0.10", "max_tokens = 10")
        for i, cost in enumerate(["0.08", "0.08", "4.84"]):
            st, _, b = meter(srv, tok, call("s%d" % i, tokens=50, cost=cost))
            assert st == 200 and b["allowed"] is True, (i, st, b)
        assert b["totalCostUSD"] == 5.0 and b["budgetUSD"] == 5.0, b
        st, _, b = meter(srv, tok, call("s9", tokens=0, cost="0.01"))
        assert st == 429 and b["reason"] == "budget exceeded", (st, b)
        t = totals(srv, "spec5")[2]
        assert t["status"]["phase"] == "Paused" and t["status"]["reason"] == "BudgetExceeded"
        # budgetUSD "0": the default-minted caveat ($0.30) is the budget.
        st, _, b = srv.request("POST", NS, task_obj("zero", budgetUSD="0", budgetTokens=0))
        assert st == 201, b
        wait_phase(srv, "zero", "Active")
        st, _, tok = srv.request("GET", NS + "/zero/token")
        tok = tok.strip()
        st, _, b = meter(srv, tok, call("z1", tokens=10, cost="0.20"))
        assert st == 200 and b["budgetUSD"] == 0.3 and b["budgetTokens"] == 1000, (st, b)
        # An attenuated smaller caveat narrows it further: $0.25 is the budget now.
        narrowed = attenuate(tok, "max_cost_usd = 0.25")
        st, _, b = meter(srv, narrowed, call("z2", tokens=10, cost="0.06"))
        assert st == 429 and b["reason"] == "budget exceeded", (st, b)
        t = totals(srv, "zero")[2]
        assert t["status"]["phase"] == "Paused" and t["status"]["reason"] == "BudgetExceeded"
        assert t["spec"]["suspended"] is True and t["status"]["costUSD"] == "0.26"
        st, _, b = meter(srv, tok, call("z3", tokens=0, cost="0"))
        assert st == 401 and b["error"] == "token revoked", (st, b)
        # Tokens alike: no spec budgetTokens, the 1000-token default caveat.
        tok = start_task(srv, "toks", budgetUSD="5.00")
        assert meter(srv, tok, call("t1", tokens=1000, cost="0"))[0] == 200
        st, _, b = meter(srv, tok, call("t2", tokens=1, cost="0"))
        assert st == 429 and b["reason"] == "budget exceeded", (st, b)
        # A malformed budget caveat still fails verification: 401, nothing charged.
        tok = start_task(srv, "badcav", budgetUSD="5.00")
        for cav in ("max_cost_usd = abc", "max_cost_usd = $1", "max_cost_usd = -1",
                    "max_cost_usd = 0.0000001", "max_tokens = 1e3", "max_tokens = -5"):
            st, _, b = meter(srv, attenuate(tok, cav), call("m-" + cav))
            assert st == 401 and b["reason"] == "Unauthorized", (cav, st, b)
        assert totals(srv, "badcav")[:2] == (0, "0.00")


OBJECTIVE_MAX = 4096   # store/store.h TASK_OBJECTIVE_MAX
GUIDANCE_MAX = 16384   # store/store.h TASK_GUIDANCE_MAX
GUIDANCE = "divergedev.com/guidance"


def test_objective_and_guidance_caps():
    """Security review finding 7: the objective and the guidance (echoed in every meter
    200, copied into every change event) are capped; one byte past is 422 with the field."""
    with Server(ARGS) as srv:
        st, _, b = srv.request("POST", NS, task_obj("cap1", objective="o" * (OBJECTIVE_MAX + 1)))
        assert st == 422 and b["details"]["causes"][0]["field"] == "spec.objective", (st, b)
        # Multi-byte characters count in bytes.
        st, _, b = srv.request("POST", NS, task_obj("cap1", objective="\u00e9" * 2049))
        assert st == 422 and b["details"]["causes"][0]["field"] == "spec.objective", (st, b)
        obj = task_obj("cap2", objective="o" * OBJECTIVE_MAX)
        obj["metadata"]["annotations"] = {GUIDANCE: "g" * (GUIDANCE_MAX + 1)}
        st, _, b = srv.request("POST", NS, obj)
        assert st == 422 and b["details"]["causes"][0]["field"] == \
            "metadata.annotations." + GUIDANCE, (st, b)
        tok = start_task(srv, "cap3", objective="o" * OBJECTIVE_MAX)
        st, _, b = merge(srv, "cap3", {"metadata": {"annotations": {GUIDANCE: "g" * (GUIDANCE_MAX + 1)}}})
        assert st == 422 and b["details"]["causes"][0]["field"] == \
            "metadata.annotations." + GUIDANCE, (st, b)
        st, _, b = merge(srv, "cap3", {"spec": {"objective": "o" * (OBJECTIVE_MAX + 1)}})
        assert st == 422 and b["details"]["causes"][0]["field"] == "spec.objective", (st, b)
        st, _, b = merge(srv, "cap3", {"metadata": {"annotations": {GUIDANCE: "g" * GUIDANCE_MAX}}})
        assert st == 200, (st, b)
        st, _, b = meter(srv, tok, call("c1"))
        assert st == 200 and b["guidance"] == "g" * GUIDANCE_MAX, st


def test_kill9_mid_metering_never_overcharges():
    srv = Server(ARGS).start()
    try:
        names = ["crash%d" % i for i in range(4)]
        toks = {n: start_task(srv, n, budgetUSD="1000.00", budgetTokens=10 ** 9) for n in names}
        acked = {n: set() for n in names}
        lock = threading.Lock()
        stop = threading.Event()

        def worker(wid):
            rng = random.Random(wid)
            i = 0
            while not stop.is_set():
                n = names[rng.randrange(len(names))]
                # Reuse an earlier id a third of the time: retries of the same request.
                rid = "w%d-%d" % (wid, rng.randrange(i) if i and rng.random() < 0.33 else i)
                i += 1
                try:
                    st, _, b = meter(srv, toks[n], call(rid, tokens=7, cost="0.003"))
                except Exception:
                    continue
                if st == 200:
                    with lock:
                        acked[n].add(rid)

        with concurrent.futures.ThreadPoolExecutor(max_workers=16) as ex:
            futs = [ex.submit(worker, w) for w in range(16)]
            time.sleep(1.0)
            srv.kill()
            stop.set()
            concurrent.futures.wait(futs)
        db = os.path.join(srv.data_dir, "diverge.db")
        con = sqlite3.connect(db)
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        con.close()
        srv2 = Server(ARGS, data_dir=srv.data_dir).start()
        try:
            con = sqlite3.connect(db)
            total_acked = 0
            for n in names:
                st, _, b = srv2.request("GET", NS + "/" + n)
                uid = b["metadata"]["uid"]
                # The recent ids are in meter_log, older ones moved to meter_requests of
                # the archive file (or of the database itself). A kill -9 between the
                # archive's commit and the log's trim leaves an id in both: a set.
                rows = [r[0] for r in con.execute(
                    "SELECT request_id FROM meter_log WHERE task_uid=?1 UNION ALL "
                    "SELECT request_id FROM meter_requests WHERE task_uid=?1", (uid,))]
                assert len(rows) == len(set(rows)), "an id was recorded twice"
                recorded = set(rows)
                if os.path.exists(db + "-meter"):
                    arc = sqlite3.connect(db + "-meter")
                    recorded |= {r[0] for r in arc.execute(
                        "SELECT request_id FROM meter_requests WHERE task_uid=?1", (uid,))}
                    arc.close()
                missing = acked[n] - recorded
                assert not missing, (n, sorted(missing)[:5])
                assert b["status"]["tokensConsumed"] == 7 * len(recorded), (n, b["status"])
                micros = 3000 * len(recorded)
                assert b["status"]["costUSD"] == "%d.%06d" % divmod(micros, 10 ** 6) or \
                    b["status"]["costUSD"] == fmt_money(micros), b["status"]["costUSD"]
                total_acked += len(acked[n])
            con.close()
            assert total_acked > 50, total_acked
            print("acknowledged %d distinct charges before kill -9" % total_acked)
        finally:
            srv2.stop()
    finally:
        srv.cleanup()


SPILL_IDS = 2048  # the meter's in-memory generation of ids (STORE_METER_INDEX_IDS / 2)


def test_kill9_across_the_id_spill_never_recharges():
    """Past the point where the meter's request ids move out of memory into the archive
    file (off the commit path), a kill -9 and a restart keep every acknowledged id:
    sent again, each is answered as already charged and adds nothing."""
    srv = Server(ARGS).start()
    try:
        tok = start_task(srv, "spill", budgetUSD="1000.00", budgetTokens=10 ** 9)
        acked, lock = [], threading.Lock()
        stop = threading.Event()

        def worker(wid):
            i = 0
            while not stop.is_set():
                rid = "s%d-%d" % (wid, i)
                i += 1
                try:
                    st, _, _ = meter(srv, tok, call(rid, tokens=7, cost="0.003"))
                except Exception:
                    continue
                if st == 200:
                    with lock:
                        acked.append(rid)

        with concurrent.futures.ThreadPoolExecutor(max_workers=8) as ex:
            futs = [ex.submit(worker, w) for w in range(8)]
            deadline = time.time() + 50
            while len(acked) < 2 * SPILL_IDS + 300 and time.time() < deadline:
                time.sleep(0.01)
            srv.kill()
            stop.set()
            concurrent.futures.wait(futs)
        assert len(acked) > 2 * SPILL_IDS, len(acked)
        srv2 = Server(ARGS, data_dir=srv.data_dir).start()
        try:
            st, _, b = srv2.request("GET", NS + "/spill")
            before = b["status"]["tokensConsumed"]
            assert before >= 7 * len(acked), (before, len(acked))
            # Thousands of resends: one keep-alive connection, not one each (same requests).
            conn = http.client.HTTPConnection("127.0.0.1", srv2.port, timeout=30)
            hdr = {"Authorization": "Bearer " + tok, "Content-Type": "application/json"}
            try:
                for rid in acked:
                    conn.request("POST", METER, json.dumps(call(rid, tokens=7, cost="0.003")), hdr)
                    resp = conn.getresponse()
                    st, b = resp.status, json.loads(resp.read() or b"{}")
                    assert st == 200 and b.get("duplicate") is True, (rid, st, b)
            finally:
                conn.close()
            st, _, b = srv2.request("GET", NS + "/spill")
            assert b["status"]["tokensConsumed"] == before, (before, b["status"])
            print("%d acknowledged ids, all still charged once after kill -9" % len(acked))
        finally:
            srv2.stop()
    finally:
        srv.cleanup()


def fmt_money(micros):
    whole, frac = divmod(micros, 10 ** 6)
    s = "%06d" % frac
    while len(s) > 2 and s.endswith("0"):
        s = s[:-1]
    return "%d.%s" % (whole, s)


if __name__ == "__main__":
    run_tests([test_lifecycle_pause_resume_rotates_token, test_status_codes_in_order,
               test_budget_exact_boundary_pauses_and_revokes, test_max_iterations_and_both_at_once,
               test_iteration_never_goes_back, test_guidance_preview_and_caveat_budget, test_attenuated_token_narrows,
               test_request_id_rules_charge_nothing, test_budget_caveats_are_budgets_not_401,
               test_objective_and_guidance_caps,
               test_kill9_mid_metering_never_overcharges,
               test_kill9_across_the_id_spill_never_recharges])
