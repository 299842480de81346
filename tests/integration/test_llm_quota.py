# SPDX-License-Identifier: Apache-2.0
"""The LLM gateway against a namespace's SpendQuota (SPEC §13, §15): its admission reserves
against the smaller of the task's budget left and the quota left, counting the calls in
flight of every task of the namespace, so concurrent calls of two tasks never take the
project past its quota; when nothing fits the call is refused (402, "diverge: project
quota exceeded") and the task pauses QuotaExceeded."""
import concurrent.futures
import json
from decimal import Decimal

from harness import API, run_tests
from llm_helpers import NS, charge_lines, start_task, wait_for, wait_phase
from test_llm_gateway import MSG, Gateway, msg_body, post, stream_raw

QUOTAS = API + "/namespaces/default/spendquotas"


def quota(srv, name, **spec):
    st, _, b = srv.request("POST", QUOTAS, {"metadata": {"name": name}, "spec": spec})
    assert st == 201, (st, b)


def used_usd(srv, name):
    st, _, b = srv.request("GET", QUOTAS + "/" + name)
    assert st == 200, b
    return Decimal(b["status"]["usedUSD"])


def test_concurrent_calls_of_two_tasks_never_pass_the_quota():
    with Gateway() as gw:
        srv, fake = gw.srv, gw.fake
        fake.worst_case = True  # every call uses all it may: body bytes in, max_tokens out
        quota(srv, "team", monthlyUSD="0.20")
        toks = [start_task(srv, n, budgetUSD="5.00") for n in ("qa", "qb")]

        def one(i):
            body = msg_body(max_tokens=3000, stream=i % 2 == 0)
            h = {"x-api-key": toks[i % 2]}
            if i % 2 == 0:
                st, raw, _ = stream_raw(srv, MSG, body, h)
            else:
                st, _, raw = post(srv, MSG, body, h)
            return st, raw

        with concurrent.futures.ThreadPoolExecutor(16) as ex:
            res = list(ex.map(one, range(48)))
        # Then one call of each task with none in flight: what the quota's spend leaves
        # (not calls in flight) refuses it, however the 48 interleaved.
        res += [one(46), one(47)]
        statuses = [st for st, _ in res]
        assert set(statuses) <= {200, 402, 401}, statuses
        assert statuses.count(200) >= 4, statuses
        refused = [json.loads(raw)["error"]["message"] for st, raw in res if st == 402]
        assert any(m.startswith("diverge: project quota exceeded") for m in refused), refused
        # Each answered call's charge follows its answer: wait for all of them.
        wait_for(lambda: sum(len(charge_lines(srv, n)) for n in ("qa", "qb")) ==
                 statuses.count(200), "a charge line for every answered call")
        spent = sum(Decimal(srv.request("GET", NS + "/" + n)[2]["status"]["costUSD"])
                    for n in ("qa", "qb"))
        assert spent <= Decimal("0.20") and spent > Decimal("0.15"), spent
        assert used_usd(srv, "team") == spent
        reasons = {srv.request("GET", NS + "/" + n)[2]["status"]["reason"] for n in ("qa", "qb")}
        assert "QuotaExceeded" in reasons, reasons
        assert "BudgetExceeded" not in reasons, reasons


def test_quota_lowers_the_output_then_refuses_and_pauses():
    with Gateway() as gw:
        srv, fake = gw.srv, gw.fake
        quota(srv, "team", monthlyUSD="0.01")
        tok = start_task(srv, "qpoor", budgetUSD="5.00")
        body = msg_body(max_tokens=4096, system="x" * 900)
        fake.usage = {"input": 100, "output": 400, "cache_write": 0, "cache_read": 0}
        st, _, raw = post(srv, MSG, body, {"x-api-key": tok})
        assert st == 200, raw
        # as for a budget of $0.01: the output limit is what the quota can pay for
        assert fake.requests[-1]["body"]["max_tokens"] < 700, fake.requests[-1]["body"]
        calls = len(fake.requests)
        st, _, raw = post(srv, MSG, body, {"x-api-key": tok})
        b = json.loads(raw)
        assert st == 402 and b["error"]["message"].startswith(
            "diverge: project quota exceeded"), (st, b)
        assert len(fake.requests) == calls
        t = wait_phase(srv, "qpoor", "Paused")
        assert t["status"]["reason"] == "QuotaExceeded", t["status"]
        assert used_usd(srv, "team") == Decimal(t["status"]["costUSD"]) <= Decimal("0.01")


if __name__ == "__main__":
    run_tests([test_concurrent_calls_of_two_tasks_never_pass_the_quota,
               test_quota_lowers_the_output_then_refuses_and_pauses])
