# SPDX-License-Identifier: Apache-2.0
"""The one-click GitHub App: GET /setup/github-app (admin header or dashboard cookie) shows a
form that posts an App manifest to the GitHub web host of --github-api-url (here a GitHub
Enterprise style `URL/api/v3` on the fake, whose web form redirects back as github.com does);
the callback checks the state against the admin's session, exchanges GitHub's code at
POST {api}/app-manifests/{code}/conversions, stores the App's id, key and webhook secret
(0600) in the data dir and uses them at once: a delivery signed with the new secret is
accepted and the bot answers as the App (installation token minted with the new id and key)
without a restart, and after a restart without flags. Failures get clear pages."""
import html.parser
import json
import os
import re
import shutil
import stat
import subprocess
import tempfile
import urllib.error
import urllib.parse
import urllib.request

from harness import Server, run_tests
from github_helpers import FakeGitHub, comment_payload, deliver, sign, wait

PUBLIC = "https://diverge.example.test"  # never contacted: only written into the manifest
NO_CREDS = {"DIVERGE_NOTIFIER_TOKEN": None, "GITHUB_TOKEN": None, "DIVERGE_GITHUB_APP_ID": None,
            "DIVERGE_GITHUB_APP_KEY_FILE": None, "DIVERGE_GITHUB_WEBHOOK_SECRET": None}
FILES = ("github-app-id", "github-app-key.pem", "github-webhook-secret")
INSTALLATION = 1  # the installation id of the delivery fixture


class Form(html.parser.HTMLParser):
    """The POST form of the setup page: its action and its hidden manifest, unescaped."""

    def __init__(self, text):
        super().__init__()
        self.action = self.manifest = self.refresh = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "form" and a.get("method") == "post":
            self.action = a.get("action")
        if tag == "input" and a.get("name") == "manifest":
            self.manifest = a.get("value")
        if tag == "meta" and a.get("http-equiv") == "refresh":
            self.refresh = a.get("content")


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *a, **kw):
        return None


def raw(url, data=None, headers=None, method=None):
    """(status, headers, text) without following redirects."""
    opener = urllib.request.build_opener(NoRedirect)
    req = urllib.request.Request(url, data=data, headers=headers or {}, method=method)
    try:
        resp = opener.open(req, timeout=30)
        return resp.status, resp.headers, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read().decode()


def login_cookie(srv):
    st, h, _ = raw(srv.url + "/ui/login?token=" + srv.token)
    assert st == 303, st
    return h["Set-Cookie"].split(";")[0]


def page(srv, cookie=None, query="", auth=False):
    headers = {"Cookie": cookie} if cookie else {}
    if auth:
        headers["Authorization"] = "Bearer " + srv.token
    return raw(srv.url + "/setup/github-app" + query, headers=headers)


def callback(srv, query, cookie=None, auth=False):
    headers = {"Cookie": cookie} if cookie else {}
    if auth:
        headers["Authorization"] = "Bearer " + srv.token
    return raw(srv.url + "/setup/github-app/callback?" + query, headers=headers)


def make_key(tmp):
    path = os.path.join(tmp, "new-app.pem")
    subprocess.run(["openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt",
                    "rsa_keygen_bits:2048", "-out", path], check=True, capture_output=True)
    with open(path) as f:
        return f.read()


def new_fake():
    gh = FakeGitHub()
    gh.start()
    gh.add_repo("octo/repo")
    gh.add_pull("octo/repo", 7, head_ref="feature-x")
    gh.set_permission("octo/repo", "alice", "write")
    return gh


def serve(gh, data_dir=None, extra=()):
    args = ["--sandbox-provider", "none", "--github-api-url", gh.url + "/api/v3",
            "--public-url", PUBLIC] + list(extra)
    return Server(args=args, env=NO_CREDS, data_dir=data_dir)


def github_form_post(gh, form):
    """What the browser does with the form: post it to GitHub, which (once the user
    confirms) redirects back to the manifest's redirect_url with code and state."""
    data = urllib.parse.urlencode({"manifest": form.manifest}).encode()
    st, h, _ = raw(form.action, data=data, method="POST",
                   headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert st == 302, st
    return h["Location"]


def to_local(srv, location):
    """The callback URL GitHub sent the browser to, on the server's real address."""
    assert location.startswith(PUBLIC + "/setup/github-app/callback?"), location
    return location.split("?", 1)[1]


def test_page_needs_admin_and_carries_the_manifest():
    gh = new_fake()
    try:
        with serve(gh) as srv:
            st, _, text = page(srv)
            assert st == 401 and "/ui/login?token=" in text, (st, text)
            st, _, _ = page(srv, cookie="diverge_token=" + "0" * 64)
            assert st == 401
            for kw in ({"auth": True}, {"cookie": login_cookie(srv)}):
                st, h, text = page(srv, **kw)
                assert st == 200 and h["Content-Type"].startswith("text/html"), (st, text)
                assert "default-src 'self'" in h["Content-Security-Policy"]
                assert "<script" not in text and "<style" not in text
                f = Form(text)
                assert re.fullmatch(re.escape(gh.url) + r"/settings/apps/new\?state=[0-9a-f]{64}",
                                    f.action), f.action
                m = json.loads(f.manifest)
                assert re.fullmatch(r"diverge-[0-9a-f]{8}", m["name"]), m
                assert m["url"] == PUBLIC
                assert m["hook_attributes"] == {"url": PUBLIC + "/api/v1/webhooks/github",
                                                "active": True}, m
                assert m["redirect_url"] == PUBLIC + "/setup/github-app/callback"
                assert m["public"] is False
                assert m["default_permissions"] == {"issues": "write", "pull_requests": "write",
                                                    "contents": "write", "metadata": "read"}, m
                assert m["default_events"] == ["issue_comment", "pull_request_review_comment"]
            # An organization's App; names GitHub does not allow are refused.
            st, _, text = page(srv, auth=True, query="?org=my-org")
            assert st == 200
            assert re.fullmatch(re.escape(gh.url) +
                                r"/organizations/my-org/settings/apps/new\?state=[0-9a-f]{64}",
                                Form(text).action)
            st, _, text = page(srv, auth=True, query="?org=" + urllib.parse.quote('x"/<b>'))
            assert st == 400 and "<b>" not in text, (st, text)
            assert "(off: no --github-webhook-secret)" in "\n".join(srv.lines)
            assert any("GitHub App setup: " + PUBLIC + "/setup/github-app" in x
                       for x in srv.lines), srv.lines
    finally:
        gh.stop()


def comment(gh, srv, body, secret):
    c = gh.add_comment("octo/repo", 7, user="alice", body=body)
    payload = comment_payload("octo/repo", 7, c["id"], body, user="alice")
    st, _, ans = deliver(srv, payload, secret=secret)
    return c["id"], st, ans


def test_one_click_flow_used_at_once_and_after_restart():
    tmp = tempfile.mkdtemp(prefix="diverge-ghapp-")
    gh = new_fake()
    gh.manifest_key_pem = make_key(tmp)
    srv = serve(gh)
    try:
        srv.start()
        # No secret yet: GitHub deliveries are refused.
        body = b'{"zen":"x"}'
        st, _, _ = srv.request("POST", "/api/v1/webhooks/github", body, auth=False,
                               headers={"X-GitHub-Event": "ping",
                                        "X-Hub-Signature-256": sign(body, "x")})
        assert st == 503, st
        cookie = login_cookie(srv)
        st, _, text = page(srv, cookie=cookie)
        assert st == 200
        form = Form(text)
        query = to_local(srv, github_form_post(gh, form))
        assert gh.manifests[-1][0] == json.loads(form.manifest)
        good = dict(urllib.parse.parse_qsl(query))
        # A state that is not ours, or bound to another session, is refused (CSRF).
        bad = dict(good, state="f" * 64)
        st, _, text = callback(srv, urllib.parse.urlencode(bad), cookie=cookie)
        assert st == 403 and "/setup/github-app" in text, (st, text)
        st, _, _ = callback(srv, query, auth=True)  # the header, not this cookie's session
        assert st == 403
        st, _, _ = callback(srv, query, cookie=login_cookie(srv))  # another login
        assert st == 403
        # Back from GitHub the browser holds its SameSite=Strict cookie back: the page
        # reloads itself once from our origin (and then says how to log in).
        st, _, text = callback(srv, query)
        assert st == 401
        assert Form(text).refresh == "0; url=/setup/github-app/callback?" + query + "&reloaded=1"
        st, _, text = callback(srv, query + "&reloaded=1")
        assert st == 401 and Form(text).refresh is None
        assert not any(os.path.exists(os.path.join(srv.data_dir, n)) for n in FILES)
        # The real callback.
        st, _, text = callback(srv, query, cookie=cookie)
        assert st == 200, (st, text)
        app = gh.created_apps[-1]
        assert str(app["id"]) in text and app["slug"] in text
        assert gh.html_base + "/apps/" + app["slug"] + "/installations/new" in text
        assert app["webhook_secret"] not in text and "PRIVATE KEY" not in text
        assert good["code"] not in text
        conv = gh.find_requests("POST", r"/app-manifests/.*/conversions")
        assert len(conv) == 1 and "authorization" not in conv[0]["headers"], conv
        assert conv[0]["headers"]["accept"] == "application/vnd.github+json"
        want = {"github-app-id": "%d\n" % app["id"], "github-app-key.pem": app["pem"],
                "github-webhook-secret": app["webhook_secret"] + "\n"}
        for name, content in want.items():
            p = os.path.join(srv.data_dir, name)
            st_ = os.lstat(p)
            assert stat.S_ISREG(st_.st_mode) and stat.S_IMODE(st_.st_mode) == 0o600, (name, st_)
            with open(p) as f:
                assert f.read().strip() == content.strip(), name
        # Nothing secret in the logs.
        logs = srv.stderr() + "\n".join(srv.lines)
        assert app["webhook_secret"] not in logs and "PRIVATE KEY" not in logs
        assert good["code"] not in logs and good["state"] not in logs
        # The same answer again, and the page: configured already.
        st, _, text = callback(srv, query, cookie=cookie)
        assert st == 409 and "github-app-key.pem" in text, (st, text)
        st, _, _ = page(srv, cookie=cookie)
        assert st == 409
        # At once, without a restart: a delivery signed with the new secret is accepted,
        # one signed otherwise is not, and the bot answers as the App.
        gh.add_installation(INSTALLATION)
        _, st, _ = comment(gh, srv, "/diverge help", "not-the-secret")
        assert st == 401, st
        cid, st, ans = comment(gh, srv, "/diverge fix the checkout", app["webhook_secret"])
        assert st == 202 and ans == {"accepted": True}, (st, ans)
        wait(lambda: gh.reactions(cid), what="the App's reaction")
        assert gh.reactions(cid)[0]["user"]["login"] == app["slug"] + "[bot]"
        assert gh.issued_tokens and all(t["installation_id"] == INSTALLATION
                                        for t in gh.issued_tokens.values())
        assert gh.jwts and all(c["iss"] in (app["id"], str(app["id"])) for _, c in gh.jwts)
        srv.stop()
        # Counted once the first server is gone: every JWT after this is the second's (taken
        # after the comment's 202, the count could already hold the JWT it was posted for).
        n = len(gh.jwts)
        # After a restart without flags: still configured from the data dir.
        srv2 = serve(gh, data_dir=srv.data_dir)
        try:
            srv2.start()
            assert not any("GitHub App setup:" in x for x in srv2.lines), srv2.lines
            assert any("GitHub webhook:" in x and "(off" not in x for x in srv2.lines)
            assert "github_app_stored" in srv2.stderr()
            cid, st, _ = comment(gh, srv2, "/diverge fix again", app["webhook_secret"])
            assert st == 202, st
            wait(lambda: gh.reactions(cid), what="the App's reaction after a restart")
            assert gh.reactions(cid)[0]["user"]["login"] == app["slug"] + "[bot]"
            assert len(gh.jwts) > n  # signed again by the restarted server with the stored key
            st, _, _ = page(srv2, auth=True)
            assert st == 409
        finally:
            srv2.cleanup()
    finally:
        srv.cleanup()
        gh.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def test_a_pat_gives_way_to_the_app():
    """With a PAT in the environment the App set up later answers instead (as an App given
    by flags wins over a PAT), at once."""
    gh = new_fake()
    gh.expect_token("ghp_pat", login="pat-user")
    srv = serve(gh)
    srv.env["DIVERGE_NOTIFIER_TOKEN"] = "ghp_pat"
    try:
        srv.start()
        st, _, text = page(srv, auth=True)
        assert st == 200
        f = Form(text)
        state = urllib.parse.parse_qs(urllib.parse.urlsplit(f.action).query)["state"][0]
        code = gh.new_manifest_code(json.loads(f.manifest))
        st, _, text = callback(srv, "code=%s&state=%s" % (code, state), auth=True)
        assert st == 200, (st, text)
        app = gh.created_apps[-1]
        gh.add_installation(INSTALLATION)
        cid, st, _ = comment(gh, srv, "/diverge fix it", app["webhook_secret"])
        assert st == 202, st
        wait(lambda: gh.reactions(cid), what="the App's reaction")
        assert gh.reactions(cid)[0]["user"]["login"] == app["slug"] + "[bot]"
    finally:
        srv.cleanup()
        gh.stop()


def test_refusals():
    gh = new_fake()
    try:
        # A webhook secret given by flag would win over the App's: refused, saying so.
        with serve(gh, extra=["--github-webhook-secret", "s3cret"]) as srv:
            st, _, text = page(srv, auth=True)
            assert st == 409 and "--github-webhook-secret" in text, (st, text)
        with serve(gh) as srv:
            def fresh_state():
                st, _, text = page(srv, auth=True)
                assert st == 200
                return urllib.parse.parse_qs(
                    urllib.parse.urlsplit(Form(text).action).query)["state"][0]
            # A code GitHub does not know (used, expired, made up).
            st, _, text = callback(srv, "code=0123abcd&state=" + fresh_state(), auth=True)
            assert st == 502 and "no such code" in text, (st, text)
            # A code that could not go into a URL as it is.
            st, _, text = callback(srv, "code=..%2Fx&state=" + fresh_state(), auth=True)
            assert st == 400, (st, text)
            # A state is used once, even when the exchange failed.
            s = fresh_state()
            st, _, _ = callback(srv, "code=0123abcd&state=" + s, auth=True)
            assert st == 502
            st, _, _ = callback(srv, "code=0123abcd&state=" + s, auth=True)
            assert st == 403
            # GitHub failing: 503, nothing stored.
            code = gh.new_manifest_code({"name": "x", "url": PUBLIC,
                                         "hook_attributes": {"url": PUBLIC},
                                         "redirect_url": PUBLIC})
            gh.inject("POST", r"/app-manifests/.*", status=500)
            st, _, text = callback(srv, "code=%s&state=%s" % (code, fresh_state()), auth=True)
            assert st == 503 and "could not be reached" in text, (st, text)
            # An answer without a usable key: 502, nothing stored.
            gh.clear_injections()
            gh.inject("POST", r"/app-manifests/.*", status=201,
                      body={"id": 5, "slug": "x", "pem": "not a key", "webhook_secret": "abc"})
            st, _, text = callback(srv, "code=%s&state=%s" % (code, fresh_state()), auth=True)
            assert st == 502, (st, text)
            assert not any(os.path.exists(os.path.join(srv.data_dir, n)) for n in FILES)
            # A file left over from an earlier setup: refused, with the fix.
            p = os.path.join(srv.data_dir, "github-webhook-secret")
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            os.write(fd, b"old\n")
            os.close(fd)
            st, _, text = page(srv, auth=True)
            assert st == 409 and "delete those files" in text, (st, text)
    finally:
        gh.stop()


if __name__ == "__main__":
    run_tests([test_page_needs_admin_and_carries_the_manifest,
               test_one_click_flow_used_at_once_and_after_restart, test_a_pat_gives_way_to_the_app,
               test_refusals])
