# SPDX-License-Identifier: Apache-2.0
"""GitLab merge requests end to end (SPEC §5, issue 10) against the fake GitLab API: the
webhook's token and Standard Webhooks authentication, Note Hook processing rules, the two
real payloads, deduplication, access levels, the task, the award and the replies."""
import json
import socket
import time

from gitlab_helpers import (ATLANTIS_FIXTURE, BOT, DOCS_FIXTURE, HOOK_TOKEN, NS, PROJECT,
                            deliver, deliver_signed, note_from, fixture_bytes, get_task, new_fake,
                            note_payload, replies, server_args, server_env, stickies, wait,
                            whsec)
from harness import Server, run_tests


def post(gl, srv, body, user="alice", with_id=True, **kw):
    payload, note_id = note_from(gl, body, user=user, with_id=with_id, **kw)
    st, _, ans = deliver(srv, payload)
    return note_id, st, ans


def test_fix_end_to_end():
    gl = new_fake()
    # agent.yaml from the TARGET branch; the source branch's copy (the MR author's) is
    # never read.
    gl.set_file(PROJECT, "main", ".diverge/agent.yaml",
                'version: "1"\nagent:\n  budgetUSD: "7.50"\n  budgetTokens: 300000\n')
    gl.set_file(PROJECT, "feature-x", ".diverge/agent.yaml",
                'version: "1"\nagent:\n  budgetUSD: "999.00"\n')
    try:
        with Server(server_args(gl), env=server_env()) as srv:
            payload, note_id = note_from(gl, "/diverge fix the flaky test")
            st, _, ans = deliver(srv, payload, event_uuid="uuid-fix-1")
            assert st == 202 and ans == {"accepted": True}, (st, ans)
            t = wait(lambda: get_task(srv), what="task fix-mr-7")
            ann = t["metadata"]["annotations"]
            assert ann["divergedev.com/provider"] == "gitlab", ann
            assert ann["divergedev.com/project"] == PROJECT, ann
            assert ann["divergedev.com/mr-iid"] == "7", ann
            spec = t["spec"]
            assert spec["objective"] == "the flaky test", spec
            assert spec["repository"]["workingBranch"] == "feature-x", spec
            assert spec["repository"]["url"] == "https://gitlab.example/%s.git" % PROJECT, spec
            assert spec["budgetUSD"] == "7.50" and spec["budgetTokens"] == 300000, spec
            wait(lambda: (note_id, "thumbsup", BOT) in gl.awards, what="thumbsup award")
            wait(lambda: stickies(gl), what="sticky note")
            # The project id is ONE encoded segment; the file path too; ref is the target.
            files = gl.requests("GET", r"/repository/files/")
            assert files and all(
                "/projects/group%2Fsub%2Fproject/repository/files/.diverge%2Fagent.yaml/raw?ref=main"
                in q["path"] for q in files), [q["path"] for q in files]
            # Calls made for the delivery carry its X-Gitlab-Event-UUID.
            award = gl.requests("POST", r"/award_emoji$")
            assert award[0]["headers"].get("X-Gitlab-Event-UUID") == "uuid-fix-1", award[0]
            member = gl.requests("GET", r"/members/all/")
            assert member[0]["headers"].get("X-Gitlab-Event-UUID") == "uuid-fix-1", member[0]
            assert all(q["headers"].get("PRIVATE-TOKEN") == "glpat-test" for q in gl.log)
            # No note is ever a lone emoji (GitLab would make it an award).
            assert not [a for a in gl.awards if a[0] is None], gl.awards
    finally:
        gl.stop()


def test_duplicates_have_no_second_effect():
    gl = new_fake()
    try:
        with Server(server_args(gl), env=server_env()) as srv:
            payload, note_id = note_payload("/diverge help", user="alice",
                                            user_id=gl.users["alice"])
            st, _, _ = deliver(srv, payload, idem="idem-1")
            assert st == 202, st
            wait(lambda: replies(gl), what="help reply")
            # The same Idempotency-Key (a retried delivery) and the same note under another
            # delivery id are both duplicates.
            st, _, ans = deliver(srv, payload, idem="idem-1")
            assert st == 200 and ans == {"duplicate": True}, (st, ans)
            st, _, ans = deliver(srv, payload, idem="idem-2")
            assert st == 200 and ans == {"duplicate": True}, (st, ans)
            # webhook-id / X-Gitlab-Event-UUID without Idempotency-Key.
            p2, _ = note_payload("/diverge help", user="alice", user_id=gl.users["alice"])
            st, _, _ = deliver(srv, p2, event_uuid="same-uuid")
            assert st == 202, st
            p3, _ = note_payload("/diverge help", user="alice", user_id=gl.users["alice"])
            st, _, ans = deliver(srv, p3, event_uuid="same-uuid")
            assert st == 200 and ans == {"duplicate": True}, (st, ans)
            wait(lambda: len(replies(gl)) == 2, what="two help replies")
            time.sleep(0.5)
            assert len(replies(gl)) == 2, replies(gl)
    finally:
        gl.stop()


def test_auth_token_rotation_and_refusals():
    gl = new_fake()
    try:
        payload, _ = note_payload("/diverge help", user="alice", user_id=gl.users["alice"])
        with Server(["--sandbox-provider", "none"], env=server_env()) as srv:
            st, _, _ = deliver(srv, payload)
            assert st == 503, st
        args = server_args(gl)
        args[args.index(HOOK_TOKEN)] = "old-token," + HOOK_TOKEN
        with Server(args, env=server_env()) as srv:
            for tok in ("wrong", "", HOOK_TOKEN + "x", "old-token,"):
                st, _, ans = deliver(srv, payload, token=tok)
                assert st == 401, (tok, st, ans)
            st, _, _ = deliver(srv, payload, token=None)
            assert st == 401, st
            assert not gl.requests(), "no effect of a refused delivery"
            st, _, _ = deliver(srv, payload, token="old-token")
            assert st == 202, st
            p2, _ = note_payload("/diverge help", user="alice", user_id=gl.users["alice"])
            st, _, _ = deliver(srv, p2, token=HOOK_TOKEN)
            assert st == 202, st
            wait(lambda: len(replies(gl)) == 2, what="both rotated tokens accepted")
    finally:
        gl.stop()


def test_standard_webhooks_signatures():
    gl = new_fake()
    old, new = whsec(b"old-key-0123456789abcdef"), whsec(b"\x00\xffnew key bytes!")
    try:
        args = ["--sandbox-provider", "none", "--gitlab-url", gl.url,
                "--gitlab-signing-secret", old + "," + new, "--notifier-provider", "gitlab"]
        with Server(args, env=server_env()) as srv:
            body, _ = note_payload("/diverge help", user="alice", user_id=gl.users["alice"])
            st, _, _ = deliver_signed(srv, body, new)  # the rotated-in secret
            assert st == 202, st
            body2, _ = note_payload("/diverge help", user="alice", user_id=gl.users["alice"])
            st, _, _ = deliver_signed(srv, body2, old)  # the one being retired
            assert st == 202, st
            # Several signatures, one of them valid.
            body3, _ = note_payload("/diverge help", user="alice", user_id=gl.users["alice"])
            ts = int(time.time())
            from gitlab_helpers import sw_sign
            good = sw_sign(new, "msg_3", ts, body3)
            st, _, _ = deliver_signed(srv, body3, new, msg_id="msg_3", ts=ts,
                                      sigs="v1,AAAA" + good[5:] + " v1a,xyz " + good)
            assert st == 202, st
            # Stale and future timestamps, a wrong secret, a changed body, no signature.
            body4, _ = note_payload("/diverge help", user="alice", user_id=gl.users["alice"])
            for ts in (int(time.time()) - 301, int(time.time()) + 400):
                st, _, _ = deliver_signed(srv, body4, new, ts=ts)
                assert st == 401, (ts, st)
            st, _, _ = deliver_signed(srv, body4, whsec(b"someone else"))
            assert st == 401, st
            sig = sw_sign(new, "msg_5", int(time.time()), body4)
            st, _, _ = deliver_signed(srv, body4 + b" ", new, msg_id="msg_5", sigs=sig)
            assert st == 401, st
            st, _, _ = deliver(srv, body4, token=None)
            assert st == 401, st
            # The same webhook-id again is the same delivery.
            st, _, ans = deliver_signed(srv, body3, new, msg_id="msg_3")
            assert st == 200 and ans == {"duplicate": True}, (st, ans)
            wait(lambda: len(replies(gl)) == 3, what="three help replies")
        refused = False
        bad = Server(args[:4] + ["--gitlab-signing-secret", "not-a-whsec"], env=server_env())
        try:
            bad.start()
        except RuntimeError:
            refused = True  # the server refused to start
        finally:
            bad.cleanup()
        assert refused, "a malformed signing secret must be refused"
    finally:
        gl.stop()


def test_access_levels():
    gl = new_fake()
    try:
        with Server(server_args(gl), env=server_env()) as srv:
            # Reporter (20) cannot fix.
            _, st, _ = post(gl, srv, "/diverge fix it", user="bob")
            assert st == 202, st
            r = wait(lambda: replies(gl), what="refusal for the reporter")
            assert "Developer (30)" in r[0]["body"] and "Reporter (20)" in r[0]["body"], r
            assert get_task(srv) is None
            # Not a member (404): nothing either; the id comes from GET /users.
            _, st, _ = post(gl, srv, "/diverge fix it", user="mallory", with_id=False)
            assert st == 202, st
            wait(lambda: len(replies(gl)) == 2, what="refusal for a non-member")
            assert "no access (0)" in replies(gl)[1]["body"], replies(gl)[1]
            assert gl.requests("GET", r"/users\?username=mallory")
            assert get_task(srv) is None
            # Developer can fix, cannot budget +$5; Maintainer can.
            _, st, _ = post(gl, srv, "/diverge fix it", user="alice")
            t = wait(lambda: get_task(srv), what="task")
            _, st, _ = post(gl, srv, "/diverge budget +$5", user="alice")
            wait(lambda: len(replies(gl)) == 3, what="budget refusal")
            assert "Maintainer (40)" in replies(gl)[2]["body"], replies(gl)[2]
            assert get_task(srv)["spec"]["budgetUSD"] == t["spec"]["budgetUSD"]
            note_id, st, _ = post(gl, srv, "/diverge budget +$5", user="carol")
            wait(lambda: (note_id, "thumbsup", BOT) in gl.awards, what="maintainer budget")
    finally:
        gl.stop()


def test_colliding_namespace_task_is_not_touched():
    """group/sub/project and group/sub-project share the namespace group-sub-project: a
    command on the second project's MR !7 never changes the first project's fix-mr-7."""
    gl = new_fake()
    other = "group/sub-project"
    gl.add_project(other)
    gl.add_mr(other, 7, source="evil", target="main")
    gl.set_access(other, "eve", "owner")
    try:
        with Server(server_args(gl), env=server_env()) as srv:
            _, st, _ = post(gl, srv, "/diverge fix the cache", user="alice")
            before = wait(lambda: get_task(srv), what="task of group/sub/project")
            payload, note_id = note_from(gl, "/diverge budget +$5000\n/diverge fix run evil",
                                         user="eve", project=other)
            st, _, _ = deliver(srv, payload)
            assert st == 202, st
            wait(lambda: replies(gl, other, 7), what="refusal on the other project")
            after = get_task(srv)
            assert after["spec"] == before["spec"], (before["spec"], after["spec"])
            assert after["metadata"]["annotations"]["divergedev.com/project"] == PROJECT
            assert (note_id, "thumbsup", BOT) not in gl.awards
    finally:
        gl.stop()


def test_notifier_token_fallback():
    """DIVERGE_NOTIFIER_TOKEN is GitHub's too: GitLab uses it only when GitLab alone is
    configured, so a GitHub token never reaches a GitLab host."""
    gl = new_fake()
    env = dict(server_env(), DIVERGE_GITLAB_TOKEN=None, DIVERGE_NOTIFIER_TOKEN="glpat-test")
    try:
        both = server_args(gl, "--github-webhook-secret", "gh-secret")
        both.remove("--notifier-provider")
        both.remove("gitlab")
        with Server(both, env=env) as srv:
            _, st, _ = post(gl, srv, "/diverge help", user="alice")
            assert st == 202, st
            time.sleep(1.0)
            assert not gl.log, [q["path"] for q in gl.log]
        with Server(server_args(gl), env=env) as srv:  # --notifier-provider gitlab
            _, st, _ = post(gl, srv, "/diverge help", user="alice")
            wait(lambda: replies(gl), what="reply with the notifier token")
    finally:
        gl.stop()


def test_configured_tiers():
    gl = new_fake()
    try:
        with Server(server_args(gl, "--gitlab-min-access-fix", "reporter"),
                    env=server_env()) as srv:
            _, st, _ = post(gl, srv, "/diverge fix it", user="bob")
            wait(lambda: get_task(srv), what="a reporter may fix with the lower tier")
    finally:
        gl.stop()


def test_ignored_and_malformed_deliveries():
    gl = new_fake()
    try:
        with Server(server_args(gl), env=server_env()) as srv:
            uid = gl.users["alice"]
            cases = [note_payload("/diverge help", user_id=uid, action="update")[0],
                     note_payload("/diverge help", user_id=uid, noteable="Issue")[0],
                     note_payload("/diverge help", user_id=uid, noteable="Commit")[0],
                     note_payload("/diverge help", user_id=uid, system=True)[0],
                     note_payload("no command here", user_id=uid)[0]]
            for body in cases:
                st, _, _ = deliver(srv, body)
                assert st == 204, (st, body[:80])
            body, _ = note_payload("/diverge help", user_id=uid)
            for ev in ("Confidential Note Hook", "Push Hook", "Merge Request Hook"):
                st, _, _ = deliver(srv, body, event=ev)
                assert st == 204, (ev, st)
            # Missing event header, malformed JSON (with and without a command).
            st, _, _ = srv.request("POST", "/api/v1/webhooks/gitlab", body, auth=False,
                                   headers={"X-Gitlab-Token": HOOK_TOKEN})
            assert st == 400, st
            for bad in (b'{"object_kind": "note", "x": /diverge', b'{"a": 1', b"[1, 2"):
                st, _, _ = deliver(srv, bad)
                assert st == 400, (bad, st)
            # Names GitLab does not allow.
            for proj in ("a/../b", "-a/b", "a//b", "a/b.git", "a/b c", "a/%2e%2e/b"):
                body, _ = note_payload("/diverge help", project=proj, user_id=uid)
                st, _, ans = deliver(srv, body)
                assert st == 400, (proj, st, ans)
            body, _ = note_payload("/diverge help", user="al ice", user_id=uid)
            st, _, _ = deliver(srv, body)
            assert st == 400, st
            body, _ = note_payload("/diverge fix x", source="a..b", user_id=uid)
            st, _, _ = deliver(srv, body)
            assert st == 400, st
            # Missing fields -> 400 without a command too (SPEC §5).
            p = json.loads(note_payload("no command here", user_id=uid)[0])
            del p["merge_request"]
            for bad in (b"{}", json.dumps(p).encode()):
                st, _, _ = deliver(srv, bad)
                assert st == 400, (bad[:60], st)
            # The note id is required and the MR iid must be positive.
            p = json.loads(note_payload("/diverge help", user_id=uid)[0])
            p["merge_request"]["iid"] = -3
            st, _, _ = deliver(srv, json.dumps(p).encode())
            assert st == 400, st
            time.sleep(0.5)
            assert not gl.requests("POST"), "nothing was processed"
    finally:
        gl.stop()


def _head_only(srv, headers):
    """Sends only the head of a POST with a large declared body; returns the status line
    the server answered with before any body byte was sent."""
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    try:
        head = "POST /api/v1/webhooks/gitlab HTTP/1.1\r\nHost: x\r\nContent-Length: 5000000\r\n"
        head += "".join("%s: %s\r\n" % kv for kv in headers.items()) + "\r\n"
        s.sendall(head.encode())
        return s.recv(4096).split(b"\r\n", 1)[0].decode()
    finally:
        s.close()


def test_refused_before_the_body_and_size_cap():
    gl = new_fake()
    try:
        with Server(server_args(gl), env=server_env()) as srv:
            ev = {"X-Gitlab-Event": "Note Hook"}
            assert " 401 " in _head_only(srv, ev)
            assert " 401 " in _head_only(srv, dict(ev, **{"X-Gitlab-Token": "wrong"}))
            # Two token headers are refused rather than guessed between.
            s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
            s.sendall(("POST /api/v1/webhooks/gitlab HTTP/1.1\r\nHost: x\r\n"
                       "X-Gitlab-Event: Note Hook\r\nX-Gitlab-Token: wrong\r\n"
                       "X-Gitlab-Token: %s\r\nContent-Length: 2\r\n\r\n{}" % HOOK_TOKEN).encode())
            assert b" 401 " in s.recv(4096).split(b"\r\n", 1)[0]
            s.close()
            # Over 25 MiB: 413, nothing stored.
            big = b'{"object_kind": "note", "pad": "' + b"x" * (25 * 1024 * 1024) + b'"}'
            st, _, _ = deliver(srv, big)
            assert st == 413, st
            time.sleep(0.3)
            assert not gl.requests("POST")
    finally:
        gl.stop()


def test_real_payloads():
    """The two published payloads, byte for byte apart from the note text: the docs one
    (current format) and atlantis' (older: no action, no user.id, and a DUPLICATE key
    merge_request.source.git_http_url, where the last value wins)."""
    gl = new_fake()
    gl.add_user("root", uid=1)  # both payloads: Administrator, id 1
    gl.add_project("gitlab-org/gitlab-test")
    gl.add_mr("gitlab-org/gitlab-test", 1, source="master", target="markdown")
    gl.set_access("gitlab-org/gitlab-test", "root", "owner")
    gl.add_project("gitlabhq/gitlab-test")
    gl.add_mr("gitlabhq/gitlab-test", 1, source="main", target="markdown")
    gl.set_access("gitlabhq/gitlab-test", "root", "owner")
    try:
        with Server(server_args(gl), env=server_env()) as srv:
            for name in (DOCS_FIXTURE, ATLANTIS_FIXTURE):
                raw = fixture_bytes(name)
                st, _, _ = deliver(srv, raw)
                assert st == 204, (name, st)  # "This MR needs work." is no command
            docs = fixture_bytes(DOCS_FIXTURE).replace(b"This MR needs work.", b"/diverge help")
            st, _, _ = deliver(srv, docs)
            assert st == 202, st
            wait(lambda: replies(gl, "gitlab-org/gitlab-test", 1), what="reply on the docs MR")
            atl = fixture_bytes(ATLANTIS_FIXTURE).replace(b"This MR needs work.",
                                                          b"/diverge fix the docs")
            last = json.loads(atl)["merge_request"]["source"]["git_http_url"]  # last wins
            st, _, ans = deliver(srv, atl)
            assert st == 202, (st, ans)
            ns = "/apis/divergedev.com/v1alpha1/namespaces/gitlabhq-gitlab-test/agenttasks"
            t = wait(lambda: get_task(srv, "fix-mr-1", ns), what="task from the atlantis payload")
            assert t["spec"]["repository"]["url"] == last, t["spec"]
            assert t["spec"]["repository"]["workingBranch"] == "main", t["spec"]
            # No user.id in that payload: the note's author_id names the member.
            assert gl.requests("GET", r"/gitlabhq%2Fgitlab-test/members/all/1$")
    finally:
        gl.stop()


def test_bot_and_marker_notes_are_ignored():
    gl = new_fake()
    try:
        with Server(server_args(gl), env=server_env()) as srv:
            own, st, _ = post(gl, srv, "/diverge help", user=BOT)
            assert st == 202, st
            _, st, _ = post(gl, srv, "<!-- diverge-agent-task -->\n/diverge help", user="alice")
            assert st == 202, st
            _, st, _ = post(gl, srv, "/diverge status", user="alice")
            answers = lambda: [n for n in replies(gl) if n["id"] != own]  # noqa: E731
            wait(answers, what="status reply")
            time.sleep(0.5)
            assert len(answers()) == 1 and "Tasks of" in answers()[0]["body"], answers()
    finally:
        gl.stop()


def test_token_or_signature_either_suffices():
    """SPEC §5: the token, or a valid signature when a signing secret is configured."""
    from gitlab_helpers import sw_sign
    gl = new_fake()
    secret = whsec(b"both-configured-key-0123")
    try:
        with Server(server_args(gl, "--gitlab-signing-secret", secret), env=server_env()) as srv:
            uid = gl.users["alice"]
            body, _ = note_payload("/diverge help", user="alice", user_id=uid)
            ts = int(time.time())
            sig = {"webhook-id": "msg_both", "webhook-timestamp": str(ts),
                   "webhook-signature": sw_sign(secret, "msg_both", ts, body)}
            st, _, _ = deliver(srv, body, token="not-the-token", headers=sig)
            assert st == 202, st  # a wrong token beside a valid signature
            body2, _ = note_payload("/diverge help", user="alice", user_id=uid)
            assert deliver(srv, body2, token="not-the-token")[0] == 401
            bad = dict(sig, **{"webhook-id": "msg_bad"})  # signed for another id
            st, _, _ = deliver(srv, body2, token="not-the-token", headers=bad)
            assert st == 401, st
            assert deliver(srv, body2)[0] == 202  # the token alone
            wait(lambda: len(replies(gl)) == 2, what="two help replies")
    finally:
        gl.stop()


if __name__ == "__main__":
    run_tests([test_fix_end_to_end, test_duplicates_have_no_second_effect,
               test_auth_token_rotation_and_refusals, test_standard_webhooks_signatures,
               test_token_or_signature_either_suffices,
               test_access_levels, test_colliding_namespace_task_is_not_touched,
               test_notifier_token_fallback, test_configured_tiers, test_ignored_and_malformed_deliveries,
               test_refused_before_the_body_and_size_cap, test_real_payloads,
               test_bot_and_marker_notes_are_ignored])
