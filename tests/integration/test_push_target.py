# SPDX-License-Identifier: Apache-2.0
"""Where the server pushes (SPEC §9, security review 2026-12-01 finding 1): a PR whose head
repository (a fork) was deleted gets a reply and no task, never the base repository in its
place (GitHub head.repo null; GitLab merge_request.source null); the base branch of the
repository a PR targets is never pushed, and the exemption for a PR head named like the
base is the bot's signed grant, not an annotation the task API takes from its caller. A
fork's main into the base's main is still pushed, to the fork."""
import json
import os
import shutil

from github_helpers import (BOT, comment_payload, deliver, new_fake, server_env, SECRET,
                            wait)
import gitlab_helpers as glh
from harness import API, Server, run_tests
from sandbox_helpers import FAKE_RUNNER, bare_repo, git

NS = "octo-repo"


def tasks_path(ns):
    return API + "/namespaces/%s/agenttasks" % ns


def get_task(srv, ns, name):
    st, _, b = srv.request("GET", tasks_path(ns) + "/" + name)
    return b if st == 200 else None


def log_of(srv, ns, name):
    try:
        with open(os.path.join(srv.data_dir, "logs", ns, name + ".log")) as f:
            return f.read()
    except OSError:
        return ""


def finished(srv, ns, name):
    t = get_task(srv, ns, name)
    return t if t and t["status"]["phase"] in ("Completed", "Failed") else None


def branch_head(bare, ref="main"):
    return git("--git-dir", bare, "rev-parse", ref).strip()


def github_server(gh):
    """A server whose process sandbox runs the fake runner: it commits and pushes."""
    return Server(["--sandbox-provider", "process", "--agent-cmd", "echo change >> README",
                   "--github-webhook-secret", SECRET, "--github-api-url", gh.url],
                  env=dict(server_env(), DIVERGE_RUNNER_PATH=FAKE_RUNNER))


def comment(gh, srv, repo, number, body, user="alice"):
    c = gh.add_comment(repo, number, user=user, body=body)
    st, _, ans = deliver(srv, comment_payload(repo, number, c["id"], body, user=user))
    assert st == 202, (st, ans)


def replies(gh, repo, number):
    return [c["body"] for c in gh.comments(repo, number) if c["user"]["login"] == BOT]


def test_github_deleted_fork_gets_a_reply_and_no_task():
    victim = bare_repo()
    before = branch_head(victim)
    gh = new_fake()
    try:
        gh.add_repo("octo/repo", clone_url="file://" + victim)
        pull = gh.add_pull("octo/repo", 8, head_ref="main", head_repo="eve/repo")
        # GitHub's shape once the fork is deleted: head.repo is null.
        pull["head"]["repo"] = None
        gh.inject(method="GET", path_re="/repos/octo/repo/pulls/8$", status=200, body=pull,
                  times=None)
        with github_server(gh) as srv:
            comment(gh, srv, "octo/repo", 8, "/diverge fix tidy the README")
            got = wait(lambda: replies(gh, "octo/repo", 8), what="reply")
            assert "the PR's head repository no longer exists" in got[0], got
            assert "Nothing was changed" in got[0], got
            assert get_task(srv, NS, "fix-pr-8") is None
            st, _, lst = srv.request("GET", tasks_path(NS))
            assert st == 200 and lst["items"] == [], lst
        assert branch_head(victim) == before
    finally:
        gh.stop()
        shutil.rmtree(os.path.dirname(victim), ignore_errors=True)


def test_github_fork_main_into_main_is_pushed_to_the_fork():
    victim, fork = bare_repo(), bare_repo()
    before = branch_head(victim)
    fork_before = branch_head(fork)
    gh = new_fake()
    try:
        gh.add_repo("octo/repo", clone_url="file://" + victim)
        gh.add_repo("eve/repo", clone_url="file://" + fork, fork=True, owner_type="User")
        gh.add_pull("octo/repo", 9, head_ref="main", head_repo="eve/repo")
        with github_server(gh) as srv:
            comment(gh, srv, "octo/repo", 9, "/diverge fix tidy the README")
            t = wait(lambda: finished(srv, NS, "fix-pr-9"), timeout=60, what="task")
            assert t["status"]["phase"] == "Completed", (t["status"], log_of(srv, NS, "fix-pr-9"))
            repo = t["spec"]["repository"]
            assert repo == {"url": "file://" + fork, "baseBranch": "main",
                            "workingBranch": "main"}, repo
            ann = t["metadata"]["annotations"]
            assert ann["divergedev.com/pr-base-repository"] == "file://" + victim, ann
            assert ann["divergedev.com/pr-base-branch"] == "main", ann
            assert ann["divergedev.com/push-grant"].startswith("v1."), ann
            assert "[diverge] pushed refs/heads/main" in log_of(srv, NS, "fix-pr-9")
        assert branch_head(fork) != fork_before
        assert branch_head(victim) == before
    finally:
        gh.stop()
        for d in (victim, fork):
            shutil.rmtree(os.path.dirname(d), ignore_errors=True)


def test_api_task_on_the_base_branch_is_never_pushed():
    """The comment-made annotations, even a real grant copied from another task, set
    through the task API do not let a task push its base branch."""
    victim = bare_repo()
    before = branch_head(victim)
    with Server(["--sandbox-provider", "process", "--agent-cmd", "echo change >> README"],
                env={"DIVERGE_RUNNER_PATH": FAKE_RUNNER}) as srv:
        url = "file://" + victim
        cases = {
            # The review's case: the provider annotation alone used to exempt the task.
            "plain": {"divergedev.com/provider": "github", "divergedev.com/project": "octo/repo",
                      "divergedev.com/pr-number": "7"},
            # A PR base recorded as another repository, and a grant that is not the bot's.
            "forged": {"divergedev.com/provider": "github",
                       "divergedev.com/project": "octo/repo", "divergedev.com/pr-number": "7",
                       "divergedev.com/pr-base-repository": "file:///elsewhere.git",
                       "divergedev.com/pr-base-branch": "main",
                       "divergedev.com/push-grant": "v1." + "0" * 64},
        }
        for name, ann in cases.items():
            obj = {"apiVersion": "divergedev.com/v1alpha1", "kind": "AgentTask",
                   "metadata": {"name": name, "namespace": "default", "annotations": ann},
                   "spec": {"objective": "tidy", "repository": {
                       "url": url, "baseBranch": "main", "workingBranch": "main"}}}
            st, _, body = srv.request("POST", tasks_path("default"), obj)
            assert st == 201, (st, body)
        for name in cases:
            t = wait(lambda: finished(srv, "default", name), timeout=60, what=name)
            log = log_of(srv, "default", name)
            assert t["status"]["phase"] == "Failed", (name, t["status"], log)
            assert t["status"]["reason"] == "PushFailed", (name, t["status"])
            assert "refusing to push the working branch: the working branch is the base " \
                   "branch" in log, log
            assert "pushed refs/heads/main" not in log, log
    assert branch_head(victim) == before
    shutil.rmtree(os.path.dirname(victim), ignore_errors=True)


def gitlab_note(gl, body, iid, source_gone=True):
    payload, _ = glh.note_from(gl, body, iid=iid, source="main", target="main")
    p = json.loads(payload)
    if source_gone:
        p["merge_request"]["source"] = None  # GitLab's shape once the fork is deleted
        p["merge_request"]["source_project_id"] = None
    return json.dumps(p).encode()


def test_gitlab_deleted_source_project_gets_a_reply_and_no_task():
    gl = glh.new_fake()
    try:
        gl.add_mr(glh.PROJECT, 11, source="main", target="main")
        gl.projects[glh.PROJECT]["mrs"][11]["source_project_id"] = None
        gl.add_mr(glh.PROJECT, 12, source="main", target="main")
        gl.projects[glh.PROJECT]["mrs"][12]["source_project_id"] = 999999  # 404
        with Server(glh.server_args(gl), env=glh.server_env()) as srv:
            for iid in (11, 12):
                st, _, ans = glh.deliver(srv, gitlab_note(gl, "/diverge fix tidy", iid))
                assert st == 202, (st, ans)
            for iid in (11, 12):
                got = wait(lambda: [n["body"] for n in gl.mr_notes(glh.PROJECT, iid)
                                    if n["author"]["username"] == glh.BOT], what="reply")
                assert "the MR's source project no longer exists" in got[0], got
            st, _, lst = srv.request("GET", glh.NS)
            assert st == 200 and lst["items"] == [], lst
    finally:
        gl.stop()


if __name__ == "__main__":
    run_tests([test_github_deleted_fork_gets_a_reply_and_no_task,
               test_github_fork_main_into_main_is_pushed_to_the_fork,
               test_api_task_on_the_base_branch_is_never_pushed,
               test_gitlab_deleted_source_project_gets_a_reply_and_no_task])
