# SPDX-License-Identifier: Apache-2.0
"""The sticky status comment (SPEC §6) against the fake GitHub: one comment per task,
edited in place at each phase, never duplicated (lost responses, lost database rows, a
marker comment on page 3 of a 250-comment thread), adopting an older version's marker
comment, retried through rate limits and 500s,
re-created when a human deleted it; and the offline `diverge local` walk-through."""
import json
import os
import sqlite3
import time

from github_helpers import BOT, new_fake, server_env, wait
from harness import API, Server, run_tests

NS = API + "/namespaces/octo-repo/agenttasks"
MARKER = "<!-- diverge-agent-task -->"
# agent-sandbox is not built here: the controller leaves phases alone, so the test moves
# the task through its phases by hand with status patches.
ARGS = ["--sandbox-provider", "agent-sandbox", "--notifier-min-interval", "1"]


def args(gh, *extra):
    return ARGS + ["--github-api-url", gh.url] + list(extra)


def make_task(srv, name="fix-pr-7", number=7):
    obj = {"apiVersion": "divergedev.com/v1alpha1", "kind": "AgentTask",
           "metadata": {"name": name, "annotations": {
               "divergedev.com/provider": "github", "divergedev.com/project": "octo/repo",
               "divergedev.com/pr-number": str(number)}},
           "spec": {"objective": "fix the N+1 query", "budgetUSD": "5.00",
                    "budgetTokens": 200000, "maxIterations": 8,
                    "repository": {"url": "https://github.com/octo/repo.git",
                                   "workingBranch": "feature-x"}}}
    st, _, b = srv.request("POST", NS, obj)
    assert st == 201, b
    return b


def set_status(srv, name, **status):
    st, _, b = srv.request("PATCH", NS + "/" + name + "/status", {"status": status},
                           headers={"Content-Type": "application/merge-patch+json"})
    assert st == 200, b
    return b


def stickies(gh, number=7):
    return [c for c in gh.comments("octo/repo", number)
            if c["user"]["login"] == BOT and c["body"].startswith(MARKER)]


def test_one_comment_edited_at_each_phase():
    gh = new_fake()
    try:
        with Server(args(gh), env=server_env()) as srv:
            make_task(srv)
            wait(lambda: stickies(gh), what="sticky comment")
            badges = [("Provisioning", "Running"), ("Active", "Running"),
                      ("Paused", "Paused"), ("Active", "Running"), ("Completed", "Completed")]
            for phase, badge in badges:
                set_status(srv, "fix-pr-7", phase=phase,
                           reason="Suspended" if phase == "Paused" else "")
                wait(lambda: badge in stickies(gh)[0]["body"] and
                     ("Paused" in stickies(gh)[0]["body"]) == (phase == "Paused"),
                     what="badge " + badge)
            # The preview links appear with status.previewUrl.
            set_status(srv, "fix-pr-7", previewUrl="https://preview.test/?_diverge_env=agent-preview-fix-pr-7")
            wait(lambda: "_diverge_env=clear" in stickies(gh)[0]["body"], what="preview links")
            body = stickies(gh)[0]["body"]
            assert "https://preview.test/?_diverge_env=agent-preview-fix-pr-7" in body, body
            # Spend shows up (throttled, but within the interval).
            set_status(srv, "fix-pr-7", tokensConsumed=4500, costUSD="0.0675")
            wait(lambda: "0.0675" in stickies(gh)[0]["body"], what="spend")
            time.sleep(1.5)
            assert len(stickies(gh)) == 1, stickies(gh)
            posts = gh.find_requests("POST", r"/issues/7/comments$")
            assert len(posts) == 1, posts
            patches = gh.find_requests("PATCH", r"/issues/comments/\d+$")
            bodies = [p["body"]["body"] for p in patches]
            assert len(patches) >= 5, len(patches)
            # No redundant edit: every PATCH changed the body.
            first = posts[0]["body"]["body"]
            prev = first
            for b in bodies:
                assert b != prev, "redundant PATCH"
                prev = b
            # Nothing more is sent once nothing changes.
            n = len(gh.requests)
            time.sleep(1.5)
            assert len([r for r in gh.requests[n:] if r["method"] != "GET"]) == 0
    finally:
        gh.stop()


def test_lost_response_and_lost_row_never_duplicate():
    gh = new_fake()
    try:
        srv = Server(args(gh), env=server_env()).start()
        try:
            # The create reaches GitHub but the answer is lost (like a crash between
            # "created at the SCM" and "id stored"): the retry adopts it.
            rule = gh.inject("POST", r"/issues/7/comments$", status=502, apply=True)
            make_task(srv)
            wait(lambda: rule.hits == 1 and len(gh.find_requests("POST", r"/comments$")) >= 1,
                 what="lost create")
            set_status(srv, "fix-pr-7", phase="Active")
            wait(lambda: stickies(gh) and "Running" in stickies(gh)[0]["body"], what="edit")
            assert len(stickies(gh)) == 1, stickies(gh)
            srv.kill()
            # Lose the database row of the sticky comment, then restart.
            db = sqlite3.connect(os.path.join(srv.data_dir, "diverge.db"))
            db.execute("DELETE FROM sticky")
            db.commit()
            db.close()
            srv2 = Server(args(gh), env=server_env(), data_dir=srv.data_dir).start()
            try:
                set_status(srv2, "fix-pr-7", phase="Paused", reason="Suspended")
                wait(lambda: "Paused" in stickies(gh)[0]["body"], what="adopted edit")
                time.sleep(0.5)
                assert len(stickies(gh)) == 1, stickies(gh)
                # One create ever reached GitHub (the one whose answer was lost).
                assert len(gh.find_requests("POST", r"/issues/7/comments$")) == 1
            finally:
                srv2.stop()
        finally:
            srv.cleanup()
    finally:
        gh.stop()


def test_marker_on_page_three_is_found():
    gh = new_fake()
    try:
        tag = "<!-- diverge-task: octo-repo/fix-pr-7 -->"
        for i in range(250):
            if i == 240:
                gh.add_comment("octo/repo", 7, user=BOT, body=MARKER + "\n" + tag + "\nold")
            else:
                gh.add_comment("octo/repo", 7, user="someone", body="comment %d" % i)
        with Server(args(gh), env=server_env()) as srv:
            make_task(srv)
            wait(lambda: "old" not in stickies(gh)[0]["body"], what="adopted page-3 comment")
            pages = gh.find_requests("GET", r"/comments$")
            assert len(pages) >= 3, [p["raw_query"] for p in pages]
            assert gh.find_requests("POST", r"/issues/7/comments$") == []
            assert len(stickies(gh)) == 1
    finally:
        gh.stop()


def test_legacy_marker_comment_is_adopted():
    """A marker comment of the bot that names no task (an older version's, or another
    deployment's) is adopted; later ones like it are folded; one naming another task, and
    marker comments by anyone else, are left alone."""
    gh = new_fake()
    try:
        gh.add_comment("octo/repo", 7, user="someone", body=MARKER + "\nplanted, no task")
        other = gh.add_comment("octo/repo", 7, user=BOT, body=MARKER +
                               "\n<!-- diverge-task: octo-repo/fix-pr-9 -->\nother task")
        legacy = gh.add_comment("octo/repo", 7, user=BOT, body=MARKER + "\n\nold status")
        dup = gh.add_comment("octo/repo", 7, user=BOT, body=MARKER + "\nolder format")
        with Server(args(gh), env=server_env()) as srv:
            make_task(srv)
            wait(lambda: "diverge-task: octo-repo/fix-pr-7" in gh.comment(legacy["id"])["body"],
                 what="legacy comment adopted")
            wait(lambda: gh.find_requests("DELETE", r"/issues/comments/%d$" % dup["id"]),
                 what="second legacy comment folded")
            set_status(srv, "fix-pr-7", phase="Active")
            wait(lambda: "Running" in gh.comment(legacy["id"])["body"], what="adopted edit")
            assert gh.find_requests("POST", r"/issues/7/comments$") == []
            assert "other task" in gh.comment(other["id"])["body"]
            deleted = [r["path"] for r in gh.find_requests("DELETE")]
            assert deleted == ["/repos/octo/repo/issues/comments/%d" % dup["id"]], deleted
            assert [c["user"]["login"] for c in gh.comments("octo/repo", 7)] == \
                ["someone", BOT, BOT]
    finally:
        gh.stop()


def test_own_task_line_is_preferred_over_legacy():
    gh = new_fake()
    try:
        legacy = gh.add_comment("octo/repo", 7, user=BOT, body=MARKER + "\nlegacy")
        own = gh.add_comment("octo/repo", 7, user=BOT, body=MARKER +
                             "\n<!-- diverge-task: octo-repo/fix-pr-7 -->\nmine")
        with Server(args(gh), env=server_env()) as srv:
            make_task(srv)
            wait(lambda: "mine" not in gh.comment(own["id"])["body"], what="own comment adopted")
            time.sleep(0.5)
            assert gh.comment(legacy["id"])["body"] == MARKER + "\nlegacy"
            assert gh.find_requests("POST", r"/issues/7/comments$") == []
            assert gh.find_requests("DELETE") == []
    finally:
        gh.stop()


def test_rate_limits_errors_and_human_deletion():
    gh = new_fake()
    try:
        with Server(args(gh), env=server_env()) as srv:
            r403 = gh.inject("POST", r"/issues/7/comments$", status=403,
                             headers={"Retry-After": "2"}, times=1)
            r500 = gh.inject("GET", r"/issues/7/comments$", status=500, times=2)
            t0 = time.time()
            make_task(srv)
            wait(lambda: stickies(gh), timeout=30, what="sticky after 403 and 500s")
            assert r403.hits == 1 and r500.hits == 2
            assert time.time() - t0 >= 2.0  # Retry-After honoured
            # A human deletes it: the next edit (404) makes a new one.
            cid = stickies(gh)[0]["id"]
            gh.request_delete = None
            import urllib.request
            req = urllib.request.Request(gh.url + "/repos/octo/repo/issues/comments/%d" % cid,
                                         method="DELETE",
                                         headers={"Authorization": "Bearer ghp_testtoken",
                                                  "User-Agent": "test"})
            urllib.request.urlopen(req).read()
            assert stickies(gh) == []
            set_status(srv, "fix-pr-7", phase="Active")
            wait(lambda: stickies(gh), timeout=20, what="re-created sticky")
            assert stickies(gh)[0]["id"] != cid
            assert len(stickies(gh)) == 1
    finally:
        gh.stop()


def test_local_walkthrough():
    with Server(["--sandbox-provider", "none", "--notifier-min-interval", "1"],
                env={"GITHUB_TOKEN": None, "DIVERGE_NOTIFIER_TOKEN": None}) as srv:
        r = srv.cli("local", "comment", "octo/demo#1", "/diverge fix the flaky login test",
                    "--as", "alice")
        assert r.returncode == 0, r
        assert "comment" in r.stdout
        st, _, b = srv.request("GET", API + "/namespaces/octo-demo/agenttasks/fix-pr-1")

        def thread():
            r = srv.cli("local", "thread", "octo/demo#1")
            assert r.returncode == 0, r
            return r.stdout

        def stickies():
            r = srv.cli("local", "thread", "octo/demo#1", "-o", "json")
            assert r.returncode == 0, r
            return [c for c in json.loads(r.stdout)["comments"]
                    if c["body"].startswith(MARKER)]

        wait(lambda: len(stickies()) == 1 and "Running" in thread(), what="sticky in thread")
        out = thread()
        assert "alice" in out and "[+1]" in out, out
        # Read as on the PR page: no marker comments, no zero-width characters.
        assert "<!--" not in out and "\u200b" not in out and "\u200d" not in out, out
        r = srv.cli("local", "comment", "octo/demo#1", "/diverge pause", "--as", "alice")
        assert r.returncode == 0
        wait(lambda: "Paused" in thread(), what="sticky edited to Paused")
        assert len(stickies()) == 1
        r = srv.cli("local", "comment", "octo/demo#1", "/diverge budget +$5", "--as", "bob",
                    "--permission", "write")
        wait(lambda: "maintain" in thread(), what="refusal for bob")
        r = srv.cli("local", "thread", "octo/demo#1", "-o", "json")
        assert r.returncode == 0 and '"comments"' in r.stdout
        assert srv.cli("local", "thread", "nonsense").returncode == 2
        assert srv.cli("local", "comment", "a/b#0", "x").returncode == 2


if __name__ == "__main__":
    run_tests([test_one_comment_edited_at_each_phase,
               test_lost_response_and_lost_row_never_duplicate, test_marker_on_page_three_is_found,
               test_legacy_marker_comment_is_adopted, test_own_task_line_is_preferred_over_legacy,
               test_rate_limits_errors_and_human_deletion, test_local_walkthrough])
