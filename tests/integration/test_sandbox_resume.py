# SPDX-License-Identifier: Apache-2.0
"""Pause and resume of a sandbox with the real diverge-agent-runner: once the task reads
Pausing (token revoked) every process is frozen already, and the runner's next meter call
after the thaw is accepted. The controller used to thaw the sandbox before the
transaction that makes the fresh token current and the task Active, so a runner thawed
right before a heartbeat metered with a token the server did not know yet (401 "token
revoked"), exited 4 and the task failed (RunnerFailed) — about one resume in four with an
agent that meters before every iteration (bench/sandbox_latency.py found it)."""
import contextlib
import os
import shutil
import sys
import tempfile
import time

from harness import Server, run_tests
from sandbox_helpers import bare_repo, create, get, patch, task, task_log, wait_until
from test_sandbox_local import cgroup_dirs, usable

# One usage line per iteration and a failure: the runner meters before every iteration.
AGENT = "echo '{\"tokensUsed\":1,\"costUSD\":0.000001}' >> \"$DIVERGE_USAGE_FILE\"; exit 1"
CYCLES = 12


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


@contextlib.contextmanager
def metering_task(name):
    """A server on the local provider and its task NAME running AGENT, once it metered:
    yields the server and the runner's usage offset file."""
    repo = bare_repo()
    os.chmod(os.path.dirname(repo), 0o755)
    try:
        with Server(args=["--sandbox-provider", "local", "--agent-cmd", AGENT]) as srv:
            create(srv, task(name, "file://" + repo, maxIterations=10000))
            offset = os.path.join(srv.data_dir, "state", "default", name, "usage.jsonl.offset")
            wait_until(lambda: read(offset), timeout=60, what="the first meter call")
            yield srv, offset
    finally:
        shutil.rmtree(os.path.dirname(repo), ignore_errors=True)


def test_runner_meters_after_every_resume():
    with metering_task("rz") as (srv, offset):

        def failed():
            st = get(srv, "rz")["status"]
            assert st["phase"] not in ("Failed", "Completed"), (st, task_log(srv, "rz"))

        freezer, _, v2 = cgroup_dirs(srv, "rz")
        seen = []

        def pausing():
            # The phase first, then the freezer: a sandbox frozen before the Pausing
            # transaction reads frozen from the first moment the phase is not Active.
            phase = get(srv, "rz")["status"]["phase"]
            if phase not in ("Pausing", "Paused"):
                return False
            if freezer is not None:
                state = read(os.path.join(freezer, "cgroup.events" if v2 else "freezer.state"))
                seen.append((phase, "frozen 1" in (state or "") if v2 else
                             (state or "").strip() == "FROZEN"))
            return True

        for _ in range(CYCLES):
            before = read(offset)
            wait_until(lambda: failed() or read(offset) != before, what="metering")
            patch(srv, "rz", {"suspended": True})
            deadline = time.monotonic() + 20
            while not pausing():  # polled closely, to catch Pausing before Paused
                failed()
                assert time.monotonic() < deadline, "timed out waiting for Pausing"
                time.sleep(0.001)
            wait_until(lambda: failed() or get(srv, "rz")["status"]["phase"] == "Paused",
                       what="Paused")
            before = read(offset)
            patch(srv, "rz", {"suspended": False})
            # Metering again (the offset moves only after a 200), and the runner did not
            # stop on a refused call.
            wait_until(lambda: failed() or read(offset) != before, what="metering after resume")
        failed()
        log = task_log(srv, "rz")
        if "freeze failed" not in log:
            assert all(f for _, f in seen), (seen, log)
        # A meter call sent just before the freeze and answered after Pausing (token
        # revoked) gets a 401 (SPEC §4, §7); the runner then waits for the fresh token the
        # resume writes and goes on: it never stops on it.
        assert ": stopping" not in log and "runner exited" not in log, log
        # Every resume thawed the sandbox, or (a freeze that did not complete stops the
        # sandbox rather than leave it running unmetered) started a new runner that went
        # on from the next iteration.
        # The controller logs a thaw right after it: the runner may meter in between.
        def resumed():
            text = task_log(srv, "rz")
            return (text.count("[diverge] resumed (thawed, fresh token)") +
                    text.count("[diverge] resumed (provider ")) == CYCLES
        wait_until(resumed, what="every resume in the log")


def test_resume_right_after_suspend():
    """A suspend's request freezes the sandbox before its commit (the controller finishes
    the pause); a resume sent right after it, often before the controller reconciled the
    suspend, must leave the sandbox thawed and the runner metering, never frozen under an
    Active task. A delete right after a suspend stops the sandbox."""
    with metering_task("rr") as (srv, offset):
        freezer, _, v2 = cgroup_dirs(srv, "rr")

        def running():
            st = get(srv, "rr")["status"]
            assert st["phase"] not in ("Failed", "Completed"), (st, task_log(srv, "rr"))
            if freezer is None:
                return st["phase"] == "Active"
            state = read(os.path.join(freezer, "cgroup.events" if v2 else "freezer.state"))
            thawed = "frozen 0" in (state or "") if v2 else (state or "").strip() == "THAWED"
            return st["phase"] == "Active" and thawed

        for _ in range(CYCLES):
            patch(srv, "rr", {"suspended": True})
            patch(srv, "rr", {"suspended": False})
            before = read(offset)
            wait_until(lambda: running() and read(offset) != before,
                       what="Active, thawed and metering after a suspend and a resume")
        log = task_log(srv, "rr")
        assert ": stopping" not in log and "runner exited" not in log, log
        patch(srv, "rr", {"suspended": True})
        st, _, body = srv.request("DELETE",
                                  "/apis/divergedev.com/v1alpha1/namespaces/default/agenttasks/rr")
        assert st == 200, (st, body)
        wait_until(lambda: not os.path.exists(os.path.join(srv.data_dir, "run", "default.rr")),
                   what="the sandbox stopped after the delete")
        if freezer is not None:
            wait_until(lambda: not os.path.isdir(freezer) or
                       not (read(os.path.join(freezer, "cgroup.procs")) or "").split(),
                       what="no process left in the sandbox's cgroup")


if __name__ == "__main__":
    why = usable()
    if why:
        print("SKIP test_sandbox_resume: " + why)
        sys.exit(0)
    run_tests([test_runner_meters_after_every_resume, test_resume_right_after_suspend])
