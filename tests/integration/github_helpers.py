# SPDX-License-Identifier: Apache-2.0
"""Helpers for tests that drive `diverge serve` with signed GitHub deliveries against the
fake GitHub REST server (tests/fakes/fake_github.py)."""
import hashlib
import hmac
import json
import os
import sys
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "fakes"))
from fake_github import FakeGitHub  # noqa: E402

FIXTURES = os.path.join(HERE, "..", "fixtures", "github")
SECRET = "s3cret-webhook"
TOKEN = "ghp_testtoken"
BOT = "diverge-bot"


def fixture_bytes(name):
    with open(os.path.join(FIXTURES, name), "rb") as f:
        return f.read()


def sign(body, secret=SECRET):
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def comment_payload(repo, number, comment_id, body, user="alice", user_type="User",
                    association="CONTRIBUTOR", action="created", pull=True):
    """An issue_comment delivery built on the real (derived) PR fixture."""
    p = json.loads(fixture_bytes("DERIVED.issue_comment.created.pr.with-installation.json"))
    p["action"] = action
    p["issue"]["number"] = number
    if not pull:
        p["issue"].pop("pull_request", None)
    p["comment"]["id"] = int(comment_id)
    p["comment"]["body"] = body
    p["comment"]["user"]["login"] = user
    p["comment"]["user"]["type"] = user_type
    p["comment"]["author_association"] = association
    p["repository"]["full_name"] = repo
    p["repository"]["name"] = repo.split("/")[1]
    p["repository"]["owner"]["login"] = repo.split("/")[0]
    return json.dumps(p).encode()


def deliver(srv, body, event="issue_comment", delivery=None, secret=SECRET, signature=None,
            headers=None):
    h = {"X-GitHub-Event": event, "X-GitHub-Delivery": delivery or str(uuid.uuid4()),
         "Content-Type": "application/json",
         "X-Hub-Signature-256": signature if signature is not None else sign(body, secret)}
    if signature is False:
        del h["X-Hub-Signature-256"]
    h.update(headers or {})
    return srv.request("POST", "/api/v1/webhooks/github", body, headers=h, auth=False)


def new_fake():
    gh = FakeGitHub()
    gh.start()
    gh.bot_login = BOT
    gh.expect_token(TOKEN, login=BOT)
    gh.add_repo("octo/repo")
    gh.add_pull("octo/repo", 7, head_ref="feature-x")
    for user, role in (("alice", "write"), ("bob", "read"), ("carol", "maintain"),
                       ("dave", "triage")):
        gh.set_permission("octo/repo", user, role)
    return gh


def server_args(gh, *extra):
    return ["--sandbox-provider", "none", "--github-webhook-secret", SECRET,
            "--github-api-url", gh.url] + list(extra)


def server_env():
    return {"DIVERGE_NOTIFIER_TOKEN": TOKEN, "GITHUB_TOKEN": None}


def wait(pred, timeout=15, what="condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError("timed out waiting for " + what)
