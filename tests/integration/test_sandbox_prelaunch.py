# SPDX-License-Identifier: Apache-2.0
"""A local start whose repository mirror is already there spawns its sandbox while the
mirror is fetched, with the real diverge-agent-runner: the runner waits at its start gate
(nothing checked out, nothing metered, the agent not run) until the server made the
workspace from the fetched mirror and the task is Active; then it runs on the head the
fetch brought, pushed after the sandbox had started. A task suspended while its runner
waits gets that sandbox stopped and no workspace left behind; resumed, it is provisioned
as any other. A deleted one gets its waiting sandbox stopped. The server stays in its own
cgroups (a start's cgroup warm-up moves it where it is). The remote is a dumb-HTTP
server on loopback that holds every request until released (the fetch takes its time).
Skipped with a message when bubblewrap or user namespaces are missing."""
import glob
import os
import shutil
import sys

from harness import API, Server, run_tests
from sandbox_helpers import (bare_repo, create, get, git, patch, task, task_log, wait_log,
                             wait_phase, wait_until)
from test_controller_phases import SlowGitServer
from test_sandbox_local import usable

AGENT = 'echo "files: $(ls | tr "\\n" " ")"; echo fixed > fixed.txt'
EARLY = "sandbox started while the mirror is fetched"


def runners(name):
    """Pids of the diverge-agent-runner processes of task NAME."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/comm" % d) as f:
                comm = f.read().strip()
            if not comm.startswith("diverge-agent-r"):
                continue
            with open("/proc/%s/environ" % d, "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if ("DIVERGE_TASK_NAME=" + name).encode() in env:
            out.append(int(d))
    return out


def workspace(srv, name):
    return os.path.join(srv.data_dir, "workspaces", "default", name)


class Setup:
    """A server on the local provider and a slow remote whose mirror a first task warmed."""

    def __enter__(self):
        self.repo = bare_repo()
        os.chmod(os.path.dirname(self.repo), 0o755)
        git("--git-dir", self.repo, "update-server-info")
        self.gs = SlowGitServer(self.repo)
        self.gs.release()
        # The prelaunch's own spawn: no warm slot (test_sandbox_slots) takes its place.
        self.srv = Server(args=["--sandbox-provider", "local", "--agent-cmd", AGENT,
                                "--sandbox-warm-slots", "0"])
        self.srv.__enter__()
        create(self.srv, task("warm", self.gs.url))
        wait_log(self.srv, "warm", "files:", timeout=60)
        wait_phase(self.srv, "warm", ("Completed", "Failed"), timeout=60)
        return self

    def hold(self, name):
        """Creates task NAME while the remote holds requests; returns once its sandbox
        runs, waiting at the gate, and its fetch reached the remote."""
        self.gs.gate.clear()
        seen = len(self.gs.paths)
        create(self.srv, task(name, self.gs.url))
        wait_log(self.srv, name, EARLY, timeout=60)
        wait_until(lambda: len(self.gs.paths) > seen, timeout=60, what="the fetch")
        wait_until(lambda: runners(name), timeout=60, what="the runner of " + name)
        wait_phase(self.srv, name, "Provisioning", timeout=60)

    def __exit__(self, *exc):
        self.gs.release()
        self.srv.__exit__(*exc)
        self.gs.close()
        shutil.rmtree(os.path.dirname(self.repo), ignore_errors=True)


def cgroups(pid):
    with open("/proc/%d/cgroup" % pid) as f:
        return f.read()


def task_cgroups(name):
    """The cgroup folders of task default/NAME (v1: one per hierarchy; v2: one)."""
    return (glob.glob("/sys/fs/cgroup/*/diverge/*/default." + name) +
            glob.glob("/sys/fs/cgroup/diverge/*/default." + name))


def test_runner_waits_at_the_gate_then_runs_on_the_fetched_head():
    with Setup() as s:
        srv = s.srv
        before = cgroups(srv.proc.pid)
        s.hold("early")
        # Waiting: nothing in the workspace, no agent, no meter call.
        assert os.listdir(workspace(srv, "early")) == []
        log = task_log(srv, "early")
        assert "running the agent" not in log and "provisioned" not in log, log
        # A commit the remote gets after the sandbox started is what the task runs on.
        work = os.path.join(os.path.dirname(s.repo), "work")
        with open(os.path.join(work, "late.txt"), "w") as f:
            f.write("late\n")
        git("add", "late.txt", cwd=work)
        git("commit", "-q", "-m", "late", cwd=work)
        git("push", "-q", s.repo, "main", cwd=work)
        git("--git-dir", s.repo, "update-server-info")
        s.gs.release()
        wait_log(srv, "early", "files:", timeout=60)
        log = task_log(srv, "early")
        files = [l for l in log.splitlines() if "files:" in l][0]
        assert "late.txt" in files and "README" in files, log
        assert log.index("repository mirror fetched") < log.index("[diverge] provisioned") < \
            log.index("files:"), log
        # The warm-up ahead of a start moves the server into the cgroups it was in.
        assert cgroups(srv.proc.pid) == before


def test_suspended_or_deleted_while_waiting_stops_the_early_sandbox():
    with Setup() as s:
        srv = s.srv
        s.hold("held")
        patch(srv, "held", {"suspended": True})
        wait_phase(srv, "held", "Paused", timeout=60)
        wait_until(lambda: not runners("held"), timeout=30, what="the early sandbox to stop")
        assert not os.path.exists(workspace(srv, "held")), os.listdir(workspace(srv, "held"))
        s.gs.release()
        wait_log(srv, "held", "repository mirror", timeout=60)
        # Resumed: provisioned as a task that never ran (not failed for its workspace).
        patch(srv, "held", {"suspended": False})
        wait_log(srv, "held", "[diverge] provisioned", timeout=60)
        wait_log(srv, "held", "files:", timeout=60)

        # The remote holds requests again (held's push too, if still on its way: pushes
        # run off the controller's lock, so it does not hold the delete below).
        s.hold("gone")
        made = task_cgroups("gone")  # made ahead of the start (none without root cgroups)
        st, _, body = srv.request("DELETE", API + "/namespaces/default/agenttasks/gone")
        assert st in (200, 202), (st, body)
        wait_until(lambda: not runners("gone"), timeout=30, what="the deleted task's sandbox")
        wait_until(lambda: not task_cgroups("gone"), timeout=30,
                   what="the deleted task's cgroups %r to go" % made)


if __name__ == "__main__":
    why = usable()
    if why is not None:
        print("SKIP: " + why)
        sys.exit(0)
    run_tests([test_runner_waits_at_the_gate_then_runs_on_the_fetched_head,
               test_suspended_or_deleted_while_waiting_stops_the_early_sandbox])
