# SPDX-License-Identifier: Apache-2.0
"""The controller with `--sandbox-provider process` and a fake runner (DIVERGE_RUNNER_PATH):
provision from a file:// bare repo, runner exit 0 → the server pushes the working branch
→ Completed; pause freezes and resume thaws; timeout; runner failure; delete; kill -9 of
serve mid-run → restarted on the same workspace; the mirror is reused by a second task
(not fetched while the remote's branches are the mirror's) and fetched for a third after
the remote's main moved."""
import os
import re
import shutil
import subprocess
import tempfile
import time

from harness import API, DIVERGE_BIN, Server, run_tests
from sandbox_helpers import (FAKE_RUNNER, bare_repo, create, get, git, group_members,
                             leader_pid, patch, proc_state, task, task_log, wait_log,
                             wait_phase, wait_until)


def server(agent_cmd, data_dir=None):
    return Server(args=["--sandbox-provider", "process", "--agent-cmd", agent_cmd],
                  env={"DIVERGE_RUNNER_PATH": FAKE_RUNNER}, data_dir=data_dir)


def test_complete_pushes_working_branch():
    repo = bare_repo()
    with server("echo fixed > fixed.txt") as srv:
        create(srv, task("t1", "file://" + repo))
        body = wait_phase(srv, "t1", ("Completed", "Failed"))
        log = task_log(srv, "t1")
        assert body["status"]["phase"] == "Completed", (body["status"], log)
        assert body["status"]["completionTime"]
        assert "[diverge] provisioned" in log and "pushed refs/heads/agent/t1" in log, log
        assert "fake runner: meter 1 -> 200" in log, log
        assert "NO ISOLATION" in log
        assert git("--git-dir", repo, "show", "agent/t1:fixed.txt") == "fixed\n"
        msg = git("--git-dir", repo, "log", "-1", "--format=%s", "agent/t1")
        assert msg.strip() == "fix(t1): fix the thing", msg
        # main untouched
        assert git("--git-dir", repo, "log", "--format=%s", "main").strip() == "initial"
        # A second task on the same repository reuses the mirror: the remote's branches,
        # read from its files, are the mirror's, so nothing is fetched.
        create(srv, task("t2", "file://" + repo))
        wait_phase(srv, "t2", "Completed")
        assert "repository mirror up to date (reused)" in task_log(srv, "t2")
        mirrors = os.listdir(os.path.join(srv.data_dir, "mirrors"))
        assert len(mirrors) == 1
        # A commit on the remote's main: the next start fetches it and runs on it.
        work = os.path.join(os.path.dirname(repo), "work")
        with open(os.path.join(work, "later.txt"), "w") as f:
            f.write("later\n")
        git("add", "later.txt", cwd=work)
        git("commit", "-q", "-m", "later", cwd=work)
        git("push", "-q", repo, "main", cwd=work)
        create(srv, task("t3", "file://" + repo))
        wait_phase(srv, "t3", "Completed")
        log = task_log(srv, "t3")
        assert "repository mirror fetched (reused)" in log, log
        mirror = os.path.join(srv.data_dir, "mirrors", mirrors[0])
        assert git("--git-dir", mirror, "rev-parse", "main") == \
            git("--git-dir", repo, "rev-parse", "main")
        assert git("--git-dir", repo, "show", "agent/t3:later.txt") == "later\n"
        # The token is revoked once finished.
        st, _, _ = srv.request("GET", API + "/namespaces/default/agenttasks/t1/token")
        assert st in (200, 404, 409, 410), st
    shutil.rmtree(os.path.dirname(repo), ignore_errors=True)


def test_runner_failure_and_push_refusal():
    repo = bare_repo()
    with server("exit 3") as srv:
        create(srv, task("f1", "file://" + repo))
        body = wait_phase(srv, "f1", ("Completed", "Failed"))
        assert body["status"]["phase"] == "Failed", body["status"]
        assert body["status"]["reason"] == "RunnerFailed", body["status"]
    with server("echo x > x.txt") as srv:
        # workingBranch == baseBranch on a task not made from a PR comment: refused.
        create(srv, task("f2", "file://" + repo,
                         repository={"url": "file://" + repo, "workingBranch": "main"}))
        body = wait_phase(srv, "f2", ("Completed", "Failed"))
        assert body["status"]["phase"] == "Failed", body["status"]
        assert "refusing to push" in task_log(srv, "f2")
        assert git("--git-dir", repo, "log", "--format=%s", "main").strip() == "initial"
    shutil.rmtree(os.path.dirname(repo), ignore_errors=True)


def by_cmdline(cmdline):
    """States of the processes whose command line is CMDLINE (a list)."""
    want = ("\0".join(cmdline) + "\0").encode()
    out = []
    for d in os.listdir("/proc"):
        try:
            with open("/proc/%s/cmdline" % d, "rb") as f:
                if f.read() != want:
                    continue
            out.append(proc_state(int(d)))
        except (OSError, ValueError):
            continue
    return [s for s in out if s and s != "Z"]


def test_pause_freezes_resume_thaws_delete_stops():
    # A child that left the process group and session is frozen and stopped too.
    with server("setsid sleep 301 & sleep 300") as srv:
        create(srv, task("p1"))
        wait_phase(srv, "p1", "Active")
        wait_log(srv, "p1", "fake runner: meter 1 -> 200")
        pid = wait_until(lambda: leader_pid(srv, "p1"), what="leader pid")
        wait_until(lambda: by_cmdline(["sleep", "301"]), what="the setsid child")
        patch(srv, "p1", {"suspended": True})
        wait_phase(srv, "p1", "Paused")
        wait_until(lambda: all(s == "T" for _, s in group_members(pid)) and group_members(pid),
                   what="every process stopped")
        assert "paused (every process frozen" in task_log(srv, "p1")
        # SIGSTOP takes effect when the process next runs: on a loaded machine a woken
        # 'sleep' shows R for a moment before T.
        wait_until(lambda: by_cmdline(["sleep", "301"]) == ["T"], what="the setsid child stopped")
        patch(srv, "p1", {"suspended": False})
        wait_phase(srv, "p1", "Active")
        wait_until(lambda: all(s != "T" for _, s in group_members(pid)), what="thawed")
        # The log line follows the thaw: on a loaded machine a moment later.
        wait_log(srv, "p1", "resumed (thawed, fresh token)")
        st, _, _ = srv.request("DELETE", API + "/namespaces/default/agenttasks/p1")
        assert st == 200, st
        wait_until(lambda: not group_members(pid), what="sandbox gone after delete")
        wait_until(lambda: not by_cmdline(["sleep", "301"]), what="setsid child gone")
        ws = os.path.join(srv.data_dir, "workspaces", "default", "p1")
        wait_until(lambda: not os.path.exists(ws), what="workspace removed after delete")


def test_timeout_kills_everything():
    with server("sleep 300") as srv:
        create(srv, task("to", sandbox={"timeoutSeconds": 2}))
        wait_phase(srv, "to", "Active")
        pid = wait_until(lambda: leader_pid(srv, "to"), what="leader pid")
        body = wait_phase(srv, "to", ("Failed", "Completed"), timeout=30)
        assert body["status"]["reason"] == "Timeout", body["status"]
        assert not group_members(pid)
        assert "timeout: sandbox.timeoutSeconds 2 passed" in task_log(srv, "to")


def test_restart_after_kill9_continues():
    repo = bare_repo()
    ctl = tempfile.mkdtemp(prefix="diverge-ctl-")
    cmd = "while [ ! -f %s/go ]; do sleep 0.1; done; echo done > done.txt" % ctl
    srv = server(cmd).start()
    try:
        create(srv, task("r1", "file://" + repo))
        wait_phase(srv, "r1", "Active")
        wait_log(srv, "r1", "fake runner: meter 1 -> 200")
        old = leader_pid(srv, "r1")
        srv.kill()
        srv2 = server(cmd, data_dir=srv.data_dir).start()
        try:
            wait_log(srv2, "r1", "restarted after server restart")
            assert not group_members(old), "the old runner was left running"
            open(os.path.join(ctl, "go"), "w").close()
            body = wait_phase(srv2, "r1", ("Completed", "Failed"))
            assert body["status"]["phase"] == "Completed", (body["status"], task_log(srv2, "r1"))
            assert git("--git-dir", repo, "show", "agent/r1:done.txt") == "done\n"
        finally:
            srv2.cleanup()
    finally:
        srv.cleanup()
        shutil.rmtree(srv.data_dir, ignore_errors=True)
        shutil.rmtree(ctl, ignore_errors=True)
        shutil.rmtree(os.path.dirname(repo), ignore_errors=True)


def test_budget_pause_then_resume_starts_next_iteration():
    repo = bare_repo()
    with server("echo more > more.txt") as srv:
        # The fake runner's first heartbeat costs 0.01: over this budget → 429.
        create(srv, task("bu", "file://" + repo, budgetUSD="0.005"))
        body = wait_phase(srv, "bu", "Paused")
        assert body["status"]["reason"] == "BudgetExceeded", body["status"]
        wait_log(srv, "bu", "meter 1 -> 429")
        wait_log(srv, "bu", "runner exited (status 0)")  # exit 0 on 429: stays Paused
        time.sleep(0.3)
        assert get(srv, "bu")["status"]["phase"] == "Paused"
        assert "pushed" not in task_log(srv, "bu")
        patch(srv, "bu", {"budgetUSD": "1.00", "suspended": False})
        body = wait_phase(srv, "bu", ("Completed", "Failed"))
        log = task_log(srv, "bu")
        assert body["status"]["phase"] == "Completed", (body["status"], log)
        assert "start iteration 2" in log and "meter 2 -> 200" in log, log
        assert git("--git-dir", repo, "show", "agent/bu:more.txt") == "more\n"
    shutil.rmtree(os.path.dirname(repo), ignore_errors=True)


def test_paused_sandbox_killed_by_restart_then_resumed():
    ctl = tempfile.mkdtemp(prefix="diverge-ctl-")
    cmd = "while [ ! -f %s/go ]; do sleep 0.1; done" % ctl
    srv = server(cmd).start()
    try:
        create(srv, task("pk"))
        wait_log(srv, "pk", "fake runner: meter 1 -> 200")
        pid = leader_pid(srv, "pk")
        patch(srv, "pk", {"suspended": True})
        wait_phase(srv, "pk", "Paused")
        srv.kill()  # (an orphaned stopped group also gets SIGHUP from the kernel)
        srv2 = server(cmd, data_dir=srv.data_dir).start()
        try:
            # Nothing of the dead server's sandbox is left; the task stays Paused.
            wait_until(lambda: not group_members(pid), what="stopped sandbox gone")
            assert get(srv2, "pk")["status"]["phase"] == "Paused"
            open(os.path.join(ctl, "go"), "w").close()
            patch(srv2, "pk", {"suspended": False})
            body = wait_phase(srv2, "pk", ("Completed", "Failed"))
            assert body["status"]["phase"] == "Completed", (body["status"], task_log(srv2, "pk"))
            assert "start iteration 2" in task_log(srv2, "pk")
        finally:
            srv2.cleanup()
    finally:
        srv.cleanup()
        shutil.rmtree(srv.data_dir, ignore_errors=True)
        shutil.rmtree(ctl, ignore_errors=True)


def test_no_runner_fails_closed():
    srv = Server(args=["--sandbox-provider", "process"],
                 env={"DIVERGE_RUNNER_PATH": "/nonexistent/diverge-agent-runner"})
    with srv:
        assert any("SANDBOXES CANNOT RUN" in l for l in srv.lines), srv.lines
        st, _, body = srv.request("GET", "/readyz", auth=False)
        assert st == 200 and "cannot be executed" in body.get("sandbox", ""), body
        create(srv, task("nr"))
        body = wait_phase(srv, "nr", ("Failed", "Active", "Completed"))
        assert body["status"]["phase"] == "Failed", body["status"]
        assert body["status"]["reason"] == "SandboxError", body["status"]
        assert "cannot be executed" in body["status"]["message"], body["status"]


def test_log_endpoint_and_cli_follow():
    ctl = tempfile.mkdtemp(prefix="diverge-ctl-")
    cmd = "echo agent-line-1; while [ ! -f %s/go ]; do sleep 0.1; done; echo agent-line-2" % ctl
    with server(cmd) as srv:
        create(srv, task("lg"))
        wait_log(srv, "lg", "agent-line-1")
        path = API + "/namespaces/default/agenttasks/lg/log"
        st, hdrs, text = srv.request("GET", path)
        assert st == 200 and hdrs["content-type"].startswith("text/plain"), (st, hdrs)
        assert "agent-line-1" in text and "[diverge] provisioned" in text, text
        # Every line starts with an RFC 3339 time.
        for line in text.splitlines():
            assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ ", line), line
        st, _, tail = srv.request("GET", path + "?sinceBytes=%d" % (len(text.encode()) - 5))
        assert st == 200 and tail == text[-5:], (tail, text[-5:])
        st, _, _ = srv.request("GET", path + "?sinceBytes=-1")
        assert st == 400
        st, _, _ = srv.request("GET", API + "/namespaces/default/agenttasks/nope/log")
        assert st == 404
        st, _, _ = srv.request("GET", path, auth=False)
        assert st == 401
        # diverge task logs -f streams until the task finishes.
        env = dict(os.environ, DIVERGE_SERVER=srv.url, DIVERGE_API_TOKEN=srv.token)
        proc = subprocess.Popen([DIVERGE_BIN, "task", "logs", "lg", "-f"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(0.3)
        assert proc.poll() is None, "follow ended while the task runs"
        open(os.path.join(ctl, "go"), "w").close()
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, (proc.returncode, err)
        assert "agent-line-1" in out and "agent-line-2" in out, out
        assert get(srv, "lg")["status"]["phase"] == "Completed"
        r = srv.cli("task", "logs", "lg")
        assert r.returncode == 0 and "agent-line-2" in r.stdout, r
    shutil.rmtree(ctl, ignore_errors=True)


def test_no_repository_says_what_to_do():
    """A task with nothing to clone fails with a message that says what to do, not just
    "the runner exited with status 2": one made through the API without
    spec.repository.url (the real runner finds no DIVERGE_REPO_URL), and one made by a
    comment on a local PR that was never opened (its local:// placeholder, refused before
    any sandbox starts)."""
    with Server(args=["--sandbox-provider", "process", "--agent-cmd", "true"],
                env={"DIVERGE_RUNNER_PATH": None}) as srv:
        create(srv, task("norepo"))
        body = wait_phase(srv, "norepo", ("Completed", "Failed"))
        st = body["status"]
        assert st["phase"] == "Failed" and st["reason"] == "RunnerFailed", st
        assert st["message"] == ("no repository: set spec.repository.url, or use "
                                 "--sandbox-provider none for an external agent (the runner "
                                 "exited with status 2)"), st
        assert "[diverge] failed: no repository: set spec.repository.url" in task_log(
            srv, "norepo")
        r = srv.cli("local", "comment", "myorg/never#3", "/diverge fix it")
        assert r.returncode == 0, r.stderr
        ns = "myorg-never"
        deadline = time.time() + 30
        while True:
            st, _, b = srv.request("GET", API + "/namespaces/%s/agenttasks/fix-pr-3" % ns)
            if st == 200 and b["status"]["phase"] == "Failed":
                break
            assert time.time() < deadline, (st, b)
            time.sleep(0.05)
        msg = b["status"]["message"]
        assert msg.startswith("no repository: local://myorg/never is a local pull request "
                              "without one (open it with `diverge local pr open"), msg
        assert msg.endswith("or use --sandbox-provider none for an external agent"), msg
        assert b["status"]["reason"] == "SandboxError", b["status"]


if __name__ == "__main__":
    run_tests([test_complete_pushes_working_branch, test_runner_failure_and_push_refusal,
               test_pause_freezes_resume_thaws_delete_stops, test_timeout_kills_everything,
               test_restart_after_kill9_continues, test_log_endpoint_and_cli_follow,
               test_budget_pause_then_resume_starts_next_iteration,
               test_no_runner_fails_closed, test_paused_sandbox_killed_by_restart_then_resumed,
               test_no_repository_says_what_to_do])
