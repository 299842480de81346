# SPDX-License-Identifier: Apache-2.0
"""SpendQuota (SPEC §15) against the real `diverge serve --sandbox-provider none`: the API
(create, validation, patch that cannot touch status, the /status subresource, delete),
`kubectl get spendquotas` with the real kubectl, a quota reached across two tasks of one
project (429 + QuotaExceeded on the call that crosses it, another project unaffected, a
retried request never charged twice), a new month's reset (the status subresource moves
periodStart back), and quota totals equal to the sum of the tasks' charges after a kill -9
in the middle of concurrent metering."""
import concurrent.futures
import random
import threading
import time

from harness import API, Server, run_tests
from test_meter import call, meter
from test_kubectl import Kubectl, rows
from test_mcp import Mcp

ARGS = ["--sandbox-provider", "none"]
MERGE = {"Content-Type": "application/merge-patch+json"}


def quotas(ns):
    return API + "/namespaces/%s/spendquotas" % ns


def tasks(ns):
    return API + "/namespaces/%s/agenttasks" % ns


def make_quota(srv, ns, name, **spec):
    st, _, b = srv.request("POST", quotas(ns), {"apiVersion": "divergedev.com/v1alpha1",
                                                "kind": "SpendQuota",
                                                "metadata": {"name": name}, "spec": spec})
    assert st == 201, (st, b)
    return b


def get_quota(srv, ns, name):
    st, _, b = srv.request("GET", quotas(ns) + "/" + name)
    assert st == 200, (st, b)
    return b


def wait_task(srv, ns, name, pred, what, timeout=15):
    deadline = time.time() + timeout
    b = None
    while time.time() < deadline:
        st, _, b = srv.request("GET", tasks(ns) + "/" + name)
        if st == 200 and pred(b):
            return b
        time.sleep(0.02)
    raise AssertionError("%s/%s never %s: %s" % (ns, name, what, b))


def start(srv, ns, name, **spec):
    s = {"objective": "do it", "budgetUSD": "100.00"}
    s.update(spec)
    st, _, b = srv.request("POST", tasks(ns), {"metadata": {"name": name}, "spec": s})
    assert st == 201, (st, b)
    wait_task(srv, ns, name, lambda t: t["status"]["phase"] == "Active", "Active")
    st, _, tok = srv.request("GET", tasks(ns) + "/" + name + "/token")
    assert st == 200, tok
    return tok.strip()


def test_api_validation_and_status_subresource():
    with Server(ARGS) as srv:
        q = make_quota(srv, "proj", "team", monthlyUSD="100", monthlyTokens=50000000,
                       maxRunningTasks=2)
        assert q["kind"] == "SpendQuota" and q["metadata"]["namespace"] == "proj"
        assert q["spec"] == {"monthlyUSD": "100.00", "monthlyTokens": 50000000,
                             "maxRunningTasks": 2}, q
        assert q["status"]["usedUSD"] == "0.00" and q["status"]["usedTokens"] == 0
        ps = q["status"]["periodStart"]
        assert ps.endswith("-01T00:00:00Z"), ps
        # every field is optional
        make_quota(srv, "proj", "empty")
        bad = [({"monthlyUSD": 5}, "spec.monthlyUSD"), ({"monthlyUSD": "-1"}, "spec.monthlyUSD"),
               ({"monthlyUSD": "1.2345678"}, "spec.monthlyUSD"),
               ({"monthlyTokens": -1}, "spec.monthlyTokens"),
               ({"monthlyTokens": "5"}, "spec.monthlyTokens"),
               ({"maxRunningTasks": 1.5}, "spec.maxRunningTasks"),
               ({"monthlyUsd": "1"}, "spec.monthlyUsd")]
        for spec, field in bad:
            st, _, b = srv.request("POST", quotas("proj"),
                                   {"metadata": {"name": "bad"}, "spec": spec})
            assert st == 422 and b["details"]["causes"][0]["field"] == field, (spec, st, b)
            assert b["details"]["kind"] == "SpendQuota", b
        st, _, b = srv.request("POST", quotas("proj"), {"metadata": {"name": "team"}})
        assert st == 409 and b["reason"] == "AlreadyExists", (st, b)
        st, _, b = srv.request("POST", quotas("proj"), {"metadata": {"name": "Team"}})
        assert st == 422, (st, b)
        # a spec write cannot set status
        st, _, b = srv.request("PATCH", quotas("proj") + "/team",
                               {"spec": {"monthlyUSD": "150.5"},
                                "status": {"usedUSD": "99.00"}}, headers=MERGE)
        assert st == 200 and b["spec"]["monthlyUSD"] == "150.50", (st, b)
        assert b["status"]["usedUSD"] == "0.00", b
        st, _, b = srv.request("PUT", quotas("proj") + "/team",
                               {"metadata": {"name": "team"}, "spec": {"monthlyTokens": 7},
                                "status": {"usedTokens": 5}})
        assert st == 200 and b["spec"] == {"monthlyTokens": 7}, (st, b)
        assert b["status"]["usedTokens"] == 0, b
        # stale resourceVersion: 409
        st, _, b2 = srv.request("PATCH", quotas("proj") + "/team",
                                {"metadata": {"resourceVersion": "1"},
                                 "spec": {"monthlyTokens": 8}}, headers=MERGE)
        assert st == 409, (st, b2)
        # the status subresource is where an operator corrects usage
        st, _, b = srv.request("PATCH", quotas("proj") + "/team/status",
                               {"status": {"usedTokens": 3}}, headers=MERGE)
        assert st == 200 and b["status"]["usedTokens"] == 3, (st, b)
        st, _, b = srv.request("PATCH", quotas("proj") + "/team/status",
                               {"status": {"usedUSD": "x"}}, headers=MERGE)
        assert st == 422, (st, b)
        st, _, lst = srv.request("GET", API + "/spendquotas")
        assert st == 200 and lst["kind"] == "SpendQuotaList", lst
        assert [i["metadata"]["name"] for i in lst["items"]] == ["empty", "team"], lst
        st, _, _ = srv.request("GET", quotas("proj"), auth=False)
        assert st == 401
        st, _, b = srv.request("DELETE", quotas("proj") + "/empty")
        assert st == 200, (st, b)
        st, _, b = srv.request("GET", quotas("proj") + "/empty")
        assert st == 404 and b["reason"] == "NotFound", (st, b)


def test_kubectl_get_spendquotas():
    with Server(ARGS + ["--tls-listen", "127.0.0.1:0"]) as srv:
        k = Kubectl(srv)
        try:
            k.ok("apply", "-n", "proj", "-f", "-", input=(
                "apiVersion: divergedev.com/v1alpha1\nkind: SpendQuota\n"
                "metadata: {name: team}\n"
                "spec: {monthlyUSD: \"100.00\", monthlyTokens: 5000, maxRunningTasks: 2}\n"))
            out = k.ok("get", "spendquotas", "-n", "proj")
            r = rows(out)
            assert r[0][:4] == ["NAME", "USD", "TOKENS", "MAX-RUNNING"], out
            assert r[1][0] == "team" and r[1][1:4] == ["0.00", "/", "100.00"], out
            out = k.ok("get", "spendquota", "team", "-n", "proj", "-o",
                       "jsonpath={.spec.monthlyUSD} {.status.usedUSD}")
            assert out == "100.00 0.00", out
            out = k.ok("get", "sq", "-A")
            assert "team" in out, out
            r = k.run("apply", "-n", "proj", "-f", "-", input=(
                "apiVersion: divergedev.com/v1alpha1\nkind: SpendQuota\n"
                "metadata: {name: bad}\nspec: {monthlyTokens: -5}\n"))
            assert r.returncode != 0 and "spec.monthlyTokens" in r.stderr, r.stderr
            k.ok("delete", "spendquota", "team", "-n", "proj")
            out = k.run("get", "spendquotas", "-n", "proj")
            assert "No resources found" in out.stderr + out.stdout, out
        finally:
            k.cleanup()


def test_quota_across_two_tasks_pauses_the_crossing_call():
    with Server(ARGS) as srv:
        make_quota(srv, "proj", "team", monthlyUSD="1.00")
        a = start(srv, "proj", "a")
        b = start(srv, "proj", "b")
        other = start(srv, "other", "c")
        st, _, r = meter(srv, a, call("a1", tokens=10, cost="0.40"))
        assert st == 200 and r["allowed"], (st, r)
        st, _, r = meter(srv, b, call("b1", tokens=10, cost="0.50"))
        assert st == 200, (st, r)
        # a retried request is free, for the task and for the quota
        st, _, r = meter(srv, b, call("b1", tokens=10, cost="0.50"))
        assert st == 200 and r.get("duplicate"), (st, r)
        assert get_quota(srv, "proj", "team")["status"]["usedUSD"] == "0.90"
        # exactly at the quota is allowed; past it is not
        st, _, r = meter(srv, a, call("a2", tokens=10, cost="0.10"))
        assert st == 200, (st, r)
        st, _, r = meter(srv, b, call("b2", tokens=10, cost="0.01"))
        assert st == 429 and r["reason"] == "project quota exceeded", (st, r)
        assert r["quota"] == "team" and r["suspended"] is True, r
        t = wait_task(srv, "proj", "b", lambda t: t["status"]["phase"] == "Paused", "Paused")
        assert t["status"]["reason"] == "QuotaExceeded" and t["spec"]["suspended"], t
        assert "team" in t["status"]["message"], t
        # the crossing call is charged (its cost was spent), and its token is revoked
        assert t["status"]["costUSD"] == "0.51", t["status"]
        q = get_quota(srv, "proj", "team")
        assert q["status"]["usedUSD"] == "1.01" and q["status"]["usedTokens"] == 40, q
        st, _, r = meter(srv, b, call("b3", tokens=1, cost="0"))
        assert st == 401, (st, r)
        # the other task of the project is stopped at its next charge
        st, _, r = meter(srv, a, call("a3", tokens=1, cost="0.01"))
        assert st == 429 and r["reason"] == "project quota exceeded", (st, r)
        # another project is unaffected
        for i in range(3):
            st, _, r = meter(srv, other, call("c%d" % i, tokens=10, cost="1.00"))
            assert st == 200, (st, r)
        # raising the quota lets a resumed task go on; it stays paused until resumed
        st, _, _ = srv.request("PATCH", quotas("proj") + "/team",
                               {"spec": {"monthlyUSD": "5.00"}}, headers=MERGE)
        assert st == 200
        assert wait_task(srv, "proj", "b", lambda t: True, "read")["status"]["phase"] == "Paused"
        st, _, _ = srv.request("PATCH", tasks("proj") + "/b", {"spec": {"suspended": False}},
                               headers=MERGE)
        assert st == 200
        wait_task(srv, "proj", "b", lambda t: t["status"]["phase"] == "Active", "resumed")
        st, _, tok = srv.request("GET", tasks("proj") + "/b/token")
        st, _, r = meter(srv, tok.strip(), call("b4", tokens=1, cost="0.10"))
        assert st == 200, (st, r)


def test_cli_mcp_and_metrics_show_used_and_quota():
    with Server(ARGS) as srv:
        make_quota(srv, "proj", "team", monthlyUSD="2.00", monthlyTokens=1000,
                   maxRunningTasks=3)
        make_quota(srv, "proj", "open")
        a = start(srv, "proj", "a")
        st, _, _ = meter(srv, a, call("a1", tokens=40, cost="0.036"))
        assert st == 200
        r = srv.cli("quota", "list", "-n", "proj")
        assert r.returncode == 0, r
        lines = [ln.split() for ln in r.stdout.strip().splitlines()]
        assert lines[0] == ["NAME", "USD", "TOKENS", "MAX-RUNNING", "PERIOD"], r.stdout
        assert lines[1][:4] == ["open", "0.036", "40", "-"], r.stdout
        assert lines[2][:4] == ["team", "0.036/2.00", "40/1000", "3"], r.stdout
        r = srv.cli("quota", "list", "-A")
        assert r.returncode == 0 and r.stdout.split()[0] == "NAMESPACE", r
        r = srv.cli("quota", "status", "team", "-n", "proj")
        assert r.returncode == 0 and "USD:          0.036/2.00" in r.stdout, r
        assert "Max running:  3" in r.stdout, r.stdout
        r = srv.cli("quota", "status", "nope", "-n", "proj")
        assert r.returncode == 1 and r.stderr.startswith("diverge: "), r
        r = srv.cli("quota", "list", "-n", "empty")
        assert r.returncode == 0 and "No spend quotas found" in r.stderr, r
        with Mcp(srv) as m:
            m.initialize()
            res = m.ok("diverge_quota_status", namespace="proj")
            text = res["content"][0]["text"]
            assert "team: $0.036 / $2.00, 40 / 1000 tokens this month" in text, text
            assert [q["metadata"]["name"] for q in res["structuredContent"]["quotas"]] == \
                ["open", "team"], res
        _, _, metrics = srv.request("GET", "/metrics", auth=False)
        assert 'diverge_project_spend_usd{namespace="proj"} 0.036\n' in metrics, metrics
        assert 'diverge_project_quota_usd{namespace="proj",quota="team"} 2.00\n' in metrics


def test_new_month_resets_usage_at_the_first_charge():
    with Server(ARGS) as srv:
        make_quota(srv, "proj", "team", monthlyTokens=100)
        a = start(srv, "proj", "a")
        st, _, r = meter(srv, a, call("a1", tokens=101, cost="0"))
        assert st == 429, (st, r)
        wait_task(srv, "proj", "a", lambda t: t["status"]["reason"] == "QuotaExceeded", "paused")
        # the period started last year: the next charge counts from zero
        st, _, q = srv.request("PATCH", quotas("proj") + "/team/status",
                               {"status": {"periodStart": "2020-01-01T00:00:00Z"}},
                               headers=MERGE)
        assert st == 200 and q["status"]["periodStart"] == "2020-01-01T00:00:00Z", q
        q = get_quota(srv, "proj", "team")  # shown as the meter will count it
        assert q["status"]["usedTokens"] == 0 and q["status"]["periodStart"] != \
            "2020-01-01T00:00:00Z", q
        # the quota-paused task stays paused until resumed
        t = wait_task(srv, "proj", "a", lambda t: True, "read")
        assert t["status"]["phase"] == "Paused", t
        b = start(srv, "proj", "b")
        st, _, r = meter(srv, b, call("b1", tokens=60, cost="0"))
        assert st == 200, (st, r)
        q = get_quota(srv, "proj", "team")
        assert q["status"]["usedTokens"] == 60, q


def test_kill9_quota_totals_equal_the_tasks_charges():
    srv = Server(ARGS).start()
    try:
        make_quota(srv, "proj", "team", monthlyUSD="100000.00")
        make_quota(srv, "proj", "tokens", monthlyTokens=10 ** 12)
        names = ["k%d" % i for i in range(3)]
        toks = {n: start(srv, "proj", n, budgetUSD="1000.00", budgetTokens=10 ** 9)
                for n in names}
        acked = [0]
        lock = threading.Lock()
        stop = threading.Event()

        def worker(wid):
            rng = random.Random(wid)
            i = 0
            while not stop.is_set():
                n = names[rng.randrange(len(names))]
                rid = "w%d-%d" % (wid, rng.randrange(i) if i and rng.random() < 0.33 else i)
                i += 1
                try:
                    st, _, _ = meter(srv, toks[n], call(rid, tokens=7, cost="0.003"))
                except Exception:
                    continue
                if st == 200:
                    with lock:
                        acked[0] += 1

        with concurrent.futures.ThreadPoolExecutor(max_workers=12) as ex:
            futs = [ex.submit(worker, w) for w in range(12)]
            deadline = time.time() + 30
            while acked[0] < 100 and time.time() < deadline:
                time.sleep(0.01)
            srv.kill()
            stop.set()
            concurrent.futures.wait(futs)
        srv2 = Server(ARGS, data_dir=srv.data_dir).start()
        try:
            tokens = cost = 0
            for n in names:
                st, _, t = srv2.request("GET", tasks("proj") + "/" + n)
                tokens += t["status"]["tokensConsumed"]
                whole, frac = t["status"]["costUSD"].split(".")
                cost += int(whole) * 10 ** 6 + int(frac.ljust(6, "0"))
            assert tokens > 0 and tokens == 7 * (cost // 3000), (tokens, cost)
            q = get_quota(srv2, "proj", "team")["status"]
            whole, frac = q["usedUSD"].split(".")
            assert int(whole) * 10 ** 6 + int(frac.ljust(6, "0")) == cost, (q, cost)
            assert get_quota(srv2, "proj", "tokens")["status"]["usedTokens"] == tokens
            print("quota totals %d tokens, %d micro-dollars after kill -9" % (tokens, cost))
        finally:
            srv2.stop()
    finally:
        srv.cleanup()


if __name__ == "__main__":
    run_tests([test_api_validation_and_status_subresource, test_kubectl_get_spendquotas,
               test_quota_across_two_tasks_pauses_the_crossing_call,
               test_cli_mcp_and_metrics_show_used_and_quota,
               test_new_month_resets_usage_at_the_first_charge,
               test_kill9_quota_totals_equal_the_tasks_charges])
