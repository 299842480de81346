# SPDX-License-Identifier: Apache-2.0
"""The GitHub slash-command bot end to end (SPEC §5): signed deliveries into the real
`diverge serve`, the durable inbox, the bot worker, and the outbox calling the fake GitHub
REST server: 202, task made with the right spec/annotations, +1 reaction; duplicates;
bad signatures; permission tiers (a forged author_association cannot beat `read`);
replies for help, status and refusals; SCM failures retried."""
import json
import os
import time

from github_helpers import (BOT, SECRET, comment_payload, deliver, fixture_bytes, new_fake,
                            server_args, server_env, sign, wait)
from harness import API, Server, run_tests

NS = API + "/namespaces/octo-repo/agenttasks"



def comment_annotations(t):
    """The task's annotations but the one the controller writes when it starts the task
    (the sandbox provider): what a comment could have changed."""
    ann = dict(t["metadata"].get("annotations") or {})
    ann.pop("divergedev.com/sandbox-provider", None)
    return ann

def post_comment(gh, srv, body, user="alice", association="CONTRIBUTOR", number=7, **kw):
    c = gh.add_comment("octo/repo", number, user=user, body=body)
    payload = comment_payload("octo/repo", number, c["id"], body, user=user,
                              association=association, **kw)
    st, _, ans = deliver(srv, payload)
    return c["id"], st, ans, payload


def task(srv, name="fix-pr-7"):
    st, _, b = srv.request("GET", NS + "/" + name)
    return b if st == 200 else None


MARKER = "<!-- diverge-agent-task -->"


def replies(gh, number=7):
    """The bot's reply comments (its sticky status comment is not a reply)."""
    return [c for c in gh.comments("octo/repo", number)
            if c["user"]["login"] == BOT and not c["body"].startswith(MARKER)]


def test_signature_and_events():
    gh = new_fake()
    try:
        with Server(server_args(gh), env=server_env()) as srv:
            body = comment_payload("octo/repo", 7, 1, "/diverge help")
            assert deliver(srv, body, signature="sha256=" + "0" * 64)[0] == 401
            assert deliver(srv, body, signature=False)[0] == 401
            assert deliver(srv, body, secret="wrong")[0] == 401
            st, _, _ = srv.request("GET", "/metrics", auth=False)
            # ping -> 200; other events and actions -> 204
            assert deliver(srv, fixture_bytes("ping.repository.octokit.json"), "ping")[0] == 200
            assert deliver(srv, fixture_bytes("issue_comment.created.octokit.json"))[0] == 204
            assert deliver(srv, comment_payload("octo/repo", 7, 2, "/diverge help",
                                                action="edited"))[0] == 204
            assert deliver(srv, comment_payload("octo/repo", 7, 3, "/diverge help",
                                                pull=False))[0] == 204
            assert deliver(srv, b"{}", "push")[0] == 204
            # no command at all: acknowledged without processing
            assert deliver(srv, comment_payload("octo/repo", 7, 4, "LGTM"))[0] == 204
            # bots are ignored
            assert deliver(srv, comment_payload("octo/repo", 7, 5, "/diverge help",
                                                user="ci[bot]", user_type="Bot"))[0] == 204
            # malformed JSON (signed) -> 400, with or without a command in it
            st, _, b = deliver(srv, b"{\"action\": ")
            assert st == 400 and b["reason"] == "BadRequest", b
            st, _, b = deliver(srv, b"{\"comment\": \"/diverge fix\", ")
            assert st == 400 and b["reason"] == "BadRequest", b
            st, _, b = deliver(srv, b"{\"comment\": \"\xff\xfe\"}")
            assert st == 400, b
            st, _, b = deliver(srv, json.dumps({"action": "created", "issue": {"number": 7,
                               "pull_request": {}}, "comment": {"id": 9, "body": "/diverge x"},
                               "repository": {"full_name": "octo/repo"}}).encode())
            assert st == 400
            # Missing fields -> 400 without a command too (SPEC §5): read as a command's is.
            no_login = {"action": "created", "issue": {"number": 7, "pull_request": {}},
                        "comment": {"id": 9, "body": "LGTM"},
                        "repository": {"full_name": "octo/repo"}}
            for bad in (b"{}", b'{"action": "created"}', json.dumps(no_login).encode()):
                st, _, b = deliver(srv, bad)
                assert st == 400 and b["reason"] == "BadRequest", (bad, st, b)
            # 25 MiB cap
            big = b"{\"x\":\"" + b"a" * (26 * 1024 * 1024) + b"\"}"
            assert deliver(srv, big)[0] == 413
            # nothing was stored by any of the above
            time.sleep(0.3)
            assert gh.find_requests("POST") == [], gh.find_requests("POST")
        # No secret configured: 503.
        with Server(["--github-api-url", gh.url], env=server_env()) as srv:
            assert deliver(srv, comment_payload("octo/repo", 7, 1, "/diverge help"))[0] == 503
        # Rotation: the fixture signed with GitHub's documented test secret verifies.
        doc_secret = "It's a Secret to Everybody"
        with Server(["--github-webhook-secret", "old-one," + doc_secret,
                     "--github-api-url", gh.url], env=server_env()) as srv:
            raw = fixture_bytes("issue_comment.created.pr.atlantis.json")
            sigs = dict(l.split(" ", 1) for l in
                        open(os.path.join(os.path.dirname(__file__), "..", "fixtures", "github",
                                          "SIGNATURES.txt")).read().splitlines()
                        if l and not l.startswith("#"))
            sig = sigs["issue_comment.created.pr.atlantis.json"].strip()
            st, _, _ = deliver(srv, raw, signature=sig)
            assert st == 204, st  # a real PR comment without a command
            assert sign(raw, doc_secret) == sig
    finally:
        gh.stop()


def test_fix_creates_task_reacts_and_dedups():
    gh = new_fake()
    gh.set_file("octo/repo", ".diverge/agent.yaml",
                'version: "1"\nagent:\n  budgetUSD: "7.50"\n  budgetTokens: 300000\n'
                '  maxIterations: 4\n  capabilities: ["claude-*"]\n')  # on the base, main
    try:
        with Server(server_args(gh), env=server_env()) as srv:
            cid, st, ans, payload = post_comment(gh, srv, "/diverge fix the N+1 query in checkout")
            assert st == 202 and ans == {"accepted": True}, (st, ans)
            t = wait(lambda: task(srv), what="task fix-pr-7")
            md, spec = t["metadata"], t["spec"]
            assert md["namespace"] == "octo-repo"
            assert md["annotations"]["divergedev.com/provider"] == "github"
            assert md["annotations"]["divergedev.com/project"] == "octo/repo"
            assert md["annotations"]["divergedev.com/pr-number"] == "7"
            assert spec["objective"] == "the N+1 query in checkout"
            assert spec["repository"]["workingBranch"] == "feature-x"
            assert spec["repository"]["baseBranch"] == "feature-x"
            assert spec["repository"]["url"].endswith("octo/repo.git"), spec
            assert spec["budgetUSD"] == "7.50" and spec["budgetTokens"] == 300000
            assert spec["maxIterations"] == 4 and spec["capabilities"] == ["claude-*"]
            wait(lambda: gh.reactions(cid), what="+1 reaction")
            assert [r["content"] for r in gh.reactions(cid)] == ["+1"]
            # The same delivery again, and the same comment under a new delivery id.
            # (The controller may still be writing status: compare what comments change.)
            before = (task(srv)["spec"], comment_annotations(task(srv)))
            # Same comment, new delivery id (a redelivery): a duplicate by comment id.
            st, _, ans = deliver(srv, payload, delivery="dup-1")
            assert st == 200 and ans == {"duplicate": True}, (st, ans)
            # Same delivery id again.
            st, _, ans = deliver(srv, payload, delivery="dup-1")
            assert st == 200 and ans == {"duplicate": True}, (st, ans)
            time.sleep(0.5)
            assert len(gh.reactions(cid)) == 1
            assert (task(srv)["spec"], comment_annotations(task(srv))) == before
            # Every outbound call carried our User-Agent and the token.
            for r in gh.requests:
                assert r["headers"].get("user-agent", "").startswith("diverge/"), r
            # fix again: the objective changes, no second task.
            cid2, st, _, _ = post_comment(gh, srv, "/diverge fix also the cache")
            wait(lambda: task(srv)["spec"]["objective"] == "also the cache", what="objective")
    finally:
        gh.stop()


def test_permission_tiers_and_forged_association():
    gh = new_fake()
    try:
        with Server(server_args(gh), env=server_env()) as srv:
            post_comment(gh, srv, "/diverge fix it")
            wait(lambda: task(srv), what="task")
            budget = task(srv)["spec"]["budgetUSD"]
            # bob has read; his payload claims OWNER: budget needs maintain, from the API.
            cid, st, _, _ = post_comment(gh, srv, "/diverge budget +$10", user="bob",
                                         association="OWNER")
            assert st == 202
            r = wait(lambda: [c for c in replies(gh) if "@bob" in c["body"]], what="refusal")
            assert "maintain" in r[0]["body"] and "read" in r[0]["body"], r[0]["body"]
            assert task(srv)["spec"]["budgetUSD"] == budget
            assert gh.reactions(cid) == []
            assert gh.find_requests("GET", r"/collaborators/bob/permission")
            # bob cannot pause either (write needed); dave (triage) neither.
            post_comment(gh, srv, "/diverge pause", user="dave")
            wait(lambda: [c for c in replies(gh) if "@dave" in c["body"]], what="dave refusal")
            assert task(srv)["spec"].get("suspended") is not True
            # carol (maintain) may add budget: effective 5.00 + 10 = 15.00.
            cid, st, _, _ = post_comment(gh, srv, "/diverge budget +$10 2M", user="carol")
            wait(lambda: task(srv)["spec"]["budgetUSD"] == "15.00", what="budget bump")
            assert task(srv)["spec"]["budgetTokens"] == 3000000
            wait(lambda: gh.reactions(cid), what="carol's +1")
            # alice (write) pauses, guides and resumes without amounts.
            post_comment(gh, srv, "/diverge pause\n/diverge guide look at the ORM")
            wait(lambda: task(srv)["spec"].get("suspended") is True, what="pause")
            assert task(srv)["metadata"]["annotations"]["divergedev.com/guidance"] == \
                "look at the ORM"
            post_comment(gh, srv, "/diverge resume")
            wait(lambda: task(srv)["spec"].get("suspended") is False, what="resume")
            # resume WITH amounts needs maintain: alice is refused.
            post_comment(gh, srv, "/diverge resume +$5")
            wait(lambda: [c for c in replies(gh) if "@alice" in c["body"] and
                          "maintain" in c["body"]], what="alice refusal")
    finally:
        gh.stop()


def test_help_status_errors_and_no_task():
    gh = new_fake()
    try:
        with Server(server_args(gh), env=server_env()) as srv:
            post_comment(gh, srv, "/diverge help", user="bob")
            r = wait(lambda: replies(gh), what="help reply")
            assert "| Command" in r[0]["body"] or "|" in r[0]["body"], r[0]["body"]
            assert "/diverge fix" in r[0]["body"]
            post_comment(gh, srv, "/diverge pause")
            wait(lambda: len(replies(gh)) >= 2, what="no-task reply")
            assert "fix" in replies(gh)[1]["body"] and "no task" in replies(gh)[1]["body"]
            post_comment(gh, srv, "/diverge budget +abc", user="carol")
            wait(lambda: len(replies(gh)) >= 3, what="parse error reply")
            assert '`+abc`' in replies(gh)[2]["body"], replies(gh)[2]["body"]
            post_comment(gh, srv, "/diverge fix the bug")
            wait(lambda: task(srv), what="task")
            post_comment(gh, srv, "/diverge status", user="bob")
            wait(lambda: len(replies(gh)) >= 4, what="status reply")
            assert "fix-pr-7" in replies(gh)[3]["body"], replies(gh)[3]["body"]
            # Its status-comment link, once the sticky comment exists.
            sticky = wait(lambda: [c for c in gh.comments("octo/repo", 7)
                                   if c["body"].startswith(MARKER)], what="sticky")
            post_comment(gh, srv, "/diverge status", user="bob")
            wait(lambda: len(replies(gh)) >= 5, what="second status reply")
            assert "#issuecomment-%d" % sticky[0]["id"] in replies(gh)[4]["body"], \
                replies(gh)[4]["body"]
            # Replies of the bot itself (our login) and sticky comments are never commands.
            before = len(replies(gh))
            post_comment(gh, srv, "/diverge help", user=BOT)  # itself a comment by the bot
            post_comment(gh, srv, "<!-- diverge-agent-task -->\n/diverge help", user="alice")
            time.sleep(1.0)
            assert len(replies(gh)) == before + 1, replies(gh)
    finally:
        gh.stop()


def test_outbox_retries_scm_failures():
    gh = new_fake()
    try:
        with Server(server_args(gh), env=server_env()) as srv:
            rule = gh.inject("POST", r"/reactions$", status=500, times=2)
            rule2 = gh.inject("POST", r"/issues/\d+/comments$", status=403,
                              headers={"Retry-After": "1"},
                              body={"message": "You have exceeded a secondary rate limit"},
                              times=1)
            cid, st, _, _ = post_comment(gh, srv, "/diverge fix it\n/diverge help")
            wait(lambda: gh.reactions(cid), timeout=20, what="reaction after two 500s")
            assert rule.hits == 2
            t0 = time.time()
            wait(lambda: replies(gh), timeout=20, what="reply after the secondary limit")
            assert rule2.hits == 1
            # The 403 hit the reply or the sticky comment (separate outbox lanes): that call
            # was retried no earlier than Retry-After said.
            posts = gh.find_requests("POST", r"/issues/\d+/comments$")
            hit = [p for p in posts if p["injected"]]
            sticky = hit and hit[0]["body"]["body"].startswith(MARKER)
            wait(lambda: [p for p in gh.find_requests("POST", r"/issues/\d+/comments$")
                          if p["body"]["body"].startswith(MARKER) == sticky
                          and not p["injected"]], what="the retried call")
            again = [p for p in gh.find_requests("POST", r"/issues/\d+/comments$")
                     if p["body"]["body"].startswith(MARKER) == sticky and not p["injected"]]
            assert len(hit) == 1 and again[0]["time"] - hit[0]["time"] >= 0.9, posts
            # The permission API failing makes the comment wait, not vanish.
            gh.inject("GET", r"/collaborators/", status=502, times=2)
            cid, st, _, _ = post_comment(gh, srv, "/diverge budget +$1", user="carol")
            wait(lambda: task(srv)["spec"]["budgetUSD"] == "6.00", timeout=20,
                 what="budget after permission API recovered")
    finally:
        gh.stop()


def test_restart_applies_pending_comments_once():
    gh = new_fake()
    try:
        srv = Server(server_args(gh), env=server_env()).start()
        try:
            # GitHub unreachable while the comment arrives: accepted, then pending.
            gh.inject("GET", r"/pulls/7$", status=503, times=None)
            cid, st, _, payload = post_comment(gh, srv, "/diverge fix after restart")
            assert st == 202
            time.sleep(0.5)
            srv.kill()
            gh.clear_injections()
            srv2 = Server(server_args(gh), env=server_env(), data_dir=srv.data_dir).start()
            try:
                wait(lambda: task(srv2), what="task after restart")
                wait(lambda: gh.reactions(cid), what="reaction after restart")
                assert deliver(srv2, payload)[0] == 200  # still a duplicate after restart
                time.sleep(0.5)
                assert len(gh.reactions(cid)) == 1
            finally:
                srv2.stop()
        finally:
            srv.cleanup()
    finally:
        gh.stop()


def test_concurrent_deliveries_group_commit_once_each():
    import concurrent.futures
    gh = new_fake()
    try:
        with Server(server_args(gh), env=server_env()) as srv:
            # "/diverge" mid-line: stored (it passes the cheap filter) but holds no command.
            bodies = [comment_payload("octo/repo", 7, 5000 + i, "thanks, see /diverge docs")
                      for i in range(40)]
            work = [(b, "d-%d" % i) for i, b in enumerate(bodies)] + \
                   [(b, "r-%d" % i) for i, b in enumerate(bodies)]
            with concurrent.futures.ThreadPoolExecutor(max_workers=32) as ex:
                results = list(ex.map(lambda bd: deliver(srv, bd[0], delivery=bd[1]), work))
            codes = sorted(r[0] for r in results)
            assert codes.count(202) == 40 and codes.count(200) == 40, codes
            st, _, m = srv.request("GET", "/metrics", auth=False)
            assert st == 200
    finally:
        gh.stop()


if __name__ == "__main__":
    run_tests([test_signature_and_events, test_fix_creates_task_reacts_and_dedups,
               test_permission_tiers_and_forged_association, test_help_status_errors_and_no_task,
               test_outbox_retries_scm_failures, test_restart_applies_pending_comments_once,
               test_concurrent_deliveries_group_commit_once_each])
