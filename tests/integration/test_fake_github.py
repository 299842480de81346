# SPDX-License-Identifier: Apache-2.0
"""Tests of the fake GitHub REST API itself (tests/fakes/fake_github.py): every endpoint,
pagination with Link headers, fault injection, authentication, the GitHub App JWT flow
(RS256 checked with the openssl CLI), the request log and the write counters."""
import base64
import concurrent.futures
import hashlib
import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "fakes"))

from fake_github import FakeGitHub, make_jwt  # noqa: E402
from harness import run_tests  # noqa: E402

TOKEN = "ghp_test"


def req(gh, method, path, body=None, token=TOKEN, headers=None, timeout=10, raw=False):
    """(status, lower-case headers, parsed JSON / text / bytes) from the fake."""
    url = path if path.startswith("http") else gh.url + path
    hdrs = {"Accept": "application/vnd.github+json", "X-GitHub-Api-Version": "2022-11-28"}
    if token:
        hdrs["Authorization"] = "Bearer " + token
    data = None
    if body is not None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        hdrs["Content-Type"] = "application/json"
    hdrs.update(headers or {})
    r = urllib.request.Request(url, data=data, method=method, headers=hdrs)
    try:
        resp = urllib.request.urlopen(r, timeout=timeout)
        st, rh, payload = resp.status, resp.headers, resp.read()
    except urllib.error.HTTPError as e:
        st, rh, payload = e.code, e.headers, e.read()
    rh = {k.lower(): v for k, v in rh.items()}
    if raw:
        return st, rh, payload
    if rh.get("content-type", "").startswith("application/json") and payload:
        return st, rh, json.loads(payload)
    return st, rh, payload.decode()


def eq(a, b, what=""):
    assert a == b, "%s: %r != %r" % (what, a, b)


def parse_link(value):
    out = {}
    for part in value.split(","):
        m = re.match(r'\s*<([^>]+)>;\s*rel="(\w+)"\s*$', part)
        assert m, "bad Link part %r" % part
        out[m.group(2)] = m.group(1)
    return out


class CheckedGitHub(FakeGitHub):
    """Fails the test when the fake itself hit a bug (answered 500 internally)."""

    def __exit__(self, *exc):
        super().__exit__(*exc)
        if exc[0] is None:
            eq(self.errors, [], "fake_github internal errors")


def seeded(**kw):
    gh = CheckedGitHub(**kw).start()
    gh.add_repo("octo/repo", default_branch="main", private=False)
    gh.add_pull("octo/repo", 7, head_ref="feature-x", head_repo="octo/repo", base_ref="main",
                title="Add x", user="alice")
    return gh


def test_repo_pull_issue_user():
    with seeded() as gh:
        gh.bot_login = "diverge-bot"
        st, h, u = req(gh, "GET", "/user")
        eq(st, 200)
        eq((u["login"], u["type"]), ("diverge-bot", "User"))
        assert isinstance(u["id"], int)
        gh.bot_type = "Bot"
        eq(req(gh, "GET", "/user")[2]["type"], "Bot")
        eq(h["content-type"], "application/json; charset=utf-8")
        assert re.match(r"^[0-9A-F]{4}:[0-9A-F]{4}:[0-9A-F]{6}:[0-9A-F]{6}:[0-9A-F]{8}$",
                        h["x-github-request-id"]), h["x-github-request-id"]
        for k in ("limit", "remaining", "reset", "used", "resource"):
            assert "x-ratelimit-" + k in h, k
        st, _, repo = req(gh, "GET", "/repos/octo/repo")
        eq(st, 200)
        eq((repo["full_name"], repo["default_branch"], repo["private"], repo["visibility"]),
           ("octo/repo", "main", False, "public"))
        eq(repo["owner"]["login"], "octo")
        # owner/repo are case-insensitive; /repositories/{id} is the same repository
        eq(req(gh, "GET", "/repos/OCTO/Repo")[2]["id"], repo["id"])
        eq(req(gh, "GET", "/repositories/%d" % repo["id"])[2]["full_name"], "octo/repo")
        eq(req(gh, "GET", "/repos/octo/nope")[0], 404)
        st, _, b = req(gh, "GET", "/repos/octo/nope/pulls/7")
        eq((st, b["message"]), (404, "Not Found"))
        assert b["documentation_url"].startswith("https://docs.github.com/")

        st, _, p = req(gh, "GET", "/repos/octo/repo/pulls/7")
        eq(st, 200)
        eq((p["number"], p["state"], p["title"], p["user"]["login"]), (7, "open", "Add x", "alice"))
        eq(p["html_url"], "https://github.com/octo/repo/pull/7")
        eq(p["head"]["ref"], "feature-x")
        eq(p["head"]["sha"], gh.branch_sha("octo/repo", "feature-x"))
        assert re.match(r"^[0-9a-f]{40}$", p["head"]["sha"])
        eq(p["head"]["repo"]["full_name"], "octo/repo")
        eq(p["head"]["repo"]["clone_url"], "https://github.com/octo/repo.git")
        eq(p["head"]["repo"]["html_url"], "https://github.com/octo/repo")
        eq((p["base"]["ref"], p["base"]["repo"]["full_name"]), ("main", "octo/repo"))
        eq(req(gh, "GET", "/repos/octo/repo/pulls/8")[0], 404)
        # a PR from a fork; clone_url can be pointed at a local repository
        gh.add_repo("alice/repo", clone_url="file:///tmp/alice-repo.git")
        gh.add_pull("octo/repo", 9, head_ref="fix", head_repo="alice/repo")
        p = req(gh, "GET", "/repos/octo/repo/pulls/9")[2]
        eq((p["head"]["repo"]["full_name"], p["head"]["repo"]["clone_url"], p["head"]["label"]),
           ("alice/repo", "file:///tmp/alice-repo.git", "alice:fix"))
        # the PR is also an issue, carrying "pull_request"; plain issues are not pulls
        st, _, i = req(gh, "GET", "/repos/octo/repo/issues/7")
        eq(st, 200)
        assert "pull_request" in i
        gh.add_issue("octo/repo", 3)
        assert "pull_request" not in req(gh, "GET", "/repos/octo/repo/issues/3")[2]
        eq(req(gh, "GET", "/repos/octo/repo/pulls/3")[0], 404)
        # GitHub refuses requests without a User-Agent, and unknown API versions
        c = http.client.HTTPConnection("127.0.0.1", gh.port, timeout=5)
        c.request("GET", "/repos/octo/repo", headers={"Authorization": "token x"})
        r = c.getresponse()
        eq(r.status, 403)
        assert "User-Agent" in json.loads(r.read())["message"]
        c.close()
        st, _, b = req(gh, "GET", "/repos/octo/repo", headers={"X-GitHub-Api-Version": "1999-01-01"})
        eq(st, 400)
        eq(req(gh, "GET", "/no/such/endpoint")[0], 404)
        st, _, rl = req(gh, "GET", "/rate_limit")
        eq(st, 200)
        assert rl["resources"]["core"]["limit"] == 5000 and "rate" in rl


def test_contents():
    with seeded() as gh:
        text = 'version: "1"\nbudget:\n  usd: 2.50\n' + "# padding line\n" * 20
        gh.set_file("octo/repo", ".diverge/agent.yaml", text, ref="feature-x")
        st, h, f = req(gh, "GET", "/repos/octo/repo/contents/.diverge/agent.yaml?ref=feature-x")
        eq(st, 200)
        eq((f["type"], f["encoding"], f["name"], f["path"], f["size"]),
           ("file", "base64", "agent.yaml", ".diverge/agent.yaml", len(text)))
        lines = f["content"].split("\n")
        eq(lines[-1], "", "content ends with a newline")
        assert all(len(x) == 60 for x in lines[:-2]) and 0 < len(lines[-2]) <= 60, lines
        eq(base64.b64decode(f["content"]).decode(), text)
        blob = text.encode()
        eq(f["sha"], hashlib.sha1(b"blob %d\0" % len(blob) + blob).hexdigest())
        assert "etag" in h
        # absent on another ref, missing ref, missing path
        st, _, b = req(gh, "GET", "/repos/octo/repo/contents/.diverge/agent.yaml?ref=main")
        eq((st, b["message"]), (404, "Not Found"))
        st, _, b = req(gh, "GET", "/repos/octo/repo/contents/.diverge/agent.yaml")
        eq(st, 404, "default branch has no file")
        st, _, b = req(gh, "GET", "/repos/octo/repo/contents/.diverge/agent.yaml?ref=nobranch")
        eq((st, b["message"]), (404, "No commit found for the ref nobranch"))
        # by commit sha (an old sha keeps its snapshot) and refs/heads/
        old = gh.branch_sha("octo/repo", "feature-x")
        gh.set_file("octo/repo", ".diverge/agent.yaml", "version: \"2\"\n", ref="feature-x")
        f = req(gh, "GET", "/repos/octo/repo/contents/.diverge/agent.yaml?ref=" + old)[2]
        eq(base64.b64decode(f["content"]).decode(), text)
        f = req(gh, "GET",
                "/repos/octo/repo/contents/.diverge/agent.yaml?ref=refs/heads/feature-x")[2]
        eq(base64.b64decode(f["content"]), b'version: "2"\n')
        eq(req(gh, "GET", "/repos/octo/repo/pulls/7")[2]["head"]["sha"],
           gh.branch_sha("octo/repo", "feature-x"))
        # raw media type
        st, h, data = req(gh, "GET", "/repos/octo/repo/contents/.diverge/agent.yaml?ref=feature-x",
                          headers={"Accept": "application/vnd.github.raw+json"}, raw=True)
        eq((st, data), (200, b'version: "2"\n'))
        # a directory is an array of entries
        gh.set_file("octo/repo", ".diverge/other.txt", "x", ref="feature-x")
        st, _, d = req(gh, "GET", "/repos/octo/repo/contents/.diverge?ref=feature-x")
        eq(st, 200)
        eq([(e["name"], e["type"]) for e in d], [("agent.yaml", "file"), ("other.txt", "file")])
        d = req(gh, "GET", "/repos/octo/repo/contents?ref=feature-x")[2]
        eq([(e["name"], e["type"]) for e in d], [(".diverge", "dir")])
        gh.delete_file("octo/repo", ".diverge/other.txt", ref="feature-x")
        eq(req(gh, "GET", "/repos/octo/repo/contents/.diverge/other.txt?ref=feature-x")[0], 404)


def test_permissions():
    with seeded() as gh:
        gh.add_repo("octo/secret", private=True)
        expect = {"admin": "admin", "maintain": "write", "write": "write", "triage": "read",
                  "read": "read", "none": "none"}
        for role, legacy in expect.items():
            gh.set_permission("octo/repo", "u-" + role, role)
            st, _, b = req(gh, "GET", "/repos/octo/repo/collaborators/u-%s/permission" % role)
            eq(st, 200, role)
            eq((b["permission"], b["role_name"], b["user"]["login"]), (legacy, role, "u-" + role))
            eq(b["user"]["role_name"], role)
        eq(req(gh, "GET", "/repos/octo/repo/collaborators/u-maintain/permission")[2]["user"]
           ["permissions"], {"admin": False, "maintain": True, "push": True, "triage": True,
                             "pull": True})
        # unknown account -> 404; a known non-collaborator: read on public, none on private
        st, _, b = req(gh, "GET", "/repos/octo/repo/collaborators/ghost/permission")
        eq((st, b["message"]), (404, "Not Found"))
        gh.add_user("bob")
        b = req(gh, "GET", "/repos/octo/repo/collaborators/bob/permission")[2]
        eq((b["permission"], b["role_name"]), ("read", "read"))
        b = req(gh, "GET", "/repos/octo/secret/collaborators/bob/permission")[2]
        eq((b["permission"], b["role_name"]), ("none", "none"))
        gh.auto_users = True
        eq(req(gh, "GET", "/repos/octo/repo/collaborators/ghost/permission")[2]["permission"],
           "read")
        # a user-owned repository's owner is admin
        gh.add_user("carol")
        gh.add_repo("carol/proj", owner_type="User")
        b = req(gh, "GET", "/repos/carol/proj/collaborators/carol/permission")[2]
        eq((b["permission"], b["role_name"]), ("admin", "admin"))
        eq(req(gh, "GET", "/repos/octo/nope/collaborators/bob/permission")[0], 404)


def test_comments_crud():
    with seeded() as gh:
        gh.add_repo("octo/other")
        gh.add_pull("octo/other", 1)
        gh.set_permission("octo/repo", "alice", "write")
        seed = gh.add_comment("octo/repo", 7, user="someone", body="hi", user_type="User")
        eq(seed["author_association"], "NONE")
        assert seed["id"] > 2 ** 31, "comment ids exceed int32 like GitHub's"
        st, h, c = req(gh, "POST", "/repos/octo/repo/issues/7/comments", {"body": "first"})
        eq(st, 201)
        eq(h["location"], c["url"])
        eq(c["url"], gh.url + "/repos/octo/repo/issues/comments/%d" % c["id"])
        eq(c["html_url"], "https://github.com/octo/repo/pull/7#issuecomment-%d" % c["id"])
        eq(c["issue_url"], gh.url + "/repos/octo/repo/issues/7")
        eq((c["body"], c["user"]["login"], c["user"]["type"], c["performed_via_github_app"]),
           ("first", "diverge-bot", "User", None))
        for k in ("id", "node_id", "created_at", "updated_at", "author_association"):
            assert k in c, k
        assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$", c["created_at"])
        c2 = req(gh, "POST", "/repos/octo/other/issues/1/comments", {"body": "x"})[2]
        c3 = req(gh, "POST", "/repos/octo/repo/issues/7/comments", {"body": "again"})[2]
        assert seed["id"] < c["id"] < c2["id"] < c3["id"], "ids unique and increasing"
        eq([x["id"] for x in gh.comments("octo/repo", 7)], [seed["id"], c["id"], c3["id"]])
        # alice is a collaborator
        eq(gh.add_comment("octo/repo", 7, user="alice", body="a")["author_association"],
           "COLLABORATOR")
        # get / patch / delete, also across repos (a comment of another repo is 404)
        path = "/repos/octo/repo/issues/comments/%d" % c["id"]
        eq(req(gh, "GET", path)[2]["body"], "first")
        eq(req(gh, "GET", "/repos/octo/other/issues/comments/%d" % c["id"])[0], 404)
        st, _, u = req(gh, "PATCH", path, {"body": "edited"})
        eq((st, u["body"], u["id"]), (200, "edited", c["id"]))
        eq(gh.comment(c["id"])["body"], "edited")
        st, h, b = req(gh, "DELETE", path)
        eq((st, b), (204, ""))
        assert "content-type" not in h
        eq(req(gh, "GET", path)[0], 404)
        eq(req(gh, "PATCH", path, {"body": "x"})[0], 404)
        eq(req(gh, "DELETE", path)[0], 404)
        eq(gh.comment(c["id"]), None)
        eq(req(gh, "POST", "/repos/octo/repo/issues/99/comments", {"body": "x"})[0], 404)
        # validation
        st, _, b = req(gh, "POST", "/repos/octo/repo/issues/7/comments", {"body": "x" * 65537})
        eq(st, 422)
        eq(b["message"], "Validation Failed")
        eq(b["errors"], [{"resource": "IssueComment", "code": "custom", "field": "body",
                          "message": "body is too long (maximum is 65536 characters)"}])
        eq(req(gh, "POST", "/repos/octo/repo/issues/7/comments", {"body": "é" * 65536})[0], 201)
        eq(req(gh, "POST", "/repos/octo/repo/issues/7/comments", {})[0], 422)
        eq(req(gh, "POST", "/repos/octo/repo/issues/7/comments", {"body": 5})[0], 422)
        eq(req(gh, "POST", "/repos/octo/repo/issues/7/comments", {"body": ""})[0], 422)
        st, _, b = req(gh, "POST", "/repos/octo/repo/issues/7/comments", b"{not json")
        eq((st, b["message"]), (400, "Problems parsing JSON"))
        eq(req(gh, "PATCH", "/repos/octo/repo/issues/comments/%d" % c3["id"],
               {"body": "y" * 65537})[0], 422)


def test_pagination_250():
    with seeded() as gh:
        for i in range(250):
            gh.add_comment("octo/repo", 7, user="u%d" % (i % 5), body="c%d" % i)
        all_ids = [c["id"] for c in gh.comments("octo/repo", 7)]
        eq(all_ids, sorted(all_ids))
        rid = req(gh, "GET", "/repos/octo/repo")[2]["id"]
        base = gh.url + "/repositories/%d/issues/7/comments?per_page=100&page=" % rid
        got, pages = [], []
        url = "/repos/octo/repo/issues/7/comments?per_page=100"
        while url:
            st, h, items = req(gh, "GET", url)
            eq(st, 200)
            pages.append((len(items), parse_link(h["link"])))
            got += [c["id"] for c in items]
            url = pages[-1][1].get("next")
        eq(got, all_ids, "following rel=next yields every comment in id order")
        eq([n for n, _ in pages], [100, 100, 50])
        eq(pages[0][1], {"next": base + "2", "last": base + "3"})
        eq(pages[1][1], {"prev": base + "1", "next": base + "3", "last": base + "3",
                         "first": base + "1"})
        eq(pages[2][1], {"prev": base + "2", "first": base + "1"})
        # rel order as GitHub sends it
        h = req(gh, "GET", "/repos/octo/repo/issues/7/comments?per_page=100&page=2")[1]
        eq(re.findall(r'rel="(\w+)"', h["link"]), ["prev", "next", "last", "first"])
        # default 30 per page, max 100, beyond the end
        st, h, items = req(gh, "GET", "/repos/octo/repo/issues/7/comments")
        eq(len(items), 30)
        eq(parse_link(h["link"])["last"],
           gh.url + "/repositories/%d/issues/7/comments?page=9" % rid)
        eq(len(req(gh, "GET", "/repos/octo/repo/issues/7/comments?per_page=500")[2]), 100)
        st, h, items = req(gh, "GET", "/repos/octo/repo/issues/7/comments?per_page=100&page=4")
        eq((st, items), (200, []))
        # repos-style links when asked
        gh.link_style = "repos"
        h = req(gh, "GET", "/repos/octo/repo/issues/7/comments?per_page=100")[1]
        eq(parse_link(h["link"])["next"],
           gh.url + "/repos/octo/repo/issues/7/comments?per_page=100&page=2")
        # a short thread has no Link header; unknown issue 404
        gh.add_pull("octo/repo", 8)
        gh.add_comment("octo/repo", 8, body="only")
        st, h, items = req(gh, "GET", "/repos/octo/repo/issues/8/comments")
        eq((st, len(items)), (200, 1))
        assert "link" not in h
        eq(req(gh, "GET", "/repos/octo/repo/issues/42/comments")[0], 404)
        # since= filters on updated_at
        st, _, items = req(gh, "GET", "/repos/octo/repo/issues/8/comments?since=2999-01-01T00:00:00Z")
        eq((st, items), (200, []))


def test_reactions():
    with seeded() as gh:
        c = gh.add_comment("octo/repo", 7, user="alice", body="/diverge fix it")
        path = "/repos/octo/repo/issues/comments/%d/reactions" % c["id"]
        st, _, r1 = req(gh, "POST", path, {"content": "+1"})
        eq(st, 201)
        eq((r1["content"], r1["user"]["login"]), ("+1", "diverge-bot"))
        assert "id" in r1 and "node_id" in r1 and "created_at" in r1
        st, _, r2 = req(gh, "POST", path, {"content": "+1"})
        eq((st, r2["id"]), (200, r1["id"]), "same user+content -> 200, the existing reaction")
        eq(req(gh, "POST", path, {"content": "eyes"})[0], 201)
        st, _, b = req(gh, "POST", path, {"content": "thumbsup"})
        eq((st, b["message"]), (422, "Validation Failed"))
        eq(req(gh, "POST", path, {})[0], 422)
        eq(req(gh, "POST", "/repos/octo/repo/issues/comments/1/reactions", {"content": "+1"})[0],
           404)
        eq([x["content"] for x in gh.reactions(c["id"])], ["+1", "eyes"])
        st, _, lst = req(gh, "GET", path)
        eq((st, [x["content"] for x in lst]), (200, ["+1", "eyes"]))
        eq([x["content"] for x in req(gh, "GET", path + "?content=eyes")[2]], ["eyes"])
        summary = gh.comment(c["id"])["reactions"]
        eq((summary["total_count"], summary["+1"], summary["eyes"], summary["heart"]), (2, 1, 1, 0))
        eq(req(gh, "DELETE", path + "/%d" % r1["id"])[0], 204)
        eq([x["content"] for x in gh.reactions(c["id"])], ["eyes"])
        req(gh, "DELETE", "/repos/octo/repo/issues/comments/%d" % c["id"])
        eq(gh.reactions(c["id"]), [])


def test_injection():
    with seeded() as gh:
        rule = gh.inject(method="POST", path_re=r"/issues/\d+/comments$", status=500, times=2)
        sts = [req(gh, "POST", "/repos/octo/repo/issues/7/comments", {"body": "x"})[0]
               for _ in range(3)]
        eq(sts, [500, 500, 201])
        eq(rule.hits, 2)
        eq(len(gh.comments("octo/repo", 7)), 1, "injected failures have no effect")
        eq([r["status"] for r in gh.find_requests("POST", r"/comments$")], [500, 500, 201])
        eq([r["injected"] for r in gh.find_requests("POST", r"/comments$")], [True, True, False])
        # body was read fully (the connection stays usable) and the GET path is unaffected
        eq(req(gh, "GET", "/repos/octo/repo/issues/7/comments")[0], 200)
        # secondary rate limit
        gh.inject(method="POST", path_re=r"/comments$", status=403,
                  headers={"Retry-After": "2"},
                  body={"message": "You have exceeded a secondary rate limit"}, times=1)
        st, h, b = req(gh, "POST", "/repos/octo/repo/issues/7/comments", {"body": "y" * 5000})
        eq((st, h["retry-after"], b["message"]),
           (403, "2", "You have exceeded a secondary rate limit"))
        assert "x-github-request-id" in h
        gh.inject(method="PATCH", status=429, headers={"Retry-After": "1"})
        cid = gh.comments("octo/repo", 7)[0]["id"]
        st, h, b = req(gh, "PATCH", "/repos/octo/repo/issues/comments/%d" % cid, {"body": "z"})
        eq((st, h["retry-after"]), (429, "1"))
        assert "message" in b and "documentation_url" in b
        # primary-limit style headers can be injected too
        gh.inject(path_re=r"/pulls/", status=403, headers={"X-RateLimit-Remaining": "0"})
        st, h, _ = req(gh, "GET", "/repos/octo/repo/pulls/7")
        eq((st, h["x-ratelimit-remaining"]), (403, "0"))
        # slow response
        gh.inject(method="GET", path_re=r"/pulls/7$", delay=1.0, times=1)
        t0 = time.time()
        st, _, p = req(gh, "GET", "/repos/octo/repo/pulls/7")
        assert time.time() - t0 >= 0.95, time.time() - t0
        eq((st, p["number"]), (200, 7))
        t0 = time.time()
        req(gh, "GET", "/repos/octo/repo/pulls/7")
        assert time.time() - t0 < 0.5
        # a client timeout against a delay
        gh.inject(path_re=r"/pulls/7$", delay=2.0)
        try:
            req(gh, "GET", "/repos/octo/repo/pulls/7", timeout=0.3)
            raise AssertionError("expected a timeout")
        except (OSError, TimeoutError):
            pass
        # lost response: the effect happens, the client sees 502
        n = len(gh.comments("octo/repo", 7))
        gh.inject(method="POST", path_re=r"/comments$", status=502, apply=True)
        eq(req(gh, "POST", "/repos/octo/repo/issues/7/comments", {"body": "lost"})[0], 502)
        eq(len(gh.comments("octo/repo", 7)), n + 1)
        # dropped connection
        gh.inject(path_re=r"^/user$", drop=True)
        try:
            req(gh, "GET", "/user")
            raise AssertionError("expected a connection error")
        except (OSError, http.client.HTTPException):
            pass
        # forever until cleared
        gh.inject(path_re=r"^/user$", status=503, times=None)
        eq([req(gh, "GET", "/user")[0] for _ in range(3)], [503, 503, 503])
        gh.clear_injections()
        eq(req(gh, "GET", "/user")[0], 200)


def test_auth():
    with seeded() as gh:
        gh.add_repo("octo/secret", private=True)
        gh.add_pull("octo/secret", 1)
        # open mode: any token; anonymous reads of public repos only
        eq(req(gh, "GET", "/repos/octo/secret", token="anything")[0], 200)
        eq(req(gh, "GET", "/repos/octo/repo", token=None)[0], 200)
        eq(req(gh, "GET", "/repos/octo/secret", token=None)[0], 404)
        st, _, b = req(gh, "POST", "/repos/octo/repo/issues/7/comments", {"body": "x"}, token=None)
        eq((st, b["message"]), (401, "Requires authentication"))
        eq(req(gh, "GET", "/user", token=None)[0], 401)
        gh.expect_token(TOKEN)
        gh.expect_token("ghp_alice", login="alice")
        for scheme in ("Bearer", "token"):
            st, _, u = req(gh, "GET", "/user", token=None,
                           headers={"Authorization": "%s %s" % (scheme, TOKEN)})
            eq((st, u["login"]), (200, "diverge-bot"))
        st, h, b = req(gh, "GET", "/user", token="ghp_wrong")
        eq((st, b["message"]), (401, "Bad credentials"))
        assert b["documentation_url"].startswith("https://docs.github.com/")
        assert "x-github-request-id" in h
        eq(req(gh, "POST", "/repos/octo/repo/issues/7/comments", {"body": "x"},
               token="ghp_wrong")[0], 401)
        eq(gh.comments("octo/repo", 7), [])
        c = req(gh, "POST", "/repos/octo/repo/issues/7/comments", {"body": "x"},
                token="ghp_alice")[2]
        eq(c["user"]["login"], "alice")
        # strict mode: a private repo is visible only to collaborators (and the bot)
        eq(req(gh, "GET", "/repos/octo/secret", token="ghp_alice")[0], 404)
        eq(req(gh, "GET", "/repos/octo/secret")[0], 200)
        gh.revoke_token("ghp_alice")
        eq(req(gh, "GET", "/user", token="ghp_alice")[0], 401)


def test_jwt_flow():
    tmp = tempfile.mkdtemp(prefix="fakegh-test-")
    try:
        key = os.path.join(tmp, "app.pem")
        other = os.path.join(tmp, "other.pem")
        pub = os.path.join(tmp, "app.pub.pem")
        for k in (key, other):
            subprocess.run(["openssl", "genrsa", "-out", k, "2048"], check=True,
                           capture_output=True)
        subprocess.run(["openssl", "rsa", "-in", key, "-pubout", "-out", pub], check=True,
                       capture_output=True)
        with seeded() as gh:
            gh.add_repo("octo/secret", private=True)
            gh.add_repo("elsewhere/repo")
            gh.expect_token(TOKEN)
            with open(pub) as f:
                gh.set_app(12345, f.read(), slug="diverge-app")
            gh.add_installation(777, repos=["octo/repo", "octo/secret"], account="octo")
            url = "/app/installations/777/access_tokens"
            jwt = make_jwt(key, 12345)
            t0 = time.time()
            st, _, t = req(gh, "POST", url, token=jwt)
            eq(st, 201, t)
            assert re.match(r"^ghs_[A-Za-z0-9]{36}$", t["token"]), t["token"]
            exp = time.mktime(time.strptime(t["expires_at"], "%Y-%m-%dT%H:%M:%SZ")) - time.timezone
            assert abs(exp - (t0 + 3600)) < 5, (t["expires_at"], t0)
            eq(gh.jwts[-1][1]["iss"], 12345)
            eq(req(gh, "POST", url, token=make_jwt(key, "12345"))[0], 201, "iss as a string")
            # the installation token works like a PAT, acting as the app's bot
            tok = t["token"]
            c = req(gh, "POST", "/repos/octo/repo/issues/7/comments", {"body": "hi"}, token=tok)[2]
            eq((c["user"]["login"], c["user"]["type"]), ("diverge-app[bot]", "Bot"))
            eq(req(gh, "GET", "/repos/octo/secret", token=tok)[0], 200)
            eq(req(gh, "GET", "/repos/elsewhere/repo", token=tok)[0], 404, "not installed there")
            st, _, b = req(gh, "GET", "/user", token=tok)
            eq((st, b["message"]), (403, "Resource not accessible by integration"))
            st, _, inst = req(gh, "GET", "/repos/octo/repo/installation", token=jwt)
            eq((st, inst["id"], inst["app_id"]), (200, 777, 12345))
            eq(req(gh, "GET", "/app", token=jwt)[2]["slug"], "diverge-app")
            # rejected JWTs
            now = int(time.time())
            bad = {
                "wrong key": make_jwt(other, 12345),
                "wrong iss": make_jwt(key, 999),
                "exp - iat > 600": make_jwt(key, 12345, iat=now - 60, exp=now + 600),
                "expired": make_jwt(key, 12345, iat=now - 700, exp=now - 100),
                "alg HS256": make_jwt(key, 12345, alg="HS256"),
                "not a JWT": "ghp_test",
                "two parts": "eyJhbGciOiJSUzI1NiJ9.eyJpc3MiOjF9",
                "garbage": "eyJ.%%%.x",
            }
            for what, j in bad.items():
                st, _, b = req(gh, "POST", url, token=j)
                eq(st, 401, what)
                assert b["message"], what
            st, _, b = req(gh, "POST", url, token=jwt, headers={"Authorization": "token " + jwt})
            eq(st, 401, "the JWT must be a Bearer token")
            eq(req(gh, "POST", "/app/installations/778/access_tokens", token=jwt)[0], 404)
            # a private key given to set_app works too; tokens expire
            with open(key) as f:
                gh.set_app(12345, f.read(), slug="diverge-app")
            gh.token_ttl = 4  # long enough to be used at once on a loaded machine
            tok = req(gh, "POST", url, token=make_jwt(key, 12345))[2]["token"]
            eq(req(gh, "GET", "/repos/octo/repo", token=tok)[0], 200)
            time.sleep(4.2)
            st, _, b = req(gh, "GET", "/repos/octo/repo", token=tok)
            eq((st, b["message"]), (401, "Bad credentials"))
            assert set(gh.issued_tokens) >= {tok}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_request_log_stats_and_concurrency():
    with seeded() as gh:
        req(gh, "POST", "/repos/octo/repo/issues/7/comments?x=1", {"body": "logged"},
            headers={"X-Test": "yes"})
        e = gh.requests[-1]
        eq((e["method"], e["path"], e["query"], e["status"]),
           ("POST", "/repos/octo/repo/issues/7/comments", {"x": "1"}, 201))
        eq(e["body"], {"body": "logged"})
        eq(e["headers"]["x-test"], "yes")
        eq(e["headers"]["authorization"], "Bearer " + TOKEN)
        assert abs(e["time"] - time.time()) < 5 and e["duration"] >= 0
        eq(e["response"]["body"], "logged")
        # 40 concurrent writes from 8 threads: all succeed, ids unique
        def post(i):
            return req(gh, "POST", "/repos/octo/repo/issues/7/comments", {"body": "c%d" % i})
        # One write answered slowly: the others overlap it however the box schedules them.
        gh.inject(method="POST", path_re=r"/comments$", delay=0.5)
        with concurrent.futures.ThreadPoolExecutor(8) as ex:
            res = list(ex.map(post, range(40)))
        eq({st for st, _, _ in res}, {201})
        ids = [b["id"] for _, _, b in res]
        eq(len(set(ids)), 40)
        eq(len(gh.comments("octo/repo", 7)), 41)
        s = gh.stats
        eq((s["writes"], s["writes_ok"]), (41, 41))
        eq(s["max_writes_per_minute"], 41)
        eq(sum(s["writes_per_minute"].values()), 41)
        assert s["max_concurrency"] >= 2, s
        eq(gh.writes_in_window(60), 41)
        reads = s["requests"]
        req(gh, "GET", "/repos/octo/repo")
        eq(gh.stats["writes"], 41)
        eq(gh.stats["requests"], reads + 1)
        gh.clear_requests()
        eq(gh.requests, [])
        # opt-in enforcement of GitHub's 80 content-creating requests per minute
        gh.secondary_limit_per_minute = 43
        sts = [post(i)[0] for i in range(4)]
        eq(sts[:2], [201, 201])
        eq(sts[2:], [403, 403])
        st, h, b = post(99)
        assert "secondary rate limit" in b["message"] and int(h["retry-after"]) >= 1
        eq(gh.stats["secondary_limited"], 3)
        # wait_for helpers
        threading.Timer(0.2, lambda: gh.add_comment("octo/repo", 7, body="late")).start()
        gh.wait_for(lambda: any(c["body"] == "late" for c in gh.comments("octo/repo", 7)), 5)
        eq(len(gh.wait_for_request("POST", r"/comments$", 403, count=3)), 3)


def test_rate_limit_and_etag():
    with seeded() as gh:
        gh.rate_limit_remaining(2, limit=60, reset_in=2)
        st, h, _ = req(gh, "GET", "/repos/octo/repo")
        eq((st, h["x-ratelimit-limit"], h["x-ratelimit-remaining"], h["x-ratelimit-used"],
            h["x-ratelimit-resource"]), (200, "60", "1", "59", "core"))
        eq(req(gh, "GET", "/repos/octo/repo")[1]["x-ratelimit-remaining"], "0")
        st, h, b = req(gh, "GET", "/repos/octo/repo")
        eq((st, h["x-ratelimit-remaining"]), (403, "0"))
        assert b["message"].startswith("API rate limit exceeded"), b
        eq(req(gh, "GET", "/rate_limit")[2]["resources"]["core"]["remaining"], 0)
        time.sleep(max(0.0, int(h["x-ratelimit-reset"]) - time.time()) + 0.05)
        st, h, _ = req(gh, "GET", "/repos/octo/repo")
        eq((st, h["x-ratelimit-remaining"]), (200, "59"))
        # conditional requests: 304 with the ETag, not counted
        st, h, _ = req(gh, "GET", "/repos/octo/repo/pulls/7")
        etag = h["etag"]
        st, h2, body = req(gh, "GET", "/repos/octo/repo/pulls/7", headers={"If-None-Match": etag})
        eq((st, body), (304, ""))
        eq(h2["x-ratelimit-remaining"], h["x-ratelimit-remaining"])


def test_keepalive_shutdown_and_main():
    gh = seeded()
    c = http.client.HTTPConnection("127.0.0.1", gh.port, timeout=5)
    for i in range(3):  # one connection, several requests, a body each time
        c.request("POST", "/repos/octo/repo/issues/7/comments", body=json.dumps({"body": "k%d" % i}),
                  headers={"User-Agent": "t", "Authorization": "token x",
                           "Content-Type": "application/json"})
        r = c.getresponse()
        eq(r.status, 201)
        r.read()
    gh.inject(delay=30)
    slow = threading.Thread(target=lambda: _ignore(lambda: req(gh, "GET", "/user", timeout=10)))
    slow.start()
    time.sleep(0.2)
    t0 = time.time()
    gh.stop()
    assert time.time() - t0 < 2, "stop() is fast even with open connections and delays"
    slow.join(5)
    c.close()
    # standalone
    p = subprocess.Popen([sys.executable, os.path.join(HERE, "..", "fakes", "fake_github.py"),
                          "--port", "0", "--demo"], stdout=subprocess.PIPE, text=True)
    try:
        url = p.stdout.readline().strip()
        assert re.match(r"^http://127\.0\.0\.1:\d+$", url), url
        st, _, b = req(type("G", (), {"url": url}), "GET", url + "/repos/octo/repo/pulls/1")
        eq((st, b["head"]["ref"]), (200, "feature-x"))
    finally:
        p.terminate()
        eq(p.wait(5), 0)


def _ignore(fn):
    try:
        fn()
    except Exception:
        pass


if __name__ == "__main__":
    run_tests([test_repo_pull_issue_user, test_contents, test_permissions, test_comments_crud,
               test_pagination_250, test_reactions, test_injection, test_auth, test_jwt_flow,
               test_request_log_stats_and_concurrency, test_rate_limit_and_etag,
               test_keepalive_shutdown_and_main])
