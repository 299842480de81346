# SPDX-License-Identifier: Apache-2.0
"""Throttling delays only the sticky edit it throttles (security review finding 13): right
after a meter call changed the spend, so a spend-only sticky edit waits out
--notifier-min-interval (15 s here: longer than the 10 s the reply is given, so a reply that
waited for the throttle could not pass), a `/diverge status` reply still goes out at once,
and the throttled edit follows later. (bench/reply_latency.py measures it.)"""
import json
import time

from github_helpers import BOT, comment_payload, deliver, new_fake, server_args, server_env, wait
from harness import API, Server, run_tests

NS = API + "/namespaces/octo-repo/agenttasks"
MARKER = "<!-- diverge-agent-task -->"
METER = "/api/v1/agenttask/meter"


def comment(gh, srv, body, user="alice"):
    c = gh.add_comment("octo/repo", 7, user=user, body=body)
    st, _, ans = deliver(srv, comment_payload("octo/repo", 7, c["id"], body, user=user))
    assert st == 202, (st, ans)
    return c


def sticky(gh):
    s = [c for c in gh.comments("octo/repo", 7)
         if c["user"]["login"] == BOT and c["body"].startswith(MARKER)]
    return s[0]["body"] if s else ""


def replies(gh):
    return [c for c in gh.comments("octo/repo", 7)
            if c["user"]["login"] == BOT and not c["body"].startswith(MARKER)]


def test_reply_does_not_wait_for_a_throttled_edit():
    gh = new_fake()
    try:
        with Server(server_args(gh, "--notifier-min-interval", "15"), env=server_env()) as srv:
            comment(gh, srv, "/diverge fix the flaky test")
            wait(lambda: "Running" in sticky(gh), what="sticky Running")
            st, _, tok = srv.request("GET", NS + "/fix-pr-7/token")
            assert st == 200, tok
            body = json.dumps({"requestId": "r1", "iteration": 1, "tokensUsed": 1500,
                               "costUSD": 0.0225})
            st, _, b = srv.request("POST", METER, body, auth=False,
                                   headers={"Authorization": "Bearer " + tok.strip()})
            assert st == 200, b
            time.sleep(0.3)  # the notifier has queued the spend edit, due in about 15 s
            assert "0.0225" not in sticky(gh)
            comment(gh, srv, "/diverge status")
            # Generous: the point is "not behind the 15 s throttle", not a latency target.
            wait(lambda: replies(gh), timeout=10, what="status reply before the throttle")
            assert "fix-pr-7" in replies(gh)[0]["body"]
            assert "0.0225" not in sticky(gh), "the spend edit was not throttled"
            # The throttled edit still goes out, after the interval.
            wait(lambda: "0.0225" in sticky(gh), timeout=45, what="the throttled spend edit")
    finally:
        gh.stop()


if __name__ == "__main__":
    run_tests([test_reply_does_not_wait_for_a_throttled_edit])
