# SPDX-License-Identifier: Apache-2.0
"""Stalls and loops are caught, not killed (SPEC §14 "Stalls and loops"), with the real
runner on a local PR:

- no sandbox output, meter or gateway call for --stall-after: status.stalledSince and
  "⚠️ Stalled since" in the sticky comment, both cleared once output resumes;
- the same verify failure three iterations in a row: the task pauses with reason
  NoProgress (its sandbox frozen), the PR gets a reply quoting the failure and suggesting
  /diverge guide and /diverge resume; after a guide and a resume the agent hears the
  guidance and the frozen runner continues with the next iteration."""
import shutil
import tempfile

from harness import Server, run_tests
from test_local_pr import Clean, thread, wait
from test_runs_wip import ENV, PROVIDER, get_task, make_repo

STALL_YAML = """version: "1"
agent:
  command: echo start; sleep 6; echo back; sleep 2
  verifyCommand: "true"
  maxIterations: 1
"""

LOOP_YAML = """version: "1"
agent:
  command: sh .diverge/agent.sh
  verifyCommand: sh check.sh
  budgetUSD: "2.00"
  maxIterations: 5
"""


def open_pr(srv, bare, ref):
    r = srv.cli("local", "pr", "open", ref, "--repo", "file://" + bare, "--head", "feature")
    assert r.returncode == 0, r
    r = srv.cli("local", "comment", ref, "/diverge fix the greeting", "--as", "alice")
    assert r.returncode == 0, r


def test_stall_is_shown_then_cleared():
    top = tempfile.mkdtemp(prefix="diverge-stall-")
    bare = make_repo(top, STALL_YAML)
    args = ["--sandbox-provider", PROVIDER, "--notifier-min-interval", "0", "--stall-after", "2s"]
    with Server(args, env=ENV) as srv, Clean(srv):
        open_pr(srv, bare, "acme/stall#4")
        t = wait(lambda: (lambda t: t if t and "stalledSince" in t["status"] else None)(
            get_task(srv, "acme-stall", "fix-pr-4")), what="stalledSince")
        assert t["status"]["phase"] == "Active", t["status"]
        out = wait(lambda: (lambda o: o if "Stalled since" in o else None)(
            thread(srv, "acme/stall#4")), what="sticky says stalled")
        assert "⚠️ Stalled since " + t["status"]["stalledSince"][11:16] + " UTC" in out, out
        # Output resumes ("back"): the stall is cleared, in the status and the sticky.
        t = wait(lambda: (lambda t: t if t and "stalledSince" not in t["status"] else None)(
            get_task(srv, "acme-stall", "fix-pr-4")), what="stall cleared")
        log = srv.cli("task", "logs", "fix-pr-4", "-n", "acme-stall").stdout
        assert "[sandbox] back" in log, log
        wait(lambda: (lambda t: t if t and t["status"]["phase"] == "Completed" else None)(
            get_task(srv, "acme-stall", "fix-pr-4")), what="completed")
        out = wait(lambda: (lambda o: o if "✅ Completed" in o else None)(
            thread(srv, "acme/stall#4")), what="sticky completed")
        assert "Stalled since" not in out.split("✅ Completed")[-1], out
    shutil.rmtree(top, ignore_errors=True)


def test_same_failure_three_times_pauses_with_no_progress():
    top = tempfile.mkdtemp(prefix="diverge-loop-")
    bare = make_repo(top, LOOP_YAML)
    with Server(["--sandbox-provider", PROVIDER, "--notifier-min-interval", "0"],
                env=ENV) as srv, Clean(srv):
        open_pr(srv, bare, "acme/loop#5")
        t = wait(lambda: (lambda t: t if t and t["status"]["phase"] == "Paused" else None)(
            get_task(srv, "acme-loop", "fix-pr-5")), what="paused")
        st = t["status"]
        assert st["reason"] == "NoProgress", st
        assert st["iteration"] == 3, st
        assert "got: Hello, World!" in st["lastFailure"], st
        log = srv.cli("task", "logs", "fix-pr-5", "-n", "acme-loop").stdout
        assert "no progress: the same verify failure 3 times in a row" in log, log
        assert "[diverge] paused (every process frozen" in log, log
        out = wait(lambda: (lambda o: o if "paused: no progress" in o else None)(
            thread(srv, "acme/loop#5")), what="no-progress reply")
        assert "got: Hello, World!" in out and "/diverge guide" in out, out
        assert "/diverge resume" in out, out
        r = srv.cli("local", "comment", "acme/loop#5", "/diverge guide compare the case of World",
                    "--as", "alice")
        assert r.returncode == 0, r
        wait(lambda: get_task(srv, "acme-loop", "fix-pr-5")["metadata"]["annotations"].get(
            "divergedev.com/guidance") == "compare the case of World", what="guidance set")
        r = srv.cli("local", "comment", "acme/loop#5", "/diverge resume", "--as", "alice")
        assert r.returncode == 0, r
        # The frozen runner continues: iteration 4 hears the guidance. The controller logs
        # the thaw right after it, so the runner may log first: wait for both lines.
        log = wait(lambda: (lambda l: l if "agent heard: compare the case" in l and
                            "resumed (thawed, fresh token)" in l else None)(
            srv.cli("task", "logs", "fix-pr-5", "-n", "acme-loop").stdout), what="guidance")
        assert "iteration 4/5: running the agent" in log, log
    shutil.rmtree(top, ignore_errors=True)


if __name__ == "__main__":
    run_tests([test_stall_is_shown_then_cleared,
               test_same_failure_three_times_pauses_with_no_progress])
