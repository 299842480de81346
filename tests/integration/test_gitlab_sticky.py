# SPDX-License-Identifier: Apache-2.0
"""The sticky status note on GitLab (SPEC §6, issue 10) against the fake GitLab API: one
note per MR and task, created once and edited with PUT, found again across pages after a
lost create response and a kill -9 with a lost database row; retried through 429s (with
and without Retry-After) and 500s; note creations paced per project."""
import os
import sqlite3
import time

from gitlab_helpers import (BOT, HOOK_TOKEN, NS, PROJECT, deliver, new_fake, note_from,
                            replies, server_env, stickies, wait)
from harness import Server, run_tests

# agent-sandbox is not built here: the controller leaves phases alone and the test moves
# the task through its phases by hand.
def args(gl, *extra):
    return ["--sandbox-provider", "agent-sandbox", "--notifier-min-interval", "1",
            "--gitlab-webhook-token", HOOK_TOKEN, "--gitlab-url", gl.url,
            "--notifier-provider", "gitlab"] + list(extra)


def set_status(srv, name, **status):
    st, _, b = srv.request("PATCH", NS + "/" + name + "/status", {"status": status},
                           headers={"Content-Type": "application/merge-patch+json"})
    assert st == 200, b
    return b


def fix(gl, srv, text="/diverge fix the cache"):
    payload, note_id = note_from(gl, text)
    st, _, _ = deliver(srv, payload)
    assert st == 202, st
    return note_id


def creates(gl):
    return gl.requests("POST", r"/merge_requests/7/notes$")


def test_lost_create_kill9_and_pages():
    gl = new_fake()
    for i in range(250):  # three pages of 100: the sticky note is found on page 3
        gl.add_note(PROJECT, 7, "human note %d" % i, user="carol")
    try:
        srv = Server(args(gl), env=server_env()).start()
        try:
            # The create reaches GitLab but its answer is lost: the retry adopts the note.
            rule = gl.inject("POST", r"/merge_requests/7/notes$", status=502, apply=True)
            fix(gl, srv)
            wait(lambda: rule.hits == 1 and stickies(gl), what="lost create")
            set_status(srv, "fix-mr-7", phase="Active")
            wait(lambda: "Running" in stickies(gl)[0]["body"], what="edit")
            assert len(stickies(gl)) == 1, stickies(gl)
            assert gl.requests("PUT", r"/notes/\d+$"), "edited with PUT"
            pages = [q["path"] for q in gl.requests("GET", r"/notes\?")]
            assert any("page=3" in p for p in pages), pages
            assert all("sort=asc" in p for p in pages), pages
            srv.kill()
            db = sqlite3.connect(os.path.join(srv.data_dir, "diverge.db"))
            db.execute("DELETE FROM sticky")
            db.commit()
            db.close()
            srv2 = Server(args(gl), env=server_env(), data_dir=srv.data_dir).start()
            try:
                set_status(srv2, "fix-mr-7", phase="Paused", reason="Suspended")
                wait(lambda: "Paused" in stickies(gl)[0]["body"], what="adopted edit")
                time.sleep(0.5)
                assert len(stickies(gl)) == 1, stickies(gl)
                assert len(creates(gl)) == 1, [q["body"][:60] for q in creates(gl)]
            finally:
                srv2.stop()
        finally:
            srv.cleanup()
    finally:
        gl.stop()


def test_sticky_adopted_only_from_the_bot():
    gl = new_fake()
    try:
        with Server(args(gl), env=server_env()) as srv:
            # Someone else writes the marker first: never adopted, never edited.
            fake = gl.add_note(PROJECT, 7, "<!-- diverge-agent-task -->\n<!-- diverge-task: "
                               "group-sub-project/fix-mr-7 -->\nfake", user="mallory")
            fix(gl, srv)
            wait(lambda: stickies(gl), what="the bot's own sticky")
            assert gl.notes[fake["id"]]["body"].endswith("fake")
            assert stickies(gl)[0]["id"] != fake["id"]
    finally:
        gl.stop()


def test_rate_limits_and_errors():
    gl = new_fake()
    try:
        with Server(args(gl), env=server_env()) as srv:
            award = gl.inject("POST", r"/award_emoji$", status=429,
                              headers={"Retry-After": "1"})
            create = gl.inject("POST", r"/merge_requests/7/notes$", status=429)
            listing = gl.inject("GET", r"/merge_requests/7/notes\?", status=500, times=2)
            note_id = fix(gl, srv)
            wait(lambda: (note_id, "thumbsup", BOT) in gl.awards, what="award after a 429")
            wait(lambda: stickies(gl), what="sticky after 429 and 500s")
            assert award.hits == 1 and create.hits == 1 and listing.hits == 2
            assert len(gl.requests("POST", r"/award_emoji$")) == 2
            time.sleep(0.5)
            assert len(stickies(gl)) == 1, stickies(gl)
    finally:
        gl.stop()


def test_note_creations_are_paced():
    gl = new_fake()
    env = dict(server_env(), DIVERGE_GITLAB_NOTES_PER_MINUTE="2")
    try:
        with Server(args(gl), env=env) as srv:
            for _ in range(3):
                payload, _ = note_from(gl, "/diverge help")
                st, _, _ = deliver(srv, payload)
                assert st == 202, st
            wait(lambda: len(replies(gl)) >= 2, what="two help replies")
            time.sleep(1.5)
            # The third waits for the minute's window; it was never sent (nor refused).
            assert len(creates(gl)) == 2, len(creates(gl))
            assert "scm_call_paced" in srv.stderr(), "the outbox deferred the third note"
    finally:
        gl.stop()


if __name__ == "__main__":
    run_tests([test_lost_create_kill9_and_pages, test_sticky_adopted_only_from_the_bot,
               test_rate_limits_and_errors, test_note_creations_are_paced])
