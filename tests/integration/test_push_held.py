# SPDX-License-Identifier: Apache-2.0
"""A slow or hanging git remote does not stall the controller (SPEC §9 "The server pushes
only after a runner exit 0 with the task still Active, then marks it Completed"): the push
runs off the controller's lock. With `--sandbox-provider process`, the fake runner and a
smart-HTTP remote on loopback that holds pushes (tests/fakes/held_git.py):

- while task A's push is held, task B is created, its agent runs, and B is deleted; a
  pause asked of A meanwhile waits for its push (its runner exited 0 already); released,
  A reaches Completed with its branch on the remote;
- A deleted during its held push is gone, and no git process of it is left;
- a remote that sends nothing ends the push with PushFailed and a clear message (git's
  low-speed limit, shortened here through git's own GIT_HTTP_LOW_SPEED_TIME);
- a server stopped (SIGTERM) during a held push stops without waiting for it; the next
  server restarts the task as after any restart, and it completes."""
import os
import shutil
import sys
import tempfile

from harness import API, Server, run_tests
from sandbox_helpers import FAKE_RUNNER, bare_repo, create, get, git, patch, proc_state, task, \
    task_log, wait_log, wait_phase, wait_until

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fakes"))
from held_git import HeldGit  # noqa: E402

AGENT = 'if [ "$DIVERGE_TASK_NAME" = b ]; then echo "agent b runs"; sleep 600; fi; ' \
        'echo fixed > fixed.txt'


def server(env=None, data_dir=None):
    return Server(args=["--sandbox-provider", "process", "--agent-cmd", AGENT],
                  env=dict({"DIVERGE_RUNNER_PATH": FAKE_RUNNER}, **(env or {})),
                  data_dir=data_dir)


class Remote:
    """A bare repository served by a HeldGit remote."""

    def __enter__(self):
        self.bare = bare_repo()
        self.top = os.path.dirname(self.bare)
        self.git = HeldGit(self.top)
        self.url = self.git.url + "/repo.git"
        return self

    def __exit__(self, *exc):
        self.git.close()
        shutil.rmtree(self.top, ignore_errors=True)

    def branch(self, name):
        """The commit of refs/heads/NAME on the remote, or None."""
        out = git("--git-dir", self.bare, "for-each-ref", "--format=%(objectname)",
                  "refs/heads/" + name)
        return out.strip() or None


def pushing(name, remote):
    """Tasks NAME's task, on REMOTE, working branch fix-NAME."""
    return task(name, repository={"url": remote.url, "baseBranch": "main",
                                  "workingBranch": "fix-" + name})


def git_processes(srv, name):
    """Pids of the live git processes (and git's helpers) working on task NAME's staging
    repository: named in their argv, or in their environment (a remote helper's GIT_DIR)."""
    staging = os.path.join(srv.data_dir, "staging", "default", name + ".git").encode()

    def about_task(pid):
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                argv = f.read()
            with open("/proc/%d/environ" % pid, "rb") as f:
                env = f.read()
        except OSError:
            return False
        return b"git" in argv and (staging in argv or staging in env)

    pids = [int(d) for d in os.listdir("/proc") if d.isdigit()]
    return [p for p in pids if about_task(p) and proc_state(p) not in (None, "Z")]


def held_push(srv, remote, name):
    """Creates task NAME whose push the remote holds; returns once it is held."""
    remote.git.hold_pushes()
    create(srv, pushing(name, remote))
    remote.git.wait_held()
    wait_log(srv, name, "fake runner: done", timeout=60)
    assert get(srv, name)["status"]["phase"] == "Active", get(srv, name)["status"]


def test_held_push_does_not_stall_other_tasks():
    with Remote() as remote, server() as srv:
        held_push(srv, remote, "a")
        # Another task starts, runs its agent and is deleted while A's push waits.
        create(srv, pushing("b", remote))
        wait_log(srv, "b", "agent b runs", timeout=60)
        st, _, body = srv.request("DELETE", API + "/namespaces/default/agenttasks/b")
        assert st in (200, 202), (st, body)
        wait_until(lambda: srv.request("GET", API + "/namespaces/default/agenttasks/b")[0] == 404,
                   timeout=30, what="task b to be gone")
        wait_log(srv, "b", "task deleted", timeout=30)
        # A pause of A (its runner exited 0, its push runs) waits for the push.
        patch(srv, "a", {"suspended": True})
        assert get(srv, "a")["status"]["phase"] == "Active", get(srv, "a")["status"]
        assert remote.branch("fix-a") is None
        remote.git.release()
        body = wait_phase(srv, "a", ("Completed", "Failed"), timeout=60)
        log = task_log(srv, "a")
        assert body["status"]["phase"] == "Completed", (body["status"], log)
        commit = remote.branch("fix-a")
        assert commit is not None and "pushed refs/heads/fix-a at " + commit in log, log
        assert "paused" not in log, log
        assert git("--git-dir", remote.bare, "show", "fix-a:fixed.txt") == "fixed\n"


def test_delete_during_held_push_kills_its_git():
    with Remote() as remote, server() as srv:
        held_push(srv, remote, "a")
        assert git_processes(srv, "a"), "no git process of the held push"
        st, _, body = srv.request("DELETE", API + "/namespaces/default/agenttasks/a")
        assert st in (200, 202), (st, body)
        wait_until(lambda: srv.request("GET", API + "/namespaces/default/agenttasks/a")[0] == 404,
                   timeout=30, what="task a to be gone")
        wait_until(lambda: not git_processes(srv, "a"), timeout=30,
                   what="the git of the deleted task's push to end")
        wait_log(srv, "a", "push stopped: the task was deleted", timeout=30)
        remote.git.release()
        # Nothing runs that could push it any more.
        assert remote.branch("fix-a") is None
        # The controller goes on: a new task completes.
        create(srv, pushing("c", remote))
        body = wait_phase(srv, "c", ("Completed", "Failed"), timeout=60)
        assert body["status"]["phase"] == "Completed", (body["status"], task_log(srv, "c"))


def test_silent_remote_fails_the_push():
    with Remote() as remote, server(env={"GIT_HTTP_LOW_SPEED_TIME": "1"}) as srv:
        remote.git.hold_pushes()
        create(srv, pushing("a", remote))
        body = wait_phase(srv, "a", ("Completed", "Failed"), timeout=60)
        log = task_log(srv, "a")
        st = body["status"]
        assert st["phase"] == "Failed" and st["reason"] == "PushFailed", (st, log)
        assert "sent (almost) nothing for too long" in st["message"], st
        assert "[diverge] push failed: git push failed: the remote sent (almost) nothing" in log, log
        assert remote.branch("fix-a") is None


def test_server_stopped_during_held_push_restarts_the_task():
    data_dir = tempfile.mkdtemp(prefix="diverge-test-")
    try:
        with Remote() as remote:
            with server(data_dir=data_dir) as srv:
                held_push(srv, remote, "a")
                rc = srv.stop()  # SIGTERM; harness kills after its own timeout
                assert rc == 0, (rc, srv.stderr())
                assert not git_processes(srv, "a")
                log = task_log(srv, "a")
                assert "push stopped: the server is stopping" in log, log
                assert "push failed" not in log, log
            remote.git.release()
            with server(data_dir=data_dir) as srv:
                body = wait_phase(srv, "a", ("Completed", "Failed"), timeout=60)
                log = task_log(srv, "a")
                assert body["status"]["phase"] == "Completed", (body["status"], log)
                assert "restarted after server restart" in log, log
                commit = remote.branch("fix-a")
                assert commit is not None and "pushed refs/heads/fix-a at " + commit in log, log
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    run_tests([test_held_push_does_not_stall_other_tasks,
               test_delete_during_held_push_kills_its_git,
               test_silent_remote_fails_the_push,
               test_server_stopped_during_held_push_restarts_the_task])
