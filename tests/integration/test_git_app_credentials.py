# SPDX-License-Identifier: Apache-2.0
"""The server fetches the repository mirror and pushes the working branch outside the
sandbox with its own GitHub credentials (SPEC §9, issue 9): with a GitHub App an
installation access token of the repository's installation as `x-access-token`, asked
again for the push once the cached one is close to its expiry; else the PAT; both only
for the GitHub web host of --github-api-url (GitHub Enterprise `HOST/api/v3` → `HOST`).
The fake GitHub serves the repository over git's smart HTTP (`git http-backend`) behind
Basic auth. The sandbox never sees a token: the agent dumps its environment."""
import json
import os
import shutil
import subprocess
import tempfile

from harness import Server, run_tests
from github_helpers import SECRET, FakeGitHub, comment_payload, deliver
from sandbox_helpers import FAKE_RUNNER, bare_repo, create, git, task, task_log, wait_phase
from test_git_credentials import GitServer

PAT = "ghp_enterprisepat0123456789"
APP_ID = "4242"
NO_CREDS = {"DIVERGE_NOTIFIER_TOKEN": None, "GITHUB_TOKEN": None, "DIVERGE_GITHUB_APP_ID": None,
            "DIVERGE_GITHUB_APP_KEY_FILE": None, "DIVERGE_GITLAB_TOKEN": None,
            "GITLAB_TOKEN": None, "DIVERGE_GITLAB_URL": None}


def make_app_key(tmp):
    key = os.path.join(tmp, "app-key.pem")
    subprocess.run(["openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt",
                    "rsa_keygen_bits:2048", "-out", key], check=True, capture_output=True)
    os.chmod(key, 0o600)
    return key


def serve(api_url, tmp, app_key=None, pat=None, extra=()):
    env = dict(NO_CREDS, DIVERGE_RUNNER_PATH=FAKE_RUNNER)
    if pat:
        env["DIVERGE_NOTIFIER_TOKEN"] = pat
    # The agent changes a file and dumps the sandbox's environment.
    agent = "echo fixed > fixed.txt; env > %s/env-$DIVERGE_TASK_NAME.txt" % tmp
    args = ["--sandbox-provider", "process", "--agent-cmd", agent, "--github-api-url",
            api_url] + list(extra or ["--notifier-provider", "none"])
    if app_key:
        args += ["--github-app-id", APP_ID, "--github-app-key-file", app_key]
    return Server(args=args, env=env)


def files_under(top):
    for d, _, names in os.walk(top):
        for n in names:
            p = os.path.join(d, n)
            if os.path.isfile(p) and not os.path.islink(p):
                yield p


def assert_nowhere(secret, srv, tmp, name):
    """SECRET is not in the sandbox's environment, the task log or any file the server
    wrote under its data dir (mirror and staging configs, token files, database)."""
    with open(os.path.join(tmp, "env-%s.txt" % name)) as f:
        env = f.read()
    assert secret not in env and "DIVERGE_GIT_" not in env, env
    assert secret not in task_log(srv, name)
    for p in files_under(srv.data_dir):
        with open(p, "rb") as f:
            assert secret.encode() not in f.read(), p


def auths(gh, service):
    """The passwords of the authenticated git requests of SERVICE."""
    return [pw for (_, _, user, pw) in gh.git_requests(service) if user is not None]


def test_app_installation_token_for_fetch_and_push():
    tmp = tempfile.mkdtemp(prefix="diverge-gitapp-")
    key = make_app_key(tmp)
    bare = bare_repo()
    gh = FakeGitHub()
    gh.start()
    try:
        with open(key) as f:
            gh.set_app(int(APP_ID), public_key_pem=f.read(), slug="diverge-app")
        gh.add_installation(77, repos=["octo/repo"])
        gh.serve_git("octo/repo", bare)
        # Tokens live 2 minutes, inside the 5-minute refresh margin: each use exchanges
        # again, as a long task's push at its end does.
        gh.token_ttl = 120
        with serve(gh.url + "/api/v3", tmp, app_key=key) as srv:
            create(srv, task("app1", gh.url + "/octo/repo.git"))
            body = wait_phase(srv, "app1", ("Completed", "Failed"))
            assert body["status"]["phase"] == "Completed", (body["status"],
                                                            task_log(srv, "app1"))
            issued = gh.issued_tokens
            assert issued and all(v["installation_id"] == 77 for v in issued.values())
            # The installation was asked with the app JWT (the task came through the API).
            assert gh.find_requests("GET", r"^/repos/octo/repo/installation$")
            fetch, push = auths(gh, "git-upload-pack"), auths(gh, "git-receive-pack")
            assert fetch and all(pw in issued for pw in fetch), (fetch, issued)
            assert push and all(pw in issued for pw in push), (push, issued)
            assert all(u in (None, "x-access-token") for (_, _, u, _) in gh.git_requests())
            # The push got a fresh token, not the fetch's one from before the run.
            assert set(push).isdisjoint(fetch), (fetch, push)
            assert "agent/app1" in git("--git-dir", bare, "branch", "--list", "agent/app1")
            for tok in issued:
                assert_nowhere(tok, srv, tmp, "app1")
    finally:
        gh.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(os.path.dirname(bare), ignore_errors=True)


def test_pat_for_the_enterprise_host():
    tmp = tempfile.mkdtemp(prefix="diverge-gitpat-")
    bare = bare_repo()
    gh = FakeGitHub()
    gh.start()
    try:
        gh.expect_token(PAT)
        gh.serve_git("octo/repo", bare)
        with serve(gh.url + "/api/v3", tmp, pat=PAT) as srv:
            create(srv, task("pat1", gh.url + "/octo/repo.git"))
            body = wait_phase(srv, "pat1", ("Completed", "Failed"))
            assert body["status"]["phase"] == "Completed", (body["status"],
                                                            task_log(srv, "pat1"))
            assert auths(gh, "git-upload-pack") and \
                set(auths(gh, "git-upload-pack")) == {PAT}, gh.git_requests()
            assert set(auths(gh, "git-receive-pack")) == {PAT}, gh.git_requests()
            assert "agent/pat1" in git("--git-dir", bare, "branch", "--list", "agent/pat1")
            assert_nowhere(PAT, srv, tmp, "pat1")
    finally:
        gh.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(os.path.dirname(bare), ignore_errors=True)


def test_comment_task_uses_the_delivered_installation():
    """A task made from a PR comment fetches and pushes with a token of the installation
    its webhook delivery named (88), not the one GitHub would name for the repository
    (77, which the app JWT lookup answers)."""
    tmp = tempfile.mkdtemp(prefix="diverge-gitwh-")
    key = make_app_key(tmp)
    bare = bare_repo()
    git("--git-dir", bare, "branch", "feature-x", "main")
    gh = FakeGitHub()
    gh.start()
    try:
        with open(key) as f:
            gh.set_app(int(APP_ID), public_key_pem=f.read(), slug="diverge-app")
        gh.add_installation(77, repos=["octo/repo"])
        gh.add_installation(88)
        gh.add_repo("octo/repo", clone_url=gh.url + "/octo/repo.git")
        gh.serve_git("octo/repo", bare)
        gh.add_pull("octo/repo", 7, head_ref="feature-x")
        gh.set_permission("octo/repo", "alice", "write")
        with serve(gh.url, tmp, app_key=key,
                   extra=["--github-webhook-secret", SECRET]) as srv:
            body = "/diverge fix it"
            c = gh.add_comment("octo/repo", 7, user="alice", body=body)
            p = json.loads(comment_payload("octo/repo", 7, c["id"], body, user="alice"))
            p["installation"]["id"] = 88
            st, _, ans = deliver(srv, json.dumps(p).encode())
            assert st == 202, (st, ans)
            # git's first receive-pack request is the unauthenticated probe (401); the
            # authenticated one follows it.
            gh.wait_for(lambda: auths(gh, "git-receive-pack"), timeout=30)
            fetch, push = auths(gh, "git-upload-pack"), auths(gh, "git-receive-pack")
            issued = gh.issued_tokens
            assert fetch and push, gh.git_requests()
            assert all(issued[pw]["installation_id"] == 88 for pw in fetch + push), issued
            gh.wait_for(lambda: "fixed.txt" in git("--git-dir", bare, "ls-tree", "--name-only",
                                                    "feature-x"), timeout=10)
            names = os.listdir(tmp)
            name = next(n[4:-4] for n in names if n.startswith("env-"))
            for tok in issued:
                with open(os.path.join(tmp, "env-%s.txt" % name)) as f:
                    assert tok not in f.read()
    finally:
        gh.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(os.path.dirname(bare), ignore_errors=True)


def test_another_host_gets_no_credentials():
    """A repository that is not on the GitHub web host gets neither the App's token nor the
    PAT (nor is an installation token asked for it)."""
    tmp = tempfile.mkdtemp(prefix="diverge-gitother-")
    key = make_app_key(tmp)
    bare = bare_repo()
    git("--git-dir", bare, "update-server-info")
    gs = GitServer(bare)
    gh = FakeGitHub()
    gh.start()
    try:
        with open(key) as f:
            gh.set_app(int(APP_ID), public_key_pem=f.read(), slug="diverge-app")
        gh.add_installation(77)
        for name, app_key, pat in (("oth1", key, None), ("oth2", None, PAT)):
            with serve(gh.url + "/api/v3", tmp, app_key=app_key, pat=pat) as srv:
                create(srv, task(name, gs.url + "/group/project.git"))
                body = wait_phase(srv, name, ("Completed", "Failed"))
                assert body["status"]["phase"] == "Failed", body["status"]
                assert gs.auth and all(a is None for a in gs.auth), gs.auth
                assert not gh.issued_tokens
    finally:
        gh.stop()
        gs.close()
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(os.path.dirname(bare), ignore_errors=True)


if __name__ == "__main__":
    run_tests([test_app_installation_token_for_fetch_and_push, test_pat_for_the_enterprise_host,
               test_comment_task_uses_the_delivered_installation,
               test_another_host_gets_no_credentials])
