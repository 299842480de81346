# SPDX-License-Identifier: Apache-2.0
"""Whose comment the sticky notifier may touch, and with which credentials (SPEC §5, §6;
security review findings 6 and 12): the bot's login is learnt again after a failed
GET /user, and until then nothing is adopted or folded; a marker comment planted by a
read-only user or by another app is never adopted nor deleted; in GitHub App mode the
login comes from GET /app and every sticky call uses the delivery's installation token;
a pagination Link to another host never gets our token."""
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time

from github_helpers import (BOT, SECRET, FakeGitHub, comment_payload, deliver, new_fake,
                            server_args, server_env, wait)
from harness import API, Server, run_tests
from test_sticky import args, make_task

MARKER = "<!-- diverge-agent-task -->"
NS = API + "/namespaces/octo-repo/agenttasks"


def comment(gh, srv, body, number, user="alice", installation=None):
    c = gh.add_comment("octo/repo", number, user=user, body=body)
    payload = comment_payload("octo/repo", number, c["id"], body, user=user)
    if installation is not None:
        p = json.loads(payload)
        p["installation"]["id"] = installation
        payload = json.dumps(p).encode()
    st, _, ans = deliver(srv, payload)
    assert st == 202, (st, ans)
    return c


def bots_sticky(gh, number, login=BOT):
    return [c for c in gh.comments("octo/repo", number)
            if c["user"]["login"] == login and c["body"].startswith(MARKER)]


def test_failed_login_lookup_never_adopts_a_planted_comment():
    """The review's repro: one 502 on GET /user, mallory (read) planted a marker comment
    with the task's own line on PR 8, alice runs /diverge fix."""
    gh = new_fake()
    try:
        gh.add_pull("octo/repo", 8, head_ref="feature-y")
        gh.set_permission("octo/repo", "mallory", "read")
        tag = "<!-- diverge-task: octo-repo/fix-pr-8 -->"
        planted = [
            gh.add_comment("octo/repo", 8, user="mallory",
                           body=MARKER + "\n" + tag + "\n[Magic Link](https://evil.example)"),
            gh.add_comment("octo/repo", 8, user="mallory", body=MARKER + "\nno task line"),
            gh.add_comment("octo/repo", 8, user="other-app[bot]", user_type="Bot",
                           body=MARKER + "\n" + tag + "\nanother app"),
        ]
        rule = gh.inject("GET", r"^/user$", status=502, times=1)
        with Server(server_args(gh), env=server_env()) as srv:
            comment(gh, srv, "/diverge fix the flaky test", 8)
            wait(lambda: bots_sticky(gh, 8), timeout=20, what="the bot's own sticky")
            assert rule.hits == 1
            assert len(gh.find_requests("GET", r"^/user$")) >= 2
            time.sleep(0.5)
            assert len(bots_sticky(gh, 8)) == 1
            assert tag in bots_sticky(gh, 8)[0]["body"]
            for c in planted:
                now = gh.comment(c["id"])
                assert now is not None and now["body"] == c["body"], now
                path = r"/issues/comments/%d$" % c["id"]
                assert gh.find_requests("PATCH", path) == []
                assert gh.find_requests("DELETE", path) == []
    finally:
        gh.stop()


def make_app_key(tmp):
    key = os.path.join(tmp, "app-key.pem")
    subprocess.run(["openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt",
                    "rsa_keygen_bits:2048", "-out", key], check=True, capture_output=True)
    os.chmod(key, 0o600)
    return key


def test_app_mode_uses_the_installation_token():
    tmp = tempfile.mkdtemp(prefix="diverge-app-")
    key = make_app_key(tmp)
    gh = FakeGitHub()
    gh.start()
    try:
        with open(key) as f:
            gh.set_app(4242, public_key_pem=f.read(), slug="diverge-app")
        gh.add_installation(77, repos=["octo/repo", "octo/other"])
        gh.add_repo("octo/repo")
        gh.add_repo("octo/other")
        gh.add_pull("octo/other", 11, head_ref="feature-o")
        gh.add_pull("octo/repo", 7, head_ref="feature-x")
        gh.add_pull("octo/repo", 9, head_ref="feature-z")
        gh.set_permission("octo/repo", "alice", "write")
        # An older sticky of the app naming no task: adopted (the login came from GET /app).
        legacy = gh.add_comment("octo/repo", 7, user="diverge-app[bot]", user_type="Bot",
                                body=MARKER + "\nold")
        env = {"DIVERGE_NOTIFIER_TOKEN": None, "GITHUB_TOKEN": None,
               "DIVERGE_GITHUB_APP_ID": None, "DIVERGE_GITHUB_APP_KEY_FILE": None}
        argv = ["--sandbox-provider", "none", "--github-webhook-secret", SECRET,
                "--github-api-url", gh.url, "--notifier-min-interval", "1",
                "--github-app-id", "4242", "--github-app-key-file", key]
        srv = first = Server(argv, env=env).start()
        try:
            comment(gh, srv, "/diverge fix it", 7, installation=77)
            wait(lambda: "Running" in gh.comment(legacy["id"])["body"], timeout=20,
                 what="sticky adopted and edited to Running")
            assert "diverge-task: octo-repo/fix-pr-7" in gh.comment(legacy["id"])["body"]
            issued = gh.issued_tokens
            assert issued and all(v["installation_id"] == 77 for v in issued.values())
            calls = gh.find_requests(path_re=r"/issues/(7/comments|comments/%d)$" % legacy["id"])
            assert calls, "no sticky call"
            for r in calls:
                tok = r["headers"]["authorization"].split(" ", 1)[1]
                assert tok in issued, r["headers"]["authorization"][:16]
                assert 200 <= r["status"] < 300, (r["method"], r["path"], r["status"])
            assert gh.find_requests("PATCH", r"/issues/comments/%d$" % legacy["id"])
            assert gh.find_requests("GET", r"^/app$")
            assert gh.find_requests("POST", r"/issues/7/comments$") == []
            # A PR without one: the sticky is created, then edited, as the app.
            comment(gh, srv, "/diverge fix that", 9, installation=77)
            wait(lambda: bots_sticky(gh, 9, "diverge-app[bot]"), timeout=20,
                 what="sticky created by the app")
            comment(gh, srv, "/diverge pause", 9, installation=77)
            wait(lambda: "Paused" in bots_sticky(gh, 9, "diverge-app[bot]")[0]["body"],
                 timeout=20, what="sticky edited to Paused")
            sid = bots_sticky(gh, 9, "diverge-app[bot]")[0]["id"]
            issued = gh.issued_tokens
            for r in (gh.find_requests("POST", r"/issues/9/comments$") +
                      gh.find_requests("PATCH", r"/issues/comments/%d$" % sid)):
                assert r["headers"]["authorization"].split(" ", 1)[1] in issued
                assert 200 <= r["status"] < 300, (r["method"], r["path"], r["status"])
            assert len(bots_sticky(gh, 9, "diverge-app[bot]")) == 1
            # After a restart the installation is still known (it is in the database).
            srv.stop()
            srv = Server(argv, env=env, data_dir=srv.data_dir).start()
            st, _, b = srv.request("PATCH", NS + "/fix-pr-9/status",
                                   {"status": {"tokensConsumed": 4321}},
                                   headers={"Content-Type": "application/merge-patch+json"})
            assert st == 200, b
            wait(lambda: "4,321" in bots_sticky(gh, 9, "diverge-app[bot]")[0]["body"],
                 timeout=20, what="sticky edited after a restart")
            last = gh.find_requests("PATCH", r"/issues/comments/%d$" % sid)[-1]
            assert last["headers"]["authorization"].split(" ", 1)[1] in gh.issued_tokens
            # A task no delivery came for (made through the API): GitHub names the
            # repository's installation.
            obj = {"metadata": {"name": "api-made", "annotations": {
                       "divergedev.com/provider": "github", "divergedev.com/project": "octo/other",
                       "divergedev.com/pr-number": "11"}},
                   "spec": {"objective": "from the API"}}
            st, _, b = srv.request("POST", API + "/namespaces/octo-other/agenttasks", obj)
            assert st == 201, b
            wait(lambda: [c for c in gh.comments("octo/other", 11)
                          if c["user"]["login"] == "diverge-app[bot]"], timeout=20,
                 what="sticky of an API-made task")
            assert gh.find_requests("GET", r"^/repos/octo/other/installation$")
            for r in gh.find_requests(path_re=r"^/repos/octo/other/issues/"):
                assert r["headers"]["authorization"].split(" ", 1)[1] in gh.issued_tokens
        finally:
            srv.stop()
            first.cleanup()
    finally:
        gh.stop()
        shutil.rmtree(tmp, ignore_errors=True)


class Listener:
    """A loopback TCP port that counts connections and answers nothing useful."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.stop = False
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stop:
            try:
                c, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            c.close()

    def close(self):
        self.stop = True
        self.thread.join()
        self.sock.close()


def test_pagination_link_to_another_host_is_not_followed():
    gh = new_fake()
    other = Listener()
    try:
        link = ('<http://127.0.0.1:%d/repos/octo/repo/issues/7/comments?page=2>; rel="next"'
                % other.port)
        rule = gh.inject("GET", r"/issues/7/comments$", status=200, headers={"Link": link},
                         body=[], times=None)
        with Server(args(gh), env=server_env()) as srv:
            make_task(srv)
            wait(lambda: rule.hits >= 1 and ("github_link_refused" in srv.stderr() or
                                              other.accepted > 0),
                 what="the next page link refused")
            time.sleep(0.5)
            assert other.accepted == 0
            assert gh.find_requests("POST", r"/issues/7/comments$") == []
    finally:
        other.close()
        gh.stop()


if __name__ == "__main__":
    run_tests([test_failed_login_lookup_never_adopts_a_planted_comment,
               test_app_mode_uses_the_installation_token,
               test_pagination_link_to_another_host_is_not_followed])
