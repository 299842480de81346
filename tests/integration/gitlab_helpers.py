# SPDX-License-Identifier: Apache-2.0
"""Helpers for tests that drive `diverge serve` with GitLab Note Hook deliveries against the
fake GitLab API (tests/fakes/fake_gitlab.py). Standard Webhooks signatures are computed
here from the published algorithm (https://www.standardwebhooks.com/: base64 HMAC-SHA256
of "<webhook-id>.<webhook-timestamp>.<body>" under the base64-decoded whsec_ secret)."""
import base64
import hashlib
import hmac
import json
import os
import sys
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "fakes"))
from fake_gitlab import FakeGitLab  # noqa: E402

FIXTURES = os.path.join(HERE, "..", "fixtures", "gitlab")
DOCS_FIXTURE = "note_hook.merge_request.gitlab-docs.json"
ATLANTIS_FIXTURE = "note_hook.merge_request.atlantis.json"
HOOK_TOKEN = "gl-hook-token"
API_TOKEN = "glpat-test"
BOT = "diverge-bot"
PROJECT = "group/sub/project"
NS = "/apis/divergedev.com/v1alpha1/namespaces/group-sub-project/agenttasks"
MARKER = "<!-- diverge-agent-task -->"
_next_note = [900000]


def fixture_bytes(name):
    with open(os.path.join(FIXTURES, name), "rb") as f:
        return f.read()


def note_payload(body, project=PROJECT, iid=7, note_id=None, user="alice", user_id=None,
                 action="create", noteable="MergeRequest", system=False, source="feature-x",
                 target="main"):
    """A Note Hook on a merge request built on the GitLab docs fixture."""
    if note_id is None:
        _next_note[0] += 1
        note_id = _next_note[0]
    p = json.loads(fixture_bytes(DOCS_FIXTURE))
    p["object_attributes"].update({"id": note_id, "note": body, "noteable_type": noteable,
                                   "system": system})
    if action is None:
        p["object_attributes"].pop("action", None)
    else:
        p["object_attributes"]["action"] = action
    p["user"]["username"] = user
    if user_id is None:
        p["user"].pop("id", None)
        p["object_attributes"].pop("author_id", None)
    else:
        p["user"]["id"] = user_id
        p["object_attributes"]["author_id"] = user_id
    p["project"]["path_with_namespace"] = project
    p["project"]["git_http_url"] = "https://gitlab.example/%s.git" % project
    p["merge_request"].update({"iid": iid, "source_branch": source, "target_branch": target})
    p["merge_request"].setdefault("source", {})["git_http_url"] = \
        "https://gitlab.example/%s.git" % project
    return json.dumps(p).encode(), note_id


def note_from(gl, body, user="alice", project=PROJECT, iid=7, with_id=True, **kw):
    """The note exists at the fake (as it does on GitLab when its hook fires); returns
    (payload, note id)."""
    n = gl.add_note(project, iid, body, user=user)
    return note_payload(body, project=project, iid=iid, note_id=n["id"], user=user,
                        user_id=gl.users[user] if with_id else None, **kw)


def whsec(key_bytes):
    return "whsec_" + base64.b64encode(key_bytes).decode()


def sw_sign(secret, msg_id, ts, body):
    key = base64.b64decode(secret[len("whsec_"):])
    mac = hmac.new(key, msg_id.encode() + b"." + str(ts).encode() + b"." + body,
                   hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def deliver(srv, body, token=HOOK_TOKEN, event="Note Hook", idem=None, event_uuid=None,
            headers=None):
    h = {"X-Gitlab-Event": event, "Content-Type": "application/json",
         "X-Gitlab-Event-UUID": event_uuid or str(uuid.uuid4())}
    if token is not None:
        h["X-Gitlab-Token"] = token
    if idem is not None:
        h["Idempotency-Key"] = idem
    h.update(headers or {})
    return srv.request("POST", "/api/v1/webhooks/gitlab", body, headers=h, auth=False)


def deliver_signed(srv, body, secret, msg_id=None, ts=None, sigs=None, event="Note Hook"):
    msg_id = msg_id or "msg_" + uuid.uuid4().hex
    ts = int(time.time()) if ts is None else ts
    sig = sigs if sigs is not None else sw_sign(secret, msg_id, ts, body)
    h = {"X-Gitlab-Event": event, "Content-Type": "application/json", "webhook-id": msg_id,
         "webhook-timestamp": str(ts), "webhook-signature": sig}
    return srv.request("POST", "/api/v1/webhooks/gitlab", body, headers=h, auth=False)


def new_fake():
    gl = FakeGitLab(token=API_TOKEN, bot=BOT).start()
    gl.add_project(PROJECT)
    gl.add_mr(PROJECT, 7, source="feature-x", target="main")
    ids = {}
    for user, level in (("alice", "developer"), ("bob", "reporter"), ("carol", "maintainer")):
        ids[user] = gl.set_access(PROJECT, user, level)
    gl.add_user("mallory")  # not a member
    gl.ids = ids
    return gl


def server_args(gl, *extra):
    return ["--sandbox-provider", "none", "--gitlab-webhook-token", HOOK_TOKEN,
            "--gitlab-url", gl.url, "--notifier-provider", "gitlab"] + list(extra)


def server_env():
    return {"DIVERGE_GITLAB_TOKEN": API_TOKEN, "GITLAB_TOKEN": None,
            "DIVERGE_NOTIFIER_TOKEN": None, "GITHUB_TOKEN": None}


def bot_notes(gl, project=PROJECT, iid=7):
    return [n for n in gl.mr_notes(project, iid) if n["author"]["username"] == BOT]


def stickies(gl, project=PROJECT, iid=7):
    return [n for n in bot_notes(gl, project, iid) if n["body"].startswith(MARKER)]


def replies(gl, project=PROJECT, iid=7):
    return [n for n in bot_notes(gl, project, iid) if not n["body"].startswith(MARKER)]


def wait(pred, timeout=20, what="condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError("timed out waiting for " + what)


def get_task(srv, name="fix-mr-7", ns_path=NS):
    st, _, b = srv.request("GET", ns_path + "/" + name)
    return b if st == 200 else None
