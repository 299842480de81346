# SPDX-License-Identifier: Apache-2.0
"""What the bot does with a project's SpendQuota (SPEC §15), through the `local` SCM
provider: `/diverge fix` in a project whose quota is used up is refused with a reply naming
the quota and the day it resets (and nothing is created); once raised, fix starts the task;
`/diverge budget` cannot raise the task past what the quota leaves (the reply says so);
`/diverge status` shows used / quota."""
import datetime
import shutil
import tempfile
import time

from harness import API, Server, run_tests
from test_local_pr import make_repo, thread

ARGS = ["--sandbox-provider", "none"]
MERGE = {"Content-Type": "application/merge-patch+json"}
NS = "acme-shop"
QUOTAS = API + "/namespaces/%s/spendquotas" % NS
TASK = API + "/namespaces/%s/agenttasks/fix-pr-12" % NS


def wait_for(fn, what, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError("timed out waiting for " + what)


def comment(srv, text):
    r = srv.cli("local", "comment", "acme/shop#12", text, "--as", "alice")
    assert r.returncode == 0, r


def test_fix_refused_with_reset_day_then_budget_capped_and_status():
    top = tempfile.mkdtemp(prefix="diverge-quota-bot-")
    try:
        url = "file://" + make_repo(top)
        with Server(ARGS) as srv:
            r = srv.cli("local", "pr", "open", "acme/shop#12", "--repo", url, "--head",
                        "feature")
            assert r.returncode == 0, r
            st, _, q = srv.request("POST", QUOTAS, {"metadata": {"name": "team"},
                                                    "spec": {"monthlyUSD": "1.00"}})
            assert st == 201, q
            st, _, q = srv.request("PATCH", QUOTAS + "/team/status",
                                   {"status": {"usedUSD": "1.00"}}, headers=MERGE)
            assert st == 200, q
            comment(srv, "/diverge fix the greeting typo")
            out = wait_for(lambda: (lambda t: t if "refused" in t else None)(
                thread(srv, "acme/shop#12")), "the refusal")
            now = datetime.datetime.now(datetime.timezone.utc)
            nxt = datetime.date(now.year + (now.month == 12), now.month % 12 + 1, 1)
            assert "`/diverge fix` refused" in out and "`team`" in out, out
            assert "$1.00 / $1.00" in out, out
            assert "resets on %s (UTC)" % nxt.isoformat() in out, out
            st, _, _ = srv.request("GET", TASK)
            assert st == 404, "no task is created while the quota is used up"
            # raised: fix starts the task
            st, _, _ = srv.request("PATCH", QUOTAS + "/team", {"spec": {"monthlyUSD": "3.00"}},
                                   headers=MERGE)
            assert st == 200
            comment(srv, "/diverge fix the greeting typo")
            t = wait_for(lambda: (lambda r: r[2] if r[0] == 200 else None)(
                srv.request("GET", TASK)), "the task")
            assert t["spec"]["budgetUSD"] == "2.00", t["spec"]  # agent.yaml's
            # the budget cannot pass what the quota leaves ($2.00 of $3.00)
            comment(srv, "/diverge budget +$10")
            out = wait_for(lambda: (lambda t: t if "budget stays at" in t else None)(
                thread(srv, "acme/shop#12")), "the budget reply")
            assert "The USD budget stays at $2.00: the project's spend quota `team` leaves no " \
                "more this month" in out, out
            assert srv.request("GET", TASK)[2]["spec"]["budgetUSD"] == "2.00"
            # with more room, it is raised only as far as the quota leaves
            st, _, _ = srv.request("PATCH", QUOTAS + "/team", {"spec": {"monthlyUSD": "4.50"}},
                                   headers=MERGE)
            assert st == 200
            comment(srv, "/diverge budget +$10")
            out = wait_for(lambda: (lambda t: t if "raised only to $3.50" in t else None)(
                thread(srv, "acme/shop#12")), "the second budget reply")
            assert srv.request("GET", TASK)[2]["spec"]["budgetUSD"] == "3.50"
            comment(srv, "/diverge status")
            out = wait_for(lambda: (lambda t: t if "Project quota" in t else None)(
                thread(srv, "acme/shop#12")), "the status reply")
            assert "Project quota `team`: $1.00 / $4.50" in out, out
            assert "resets %s UTC" % nxt.isoformat() in out, out
    finally:
        shutil.rmtree(top, ignore_errors=True)


if __name__ == "__main__":
    run_tests([test_fix_refused_with_reset_day_then_budget_capped_and_status])
