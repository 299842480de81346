# SPDX-License-Identifier: Apache-2.0
"""Runs (SPEC §14): a finished task runs again.

- local SCM, the real runner in the local sandbox (process where bubblewrap cannot run):
  `/diverge fix` completes run 1; `/diverge resume` on the finished task gets a reply
  saying to use fix and changes nothing; with its budget spent `/diverge fix` is refused
  with a reply saying how to raise it; `/diverge budget +$1` and `/diverge fix …` in one
  comment start run 2 of the same task (same sticky comment, "run 2" in it, spend
  cumulative, iterations from 0); `diverge task resume` on it exits 1 naming `rerun`,
  `diverge task rerun --objective` starts run 3;
- GitHub (fake REST server, provider none): the same bot path raises spec.run, the
  controller starts the run (status.run), and resume on a finished task is refused."""
import os
import shutil
import tempfile

from github_helpers import comment_payload, deliver, new_fake, server_args, server_env
from github_helpers import BOT
from harness import API, Server, run_tests
from sandbox_helpers import git
from test_local_pr import SERVE, ENV, Clean, make_repo, stickies, thread, get_task, wait

NS = "acme-shop"
NAME = "fix-pr-12"
REF = "acme/shop#12"


def done(srv, run):
    t = get_task(srv, NS, NAME)
    if t and t["status"].get("run", 1) == run and t["status"]["phase"] in ("Completed", "Failed"):
        return t
    return None


def comment(srv, text):
    r = srv.cli("local", "comment", REF, text, "--as", "alice")
    assert r.returncode == 0, r


def test_local_fix_reruns_a_finished_task():
    top = tempfile.mkdtemp(prefix="diverge-runs-")
    bare = make_repo(top)
    with Server(SERVE, env=ENV) as srv, Clean(srv):
        r = srv.cli("local", "pr", "open", REF, "--repo", "file://" + bare, "--head", "feature")
        assert r.returncode == 0, r
        comment(srv, "/diverge fix the greeting typo")
        t = wait(lambda: done(srv, 1), what="run 1")
        assert t["status"]["phase"] == "Completed", t["status"]
        first_cost, first_tokens = t["status"]["costUSD"], t["status"]["tokensConsumed"]
        assert first_tokens == 4800 and t["status"]["iteration"] == 2, t["status"]
        wait(lambda: "✅ Completed" in thread(srv, REF), what="sticky Completed")

        # resume on a finished task: a reply naming fix, nothing changes.
        rv = t["metadata"]["resourceVersion"]
        comment(srv, "/diverge resume")
        out = wait(lambda: (lambda o: o if "nothing to resume" in o else None)(thread(srv, REF)),
                   what="resume refusal")
        assert "`/diverge fix <objective>` starts a new run" in out, out
        assert get_task(srv, NS, NAME)["metadata"]["resourceVersion"] == rv

        # Budget spent: fix is refused with how to raise it.
        st, _, _ = srv.request("PATCH", API + "/namespaces/%s/agenttasks/%s" % (NS, NAME),
                               {"spec": {"budgetUSD": "0.05"}},
                               headers={"Content-Type": "application/merge-patch+json"})
        assert st == 200
        comment(srv, "/diverge fix once more")
        out = wait(lambda: (lambda o: o if "has spent its budget" in o else None)(
            thread(srv, REF)), what="budget refusal")
        assert "/diverge budget +$5" in out, out
        t = get_task(srv, NS, NAME)
        assert t["spec"].get("run", 1) == 1 and t["spec"]["objective"] == "the greeting typo"

        # Raise the budget and fix in one comment: run 2 of the same task.
        comment(srv, "/diverge budget +$1\n/diverge fix say hello properly")
        t = wait(lambda: done(srv, 2), what="run 2")
        assert t["status"]["phase"] == "Completed", t["status"]
        assert t["spec"]["run"] == 2 and t["spec"]["objective"] == "say hello properly"
        assert t["spec"]["budgetUSD"] == "1.05", t["spec"]
        # Iterations count from 0 again; spend is the sum of both runs.
        assert t["status"]["iteration"] == 2, t["status"]
        assert t["status"]["tokensConsumed"] == 2 * first_tokens, t["status"]
        assert t["status"]["costUSD"] in ("0.144", "0.1440"), (first_cost, t["status"])
        out = wait(lambda: (lambda o: o if "· run 2" in o and "✅ Completed" in o else None)(
            thread(srv, REF)), what="sticky run 2")
        assert len(stickies(srv, REF)) == 1, out
        log = srv.cli("task", "logs", NAME, "-n", NS).stdout
        assert "run 2 requested" in log, log
        assert git("--git-dir", bare, "log", "-1", "--format=%s", "feature").startswith(
            "fix(fix-pr-12): ")

        # The CLI: resume refused (exit 1, says rerun), rerun starts run 3.
        r = srv.cli("task", "resume", NAME, "-n", NS)
        assert r.returncode == 1, r
        assert "is finished" in r.stderr and "diverge task rerun" in r.stderr, r.stderr
        assert "/diverge fix" in r.stderr, r.stderr  # SPEC §14: the bot's message
        r = srv.cli("task", "rerun", NAME, "-n", NS, "--objective", "third time")
        assert r.returncode == 0, r
        assert "run 3 started" in r.stdout, r.stdout
        t = wait(lambda: done(srv, 3), what="run 3")
        assert t["status"]["phase"] == "Completed", t["status"]
        assert t["status"]["tokensConsumed"] >= 3 * first_tokens, t["status"]
        # A lower spec.run is refused.
        st, _, body = srv.request("PATCH", API + "/namespaces/%s/agenttasks/%s" % (NS, NAME),
                                  {"spec": {"run": 1}},
                                  headers={"Content-Type": "application/merge-patch+json"})
        assert st == 422 and "spec.run" in body["error"], (st, body)
    shutil.rmtree(top, ignore_errors=True)


def test_github_fix_reruns_and_resume_is_refused():
    gh = new_fake()
    path = API + "/namespaces/octo-repo/agenttasks/fix-pr-7"
    try:
        with Server(server_args(gh), env=server_env()) as srv:
            def say(body, cid=[100]):
                cid[0] += 1
                c = gh.add_comment("octo/repo", 7, user="alice", body=body)
                st, _, _ = deliver(srv, comment_payload("octo/repo", 7, c["id"], body))
                assert st == 202, st
                return c["id"]

            def task():
                st, _, b = srv.request("GET", path)
                return b if st == 200 else None

            say("/diverge fix the flaky test")
            wait(lambda: (task() or {}).get("status", {}).get("phase") == "Active",
                 what="Active")
            # The external agent is done: the task is finished.
            st, _, _ = srv.request("PATCH", path + "/status",
                                   {"status": {"phase": "Completed"}},
                                   headers={"Content-Type": "application/merge-patch+json"})
            assert st == 200
            cid = say("/diverge resume")
            wait(lambda: any("nothing to resume" in c["body"] for c in gh.comments("octo/repo", 7)
                             if c["user"]["login"] == BOT), what="resume refusal")
            assert gh.reactions(cid) == []
            cid = say("/diverge fix the flaky test, for real")
            t = wait(lambda: (lambda t: t if t and t["status"].get("run") == 2 and
                              t["status"]["phase"] == "Active" else None)(task()), what="run 2")
            assert t["spec"]["run"] == 2 and t["status"]["iteration"] == 0, t
            wait(lambda: gh.reactions(cid), what="+1")
            wait(lambda: any(c["body"].startswith("<!-- diverge-agent-task -->") and
                             "· run 2" in c["body"] for c in gh.comments("octo/repo", 7)),
                 what="sticky run 2")
    finally:
        gh.stop()


if __name__ == "__main__":
    run_tests([test_local_fix_reruns_a_finished_task,
               test_github_fix_reruns_and_resume_is_refused])
