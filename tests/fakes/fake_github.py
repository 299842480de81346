# SPDX-License-Identifier: Apache-2.0
"""A fake GitHub REST API on loopback for the integration tests (Python 3 stdlib only).

It serves the subset of https://docs.github.com/rest that Diverge uses (SPEC sections 5
and 6) with GitHub's paths, status codes, headers and JSON shapes:

    GET    /user                                         (PAT only; 403 for installation tokens)
    GET    /rate_limit
    GET    /repos/{o}/{r}
    GET    /repos/{o}/{r}/pulls/{n}
    GET    /repos/{o}/{r}/pulls?head=OWNER:BRANCH&base=&state=open|closed|all
    POST   /repos/{o}/{r}/pulls                          (422 when one exists for the head)
    GET    /repos/{o}/{r}/issues/{n}
    GET    /repos/{o}/{r}/contents/{path}?ref=R           (Accept: ...raw gives the bytes)
    GET    /repos/{o}/{r}/collaborators/{user}/permission
    GET    /repos/{o}/{r}/issues/{n}/comments?per_page=&page=&since=   (Link header)
    POST   /repos/{o}/{r}/issues/{n}/comments
    GET|PATCH|DELETE /repos/{o}/{r}/issues/comments/{id}
    GET|POST /repos/{o}/{r}/issues/comments/{id}/reactions
    DELETE /repos/{o}/{r}/issues/comments/{id}/reactions/{reaction_id}
    GET    /repos/{o}/{r}/installation                   (app JWT)
    GET    /app, GET /app/installations/{id}             (app JWT)
    POST   /app/installations/{id}/access_tokens         (app JWT, RS256 checked with openssl)
    POST   /app-manifests/{code}/conversions             (no auth; the App manifest flow)
    and, as github.com's web pages do for the App manifest flow (a browser form post):
    POST   /settings/apps/new?state=S, /organizations/{org}/settings/apps/new?state=S
           (form field manifest; 302 to its redirect_url?code=C&state=S)
    and every /repos/{o}/{r}/... path also as /repositories/{repo_id}/... (GitHub's Link
    headers use that form). Every API path is also served under /api/v3 (GitHub
    Enterprise's REST base: --github-api-url URL/api/v3).

    git over smart HTTP (git http-backend: clone, fetch, push) at /{o}/{r}.git for the
    repositories given to serve_git(), behind Basic auth as github.com asks it: user
    x-access-token with an unexpired installation token that sees the repository, or an
    expected PAT with any user name.

Usage:
    from fake_github import FakeGitHub
    with FakeGitHub() as gh:
        gh.add_repo("octo/repo")
        gh.add_pull("octo/repo", 7, head_ref="feature-x")
        ... start the server with --github-api-url gh.url ...
        gh.wait_for(lambda: gh.comments("octo/repo", 7))

Standalone: python3 tests/fakes/fake_github.py --port 0 [--token T] [--demo]
"""
import argparse
import base64
import hashlib
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import string
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from held_git import serve_http_backend

__all__ = ["FakeGitHub", "make_jwt", "REACTIONS", "ROLES"]

JSON_CT = "application/json; charset=utf-8"
DOCS = "https://docs.github.com/rest"
REACTIONS = ("+1", "-1", "laugh", "confused", "heart", "hooray", "rocket", "eyes")
ROLES = ("admin", "maintain", "write", "triage", "read", "none")
# role_name -> legacy "permission" (GitHub maps maintain to write and triage to read)
LEGACY_PERMISSION = {"admin": "admin", "maintain": "write", "write": "write",
                     "triage": "read", "read": "read", "none": "none"}
MAX_COMMENT = 65536
WRITE_METHODS = ("POST", "PATCH", "PUT", "DELETE")
API_VERSIONS = ("2022-11-28", "2026-03-10")

DOC = {
    "user": DOCS + "/users/users#get-the-authenticated-user",
    "repo": DOCS + "/repos/repos#get-a-repository",
    "pull": DOCS + "/pulls/pulls#get-a-pull-request",
    "list_pulls": DOCS + "/pulls/pulls#list-pull-requests",
    "create_pull": DOCS + "/pulls/pulls#create-a-pull-request",
    "issue": DOCS + "/issues/issues#get-an-issue",
    "contents": DOCS + "/repos/contents#get-repository-content",
    "permission": DOCS + "/collaborators/collaborators#get-repository-permissions-for-a-user",
    "list_comments": DOCS + "/issues/comments#list-issue-comments",
    "create_comment": DOCS + "/issues/comments#create-an-issue-comment",
    "get_comment": DOCS + "/issues/comments#get-an-issue-comment",
    "update_comment": DOCS + "/issues/comments#update-an-issue-comment",
    "delete_comment": DOCS + "/issues/comments#delete-an-issue-comment",
    "list_reactions": DOCS + "/reactions/reactions#list-reactions-for-an-issue-comment",
    "create_reaction": DOCS + "/reactions/reactions#create-reaction-for-an-issue-comment",
    "delete_reaction": DOCS + "/reactions/reactions#delete-an-issue-comment-reaction",
    "access_token": DOCS + "/apps/apps#create-an-installation-access-token-for-an-app",
    "app": DOCS + "/apps/apps#get-the-authenticated-app",
    "installation": DOCS + "/apps/apps#get-a-repository-installation-for-the-authenticated-app",
    "rate_limit": DOCS + "/overview/rate-limits-for-the-rest-api",
    "secondary": DOCS + "/overview/rate-limits-for-the-rest-api#about-secondary-rate-limits",
}

DEFAULT_MESSAGES = {
    400: "Problems parsing JSON", 401: "Bad credentials", 403: "Forbidden",
    404: "Not Found", 409: "Conflict", 410: "Gone", 422: "Validation Failed",
    429: "API rate limit exceeded", 500: "Server Error", 502: "Server Error",
    503: "Service Unavailable", 504: "We couldn't respond to your request in time. Sorry about that. Please try resubmitting your request and contact us if the problem persists.",
}

HTTP_REASONS = {200: "OK", 201: "Created", 204: "No Content", 304: "Not Modified",
                400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
                409: "Conflict", 422: "Unprocessable Entity", 429: "Too Many Requests",
                500: "Internal Server Error", 502: "Bad Gateway",
                503: "Service Unavailable", 504: "Gateway Timeout"}


def iso(t):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def parse_iso(s):
    m = re.match(r"^(\d{4})-(\d\d)-(\d\d)(?:[T ](\d\d):(\d\d)(?::(\d\d)(?:\.\d+)?)?)?(Z|[+-]\d\d:?\d\d)?$",
                 s or "")
    if not m:
        return None
    y, mo, d, h, mi, se = (int(x) if x else 0 for x in m.groups()[:6])
    import calendar
    t = calendar.timegm((y, mo, d, h, mi, se, 0, 0, 0))
    tz = m.group(7)
    if tz and tz != "Z":
        sign = 1 if tz[0] == "+" else -1
        tz = tz[1:].replace(":", "")
        t -= sign * (int(tz[:2]) * 3600 + int(tz[2:]) * 60)
    return t


def b64url_decode(s):
    if not isinstance(s, str) or not re.match(r"^[A-Za-z0-9_-]*$", s):
        raise ValueError("not base64url")
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))


def b64url(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def node_id(kind, ident):
    """GitHub's legacy global node id: base64("0<len>:<Type><id>")."""
    s = "%s%d" % (kind, ident)
    return base64.b64encode(("%03d:%s" % (len(kind), s)).encode()).decode()


def git_blob_sha(data):
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def gh_base64(data):
    """Base64 the way GitHub's contents API returns it (Ruby encode64: a newline after
    every 60 characters and at the end)."""
    enc = base64.b64encode(data).decode()
    return "".join(enc[i:i + 60] + "\n" for i in range(0, len(enc), 60))


def make_jwt(private_key_pem, app_id, iat=None, exp=None, alg="RS256", extra=None,
             header=None):
    """An app JWT signed with `openssl dgst -sha256 -sign` (private_key_pem: PEM text or a
    path to a PEM file). iat defaults to now-60 and exp to now+540 (GitHub's advice)."""
    now = int(time.time())
    hdr = {"alg": alg, "typ": "JWT"}
    hdr.update(header or {})
    claims = {"iat": now - 60 if iat is None else iat,
              "exp": now + 540 if exp is None else exp, "iss": app_id}
    claims.update(extra or {})
    signing_input = (b64url(json.dumps(hdr, separators=(",", ":")).encode()) + "." +
                     b64url(json.dumps(claims, separators=(",", ":")).encode()))
    tmp = tempfile.mkdtemp(prefix="fakegh-jwt-")
    try:
        if os.path.exists(str(private_key_pem)) and "-----BEGIN" not in str(private_key_pem):
            key_path = private_key_pem
        else:
            key_path = os.path.join(tmp, "key.pem")
            with open(key_path, "w") as f:
                f.write(private_key_pem)
        sig = subprocess.run(["openssl", "dgst", "-sha256", "-sign", key_path],
                             input=signing_input.encode(), capture_output=True, check=True).stdout
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return signing_input + "." + b64url(sig)


class Reject(Exception):
    """An error response: raised by handlers, turned into GitHub's JSON error body."""

    def __init__(self, status, message=None, doc=DOCS, errors=None, headers=None):
        super().__init__(message)
        self.status = status
        body = {"message": message or DEFAULT_MESSAGES.get(status, "Error")}
        if errors is not None:
            body["errors"] = errors
        body["documentation_url"] = doc
        body["status"] = str(status)
        self.body = body
        self.headers = headers or {}


class Rule:
    """One fault injection (see FakeGitHub.inject)."""

    def __init__(self, method, path_re, status, headers, body, times, delay, apply, drop):
        self.method = method.upper() if method else None
        self.path_re = re.compile(path_re) if path_re else None
        self.status = status
        self.headers = dict(headers or {})
        self.body = body
        self.times = times
        self.delay = delay
        self.apply = apply
        self.drop = drop
        self.hits = 0

    def matches(self, method, path):
        if self.times is not None and self.hits >= self.times:
            return False
        if self.method and self.method != method:
            return False
        return not self.path_re or bool(self.path_re.search(path))

    @property
    def exhausted(self):
        return self.times is not None and self.hits >= self.times

    def __repr__(self):
        return "Rule(%s %s status=%s hits=%d/%s)" % (
            self.method, self.path_re and self.path_re.pattern, self.status, self.hits, self.times)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, addr, handler, fake):
        self.fake = fake
        self.conns = set()
        self.conns_lock = threading.Lock()
        super().__init__(addr, handler)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "GitHub.com"
    sys_version = ""
    timeout = 60  # idle keep-alive connections are closed after this

    def setup(self):
        super().setup()
        with self.server.conns_lock:
            self.server.conns.add(self.connection)

    def finish(self):
        try:
            super().finish()
        finally:
            with self.server.conns_lock:
                self.server.conns.discard(self.connection)

    def version_string(self):
        return "GitHub.com"

    def log_message(self, fmt, *args):
        if self.server.fake.verbose:
            sys.stderr.write("fake_github: " + (fmt % args) + "\n")

    def _read_body(self):
        te = (self.headers.get("Transfer-Encoding") or "").lower()
        if "chunked" in te:
            out = b""
            while True:
                line = self.rfile.readline(65537)
                size = int(line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass
                    return out
                out += self.rfile.read(size)
                self.rfile.readline(65537)
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n > 0 else b""

    def _any(self):
        self.server.fake._handle(self)

    do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = do_HEAD = do_OPTIONS = _any


class FakeGitHub:
    """A fake api.github.com. All public methods are thread-safe.

    Attributes: url, port, host, bot_login, bot_type, verbose, link_style
    ("repositories" or "repos"), html_base, token_ttl, require_user_agent,
    secondary_limit_per_minute (None = not enforced), auto_users, rate_limit_status.
    """

    def __init__(self, host="127.0.0.1", port=0, comment_id_start=2200000001,
                 verbose=False):
        self.host = host
        self.port = port
        self.verbose = verbose
        self.bot_login = "diverge-bot"
        self.bot_type = "User"          # a PAT belongs to a (machine) user account
        self.html_base = "https://github.com"
        self.link_style = "repositories"  # Link headers use /repositories/{id}/... like GitHub
        self.token_ttl = 3600
        self.require_user_agent = True    # GitHub answers 403 without a User-Agent
        self.secondary_limit_per_minute = None
        self.auto_users = False           # unknown logins -> 404 from the permission API
        self.rate_limit_status = 403
        self._lock = threading.RLock()
        self._stop_event = threading.Event()
        self._httpd = None
        self._thread = None
        self._tmp = None
        # state
        self._users = {}                  # lower login -> user dict
        self._repos = {}                  # lower full name -> repo dict
        self._repo_by_id = {}
        self._issues = {}                 # (repo key, number) -> issue dict
        self._comments = {}               # id -> comment dict
        self._reactions = {}              # id -> reaction dict
        self._tokens = {}                 # PAT -> login or None (= bot_login)
        self._issued = {}                 # installation token -> info
        self._app = None
        self._installations = {}          # id -> {"repos": set or None, "account": login}
        self._rules = []
        self._log = []
        self._write_times = []
        self._admitted = []               # writes let through by secondary_limit_per_minute
        self._counts = {"requests": 0, "writes": 0, "writes_ok": 0, "max_concurrency": 0,
                        "in_flight": 0, "secondary_limited": 0, "rate_limited": 0}
        self._rate = {"limit": 5000, "remaining": 5000, "reset": int(time.time()) + 3600,
                      "used": 0, "resource": "core"}
        self._next = {"user": 5001, "repo": 700000001, "issue": 1900000001,
                      "comment": comment_id_start, "reaction": 250000001, "pull": 1700000001,
                      "app": 3100001}
        self.jwts = []                    # (header, claims) of every accepted app JWT
        self._git = {}                    # lower full name -> bare repository served
        self.git_auth = []                # (method, path, user, password) per git request
        self.errors = []                  # tracebacks of bugs in the fake (answered 500)
        self.manifests = []               # (manifest dict, org or None) posted to the web form
        self.manifest_key_pem = None      # private key of Apps made from manifests (else one
                                          # is generated with openssl)
        self._manifest_codes = {}         # code -> {"manifest", "org", "used"}
        self.created_apps = []            # conversion answers (id, slug, pem, webhook_secret)

    # ------------------------------------------------------------------ lifecycle
    def start(self):
        """Binds and serves in a daemon thread; a no-op when already running."""
        if self._httpd is not None:
            return self
        self._stop_event.clear()
        self._httpd = _Server((self.host, self.port), _Handler, self)
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True,
                                        name="fake-github")
        self._thread.start()
        return self

    def stop(self):
        self._stop_event.set()
        if self._httpd:
            self._httpd.shutdown()
            with self._httpd.conns_lock:
                conns = list(self._httpd.conns)
            for c in conns:
                try:
                    c.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self._httpd.server_close()
            self._thread.join(5)
            self._httpd = None
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    @property
    def url(self):
        return "http://%s:%d" % (self.host, self.port)

    # ------------------------------------------------------------------ seeding
    def add_user(self, login, user_type="User"):
        """Registers a GitHub account (User, Bot or Organization); returns its dict."""
        with self._lock:
            return dict(self._user(login, user_type))

    def _user(self, login, user_type=None):
        key = login.lower()
        u = self._users.get(key)
        if u is None:
            uid = self._next["user"]
            self._next["user"] += 1
            u = {"login": login, "id": uid,
                 "type": user_type or ("Bot" if login.endswith("[bot]") else "User")}
            self._users[key] = u
        elif user_type and u["type"] != user_type:
            u["type"] = user_type
        return u

    def add_repo(self, full_name, default_branch="main", private=False, owner_type=None,
                 clone_url=None, fork=False, description=None):
        """Creates a repository (an existing one is updated). owner_type: "User" (the owner
        is then admin) or "Organization" (default when the owner was not registered)."""
        owner, name = full_name.split("/", 1)
        with self._lock:
            key = full_name.lower()
            r = self._repos.get(key)
            if r is None:
                rid = self._next["repo"]
                self._next["repo"] += 1
                r = {"id": rid, "full_name": full_name, "owner": owner, "name": name,
                     "branches": {}, "commits": {}, "perms": {}, "created": time.time()}
                self._repos[key] = r
                self._repo_by_id[rid] = r
            self._user(owner, owner_type or
                       (self._users[owner.lower()]["type"] if owner.lower() in self._users
                        else "Organization"))
            r.update(default_branch=default_branch, private=bool(private), fork=bool(fork),
                     clone_url=clone_url, description=description, pushed=time.time())
            if default_branch not in r["branches"]:
                self._set_branch(r, default_branch, {})
            return self._repo_json(r)

    def _repo(self, full_name):
        r = self._repos.get(full_name.lower())
        if r is None:
            raise KeyError("fake_github: no repository %r (add_repo first)" % full_name)
        return r

    def _set_branch(self, r, ref, files):
        files = dict(files)
        blob = json.dumps(sorted((p, git_blob_sha(c)) for p, c in files.items()))
        sha = hashlib.sha1(("%s\0%s\0%s\0%f" % (r["full_name"], ref, blob, time.time()))
                           .encode()).hexdigest()
        r["branches"][ref] = sha
        r["commits"][sha] = files

    def add_branch(self, repo, ref, files=None):
        """Creates (or resets) branch REF with FILES {path: str|bytes}; returns its sha."""
        with self._lock:
            r = self._repo(repo)
            self._set_branch(r, ref, {p: (c.encode() if isinstance(c, str) else c)
                                      for p, c in (files or {}).items()})
            return r["branches"][ref]

    def set_file(self, repo, path, content, ref=None):
        """Writes PATH on branch REF (default branch when None), creating the branch.
        Branches are independent file sets (a new branch does not inherit main's files).
        Every change makes a new commit sha; old shas keep their snapshot."""
        with self._lock:
            r = self._repo(repo)
            ref = ref or r["default_branch"]
            files = dict(r["commits"][r["branches"][ref]]) if ref in r["branches"] else {}
            files[path.strip("/")] = content.encode() if isinstance(content, str) else content
            self._set_branch(r, ref, files)
            return r["branches"][ref]

    def delete_file(self, repo, path, ref=None):
        with self._lock:
            r = self._repo(repo)
            ref = ref or r["default_branch"]
            files = dict(r["commits"][r["branches"][ref]])
            files.pop(path.strip("/"), None)
            self._set_branch(r, ref, files)

    def branch_sha(self, repo, ref):
        with self._lock:
            return self._repo(repo)["branches"].get(ref)

    def add_pull(self, repo, number, head_ref="feature", head_repo=None, base_ref=None,
                 title=None, user="octocat", state="open", body=None, draft=False):
        """Creates PR NUMBER (an issue that is a pull request). head_repo defaults to REPO;
        a head repo that does not exist yet is created as a public fork. The head branch is
        created (empty) when missing. Returns the pull JSON."""
        with self._lock:
            r = self._repo(repo)
            hr_name = head_repo or r["full_name"]
            if hr_name.lower() not in self._repos:
                self.add_repo(hr_name, default_branch=r["default_branch"], fork=True,
                              owner_type="User")
            hr = self._repo(hr_name)
            if head_ref not in hr["branches"]:
                self._set_branch(hr, head_ref, {})
            base_ref = base_ref or r["default_branch"]
            if base_ref not in r["branches"]:
                self._set_branch(r, base_ref, {})
            self._user(user)
            self._new_issue(r, number, title or "Pull request %d" % number, user, state, body,
                            pull={"head_repo": hr["full_name"], "head_ref": head_ref,
                                  "base_ref": base_ref, "draft": bool(draft),
                                  "id": self._take("pull")})
            return self._pull_json(self._issues[(r["full_name"].lower(), number)])

    def add_issue(self, repo, number, title=None, user="octocat", state="open", body=None):
        """Creates a plain issue (not a pull request)."""
        with self._lock:
            r = self._repo(repo)
            self._user(user)
            self._new_issue(r, number, title or "Issue %d" % number, user, state, body, None)
            return self._issue_json(self._issues[(r["full_name"].lower(), number)])

    def _take(self, kind):
        v = self._next[kind]
        self._next[kind] += 1
        return v

    def _new_issue(self, r, number, title, user, state, body, pull):
        now = time.time()
        self._issues[(r["full_name"].lower(), int(number))] = {
            "repo": r, "number": int(number), "title": title, "user": user, "state": state,
            "body": body, "pull": pull, "id": self._take("issue"), "created": now,
            "updated": now, "comments": []}

    def set_permission(self, repo, login, role):
        """Grants LOGIN the role admin|maintain|write|triage|read|none on REPO."""
        if role not in ROLES:
            raise ValueError("role must be one of %s" % (ROLES,))
        with self._lock:
            r = self._repo(repo)
            self._user(login)
            r["perms"][login.lower()] = role

    def add_comment(self, repo, number, user="octocat", body="", user_type=None,
                    author_association=None, created_at=None):
        """Seeds a comment on issue/PR NUMBER as USER (user_type "User"/"Bot"; None keeps
        a known user's type, new users are "User", or "Bot" for "name[bot]"). Returns the
        comment JSON."""
        with self._lock:
            r = self._repo(repo)
            issue = self._issue(r, number)
            if issue is None:
                raise KeyError("fake_github: no issue/PR %s#%s" % (repo, number))
            self._user(user, user_type)
            c = self._new_comment(issue, user, body, author_association, created_at)
            return self._comment_json(c)

    def _issue(self, r, number):
        return self._issues.get((r["full_name"].lower(), int(number)))

    def _new_comment(self, issue, login, body, assoc=None, created=None):
        now = time.time() if created is None else created
        c = {"id": self._take("comment"), "issue": issue, "user": login.lower(), "body": body,
             "created": now, "updated": now, "assoc": assoc}
        self._comments[c["id"]] = c
        issue["comments"].append(c["id"])
        issue["updated"] = now
        return c

    # ------------------------------------------------------------------ auth setup
    def expect_token(self, token, login=None):
        """Requires authentication: from now on only the expected tokens (and issued
        installation tokens) are accepted, else 401 Bad credentials. LOGIN is the user the
        token belongs to (default: bot_login at request time). May be called repeatedly."""
        with self._lock:
            self._tokens[token] = login
            if login:
                self._user(login)

    def set_app(self, app_id, public_key_pem=None, slug="diverge", name=None):
        """Configures the GitHub App. With a key (public, or a private one from which the
        public key is derived) JWT signatures are verified; iss must equal app_id."""
        with self._lock:
            pub_path = None
            if public_key_pem:
                if self._tmp is None:
                    self._tmp = tempfile.mkdtemp(prefix="fakegh-")
                src = os.path.join(self._tmp, "app-key-%s.pem" % app_id)
                with open(src, "w") as f:
                    f.write(public_key_pem)
                pub_path = src
                if "PRIVATE KEY" in public_key_pem:
                    pub_path = os.path.join(self._tmp, "app-pub-%s.pem" % app_id)
                    subprocess.run(["openssl", "pkey", "-in", src, "-pubout", "-out", pub_path],
                                   check=True, capture_output=True)
            self._app = {"id": int(app_id), "slug": slug, "name": name or slug,
                         "pub": pub_path}
            self._user(slug + "[bot]", "Bot")

    def add_installation(self, installation_id, repos=None, account=None):
        """Registers an installation of the app; REPOS (full names) limits what its tokens
        can see (None = all). Once any installation is registered, others are 404."""
        with self._lock:
            self._installations[int(installation_id)] = {
                "repos": None if repos is None else {x.lower() for x in repos},
                "account": account}

    def revoke_token(self, token):
        with self._lock:
            self._tokens.pop(token, None)
            self._issued.pop(token, None)

    @property
    def issued_tokens(self):
        """Installation tokens issued so far: {token: {installation_id, expires, ...}}."""
        with self._lock:
            return {k: dict(v) for k, v in self._issued.items()}

    def serve_git(self, full_name, bare):
        """Serves the bare repository BARE (an existing directory) as {url}/{full_name}.git
        over git's smart HTTP, fetch and push; the repository is also added to the API."""
        with self._lock:
            if full_name.lower() not in self._repos:
                self.add_repo(full_name)
            self._git[full_name.lower()] = os.path.abspath(bare)

    def git_requests(self, service=None):
        """(method, path, user, password) of the git requests so far; SERVICE
        ("git-upload-pack" for fetches, "git-receive-pack" for pushes) keeps those of one."""
        with self._lock:
            return [x for x in self.git_auth if service is None or service in x[1]]

    def rate_limit_remaining(self, remaining, limit=5000, reset_in=3600, resource="core",
                             used=None):
        """Sets the primary rate-limit state sent in x-ratelimit-* headers. Each counted
        request decrements remaining; at 0 requests get rate_limit_status (403) "API rate
        limit exceeded" until the reset time, when remaining refills to limit."""
        with self._lock:
            self._rate = {"limit": limit, "remaining": remaining,
                          "reset": int(time.time() + reset_in), "resource": resource,
                          "used": limit - remaining if used is None else used}

    # ------------------------------------------------------------------ faults
    def inject(self, method=None, path_re=None, status=None, headers=None, body=None, times=1,
               delay=0.0, apply=False, drop=False):
        """The next TIMES requests matching METHOD and PATH_RE (re.search on the path
        without query; None = any) get STATUS with HEADERS and BODY (dict/list -> JSON,
        str/bytes -> raw; None -> GitHub's default error body for the status), after DELAY
        seconds. status=None with a delay: a slow but otherwise normal response.
        apply=True performs the request's effect before answering with STATUS (a "lost
        response"). drop=True closes the connection without any response. times=None:
        forever. Returns the Rule (rule.hits counts matches)."""
        rule = Rule(method, path_re, status, headers, body, times, delay, apply, drop)
        with self._lock:
            self._rules.append(rule)
        return rule

    def clear_injections(self):
        with self._lock:
            self._rules = []

    # ------------------------------------------------------------------ inspection
    def comments(self, repo, number):
        """The thread of issue/PR NUMBER, as GitHub returns it (ids ascending)."""
        with self._lock:
            issue = self._issue(self._repo(repo), number)
            if issue is None:
                return []
            return [self._comment_json(self._comments[i]) for i in issue["comments"]]

    def comment(self, comment_id):
        with self._lock:
            c = self._comments.get(int(comment_id))
            return self._comment_json(c) if c else None

    def reactions(self, comment_id):
        """Reactions on an issue comment (reaction JSON objects, oldest first)."""
        with self._lock:
            return [self._reaction_json(x) for x in sorted(self._reactions.values(),
                                                           key=lambda x: x["id"])
                    if x["comment"] == int(comment_id)]

    @property
    def requests(self):
        """The request log (a copy): dicts with method, path, query (dict), raw_query,
        headers (lower-case names), body (JSON, text or None), status, time, duration,
        injected, response."""
        with self._lock:
            return list(self._log)

    def find_requests(self, method=None, path_re=None, status=None):
        rx = re.compile(path_re) if path_re else None
        return [r for r in self.requests
                if (not method or r["method"] == method.upper())
                and (not rx or rx.search(r["path"]))
                and (status is None or r["status"] == status)]

    def clear_requests(self):
        with self._lock:
            self._log = []

    @property
    def stats(self):
        """Counters: requests, writes (POST/PATCH/PUT/DELETE received, /app/* excluded),
        writes_ok (2xx), writes_per_minute {epoch minute: n}, max_writes_per_minute (most
        writes in any sliding 60 s window), max_concurrency, in_flight, rate_limited,
        secondary_limited."""
        with self._lock:
            s = dict(self._counts)
            times = sorted(self._write_times)
        per_min = {}
        for t in times:
            per_min[int(t // 60) * 60] = per_min.get(int(t // 60) * 60, 0) + 1
        best, j = 0, 0
        for i, t in enumerate(times):
            while times[j] <= t - 60:
                j += 1
            best = max(best, i - j + 1)
        s["writes_per_minute"] = per_min
        s["max_writes_per_minute"] = best
        return s

    def writes_in_window(self, seconds=60.0):
        now = time.time()
        with self._lock:
            return sum(1 for t in self._write_times if t > now - seconds)

    def wait_for(self, predicate, timeout=10.0, interval=0.05):
        """Polls PREDICATE until it returns something truthy (returned) or raises
        AssertionError after TIMEOUT seconds."""
        deadline = time.time() + timeout
        while True:
            v = predicate()
            if v:
                return v
            if time.time() >= deadline:
                raise AssertionError("fake_github: condition not met within %.1fs" % timeout)
            time.sleep(interval)

    def wait_for_request(self, method=None, path_re=None, status=None, count=1, timeout=10.0):
        return self.wait_for(lambda: (lambda r: r if len(r) >= count else None)(
            self.find_requests(method, path_re, status)), timeout)

    # ------------------------------------------------------------------ JSON shapes
    def _api(self, path):
        return self.url + path

    def _user_json(self, login, extra=None):
        u = self._users.get(login.lower()) or self._user(login)
        lg = u["login"]
        d = {"login": lg, "id": u["id"], "node_id": node_id("User", u["id"]),
             "avatar_url": "https://avatars.githubusercontent.com/u/%d?v=4" % u["id"],
             "gravatar_id": "", "url": self._api("/users/" + lg),
             "html_url": self.html_base + "/" + lg,
             "followers_url": self._api("/users/%s/followers" % lg),
             "repos_url": self._api("/users/%s/repos" % lg),
             "type": u["type"], "user_view_type": "public", "site_admin": False}
        if lg.endswith("[bot]"):
            d["html_url"] = self.html_base + "/apps/" + lg[:-5]
        d.update(extra or {})
        return d

    def _repo_json(self, r, for_login=None):
        fn = r["full_name"]
        html = self.html_base + "/" + fn
        d = {"id": r["id"], "node_id": node_id("Repository", r["id"]), "name": r["name"],
             "full_name": fn, "private": r["private"], "owner": self._user_json(r["owner"]),
             "html_url": html, "description": r.get("description"), "fork": r["fork"],
             "url": self._api("/repos/" + fn),
             "pulls_url": self._api("/repos/%s/pulls{/number}" % fn),
             "issue_comment_url": self._api("/repos/%s/issues/comments{/number}" % fn),
             "contents_url": self._api("/repos/%s/contents/{+path}" % fn),
             "git_url": "git://github.com/%s.git" % fn,
             "ssh_url": "git@github.com:%s.git" % fn,
             "clone_url": r.get("clone_url") or html + ".git",
             "svn_url": html, "homepage": None, "size": 0, "stargazers_count": 0,
             "watchers_count": 0, "language": None, "has_issues": True,
             "forks_count": 0, "archived": False, "disabled": False, "open_issues_count": 0,
             "visibility": "private" if r["private"] else "public",
             "default_branch": r["default_branch"],
             "created_at": iso(r["created"]), "updated_at": iso(r["pushed"]),
             "pushed_at": iso(r["pushed"])}
        if for_login:
            role = self._role(r, for_login)
            d["permissions"] = self._perm_flags(role)
        return d

    @staticmethod
    def _perm_flags(role):
        order = ["read", "triage", "write", "maintain", "admin"]
        lvl = order.index(role) if role in order else -1
        return {"admin": lvl >= 4, "maintain": lvl >= 3, "push": lvl >= 2,
                "triage": lvl >= 1, "pull": lvl >= 0}

    def _issue_html(self, issue):
        return "%s/%s/%s/%d" % (self.html_base, issue["repo"]["full_name"],
                                "pull" if issue["pull"] else "issues", issue["number"])

    def _issue_json(self, issue):
        fn = issue["repo"]["full_name"]
        n = issue["number"]
        d = {"url": self._api("/repos/%s/issues/%d" % (fn, n)),
             "repository_url": self._api("/repos/" + fn),
             "comments_url": self._api("/repos/%s/issues/%d/comments" % (fn, n)),
             "html_url": self._issue_html(issue), "id": issue["id"],
             "node_id": node_id("Issue", issue["id"]), "number": n, "title": issue["title"],
             "user": self._user_json(issue["user"]), "labels": [], "state": issue["state"],
             "locked": False, "assignee": None, "assignees": [], "milestone": None,
             "comments": len(issue["comments"]), "created_at": iso(issue["created"]),
             "updated_at": iso(issue["updated"]),
             "closed_at": iso(issue["updated"]) if issue["state"] == "closed" else None,
             "author_association": self._assoc(issue["repo"], issue["user"]),
             "body": issue["body"], "performed_via_github_app": None}
        if issue["pull"]:
            d["draft"] = issue["pull"]["draft"]
            d["pull_request"] = {"url": self._api("/repos/%s/pulls/%d" % (fn, n)),
                                 "html_url": self._issue_html(issue),
                                 "diff_url": self._issue_html(issue) + ".diff",
                                 "patch_url": self._issue_html(issue) + ".patch",
                                 "merged_at": None}
        return d

    def _branch_json(self, r, ref):
        owner = r["owner"]
        return {"label": "%s:%s" % (owner, ref), "ref": ref, "sha": r["branches"].get(ref),
                "user": self._user_json(owner), "repo": self._repo_json(r)}

    def _pull_json(self, issue):
        r = issue["repo"]
        p = issue["pull"]
        fn = r["full_name"]
        n = issue["number"]
        hr = self._repos[p["head_repo"].lower()]
        html = self._issue_html(issue)
        return {"url": self._api("/repos/%s/pulls/%d" % (fn, n)), "id": p["id"],
                "node_id": node_id("PullRequest", p["id"]), "html_url": html,
                "diff_url": html + ".diff", "patch_url": html + ".patch",
                "issue_url": self._api("/repos/%s/issues/%d" % (fn, n)),
                "commits_url": self._api("/repos/%s/pulls/%d/commits" % (fn, n)),
                "comments_url": self._api("/repos/%s/issues/%d/comments" % (fn, n)),
                "review_comments_url": self._api("/repos/%s/pulls/%d/comments" % (fn, n)),
                "statuses_url": self._api("/repos/%s/statuses/%s" %
                                          (fn, hr["branches"].get(p["head_ref"]))),
                "number": n, "state": issue["state"], "locked": False,
                "title": issue["title"], "user": self._user_json(issue["user"]),
                "body": issue["body"], "labels": [], "milestone": None,
                "created_at": iso(issue["created"]), "updated_at": iso(issue["updated"]),
                "closed_at": iso(issue["updated"]) if issue["state"] == "closed" else None,
                "merged_at": None, "merge_commit_sha": None, "assignee": None,
                "assignees": [], "requested_reviewers": [], "requested_teams": [],
                "draft": p["draft"],
                "head": self._branch_json(hr, p["head_ref"]),
                "base": self._branch_json(r, p["base_ref"]),
                "author_association": self._assoc(r, issue["user"]),
                "auto_merge": None, "active_lock_reason": None, "merged": False,
                "mergeable": True, "rebaseable": True, "mergeable_state": "clean",
                "merged_by": None, "comments": len(issue["comments"]),
                "review_comments": 0, "maintainer_can_modify": hr is not r, "commits": 1,
                "additions": 1, "deletions": 0, "changed_files": 1}

    def _comment_json(self, c):
        issue = c["issue"]
        fn = issue["repo"]["full_name"]
        counts = {k: 0 for k in REACTIONS}
        for x in self._reactions.values():
            if x["comment"] == c["id"]:
                counts[x["content"]] += 1
        api = self._api("/repos/%s/issues/comments/%d" % (fn, c["id"]))
        reactions = {"url": api + "/reactions", "total_count": sum(counts.values())}
        reactions.update(counts)
        return {"url": api,
                "html_url": "%s#issuecomment-%d" % (self._issue_html(issue), c["id"]),
                "issue_url": self._api("/repos/%s/issues/%d" % (fn, issue["number"])),
                "id": c["id"], "node_id": node_id("IssueComment", c["id"]),
                "user": self._user_json(c["user"]),
                "created_at": iso(c["created"]), "updated_at": iso(c["updated"]),
                "author_association": c["assoc"] or self._assoc(issue["repo"], c["user"]),
                "body": c["body"], "reactions": reactions,
                "performed_via_github_app": None}

    def _reaction_json(self, x):
        return {"id": x["id"], "node_id": node_id("Reaction", x["id"]),
                "user": self._user_json(x["user"]), "content": x["content"],
                "created_at": iso(x["created"])}

    def _role(self, r, login):
        role = r["perms"].get(login.lower())
        if role:
            return role
        if login.lower() == r["owner"].lower() and \
                self._users.get(login.lower(), {}).get("type") == "User":
            return "admin"
        return None

    def _assoc(self, r, login):
        if login.lower() == r["owner"].lower():
            return "OWNER"
        role = r["perms"].get(login.lower())
        if role and role != "none":
            return "COLLABORATOR"
        return "NONE"

    # ------------------------------------------------------------------ HTTP plumbing
    def _request_id(self):
        return "%04X:%04X:%06X:%06X:%08X" % (random.getrandbits(16), random.getrandbits(16),
                                             random.getrandbits(24), random.getrandbits(24),
                                             int(time.time()))

    def _rate_headers(self):
        rt = self._rate
        return {"X-RateLimit-Limit": str(rt["limit"]),
                "X-RateLimit-Remaining": str(rt["remaining"]),
                "X-RateLimit-Reset": str(rt["reset"]), "X-RateLimit-Used": str(rt["used"]),
                "X-RateLimit-Resource": rt["resource"]}

    def _handle(self, h):
        t0 = time.time()
        with self._lock:
            self._counts["requests"] += 1
            self._counts["in_flight"] += 1
            self._counts["max_concurrency"] = max(self._counts["max_concurrency"],
                                                  self._counts["in_flight"])
        try:
            self._handle2(h, t0)
        finally:
            with self._lock:
                self._counts["in_flight"] -= 1

    def _handle2(self, h, t0):
        method = h.command.upper()
        split = urllib.parse.urlsplit(h.path)
        path = split.path
        if path.startswith("/api/v3/"):
            path = path[len("/api/v3"):]
        elif re.match(r"^/[^/]+/[^/]+\.git/", path):
            self._git_request(h, method, path, split.query)
            return
        query_list = urllib.parse.parse_qsl(split.query, keep_blank_values=True)
        query = dict(query_list)
        try:
            raw = h._read_body()
        except (OSError, ValueError):
            h.close_connection = True
            return
        text = raw.decode("utf-8", errors="replace")
        try:
            body_logged = json.loads(text) if text else None
        except ValueError:
            body_logged = text
        hdrs = {k.lower(): v for k, v in h.headers.items()}
        entry = {"method": method, "path": path, "query": query, "raw_query": split.query,
                 "headers": hdrs, "body": body_logged, "status": None, "time": t0,
                 "duration": None, "injected": False, "response": None}
        is_write = method in WRITE_METHODS and not path.startswith("/app/")
        with self._lock:
            if is_write:
                self._counts["writes"] += 1
                self._write_times.append(t0)
            rule = next((x for x in self._rules if x.matches(method, path)), None)
            if rule:
                rule.hits += 1
        extra_headers = {}
        status = None
        resp = None
        if rule:
            entry["injected"] = True
            if rule.delay:
                self._stop_event.wait(rule.delay)
            if rule.drop:
                entry["status"] = 0
                entry["duration"] = time.time() - t0
                with self._lock:
                    self._log.append(entry)
                h.close_connection = True
                try:
                    h.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                return
        if rule is None or rule.status is None or rule.apply:
            try:
                status, resp, extra_headers = self._dispatch(method, path, query, query_list,
                                                             hdrs, raw, text)
            except Exception as e:  # a bug in the fake: answer 500 and keep it for the test
                import traceback
                with self._lock:
                    self.errors.append("%s %s: %s" % (method, path, traceback.format_exc()))
                status, resp, extra_headers = 500, {
                    "message": "fake_github internal error: %r" % e,
                    "documentation_url": DOCS, "status": "500"}, {}
        if rule is not None and rule.status is not None:
            status = rule.status
            extra_headers = {}
            if rule.body is None:
                if status >= 400:
                    msg = DEFAULT_MESSAGES.get(status, "Error")
                    if status == 403 and any(k.lower() == "retry-after" for k in rule.headers):
                        msg = ("You have exceeded a secondary rate limit. Please wait a few "
                               "minutes before you try again.")
                    resp = {"message": msg, "documentation_url": DOCS, "status": str(status)}
                else:
                    resp = None if status in (204, 304) else resp
            else:
                resp = rule.body
            extra_headers.update(rule.headers)
        self._respond(h, method, hdrs, status, resp, extra_headers, entry, t0, is_write)

    def _respond(self, h, method, hdrs, status, resp, extra_headers, entry, t0, is_write):
        headers = {"Content-Type": JSON_CT, "X-GitHub-Request-Id": self._request_id(),
                   "X-GitHub-Media-Type": "github.v3; format=json",
                   "X-GitHub-Api-Version-Selected": "2022-11-28",
                   "Access-Control-Allow-Origin": "*", "X-Content-Type-Options": "nosniff",
                   "Vary": "Accept, Authorization, Cookie, X-GitHub-OTP",
                   "Cache-Control": "private, max-age=60, s-maxage=60"}
        with self._lock:
            headers.update(self._rate_headers())
        if isinstance(resp, (dict, list)):
            payload = json.dumps(resp, ensure_ascii=False).encode("utf-8")
        elif isinstance(resp, str):
            payload = resp.encode("utf-8")
            headers["Content-Type"] = "text/plain; charset=utf-8"
        elif isinstance(resp, bytes):
            payload = resp
            headers["Content-Type"] = "text/plain; charset=utf-8"
        else:
            payload = b""
        if status == 200 and method in ("GET", "HEAD") and payload:
            etag = 'W/"%s"' % hashlib.sha256(payload).hexdigest()
            headers["ETag"] = etag
            inm = hdrs.get("if-none-match")
            if inm and etag in [x.strip() for x in inm.split(",")]:
                status, payload = 304, b""
                with self._lock:  # 304s do not count against the rate limit
                    if self._rate["used"] > 0:
                        self._rate["used"] -= 1
                        self._rate["remaining"] += 1
                    headers.update(self._rate_headers())
        headers.update(extra_headers)
        if status in (204, 304):
            payload = b""
            headers.pop("Content-Type", None)
        entry["status"] = status
        entry["response"] = resp if isinstance(resp, (dict, list)) else None
        entry["duration"] = time.time() - t0
        with self._lock:
            self._log.append(entry)
            if is_write and 200 <= status < 300:
                self._counts["writes_ok"] += 1
        try:
            h.send_response(status, HTTP_REASONS.get(status))
            for k, v in headers.items():
                h.send_header(k, v)
            h.send_header("Content-Length", str(len(payload)))
            h.end_headers()
            if method != "HEAD" and payload:
                h.wfile.write(payload)
            h.wfile.flush()
        except OSError:
            h.close_connection = True

    # ------------------------------------------------------------------ routing
    ROUTES = [
        ("GET", r"", "get_repo"),
        ("GET", r"/pulls/(\d+)", "get_pull"),
        ("GET", r"/pulls", "list_pulls"),
        ("POST", r"/pulls", "create_pull"),
        ("GET", r"/issues/(\d+)", "get_issue"),
        ("GET", r"/issues/(\d+)/comments", "list_comments"),
        ("POST", r"/issues/(\d+)/comments", "create_comment"),
        ("GET", r"/issues/comments/(\d+)", "get_comment"),
        ("PATCH", r"/issues/comments/(\d+)", "update_comment"),
        ("DELETE", r"/issues/comments/(\d+)", "delete_comment"),
        ("GET", r"/issues/comments/(\d+)/reactions", "list_reactions"),
        ("POST", r"/issues/comments/(\d+)/reactions", "create_reaction"),
        ("DELETE", r"/issues/comments/(\d+)/reactions/(\d+)", "delete_reaction"),
        ("GET", r"/contents(?:/(.*))?", "get_contents"),
        ("GET", r"/collaborators/([^/]+)/permission", "get_permission"),
    ]

    def _dispatch(self, method, path, query, query_list, hdrs, raw, text):
        """Returns (status, body, extra headers)."""
        try:
            if self.require_user_agent and not hdrs.get("user-agent"):
                raise Reject(403, "Request forbidden by administrative rules. Please make "
                             "sure your request has a User-Agent header "
                             "(https://docs.github.com/en/rest/overview/resources-in-the-rest-api#user-agent-required). "
                             "Check https://developer.github.com for other possible causes.")
            ver = hdrs.get("x-github-api-version")
            if ver is not None and ver not in API_VERSIONS:
                raise Reject(400, "API version '%s' is not supported." % ver)
            if (re.match(r"^(/organizations/[^/]+)?/settings/apps/new$", path) or
                    re.match(r"^/app-manifests/[^/]+/conversions$", path)):
                return self._manifest_routes(method, path, query, hdrs, text)
            if path.startswith("/app") or re.match(r"^/repos/[^/]+/[^/]+/installation$", path):
                return self._app_routes(method, path, hdrs, text)
            with self._lock:
                ident = self._authenticate(hdrs)
                if path == "/rate_limit" and method == "GET":
                    return 200, self._rate_limit_json(), {}
                self._count_rate(ident)
                if path == "/user" and method == "GET":
                    return self._get_user(ident)
                m = re.match(r"^/repos/([^/]+)/([^/]+)(/.*)?$", path)
                r = None
                if m:
                    r = self._repos.get(("%s/%s" % (urllib.parse.unquote(m.group(1)),
                                                    urllib.parse.unquote(m.group(2)))).lower())
                    rest = m.group(3) or ""
                else:
                    m = re.match(r"^/repositories/(\d+)(/.*)?$", path)
                    if not m:
                        raise Reject(404)
                    r = self._repo_by_id.get(int(m.group(1)))
                    rest = m.group(2) or ""
                rmethod_wanted = "GET" if method == "HEAD" else method
                for rmethod, rx, name in self.ROUTES:
                    mm = re.match("^" + rx + "$", rest)
                    if mm and rmethod == rmethod_wanted:
                        break
                else:
                    raise Reject(404)
                if ident is not None and ident["kind"] == "jwt":
                    raise Reject(403, "Resource not accessible by integration",
                                 DOC.get(name, DOCS))
                if r is None or not self._visible(r, ident):
                    raise Reject(404, doc=DOC.get(name.replace("get_", ""), DOC["repo"]))
                if method in WRITE_METHODS:
                    if ident is None:
                        raise Reject(401, "Requires authentication", DOC.get(name, DOCS))
                    self._secondary_check()
                body = None
                if method in ("POST", "PATCH", "PUT"):
                    body = self._json_body(text, DOC.get(name, DOCS))
                return getattr(self, "_r_" + name)(r, ident, mm.groups(), query, query_list,
                                                   hdrs, body)
        except Reject as e:
            return e.status, e.body, e.headers

    def _json_body(self, text, doc):
        if not text.strip():
            return {}
        try:
            body = json.loads(text)
        except ValueError:
            raise Reject(400, "Problems parsing JSON", doc)
        if not isinstance(body, dict):
            raise Reject(400, "Problems parsing JSON", doc)
        return body

    def _authenticate(self, hdrs):
        auth = hdrs.get("authorization")
        if not auth:
            return None
        scheme, _, cred = auth.strip().partition(" ")
        cred = cred.strip()
        if scheme.lower() not in ("bearer", "token") or not cred:
            raise Reject(401, "Bad credentials")
        info = self._issued.get(cred)
        if info is not None:
            if info["expires"] <= time.time():
                raise Reject(401, "Bad credentials")
            return {"kind": "installation", "login": self._app["slug"] + "[bot]",
                    "token": cred, "installation": info}
        if cred.count(".") == 2 and cred.startswith("eyJ"):
            return {"kind": "jwt", "login": None, "token": cred}
        if self._tokens:
            if cred not in self._tokens:
                raise Reject(401, "Bad credentials")
            login = self._tokens[cred] or self.bot_login
        else:
            login = self.bot_login
        self._user(login, None)
        if login.lower() == self.bot_login.lower():
            self._users[login.lower()]["type"] = self.bot_type
        return {"kind": "pat", "login": login, "token": cred}

    def _count_rate(self, ident):
        rt = self._rate
        now = time.time()
        if now >= rt["reset"]:
            rt.update(remaining=rt["limit"], used=0, reset=int(now) + 3600)
        if rt["remaining"] <= 0:
            self._counts["rate_limited"] += 1
            who = ("installation ID %d" % ident["installation"]["id"]
                   if ident and ident["kind"] == "installation" else
                   "user ID %d" % self._users[ident["login"].lower()]["id"]
                   if ident and ident.get("login") else "127.0.0.1")
            raise Reject(self.rate_limit_status,
                         "API rate limit exceeded for %s. If you reach out to GitHub Support "
                         "for help, please include the request ID." % who, DOC["rate_limit"])
        rt["remaining"] -= 1
        rt["used"] += 1

    def _secondary_check(self):
        lim = self.secondary_limit_per_minute
        now = time.time()
        ok = self._admitted = [t for t in self._admitted if t > now - 60]
        if lim and len(ok) >= lim:
            self._counts["secondary_limited"] += 1
            retry = max(1, int(math.ceil(min(ok) + 60 - now)))
            raise Reject(403, "You have exceeded a secondary rate limit. Please wait a few "
                         "minutes before you try again. If you reach out to GitHub Support "
                         "for help, please include the request ID.", DOC["secondary"],
                         headers={"Retry-After": str(retry)})
        ok.append(now)

    def _visible(self, r, ident):
        if ident is not None and ident["kind"] == "installation":
            repos = ident["installation"].get("repos")
            if repos is not None and r["full_name"].lower() not in repos:
                return False
            return True
        if not r["private"]:
            return True
        if ident is None or ident["kind"] != "pat":
            return False
        if not self._tokens:
            return True  # open mode: any token sees everything
        role = self._role(r, ident["login"])
        return role is not None and role != "none" or \
            ident["login"].lower() == self.bot_login.lower()

    def _rate_limit_json(self):
        rt = self._rate
        core = {"limit": rt["limit"], "used": rt["used"], "remaining": rt["remaining"],
                "reset": rt["reset"]}
        reset = int(time.time()) + 60
        return {"resources": {
            "core": core,
            "search": {"limit": 30, "used": 0, "remaining": 30, "reset": reset},
            "graphql": {"limit": 5000, "used": 0, "remaining": 5000, "reset": rt["reset"]},
            "integration_manifest": {"limit": 5000, "used": 0, "remaining": 5000,
                                     "reset": rt["reset"]},
            "code_search": {"limit": 10, "used": 0, "remaining": 10, "reset": reset}},
            "rate": dict(core)}

    # ------------------------------------------------------------------ handlers
    def _get_user(self, ident):
        if ident is None:
            raise Reject(401, "Requires authentication", DOC["user"])
        if ident["kind"] == "installation":
            raise Reject(403, "Resource not accessible by integration", DOC["user"])
        if ident["kind"] == "jwt":
            raise Reject(401, "Bad credentials", DOC["user"])
        u = self._users[ident["login"].lower()]
        return 200, self._user_json(u["login"], {
            "name": None, "company": None, "blog": "", "location": None, "email": None,
            "hireable": None, "bio": None, "twitter_username": None, "public_repos": 0,
            "public_gists": 0, "followers": 0, "following": 0,
            "created_at": "2020-01-01T00:00:00Z", "updated_at": "2020-01-01T00:00:00Z"}), {}

    def _r_get_repo(self, r, ident, groups, *a):
        login = ident.get("login") if ident and ident["kind"] == "pat" else None
        return 200, self._repo_json(r, login), {}

    def _r_get_pull(self, r, ident, groups, *a):
        issue = self._issue(r, int(groups[0]))
        if issue is None or not issue["pull"]:
            raise Reject(404, doc=DOC["pull"])
        return 200, self._pull_json(issue), {}

    def _pulls_of(self, r):
        return [i for (k, _), i in sorted(self._issues.items(), key=lambda x: x[0][1])
                if k == r["full_name"].lower() and i["pull"]]

    def _head_label(self, issue):
        return "%s:%s" % (issue["pull"]["head_repo"].split("/")[0], issue["pull"]["head_ref"])

    def _r_list_pulls(self, r, ident, groups, query, *a):
        state = query.get("state", "open")
        out = []
        for i in self._pulls_of(r):
            if state != "all" and i["state"] != state:
                continue
            if query.get("head") and self._head_label(i).lower() != query["head"].lower():
                continue
            if query.get("base") and i["pull"]["base_ref"] != query["base"]:
                continue
            out.append(self._pull_json(i))
        return 200, out, {}

    def _r_create_pull(self, r, ident, groups, query, ql, hdrs, body):
        doc = DOC["create_pull"]
        for f in ("title", "head", "base"):
            if not isinstance(body.get(f), str) or not body[f]:
                raise Reject(422, "Invalid request.\n\n\"%s\" wasn't supplied." % f, doc)
        head = body["head"]
        owner, _, ref = head.rpartition(":")
        owner = owner or r["full_name"].split("/")[0]
        label = "%s:%s" % (owner, ref)
        for i in self._pulls_of(r):
            if i["state"] == "open" and self._head_label(i).lower() == label.lower():
                raise Reject(422, "Validation Failed", doc, errors=[
                    {"resource": "PullRequest", "code": "custom",
                     "message": "A pull request already exists for %s." % label}])
        if body["base"] == ref and owner.lower() == r["full_name"].split("/")[0].lower():
            raise Reject(422, "Validation Failed", doc, errors=[
                {"resource": "PullRequest", "code": "custom",
                 "message": "No commits between %s and %s" % (body["base"], ref)}])
        if ref not in r["branches"]:
            self._set_branch(r, ref, {})  # the server pushed it over git, not this API
        if body["base"] not in r["branches"]:
            self._set_branch(r, body["base"], {})
        number = max([n for (k, n) in self._issues if k == r["full_name"].lower()] + [0]) + 1
        self._new_issue(r, number, body["title"], ident["login"], "open", body.get("body"),
                        pull={"head_repo": r["full_name"], "head_ref": ref,
                              "base_ref": body["base"], "draft": bool(body.get("draft")),
                              "id": self._take("pull")})
        j = self._pull_json(self._issues[(r["full_name"].lower(), number)])
        return 201, j, {"Location": j["url"]}

    def pulls(self, repo):
        """The pull requests of REPO as GitHub's JSON, by number."""
        with self._lock:
            return [self._pull_json(i) for i in self._pulls_of(self._repo(repo))]

    def _r_get_issue(self, r, ident, groups, *a):
        issue = self._issue(r, int(groups[0]))
        if issue is None:
            raise Reject(404, doc=DOC["issue"])
        return 200, self._issue_json(issue), {}

    def _page_args(self, query):
        def num(name, default):
            try:
                v = int(query.get(name, ""))
            except ValueError:
                return default
            return v if v >= 1 else default
        return min(num("per_page", 30), 100), num("page", 1)

    def _paginate(self, items, query_list, query, base_path):
        per_page, page = self._page_args(query)
        total = len(items)
        last = max(1, int(math.ceil(total / float(per_page))))
        chunk = items[(page - 1) * per_page: page * per_page]

        def link(p):
            q = [(k, v) for k, v in query_list if k != "page"] + [("page", str(p))]
            return "<%s%s?%s>" % (self.url, base_path, urllib.parse.urlencode(q))
        rels = []
        if page > 1:
            rels.append('%s; rel="prev"' % link(page - 1))
        if page < last:
            rels.append('%s; rel="next"' % link(page + 1))
            rels.append('%s; rel="last"' % link(last))
        if page > 1:
            rels.append('%s; rel="first"' % link(1))
        return chunk, ({"Link": ", ".join(rels)} if rels else {})

    def _list_base(self, r, rest):
        if self.link_style == "repos":
            return "/repos/%s%s" % (r["full_name"], rest)
        return "/repositories/%d%s" % (r["id"], rest)

    def _r_list_comments(self, r, ident, groups, query, query_list, hdrs, body):
        n = int(groups[0])
        issue = self._issue(r, n)
        if issue is None:
            raise Reject(404, doc=DOC["list_comments"])
        items = [self._comments[i] for i in issue["comments"]]
        if "since" in query:
            since = parse_iso(query["since"])
            if since is None:
                raise Reject(422, "Invalid request.\n\nFor 'since', %r is not a date-time."
                             % query["since"], DOC["list_comments"])
            items = [c for c in items if c["updated"] >= since]
        chunk, link = self._paginate(items, query_list, query,
                                     self._list_base(r, "/issues/%d/comments" % n))
        return 200, [self._comment_json(c) for c in chunk], link

    def _check_body(self, body, doc):
        if "body" not in body:
            raise Reject(422, "Invalid request.\n\n\"body\" wasn't supplied.", doc)
        b = body["body"]
        if not isinstance(b, str):
            raise Reject(422, "Invalid request.\n\nFor 'properties/body', %s is not a string."
                         % json.dumps(b), doc)
        if b == "":
            raise Reject(422, "Validation Failed", doc, errors=[
                {"resource": "IssueComment", "code": "missing_field", "field": "body"}])
        if len(b) > MAX_COMMENT:
            raise Reject(422, "Validation Failed", doc, errors=[
                {"resource": "IssueComment", "code": "custom", "field": "body",
                 "message": "body is too long (maximum is %d characters)" % MAX_COMMENT}])
        return b

    def _r_create_comment(self, r, ident, groups, query, ql, hdrs, body):
        issue = self._issue(r, int(groups[0]))
        if issue is None:
            raise Reject(404, doc=DOC["create_comment"])
        b = self._check_body(body, DOC["create_comment"])
        c = self._new_comment(issue, ident["login"], b)
        j = self._comment_json(c)
        return 201, j, {"Location": j["url"]}

    def _find_comment(self, r, cid, doc):
        c = self._comments.get(int(cid))
        if c is None or c["issue"]["repo"] is not r:
            raise Reject(404, doc=doc)
        return c

    def _r_get_comment(self, r, ident, groups, *a):
        return 200, self._comment_json(self._find_comment(r, groups[0], DOC["get_comment"])), {}

    def _r_update_comment(self, r, ident, groups, query, ql, hdrs, body):
        c = self._find_comment(r, groups[0], DOC["update_comment"])
        c["body"] = self._check_body(body, DOC["update_comment"])
        c["updated"] = time.time()
        return 200, self._comment_json(c), {}

    def _r_delete_comment(self, r, ident, groups, *a):
        c = self._find_comment(r, groups[0], DOC["delete_comment"])
        del self._comments[c["id"]]
        c["issue"]["comments"].remove(c["id"])
        for k in [k for k, x in self._reactions.items() if x["comment"] == c["id"]]:
            del self._reactions[k]
        return 204, None, {}

    def _r_list_reactions(self, r, ident, groups, query, query_list, hdrs, body):
        c = self._find_comment(r, groups[0], DOC["list_reactions"])
        content = query.get("content")
        if content is not None and content not in REACTIONS:
            raise Reject(422, "Invalid request.\n\n%s is not a member of %s." %
                         (json.dumps(content), json.dumps(list(REACTIONS))),
                         DOC["list_reactions"])
        items = sorted((x for x in self._reactions.values() if x["comment"] == c["id"] and
                        (content is None or x["content"] == content)), key=lambda x: x["id"])
        chunk, link = self._paginate(items, query_list, query, self._list_base(
            r, "/issues/comments/%d/reactions" % c["id"]))
        return 200, [self._reaction_json(x) for x in chunk], link

    def _r_create_reaction(self, r, ident, groups, query, ql, hdrs, body):
        c = self._find_comment(r, groups[0], DOC["create_reaction"])
        content = body.get("content")
        if "content" not in body:
            raise Reject(422, "Invalid request.\n\n\"content\" wasn't supplied.",
                         DOC["create_reaction"])
        if content not in REACTIONS:
            raise Reject(422, "Validation Failed", DOC["create_reaction"], errors=[
                {"resource": "Reaction", "code": "invalid", "field": "content"}])
        login = ident["login"].lower()
        for x in self._reactions.values():
            if x["comment"] == c["id"] and x["user"] == login and x["content"] == content:
                return 200, self._reaction_json(x), {}
        x = {"id": self._take("reaction"), "comment": c["id"], "user": login,
             "content": content, "created": time.time()}
        self._reactions[x["id"]] = x
        return 201, self._reaction_json(x), {}

    def _r_delete_reaction(self, r, ident, groups, *a):
        c = self._find_comment(r, groups[0], DOC["delete_reaction"])
        x = self._reactions.get(int(groups[1]))
        if x is None or x["comment"] != c["id"]:
            raise Reject(404, doc=DOC["delete_reaction"])
        del self._reactions[x["id"]]
        return 204, None, {}

    def _r_get_contents(self, r, ident, groups, query, ql, hdrs, body):
        path = urllib.parse.unquote(groups[0] or "").strip("/")
        ref = query.get("ref") or r["default_branch"]
        if ref.startswith("refs/heads/"):
            ref = ref[len("refs/heads/"):]
        if ref in r["branches"]:
            sha = r["branches"][ref]
        elif re.match(r"^[0-9a-f]{7,40}$", ref):
            full = [s for s in r["commits"] if s.startswith(ref)]
            if len(full) != 1:
                raise Reject(404, "No commit found for the ref %s" % ref, DOC["contents"])
            sha = full[0]
        else:
            raise Reject(404, "No commit found for the ref %s" % ref, DOC["contents"])
        files = r["commits"][sha]
        q_ref = query.get("ref") or r["default_branch"]
        if path in files:
            data = files[path]
            accept = hdrs.get("accept", "")
            if "vnd.github.raw" in accept or "vnd.github.v3.raw" in accept:
                return 200, data, {"Content-Type": "application/vnd.github.raw"}
            return 200, self._file_json(r, path, data, q_ref, True), {}
        prefix = path + "/" if path else ""
        entries = {}
        for p, data in files.items():
            if p.startswith(prefix):
                rest = p[len(prefix):]
                if "/" in rest:
                    d = rest.split("/", 1)[0]
                    entries.setdefault(d, None)
                else:
                    entries[rest] = data
        if not entries:
            raise Reject(404, doc=DOC["contents"])
        out = []
        for name in sorted(entries):
            data = entries[name]
            full = prefix + name
            if data is None:
                sub = json.dumps(sorted((p, git_blob_sha(c)) for p, c in files.items()
                                        if p.startswith(full + "/")))
                tsha = hashlib.sha1(sub.encode()).hexdigest()
                out.append(self._entry_json(r, full, "dir", tsha, 0, q_ref))
            else:
                out.append(self._file_json(r, full, data, q_ref, False))
        return 200, out, {}

    def _entry_json(self, r, path, typ, sha, size, ref):
        fn = r["full_name"]
        qp = urllib.parse.quote(path)
        api = self._api("/repos/%s/contents/%s?ref=%s" % (fn, qp, urllib.parse.quote(ref)))
        git = self._api("/repos/%s/git/%s/%s" % (fn, "blobs" if typ == "file" else "trees",
                                                 sha))
        html = "%s/%s/%s/%s/%s" % (self.html_base, fn, "blob" if typ == "file" else "tree",
                                   ref, qp)
        return {"name": path.rsplit("/", 1)[-1], "path": path, "sha": sha, "size": size,
                "url": api, "html_url": html, "git_url": git,
                "download_url": ("https://raw.githubusercontent.com/%s/%s/%s" % (fn, ref, qp))
                if typ == "file" else None,
                "type": typ, "_links": {"self": api, "git": git, "html": html}}

    def _file_json(self, r, path, data, ref, with_content):
        d = self._entry_json(r, path, "file", git_blob_sha(data), len(data), ref)
        if with_content:
            if len(data) > 1024 * 1024:
                d["content"], d["encoding"] = "", "none"
            else:
                d["content"], d["encoding"] = gh_base64(data), "base64"
        return d

    def _r_get_permission(self, r, ident, groups, *a):
        login = urllib.parse.unquote(groups[0])
        u = self._users.get(login.lower())
        if u is None:
            if not self.auto_users:
                raise Reject(404, doc=DOC["permission"])
            u = self._user(login)
        role = self._role(r, login)
        if role is None:
            role = "none" if r["private"] else "read"
        return 200, {"permission": LEGACY_PERMISSION[role], "role_name": role,
                     "user": self._user_json(u["login"], {
                         "permissions": self._perm_flags(role), "role_name": role})}, {}

    # ------------------------------------------------------------------ GitHub App
    def _verify_jwt(self, hdrs):
        auth = hdrs.get("authorization") or ""
        scheme, _, tok = auth.strip().partition(" ")
        bad = Reject(401, "A JSON web token could not be decoded", DOC["access_token"])
        if scheme.lower() != "bearer" or tok.count(".") != 2:
            raise bad
        h64, c64, s64 = tok.strip().split(".")
        try:
            header = json.loads(b64url_decode(h64))
            claims = json.loads(b64url_decode(c64))
            sig = b64url_decode(s64)
        except ValueError:
            raise bad
        if not isinstance(header, dict) or not isinstance(claims, dict):
            raise bad
        if header.get("alg") != "RS256":
            raise bad
        now = time.time()
        iat, exp, iss = claims.get("iat"), claims.get("exp"), claims.get("iss")
        if not isinstance(iat, (int, float)) or isinstance(iat, bool) or iat > now + 60:
            raise Reject(401, "'Issued at' claim ('iat') must be an Integer representing the "
                         "time that the assertion was issued", DOC["access_token"])
        if not isinstance(exp, (int, float)) or isinstance(exp, bool) or exp <= now:
            raise Reject(401, "'Expiration time' claim ('exp') must be a numeric value "
                         "representing the future time at which the assertion expires",
                         DOC["access_token"])
        if exp - iat > 600 or exp > now + 600 + 60:
            raise Reject(401, "'Expiration time' claim ('exp') is too far in the future",
                         DOC["access_token"])
        if isinstance(iss, bool) or not isinstance(iss, (int, str)) or \
                not re.match(r"^\d+$", str(iss)):
            raise Reject(401, "'Issuer' claim ('iss') must be an Integer", DOC["access_token"])
        with self._lock:
            app = self._app
        if app is not None:
            if int(iss) != app["id"]:
                raise Reject(401, "Integration not found", DOC["access_token"])
            if app["pub"] and not self._openssl_verify(app["pub"], (h64 + "." + c64).encode(),
                                                       sig):
                raise Reject(401, "A JSON web token could not be decoded",
                             DOC["access_token"])
        with self._lock:
            self.jwts.append((header, claims))
        return claims

    def _openssl_verify(self, pub_path, data, sig):
        tmp = tempfile.mkdtemp(prefix="fakegh-sig-")
        try:
            sp = os.path.join(tmp, "sig")
            with open(sp, "wb") as f:
                f.write(sig)
            p = subprocess.run(["openssl", "dgst", "-sha256", "-verify", pub_path,
                                "-signature", sp], input=data, capture_output=True)
            return p.returncode == 0
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _app_routes(self, method, path, hdrs, text):
        m = re.match(r"^/app/installations/(\d+)/access_tokens$", path)
        if m and method == "POST":
            self._verify_jwt(hdrs)
            iid = int(m.group(1))
            body = self._json_body(text, DOC["access_token"])
            with self._lock:
                inst = self._installations.get(iid)
                if self._installations and inst is None:
                    raise Reject(404, doc=DOC["access_token"])
                repos = inst["repos"] if inst else None
                if body.get("repositories"):
                    want = {("%s/%s" % ((inst or {}).get("account") or "", x)).lower()
                            if "/" not in x else x.lower() for x in body["repositories"]}
                    matched = {fn for fn in self._repos
                               if fn in want or fn.split("/", 1)[1] in
                               {x.lower() for x in body["repositories"]}}
                    repos = matched if repos is None else (repos & matched)
                    if not repos:
                        raise Reject(422, "There is at least one repository that does not "
                                     "exist or is not accessible to the parent installation.",
                                     DOC["access_token"])
                tok = "ghs_" + "".join(random.choice(string.ascii_letters + string.digits)
                                       for _ in range(36))
                exp = int(time.time() + self.token_ttl)
                perms = body.get("permissions") or {"contents": "read", "issues": "write",
                                                    "metadata": "read",
                                                    "pull_requests": "write"}
                self._issued[tok] = {"id": iid, "installation_id": iid, "expires": exp,
                                     "repos": repos, "permissions": perms}
                if self._app is None:
                    self._app = {"id": 0, "slug": "diverge", "name": "diverge", "pub": None}
                self._user(self._app["slug"] + "[bot]", "Bot")
                resp = {"token": tok, "expires_at": iso(exp), "permissions": perms,
                        "repository_selection": "all" if repos is None else "selected"}
                if repos is not None:
                    resp["repositories"] = [self._repo_json(self._repos[x])
                                            for x in sorted(repos)]
            return 201, resp, {}
        m = re.match(r"^/repos/([^/]+)/([^/]+)/installation$", path)
        if m and method == "GET":
            self._verify_jwt(hdrs)
            fn = ("%s/%s" % (m.group(1), m.group(2))).lower()
            with self._lock:
                if fn not in self._repos:
                    raise Reject(404, doc=DOC["installation"])
                for iid, inst in sorted(self._installations.items()):
                    if inst["repos"] is None or fn in inst["repos"]:
                        return 200, self._installation_json(iid), {}
                raise Reject(404, doc=DOC["installation"])
        m = re.match(r"^/app/installations/(\d+)$", path)
        if m and method == "GET":
            self._verify_jwt(hdrs)
            iid = int(m.group(1))
            with self._lock:
                if self._installations and iid not in self._installations:
                    raise Reject(404)
                return 200, self._installation_json(iid), {}
        if path == "/app" and method == "GET":
            self._verify_jwt(hdrs)
            with self._lock:
                app = self._app or {"id": 0, "slug": "diverge", "name": "diverge"}
                return 200, {"id": app["id"], "slug": app["slug"], "name": app["name"],
                             "node_id": node_id("Integration", app["id"]),
                             "owner": None, "description": "",
                             "external_url": "", "html_url": self.html_base + "/apps/" +
                             app["slug"], "created_at": "2020-01-01T00:00:00Z",
                             "updated_at": "2020-01-01T00:00:00Z",
                             "permissions": {"contents": "read", "issues": "write",
                                             "metadata": "read", "pull_requests": "write"},
                             "events": ["issue_comment"],
                             "installations_count": len(self._installations)}, {}
        raise Reject(404)

    # ------------------------------------------------------------------ App manifests
    def new_manifest_code(self, manifest, org=None):
        """What GitHub's web form does once the user confirms: a one-time code for MANIFEST
        (a dict), exchanged at POST /app-manifests/{code}/conversions within an hour."""
        code = "".join(random.choice(string.hexdigits.lower()[:16]) for _ in range(20))
        with self._lock:
            self._manifest_codes[code] = {"manifest": manifest, "org": org, "used": False}
        return code

    def _manifest_key(self):
        if self.manifest_key_pem:
            return self.manifest_key_pem
        p = subprocess.run(["openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt",
                            "rsa_keygen_bits:2048"], check=True, capture_output=True, text=True)
        return p.stdout

    def _manifest_routes(self, method, path, query, hdrs, text):
        if method != "POST":
            raise Reject(404)
        m = re.match(r"^/app-manifests/([^/]+)/conversions$", path)
        if m:
            return self._manifest_convert(urllib.parse.unquote(m.group(1)))
        form = dict(urllib.parse.parse_qsl(text, keep_blank_values=True))
        try:
            manifest = json.loads(form.get("manifest", ""))
        except ValueError:
            return 422, "Invalid GitHub App configuration: manifest is not JSON", {}
        missing = [k for k in ("name", "url", "redirect_url") if not manifest.get(k)]
        if not (manifest.get("hook_attributes") or {}).get("url"):
            missing.append("hook_attributes.url")
        if missing:
            return 422, "Invalid GitHub App configuration: missing " + ", ".join(missing), {}
        org = re.match(r"^(?:/organizations/([^/]+))?/settings/apps/new$", path).group(1)
        with self._lock:
            self.manifests.append((manifest, org))
        code = self.new_manifest_code(manifest, org)
        loc = manifest["redirect_url"] + ("&" if "?" in manifest["redirect_url"] else "?")
        loc += urllib.parse.urlencode([("code", code)] + ([("state", query["state"])]
                                                          if "state" in query else []))
        return 302, None, {"Location": loc}

    def _manifest_convert(self, code):
        with self._lock:
            entry = self._manifest_codes.get(code)
            if entry is None or entry["used"]:
                raise Reject(404, doc=DOCS + "/apps/apps#create-a-github-app-from-a-manifest")
            entry["used"] = True
            man = entry["manifest"]
            app_id = self._take("app")
        pem = self._manifest_key()
        slug = re.sub(r"[^a-z0-9]+", "-", man["name"].lower()).strip("-")
        secret = "".join(random.choice("0123456789abcdef") for _ in range(40))
        self.set_app(app_id, pem, slug=slug, name=man["name"])
        with self._lock:
            owner = self._user_json(entry["org"] or "octocat")
            resp = {"id": app_id, "slug": slug, "node_id": node_id("Integration", app_id),
                    "owner": owner, "name": man["name"],
                    "description": man.get("description", ""),
                    "external_url": man["url"], "html_url": self.html_base + "/apps/" + slug,
                    "created_at": iso(time.time()), "updated_at": iso(time.time()),
                    "permissions": man.get("default_permissions", {}),
                    "events": man.get("default_events", []),
                    "installations_count": 0,
                    "client_id": "Iv1." + secret[:16], "client_secret": secret[::-1],
                    "webhook_secret": secret, "pem": pem}
            self.created_apps.append({"id": app_id, "slug": slug, "pem": pem,
                                      "webhook_secret": secret})
        return 201, resp, {}

    # ------------------------------------------------------------------ git smart HTTP
    def _git_user(self, hdrs, fn):
        """(user, password) of a Basic Authorization header (None, None without), and
        whether github.com would let them at the repository FN."""
        auth = hdrs.get("authorization") or ""
        scheme, _, cred = auth.strip().partition(" ")
        if scheme.lower() != "basic":
            return None, None, False
        try:
            user, _, pw = base64.b64decode(cred).decode().partition(":")
        except ValueError:
            return None, None, False
        with self._lock:
            info = self._issued.get(pw)
            if info is not None:
                ok = (user == "x-access-token" and info["expires"] > time.time() and
                      (info["repos"] is None or fn in info["repos"]))
            else:
                ok = pw in self._tokens
        return user, pw, ok

    def _git_request(self, h, method, path, query):
        m = re.match(r"^/([^/]+)/([^/]+?)\.git(/.*)$", path)
        fn = ("%s/%s" % (m.group(1), m.group(2))).lower()
        hdrs = {k.lower(): v for k, v in h.headers.items()}
        try:
            body = h._read_body()
        except (OSError, ValueError):
            h.close_connection = True
            return
        user, pw, ok = self._git_user(hdrs, fn)
        with self._lock:
            bare = self._git.get(fn)
            self.git_auth.append((method, path + ("?" + query if query else ""), user, pw))
        if bare is None or not ok:
            status = 404 if bare is None else 401
            out = b"Repository not found.\n" if bare is None else b"Invalid credentials\n"
            h.send_response(status)
            if status == 401:
                h.send_header("WWW-Authenticate", 'Basic realm="GitHub"')
            h.send_header("Content-Type", "text/plain")
            h.send_header("Content-Length", str(len(out)))
            h.end_headers()
            h.wfile.write(out)
            return
        serve_http_backend(h, os.path.dirname(bare), "/" + os.path.basename(bare) + m.group(3),
                           method, query, body, hdrs, user or "git")

    def _installation_json(self, iid):
        inst = self._installations.get(iid) or {}
        app = self._app or {"id": 0, "slug": "diverge"}
        acct = inst.get("account") or "octo"
        return {"id": iid, "account": self._user_json(acct), "app_id": app["id"],
                "app_slug": app["slug"], "target_type": self._users.get(
                    acct.lower(), {}).get("type", "Organization"),
                "repository_selection": "all" if inst.get("repos") is None else "selected",
                "access_tokens_url": self._api("/app/installations/%d/access_tokens" % iid),
                "permissions": {"contents": "read", "issues": "write", "metadata": "read",
                                "pull_requests": "write"}, "events": ["issue_comment"],
                "created_at": "2020-01-01T00:00:00Z", "updated_at": "2020-01-01T00:00:00Z",
                "suspended_at": None}



def _main(argv=None):
    ap = argparse.ArgumentParser(description="Fake GitHub REST API on loopback")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--token", action="append", default=[],
                    help="require this token (repeatable); default: any token")
    ap.add_argument("--demo", action="store_true",
                    help="seed octo/repo with PR #1 and an agent.yaml on its head")
    ap.add_argument("--verbose", action="store_true")
    a = ap.parse_args(argv)
    gh = FakeGitHub(a.host, a.port, verbose=a.verbose)
    for t in a.token:
        gh.expect_token(t)
    if a.demo:
        gh.add_repo("octo/repo")
        gh.add_pull("octo/repo", 1, head_ref="feature-x")
        gh.set_file("octo/repo", ".diverge/agent.yaml", 'version: "1"\n', ref="feature-x")
        gh.set_permission("octo/repo", "alice", "write")
        gh.add_comment("octo/repo", 1, user="alice", body="hello")
    done = threading.Event()
    # Before the URL is printed: a caller may stop the fake as soon as it has read it.
    signal.signal(signal.SIGTERM, lambda *x: done.set())
    gh.start()
    print(gh.url, flush=True)
    try:
        while not done.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    gh.stop()
    return 0


if __name__ == "__main__":
    sys.exit(_main())
