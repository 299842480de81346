# SPDX-License-Identifier: Apache-2.0
"""Linked preview Environments and draft PRs (SPEC §4) with `--sandbox-provider process`
and the fake runner: the Environment agent-preview-<task> is created with the task's
output annotations and previewUrl, the agent sees the preview variables, the Environment
is hibernated on pause and deleted with the task; a completed CLI-made task with
spec.draftPR opens one draft PR at the fake GitHub (also across a restart right after
completion, and linking the existing PR on a 422), or a local PR thread for a file://
repository."""
import json
import os
import shutil
import subprocess
import tempfile

from harness import API, DIVERGE_BIN, Server, run_tests
from github_helpers import TOKEN, new_fake
from sandbox_helpers import (FAKE_RUNNER, bare_repo, create, get, git, patch, task,
                             task_log, wait_log, wait_phase, wait_until)

ENVS = API + "/namespaces/default/environments"
PREVIEW = "http://127.0.0.1:9/preview"  # never contacted: the fake runner does no GET


def server(agent_cmd, *extra, data_dir=None, env=None):
    e = {"DIVERGE_RUNNER_PATH": FAKE_RUNNER, "GITHUB_TOKEN": None,
         "DIVERGE_NOTIFIER_TOKEN": None}
    e.update(env or {})
    return Server(args=["--sandbox-provider", "process", "--agent-cmd", agent_cmd] +
                  list(extra), env=e, data_dir=data_dir)


def pr_link(srv, name):
    return get(srv, name)["metadata"].get("annotations", {}).get(
        "divergedev.com/pull-request-url")


def env_get(srv, name):
    st, _, body = srv.request("GET", ENVS + "/" + name)
    return st, body


def read_env_file(path):
    out = {}
    with open(path) as f:
        for line in f:
            k, _, v = line.rstrip("\n").partition("=")
            out[k] = v
    return out


def test_preview_environment_lifecycle():
    repo = bare_repo()
    tmp = tempfile.mkdtemp(prefix="diverge-preview-")
    dump = os.path.join(tmp, "env.txt")
    # The agent writes its preview variables, then waits to be paused.
    agent = "env | grep '^DIVERGE_PREVIEW_' > %s; sleep 300" % dump
    with server(agent, "--preview-base-url", PREVIEW + "/") as srv:
        create(srv, task("pv1", "file://" + repo))
        body = wait_phase(srv, "pv1", "Active")
        url = PREVIEW + "/?_diverge_env=agent-preview-pv1"
        ann = body["metadata"]["annotations"]
        assert ann["divergedev.com/preview-environment"] == "agent-preview-pv1", ann
        assert ann["divergedev.com/preview-url"] == url, ann
        assert body["status"]["previewUrl"] == url, body["status"]
        st, env = env_get(srv, "agent-preview-pv1")
        assert st == 200, (st, env)
        assert env["kind"] == "Environment" and env["apiVersion"] == "divergedev.com/v1alpha1"
        assert env["metadata"]["ownerReferences"][0]["uid"] == body["metadata"]["uid"], env
        assert env["metadata"]["ownerReferences"][0]["kind"] == "AgentTask", env
        assert env["spec"]["branch"] == "agent/pv1", env
        assert env["spec"]["service"] == "pv1" and env["spec"]["port"] == 8080, env
        assert env["metadata"]["annotations"]["divergedev.com/sandbox-ip"] == "127.0.0.1", env
        assert "divergedev.com/hibernated" not in env["metadata"]["annotations"], env
        # The agent saw the preview variables.
        wait_until(lambda: os.path.exists(dump) and os.path.getsize(dump) > 0,
                   what="the agent's environment dump")
        seen = read_env_file(dump)
        assert seen == {"DIVERGE_PREVIEW_URL": url,
                        "DIVERGE_PREVIEW_HEADER_KEY": "x-diverge-env",
                        "DIVERGE_PREVIEW_HEADER_VALUE": "agent-preview-pv1"}, seen
        # Pause hibernates, resume wakes.
        patch(srv, "pv1", {"suspended": True})
        wait_phase(srv, "pv1", "Paused")
        _, env = env_get(srv, "agent-preview-pv1")
        a = env["metadata"]["annotations"]
        assert a.get("divergedev.com/hibernated") == "true", env
        assert "divergedev.com/sandbox-ip" not in a, env
        assert env["status"]["phase"] == "Hibernated", env
        patch(srv, "pv1", {"suspended": False})
        wait_phase(srv, "pv1", "Active")
        _, env = env_get(srv, "agent-preview-pv1")
        a = env["metadata"]["annotations"]
        assert "divergedev.com/hibernated" not in a, env
        assert a.get("divergedev.com/sandbox-ip") == "127.0.0.1", env
        # The list shows it; delete of the task deletes it.
        st, _, lst = srv.request("GET", ENVS)
        assert st == 200 and [i["metadata"]["name"] for i in lst["items"]] == \
            ["agent-preview-pv1"], lst
        st, _, _ = srv.request("DELETE", API + "/namespaces/default/agenttasks/pv1")
        assert st == 200, st
        st, _ = env_get(srv, "agent-preview-pv1")
        assert st == 404, st
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(os.path.dirname(repo), ignore_errors=True)


def test_no_preview_without_base_url_or_when_disabled():
    repo = bare_repo()
    with server("true") as srv:
        create(srv, task("np1", "file://" + repo))
        body = wait_phase(srv, "np1", "Completed")
        assert body["status"]["previewUrl"] == "", body["status"]
        assert "divergedev.com/preview-url" not in body["metadata"].get("annotations", {})
        assert env_get(srv, "agent-preview-np1")[0] == 404
    with server("true", "--preview-base-url", PREVIEW) as srv:
        t = task("np2", "file://" + repo)
        t["metadata"]["annotations"] = {"divergedev.com/preview-enabled": "false"}
        create(srv, t)
        body = wait_phase(srv, "np2", "Completed")
        assert body["status"]["previewUrl"] == "", body["status"]
        assert env_get(srv, "agent-preview-np2")[0] == 404
        # Finished with a preview: the Environment stays (released) until the task goes.
        create(srv, task("np3", "file://" + repo))
        wait_phase(srv, "np3", "Completed")
        st, env = env_get(srv, "agent-preview-np3")
        assert st == 200 and env["status"]["phase"] == "Released", env
        assert "divergedev.com/sandbox-ip" not in env["metadata"]["annotations"], env
    shutil.rmtree(os.path.dirname(repo), ignore_errors=True)


def test_bad_preview_base_url_refused():
    data = tempfile.mkdtemp(prefix="diverge-test-")
    try:
        r = subprocess.run([DIVERGE_BIN, "serve", "--listen", "127.0.0.1:0", "--data-dir", data,
                            "--sandbox-provider", "none", "--preview-base-url",
                            "ftp://preview.example"], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode != 0, (r.returncode, r.stdout, r.stderr)
        assert "--preview-base-url must be an http:// or https:// URL" in r.stderr, r.stderr
    finally:
        shutil.rmtree(data, ignore_errors=True)


def test_sticky_comment_shows_preview_link():
    """A task made from a PR comment (provider annotations) gets its preview; the sticky
    comment carries the magic link and the exit link (SPEC §6), and its draftPR opens
    nothing (the PR exists)."""
    gh = new_fake()
    try:
        with Server(["--sandbox-provider", "none", "--github-api-url", gh.url,
                     "--preview-base-url", "https://preview.example.com"],
                    env={"DIVERGE_NOTIFIER_TOKEN": TOKEN, "GITHUB_TOKEN": None}) as srv:
            obj = {"apiVersion": "divergedev.com/v1alpha1", "kind": "AgentTask",
                   "metadata": {"name": "fix-pr-7", "annotations": {
                       "divergedev.com/provider": "github",
                       "divergedev.com/project": "octo/repo",
                       "divergedev.com/pr-number": "7"}},
                   "spec": {"objective": "fix it", "draftPR": True,
                            "repository": {"url": "https://github.com/octo/repo.git",
                                           "workingBranch": "feature-x"}}}
            st, _, b = srv.request("POST", API + "/namespaces/octo-repo/agenttasks", obj)
            assert st == 201, b
            link = "https://preview.example.com/?_diverge_env=agent-preview-fix-pr-7"

            def sticky_with_link():
                return [c for c in gh.comments("octo/repo", 7)
                        if c["body"].startswith("<!-- diverge-agent-task -->") and
                        link in c["body"]]
            sticky = wait_until(sticky_with_link, what="the sticky comment's preview link")
            assert "_diverge_env=clear" in sticky[0]["body"], sticky[0]["body"]
            st, _, env = srv.request("GET", API + "/namespaces/octo-repo/environments/"
                                     "agent-preview-fix-pr-7")
            assert st == 200, env
            # provider none: no sandbox, so no sandbox-ip
            assert "divergedev.com/sandbox-ip" not in env["metadata"]["annotations"], env
        assert not gh.find_requests(method="POST", path_re=r"/pulls$")
    finally:
        gh.stop()


def gitconfig_redirect(tmp, web_url, bare):
    """A global git config that sends WEB_URL (the fake GitHub's repository URL) to the
    bare repository BARE: the server mirrors and pushes with git, offline."""
    path = os.path.join(tmp, "gitconfig")
    with open(path, "w") as f:
        f.write('[url "file://%s"]\n\tinsteadOf = %s\n' % (bare, web_url))
    return path


def draft_task(name, url):
    return task(name, url, draftPR=True)


def test_draft_pr_github_once_across_restart():
    repo = bare_repo()
    tmp = tempfile.mkdtemp(prefix="diverge-draft-")
    gh = new_fake()
    try:
        web = gh.url.rstrip("/") + "/octo/repo"
        env = {"GIT_CONFIG_GLOBAL": gitconfig_redirect(tmp, web, repo),
               "DIVERGE_NOTIFIER_TOKEN": TOKEN}
        data = tempfile.mkdtemp(prefix="diverge-test-")
        with server("echo fixed > fixed.txt", "--github-api-url", gh.url, data_dir=data,
                    env=env) as srv:
            # The outbox cannot reach GitHub yet: the PR is queued with the completion.
            gh.inject(method="POST", path_re=r"/pulls$", status=503, times=1000)
            create(srv, draft_task("dp1", web))
            body = wait_phase(srv, "dp1", ("Completed", "Failed"))
            assert body["status"]["phase"] == "Completed", (body["status"],
                                                            task_log(srv, "dp1"))
            assert git("--git-dir", repo, "show", "agent/dp1:fixed.txt") == "fixed\n"
            wait_log(srv, "dp1", "draft pull request queued (github octo/repo)")
            gh.wait_for_request(method="POST", path_re=r"/pulls$")
            srv.kill()  # a crash right after completion, the PR still queued
        gh.clear_injections()
        # Restarted right after completion: the queued PR is opened once.
        with server("true", "--github-api-url", gh.url, data_dir=data, env=env) as srv:
            pr_url = wait_until(lambda: pr_link(srv, "dp1"), what="the PR link")
            pulls = gh.pulls("octo/repo")
            drafts = [p for p in pulls if p["head"]["ref"] == "agent/dp1"]
            assert len(drafts) == 1, pulls
            p = drafts[0]
            assert p["draft"] is True and p["base"]["ref"] == "main", p
            assert p["title"] == "fix(dp1): fix the thing", p
            assert "diverge-draft-pr: default/dp1" in p["body"], p
            assert pr_url == p["html_url"], (pr_url, p)
            wait_log(srv, "dp1", "draft pull request: " + pr_url)
            reqs = gh.find_requests(method="POST", path_re=r"/pulls$", status=201)
            assert len(reqs) == 1, reqs
        # A third start logs nothing twice and opens nothing.
        with server("true", "--github-api-url", gh.url, data_dir=data, env=env) as srv:
            wait_phase(srv, "dp1", "Completed")
            assert task_log(srv, "dp1").count("draft pull request: ") == 1
        assert len(gh.find_requests(method="POST", path_re=r"/pulls$", status=201)) == 1
        shutil.rmtree(data, ignore_errors=True)
    finally:
        gh.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(os.path.dirname(repo), ignore_errors=True)


def test_draft_pr_github_422_links_existing():
    repo = bare_repo()
    tmp = tempfile.mkdtemp(prefix="diverge-draft-")
    gh = new_fake()
    try:
        web = gh.url.rstrip("/") + "/octo/repo"
        existing = gh.add_pull("octo/repo", 31, head_ref="agent/dp2", draft=True)
        env = {"GIT_CONFIG_GLOBAL": gitconfig_redirect(tmp, web, repo),
               "DIVERGE_NOTIFIER_TOKEN": TOKEN}
        with server("echo x > x.txt", "--github-api-url", gh.url, env=env) as srv:
            create(srv, draft_task("dp2", web))
            wait_phase(srv, "dp2", "Completed")
            url = wait_until(lambda: pr_link(srv, "dp2"), what="the PR link")
            assert url == existing["html_url"], (url, existing["html_url"])
            assert gh.find_requests(method="POST", path_re=r"/pulls$", status=422)
            assert len(gh.pulls("octo/repo")) == 2  # #7 of new_fake and #31
            posts = len(gh.find_requests(method="POST", path_re=r"/pulls$"))
            # A lost response: GitHub made the PR but answered 502; the retry's 422 links
            # the one it made, no second PR.
            gh.inject(method="POST", path_re=r"/pulls$", status=502, apply=True, times=1)
            create(srv, draft_task("dp4", web))
            wait_phase(srv, "dp4", "Completed")
            url4 = wait_until(lambda: pr_link(srv, "dp4"), what="the lost-response PR link")
            mine = [p for p in gh.pulls("octo/repo") if p["head"]["ref"] == "agent/dp4"]
            assert len(mine) == 1 and mine[0]["html_url"] == url4, (mine, url4)
            # A task made from a PR comment never opens one; a task without draftPR neither.
            t = task("dp3", web)
            create(srv, t)
            wait_phase(srv, "dp3", "Completed")
            assert "draft pull request" not in task_log(srv, "dp3")
        assert posts == 1, posts
        assert len(gh.find_requests(method="POST", path_re=r"/pulls$")) == 3  # 1 + 502 + 422
    finally:
        gh.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(os.path.dirname(repo), ignore_errors=True)


def test_draft_pr_local_thread():
    repo = bare_repo()  # <tmp>/repo.git → project local/repo
    with server("echo y > y.txt") as srv:
        create(srv, draft_task("dl1", "file://" + repo))
        wait_phase(srv, "dl1", "Completed")
        url = wait_until(lambda: pr_link(srv, "dl1"), what="the local PR link")
        assert url == "local://local/repo#1", url
        st, _, thread = srv.request("GET", "/api/v1/local/threads/local/repo/1")
        assert st == 200, (st, thread)
        items = thread["comments"] if isinstance(thread, dict) else thread
        assert len(items) == 1, thread
        assert items[0]["author"] == "diverge", items
        assert "Draft pull request" in items[0]["body"], items
        assert "fix(dl1): fix the thing" in items[0]["body"], items
        assert "`agent/dl1` → `main`" in items[0]["body"], items
        wait_log(srv, "dl1", "draft pull request: local://local/repo#1")
        r = srv.cli("local", "thread", "local/repo#1")
        assert r.returncode == 0 and "fix(dl1): fix the thing" in r.stdout, (r.stdout, r.stderr)
        # A second task on the same repository gets the next thread.
        create(srv, draft_task("dl2", "file://" + repo))
        wait_phase(srv, "dl2", "Completed")
        url = wait_until(lambda: pr_link(srv, "dl2"), what="the second local PR link")
        assert url == "local://local/repo#2", url
    shutil.rmtree(os.path.dirname(repo), ignore_errors=True)


if __name__ == "__main__":
    run_tests([test_preview_environment_lifecycle,
               test_no_preview_without_base_url_or_when_disabled,
               test_bad_preview_base_url_refused,
               test_sticky_comment_shows_preview_link,
               test_draft_pr_github_once_across_restart,
               test_draft_pr_github_422_links_existing,
               test_draft_pr_local_thread])
