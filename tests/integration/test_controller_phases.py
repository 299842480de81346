# SPDX-License-Identifier: Apache-2.0
"""Controller phases with `--sandbox-provider process` and the fake runner: a pause goes
through Pausing; a server killed while a task is Pausing finishes the pause on restart
(the sandbox died with it: nothing to freeze) and a later resume starts a new runner;
the time serve was down does not count toward sandbox.timeoutSeconds; a slow first clone
of one repository does not keep another task from starting."""
import http.server
import json
import os
import shutil
import sqlite3
import tempfile
import threading
import time

from harness import Server, run_tests
from sandbox_helpers import (FAKE_RUNNER, bare_repo, create, get, git, group_members,
                             leader_pid, patch, task, task_log, wait_log, wait_phase,
                             wait_until)


def server(agent_cmd, data_dir=None):
    return Server(args=["--sandbox-provider", "process", "--agent-cmd", agent_cmd],
                  env={"DIVERGE_RUNNER_PATH": FAKE_RUNNER}, data_dir=data_dir)


def set_phase_offline(data_dir, name, phase, suspended):
    """Rewrites the phase of task NAME in the database of a server that is not running
    (the state a crash between two transactions leaves)."""
    db = sqlite3.connect(os.path.join(data_dir, "diverge.db"))
    try:
        (doc,) = db.execute("SELECT doc FROM tasks WHERE namespace='default' AND name=?",
                            (name,)).fetchone()
        obj = json.loads(doc)
        obj["status"]["phase"] = phase
        obj["status"]["reason"] = "Suspended"
        obj["spec"]["suspended"] = suspended
        db.execute("UPDATE tasks SET phase=?, doc=? WHERE namespace='default' AND name=?",
                   (phase, json.dumps(obj), name))
        db.commit()
    finally:
        db.close()


def test_pause_goes_through_pausing_and_restart_in_pausing_ends_paused():
    ctl = tempfile.mkdtemp(prefix="diverge-ctl-")
    cmd = "while [ ! -f %s/go ]; do sleep 0.1; done" % ctl
    srv = server(cmd).start()
    try:
        create(srv, task("pz"))
        wait_log(srv, "pz", "fake runner: meter 1 -> 200")
        pid = leader_pid(srv, "pz")
        srv.kill()
        # Killed between "Pausing" (token revoked) and the freeze; a resume arrived too.
        set_phase_offline(srv.data_dir, "pz", "Pausing", True)
        srv2 = server(cmd, data_dir=srv.data_dir).start()
        try:
            wait_until(lambda: not group_members(pid), what="the dead server's sandbox gone")
            body = wait_phase(srv2, "pz", "Paused")
            assert body["status"]["reason"] == "Suspended", body["status"]
            log = task_log(srv2, "pz")
            assert "nothing to freeze" in log, log
            assert "restarted after server restart" not in log, log
            # A resume starts a new runner on the workspace from the next iteration.
            open(os.path.join(ctl, "go"), "w").close()
            patch(srv2, "pz", {"suspended": False})
            body = wait_phase(srv2, "pz", ("Completed", "Failed"))
            assert body["status"]["phase"] == "Completed", (body["status"], task_log(srv2, "pz"))
            assert "start iteration 2" in task_log(srv2, "pz")
        finally:
            srv2.cleanup()
    finally:
        srv.cleanup()
        shutil.rmtree(srv.data_dir, ignore_errors=True)
        shutil.rmtree(ctl, ignore_errors=True)


def test_resume_while_pausing_after_restart():
    ctl = tempfile.mkdtemp(prefix="diverge-ctl-")
    cmd = "while [ ! -f %s/go ]; do sleep 0.1; done" % ctl
    srv = server(cmd).start()
    try:
        create(srv, task("pr"))
        wait_log(srv, "pr", "fake runner: meter 1 -> 200")
        srv.kill()
        # spec.suspended went back to false while the task was Pausing.
        set_phase_offline(srv.data_dir, "pr", "Pausing", False)
        open(os.path.join(ctl, "go"), "w").close()
        srv2 = server(cmd, data_dir=srv.data_dir).start()
        try:
            body = wait_phase(srv2, "pr", ("Completed", "Failed"))
            log = task_log(srv2, "pr")
            assert body["status"]["phase"] == "Completed", (body["status"], log)
            # The pause finished first, then the resume started the next iteration.
            assert log.index("nothing to freeze") < log.index("start iteration 2"), log
        finally:
            srv2.cleanup()
    finally:
        srv.cleanup()
        shutil.rmtree(srv.data_dir, ignore_errors=True)
        shutil.rmtree(ctl, ignore_errors=True)


def test_downtime_does_not_count_toward_timeout(meanwhile=None):
    """MEANWHILE (a function), when given, runs while this test's server is down; the
    downtime then lasts as long as it, and at least the timeout and 2 s."""
    ctl = tempfile.mkdtemp(prefix="diverge-ctl-")
    cmd = "while [ ! -f %s/go ]; do sleep 0.1; done; echo done > done.txt" % ctl
    repo = bare_repo()
    # Wide enough that a box loaded by the rest of the suite (this test runs beside it)
    # never fills it with the runner's own time: under a second before the kill, the
    # restart and 3 s after it.
    timeout = 12
    srv = server(cmd).start()
    try:
        create(srv, task("dt", "file://" + repo, sandbox={"timeoutSeconds": timeout}))
        wait_log(srv, "dt", "fake runner: meter 1 -> 200")
        old = leader_pid(srv, "dt")
        srv.kill()
        # Down for longer than the whole timeout: none of it counts.
        up_again = time.monotonic() + timeout + 2
        if meanwhile is not None:
            meanwhile()
        time.sleep(max(0.0, up_again - time.monotonic()))
        srv2 = server(cmd, data_dir=srv.data_dir).start()
        try:
            wait_log(srv2, "dt", "restarted after server restart")
            assert not group_members(old), "the old runner was left running"
            # The old server's runner used about a second of the 12: a few ticks of the
            # timer later the task still runs (counting the downtime failed it at once).
            time.sleep(3)
            body = get(srv2, "dt")
            assert body["status"]["phase"] == "Active", (body["status"], task_log(srv2, "dt"))
            open(os.path.join(ctl, "go"), "w").close()
            body = wait_phase(srv2, "dt", ("Completed", "Failed"))
            log = task_log(srv2, "dt")
            assert body["status"]["phase"] == "Completed", (body["status"], log)
            assert "timeout" not in log, log
            assert git("--git-dir", repo, "show", "agent/dt:done.txt") == "done\n"
        finally:
            srv2.cleanup()
    finally:
        srv.cleanup()
        shutil.rmtree(srv.data_dir, ignore_errors=True)
        shutil.rmtree(ctl, ignore_errors=True)
        shutil.rmtree(os.path.dirname(repo), ignore_errors=True)


def test_budget_pause_time_does_not_count_toward_timeout():
    repo = bare_repo()
    ctl = tempfile.mkdtemp(prefix="diverge-ctl-")
    # Paused for longer than it, and wide enough for the runner's time before the pause
    # and after the resume on a box loaded by the rest of the suite.
    timeout = 9
    with server("while [ ! -f %s/go ]; do sleep 0.1; done; echo more > more.txt" % ctl) as srv:
        # The fake runner's first heartbeat costs 0.01: over this budget → 429, Paused.
        create(srv, task("bt", "file://" + repo, budgetUSD="0.005",
                         sandbox={"timeoutSeconds": timeout}))
        body = wait_phase(srv, "bt", "Paused")
        assert body["status"]["reason"] == "BudgetExceeded", body["status"]
        wait_log(srv, "bt", "runner exited (status 0)")
        time.sleep(timeout + 1)  # paused for longer than the whole timeout
        assert get(srv, "bt")["status"]["phase"] == "Paused"
        patch(srv, "bt", {"budgetUSD": "1.00", "suspended": False})
        wait_log(srv, "bt", "meter 2 -> 200")
        time.sleep(2)  # a few ticks of the timer: the pause did not use up the timeout
        body = get(srv, "bt")
        assert body["status"]["phase"] == "Active", (body["status"], task_log(srv, "bt"))
        open(os.path.join(ctl, "go"), "w").close()
        body = wait_phase(srv, "bt", ("Completed", "Failed"))
        log = task_log(srv, "bt")
        assert body["status"]["phase"] == "Completed", (body["status"], log)
        assert "start iteration 2" in log, log
    shutil.rmtree(os.path.dirname(repo), ignore_errors=True)
    shutil.rmtree(ctl, ignore_errors=True)


def test_downtime_and_budget_pause_do_not_count_toward_timeout():
    """The two tests above, the budget pause's run during the downtime of the first: the
    downtime is a wait with this test's server down, so the box holds just one of the two
    timeouts at a time, and the test takes the longer of the two instead of their sum."""
    test_downtime_does_not_count_toward_timeout(
        meanwhile=test_budget_pause_time_does_not_count_toward_timeout)


class SlowGitServer:
    """Serves BARE at /repo.git over dumb HTTP on loopback; every request waits until
    release() (a remote that takes its time for a first clone)."""

    def __init__(self, bare):
        self.bare = bare
        self.paths = []
        self.gate = threading.Event()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                outer.paths.append(self.path)
                outer.gate.wait(90)
                rel = self.path.split("?", 1)[0]
                path = os.path.normpath(os.path.join(outer.bare, rel[len("/repo.git/"):]))
                if not rel.startswith("/repo.git/") or not path.startswith(outer.bare) or \
                        not os.path.isfile(path):
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                with open(path, "rb") as f:
                    data = f.read()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d/repo.git" % self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()

    def release(self):
        self.gate.set()

    def close(self):
        self.gate.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def test_slow_clone_does_not_block_other_tasks():
    slow_repo = bare_repo()
    git("--git-dir", slow_repo, "update-server-info")
    local_repo = bare_repo()
    gs = SlowGitServer(slow_repo)
    try:
        with server("echo fixed > fixed.txt") as srv:
            create(srv, task("slow1", gs.url))
            wait_until(lambda: gs.paths, what="the first clone reached the remote")
            create(srv, task("slow2", gs.url))  # same repository: waits for that clone
            wait_phase(srv, "slow1", "Provisioning")
            # A task on another repository is not held up by the clone.
            create(srv, task("fast", "file://" + local_repo))
            body = wait_phase(srv, "fast", ("Completed", "Failed"))
            assert body["status"]["phase"] == "Completed", (body["status"], task_log(srv, "fast"))
            assert get(srv, "slow1")["status"]["phase"] == "Provisioning"
            assert get(srv, "slow2")["status"]["phase"] == "Provisioning"
            # Suspended while its mirror is fetched: Paused with no sandbox yet; resumed
            # later, it is provisioned (not failed for a missing workspace).
            create(srv, task("slow3", gs.url))
            wait_phase(srv, "slow3", "Provisioning")
            patch(srv, "slow3", {"suspended": True})
            wait_phase(srv, "slow3", "Paused")
            gs.release()
            wait_log(srv, "slow3", "repository mirror", timeout=60)
            patch(srv, "slow3", {"suspended": False})
            wait_log(srv, "slow3", "[diverge] provisioned", timeout=60)
            for name in ("slow1", "slow2"):
                # (the dumb-HTTP remote is read-only: their push fails later, by design)
                wait_log(srv, name, "[diverge] provisioned", timeout=60)
            # One clone, then a fetch into it: never two gits on the mirror at once.
            logs = [task_log(srv, n) for n in ("slow1", "slow2")]
            assert sum("repository mirror cloned" in l for l in logs) == 1, logs
            assert sum("repository mirror fetched (reused)" in l for l in logs) == 1, logs
            assert len(os.listdir(os.path.join(srv.data_dir, "mirrors"))) == 2
    finally:
        gs.close()
        shutil.rmtree(os.path.dirname(slow_repo), ignore_errors=True)
        shutil.rmtree(os.path.dirname(local_repo), ignore_errors=True)


if __name__ == "__main__":
    run_tests([test_pause_goes_through_pausing_and_restart_in_pausing_ends_paused,
               test_resume_while_pausing_after_restart,
               test_downtime_and_budget_pause_do_not_count_toward_timeout,
               test_slow_clone_does_not_block_other_tasks])
