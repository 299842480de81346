# SPDX-License-Identifier: Apache-2.0
"""The workspace of a local sandbox made outside it from the mirror, with the real
diverge-agent-runner: the server writes the git directory (the mirror's object files
hard-linked, the refs of the base and working branches, origin, a depth-50 shallow list)
and the runner checks it out inside the sandbox instead of cloning. Checked from inside:
the agent sees the working branch as the runner's clone left it (the remote's branch,
tracked; the base branch; a clean tree; at most 50 commits of history), cannot change a
linked object file (so not the mirror other tasks read), and the task pushes on top of
the remote's branch. A branch name the server leaves to git falls back to the runner's
clone. Skipped with a message when bubblewrap or user namespaces are missing, or when
not run as root (the server only links objects when the sandbox user is another one)."""
import os
import shutil
import stat
import sys

from harness import Server, run_tests
from sandbox_helpers import bare_repo, create, git, task, task_log, wait_phase
from test_sandbox_local import usable

# What the agent reports of its workspace, one "key=value" per line in the task log, then
# a change so the task completes and pushes.
REPORT = ("echo head=$(git rev-parse --abbrev-ref HEAD); "
          "echo upstream=$(git rev-parse --abbrev-ref '@{u}' 2>/dev/null); "
          "echo base=$(git rev-parse --verify -q refs/remotes/origin/main); "
          "echo dirty=$(git status --porcelain | wc -l); "
          "echo commits=$(git rev-list --count HEAD); "
          "echo feature=$(cat feature.txt 2>/dev/null); ")
CHANGE = "echo changed > change.txt"
# ... and whether it can change an object file of its .git (chmod as its owner, append).
PROBE = ("f=$(ls .git/objects/pack/pack-*.pack .git/objects/??/* 2>/dev/null | head -n 1); "
         "if [ -n \"$f\" ] && { chmod u+w \"$f\" || true; } && echo x >> \"$f\" 2>/dev/null; "
         "then echo object=written; else echo object=read-only; fi; ")


def report(log):
    """The agent's key=value lines of LOG."""
    out = {}
    for line in log.splitlines():
        for key in ("head", "upstream", "base", "dirty", "commits", "feature", "object"):
            mark = " %s=" % key
            if mark in line:
                out[key] = line.split(mark, 1)[1].strip()
    return out


def repo_with_feature(commits):
    """A bare repository: main with COMMITS commits, branch feature one commit ahead."""
    bare = bare_repo()
    top = os.path.dirname(bare)
    os.chmod(top, 0o755)
    work = os.path.join(top, "work")

    def commit(path, text, msg):
        with open(os.path.join(work, path), "a") as f:
            f.write(text)
        git("add", path, cwd=work)
        git("commit", "-q", "-m", msg, cwd=work)
    for i in range(commits - 1):
        commit("README", "%d\n" % i, "commit %d" % i)
    git("push", "-q", bare, "main", cwd=work)
    git("checkout", "-q", "-b", "feature", cwd=work)
    commit("feature.txt", "on feature\n", "feature")
    git("push", "-q", bare, "feature", cwd=work)
    return bare


def object_files(git_dir):
    out = []
    for root, _, files in os.walk(os.path.join(git_dir, "objects")):
        out += [os.path.join(root, f) for f in files
                if "/pack/pack-" in os.path.join(root, f) or len(f) == 38]
    return out


def run_task(srv, name, bare, working):
    """Runs task NAME on BARE with the working branch WORKING to Completed; its log."""
    create(srv, task(name, maxIterations=1,
                     repository={"url": "file://" + bare, "workingBranch": working}))
    body = wait_phase(srv, name, ("Completed", "Failed"), timeout=60)
    log = task_log(srv, name)
    assert body["status"]["phase"] == "Completed", (body["status"], log)
    return log


def test_workspace_made_from_the_mirror():
    bare = repo_with_feature(60)
    feature = git("--git-dir", bare, "rev-parse", "feature").strip()
    main = git("--git-dir", bare, "rev-parse", "main").strip()
    with Server(args=["--sandbox-provider", "local", "--agent-cmd",
                      REPORT + PROBE + CHANGE]) as srv:
        log = run_task(srv, "ws", bare, "feature")
        assert "workspace made from the mirror by the server: checking out feature" in log, log
        assert "cloning the repository" not in log, log
        got = report(log)
        assert got.get("head") == "feature" and got.get("upstream") == "origin/feature", got
        assert got.get("base") == main and got.get("dirty") == "0", got
        assert got.get("feature") == "on feature", got
        assert got.get("commits") == "50", got  # 61 in the repository: depth 50
        # The agent could not change an object file it shares with the mirror.
        assert got.get("object") == "read-only", (got, log)
        mirrors = os.path.join(srv.data_dir, "mirrors")
        mirror = os.path.join(mirrors, os.listdir(mirrors)[0])
        files = object_files(mirror)
        assert files, mirror
        for f in files:
            st = os.lstat(f)
            assert st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o444, (f, st)
        git("--git-dir", mirror, "fsck", "--no-dangling")
        # The task pushed its change on top of the remote's branch.
        assert git("--git-dir", bare, "rev-parse", "feature^").strip() == feature
        assert git("--git-dir", bare, "show", "feature:change.txt") == "changed\n"
    shutil.rmtree(os.path.dirname(bare), ignore_errors=True)


def test_a_branch_left_to_git_is_cloned_by_the_runner():
    bare = repo_with_feature(2)
    with Server(args=["--sandbox-provider", "local", "--agent-cmd", REPORT + CHANGE]) as srv:
        log = run_task(srv, "wg", bare, "fix#1")
        assert "workspace not made from the mirror" in log, log
        assert "cloning the repository" in log, log
        got = report(log)
        assert got.get("head") == "fix#1" and got.get("dirty") == "0", got
        assert git("--git-dir", bare, "show", "fix#1:change.txt") == "changed\n"
    shutil.rmtree(os.path.dirname(bare), ignore_errors=True)


def test_a_start_fetches_its_branches():
    """A start fetches the heads of its base and working branches into the mirror, a
    working branch the remote does not have yet included; not the remote's other
    branches, which no start of this task reads."""
    bare = repo_with_feature(2)
    work = os.path.join(os.path.dirname(bare), "work")
    with Server(args=["--sandbox-provider", "local", "--agent-cmd", REPORT + CHANGE]) as srv:
        run_task(srv, "b1", bare, "feature")  # clones the mirror: every branch
        git("checkout", "-q", "main", cwd=work)
        with open(os.path.join(work, "later.txt"), "w") as f:
            f.write("later\n")
        git("add", "later.txt", cwd=work)
        git("commit", "-q", "-m", "later", cwd=work)
        git("push", "-q", bare, "main", "main:other", cwd=work)
        main = git("--git-dir", bare, "rev-parse", "main").strip()
        log = run_task(srv, "b2", bare, "fresh")
        got = report(log)
        assert got.get("head") == "fresh" and got.get("base") == main, (got, log)
        mirrors = os.path.join(srv.data_dir, "mirrors")
        mirror = os.path.join(mirrors, os.listdir(mirrors)[0])
        assert git("--git-dir", mirror, "rev-parse", "main").strip() == main
        assert git("--git-dir", mirror, "for-each-ref", "refs/heads/other") == ""
        assert git("--git-dir", bare, "show", "fresh:change.txt") == "changed\n"
    shutil.rmtree(os.path.dirname(bare), ignore_errors=True)


if __name__ == "__main__":
    why = usable()
    if not why and os.geteuid() != 0:
        why = "not root: the server makes the workspace outside only as root"
    if why:
        print("SKIP test_sandbox_workspace: " + why)
        sys.exit(0)
    run_tests([test_workspace_made_from_the_mirror,
               test_a_branch_left_to_git_is_cloned_by_the_runner,
               test_a_start_fetches_its_branches])
