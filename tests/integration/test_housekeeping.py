# SPDX-License-Identifier: Apache-2.0
"""Housekeeping (SPEC §14): `diverge task delete NAME`; a second `diverge serve` on a data
dir in use exits 1 with `data dir … is in use (pid N)` and changes nothing, while a server
restarted after the first one died (kill -9 included) starts."""
import json
import os
import shutil
import subprocess
import time

from harness import API, DIVERGE_BIN, Server, run_tests, task_obj
from sandbox_helpers import FAKE_RUNNER, bare_repo, create, git, task, task_log, wait_phase

NS = API + "/namespaces/default/agenttasks"
ARGS = ["--sandbox-provider", "none"]


def test_task_delete():
    with Server(ARGS) as srv:
        st, _, b = srv.request("POST", NS, task_obj("gone"))
        assert st == 201, b
        r = srv.cli("task", "delete", "gone")
        assert r.returncode == 0 and r.stdout == "agenttask.divergedev.com/gone deleted\n", r
        st, _, _ = srv.request("GET", NS + "/gone")
        assert st == 404
        r = srv.cli("task", "delete", "gone")
        assert r.returncode == 1 and r.stderr.startswith("diverge: ") and "not found" in \
            r.stderr, r
        st, _, b = srv.request("POST", NS, task_obj("gone2"))
        r = srv.cli("task", "delete", "gone2", "-o", "json")
        assert r.returncode == 0 and json.loads(r.stdout)["metadata"]["name"] == "gone2", r
        r = srv.cli("task", "delete")
        assert r.returncode == 2, r
        r = srv.cli("task", "delete", "--help")
        assert r.returncode == 0 and "Usage: diverge task delete NAME" in r.stdout, r


def test_second_server_on_the_same_data_dir_refuses():
    with Server(ARGS) as srv:
        st, _, b = srv.request("POST", NS, task_obj("keep"))
        assert st == 201, b
        r = subprocess.run([DIVERGE_BIN, "serve", "--listen", "127.0.0.1:0", "--data-dir",
                            srv.data_dir] + ARGS, capture_output=True, text=True, timeout=30)
        assert r.returncode == 1, (r.returncode, r.stderr)
        want = "data dir %s is in use (pid %d)" % (srv.data_dir, srv.proc.pid)
        assert want in r.stderr, r.stderr
        assert r.stderr.startswith("diverge: "), r.stderr
        # the first one goes on, untouched
        st, _, b = srv.request("GET", NS + "/keep")
        assert st == 200, b
        with open(os.path.join(srv.data_dir, "serve.lock")) as f:
            assert f.read().strip() == str(srv.proc.pid)
        data = srv.data_dir
        srv.kill()  # kill -9: the lock goes with the process
        srv2 = Server(ARGS, data_dir=data).start()
        try:
            st, _, b = srv2.request("GET", NS + "/keep")
            assert st == 200, b
        finally:
            srv2.stop()


def test_task_without_repository_says_what_to_do():
    """The real runner under the process provider, a task with no repository: it fails
    with a message naming the two ways out, not a bare exit status."""
    with Server(["--sandbox-provider", "process", "--agent-cmd", "true"]) as srv:
        st, _, b = srv.request("POST", NS, task_obj("no-repo"))
        assert st == 201, b
        deadline = time.time() + 30
        while time.time() < deadline:
            st, _, b = srv.request("GET", NS + "/no-repo")
            if b["status"]["phase"] in ("Completed", "Failed"):
                break
            time.sleep(0.05)
        s = b["status"]
        assert s["phase"] == "Failed" and s["reason"] == "RunnerFailed", s
        assert s["message"] == ("no repository: set spec.repository.url, or use "
                                "--sandbox-provider none for an external agent "
                                "(the runner exited with status 2)"), s


def test_switching_the_sandbox_provider_restarts_active_tasks():
    """An Active task of provider none (no workspace ever) is started again, not failed
    with "the task's workspace is gone", when the server comes back with a sandbox
    provider: from its working branch, at its iteration, and it completes."""
    repo = bare_repo()
    try:
        with Server(ARGS) as srv:
            create(srv, task("switch", "file://" + repo))
            wait_phase(srv, "switch", "Active")
            data = srv.data_dir
            srv.own_dir = False  # keep the data dir for the next server
        with Server(["--sandbox-provider", "process", "--agent-cmd", "echo x > x.txt"],
                    env={"DIVERGE_RUNNER_PATH": FAKE_RUNNER}, data_dir=data) as srv:
            srv.own_dir = True
            b = wait_phase(srv, "switch", ("Completed", "Failed"))
            log = task_log(srv, "switch")
            assert b["status"]["phase"] == "Completed", (b["status"], log)
            assert ("restarted under --sandbox-provider process (it ran under none before): "
                    "its workspace was gone, so it continues from its working branch") in log, log
            ann = b["metadata"]["annotations"]
            assert ann["divergedev.com/sandbox-provider"] == "process", ann
            assert git("--git-dir", repo, "show", "agent/switch:x.txt") == "x\n"
    finally:
        shutil.rmtree(os.path.dirname(repo), ignore_errors=True)


if __name__ == "__main__":
    run_tests([test_task_delete, test_second_server_on_the_same_data_dir_refuses,
               test_task_without_repository_says_what_to_do,
               test_switching_the_sandbox_provider_restarts_active_tasks])
