# SPDX-License-Identifier: Apache-2.0
"""Spend is live (SPEC §14): the runner meters each usage line while the agent runs, so a
budget stops a long iteration in its middle.

- against a scripted meter that answers 429 from the fourth line on: an agent that would
  write a usage line every second for 60 s is killed (with what it started) soon after,
  its iteration never ends, the runner exits 0;
- with the real server and a local sandbox: the task pauses with BudgetExceeded in the
  middle of its first iteration, its spend shows the lines metered so far while it runs,
  and the run's checkpoint is pushed as diverge/wip/<task>."""
import os
import shutil
import tempfile

from harness import API, Server, run_tests
from runner_helpers import FakeMeter, make_bare_repo, run_runner, runner_env
from sandbox_helpers import git
from test_local_pr import Clean, wait
from test_runs_wip import ENV, PROVIDER, get_task, make_repo, refs

LONG_AGENT = """i=0
while [ $i -lt 60 ]; do
  i=$((i + 1))
  echo "step $i" >>work.txt
  printf '{"model":"m","tokensUsed":10,"costUSD":0.001}\\n' >>"$DIVERGE_USAGE_FILE"
  sleep 1
done
echo agent finished
"""


def test_runner_stops_a_long_iteration_at_the_budget():
    tmp = tempfile.mkdtemp(prefix="diverge-live-")
    try:
        repo = make_bare_repo(tmp)
        agent = os.path.join(tmp, "agent.sh")
        with open(agent, "w") as f:
            f.write(LONG_AGENT + "touch %s/child-survived &\n" % tmp)
        sock = os.path.join(tmp, "meter.sock")
        seen = []

        def answer(body, headers):
            if "-u" in body["requestId"]:
                seen.append(body["requestId"])
            if len(seen) >= 4:
                return 429, {"allowed": False, "reason": "budget exceeded"}
            return 200, {"allowed": True}

        meter = FakeMeter(sock, answer)
        env = runner_env(tmp, "live", repo, DIVERGE_METER_SOCKET=sock,
                         DIVERGE_MACAROON_TOKEN="t", DIVERGE_MAX_ITERATIONS="1",
                         DIVERGE_AGENT_CMD="sh " + agent)
        r = run_runner(env)
        meter.close()
        assert r.returncode == 0, (r.stdout, r.stderr)
        assert "the agent was stopped (the meter paused the task)" in r.stdout, r.stdout
        assert "agent finished" not in r.stdout, r.stdout
        with open(env["DIVERGE_USAGE_FILE"]) as f:
            lines = f.read().splitlines()
        assert 4 <= len(lines) < 60, lines  # stopped before the iteration's end
        assert len(seen) == 4, seen
        assert not os.path.exists(os.path.join(tmp, "child-survived"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_a_usage_line_is_charged_when_written_and_before_verify():
    """With a follow period of 60 s, the second line is charged while the agent still runs
    (a write to the usage file wakes the follow), and the last line, written just before
    the agent exits, is charged before the verify command runs."""
    tmp = tempfile.mkdtemp(prefix="diverge-live-")
    try:
        repo = make_bare_repo(tmp)
        charged = os.path.join(tmp, "charged")
        os.mkdir(charged)
        line = '{"model":"m","tokensUsed":1,"costUSD":0.000001}'
        agent = os.path.join(tmp, "agent.sh")
        with open(agent, "w") as f:
            # Each line waits (up to 60 s) until the meter saw the one before: the first
            # is charged by the first follow read, the second only by a write waking it.
            f.write("""set -e
wait_for() { i=0; while [ ! -e "%(d)s/$1" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; }
echo '%(l)s' >>"$DIVERGE_USAGE_FILE"; wait_for 1
echo '%(l)s' >>"$DIVERGE_USAGE_FILE"; wait_for 2
[ -e "%(d)s/2" ] || { echo "line 2 not charged while the agent ran"; exit 3; }
echo '%(l)s' >>"$DIVERGE_USAGE_FILE"
""" % {"d": charged, "l": line})
        sock = os.path.join(tmp, "meter.sock")
        seen = []

        def answer(body, headers):
            if "-u" in body["requestId"]:
                seen.append((body["requestId"], body.get("iteration")))
                open(os.path.join(charged, str(len(seen))), "w").close()
            return 200, {"allowed": True}

        meter = FakeMeter(sock, answer)
        env = runner_env(tmp, "prompt", repo, DIVERGE_METER_SOCKET=sock,
                         DIVERGE_MACAROON_TOKEN="t", DIVERGE_MAX_ITERATIONS="1",
                         DIVERGE_USAGE_FOLLOW_MS="60000", DIVERGE_AGENT_CMD="sh " + agent,
                         DIVERGE_VERIFY_CMD="test -e %s/3" % charged)
        r = run_runner(env)
        meter.close()
        assert "line 2 not charged" not in r.stdout, r.stdout
        assert "verify exit 0" in r.stdout, (r.stdout, meter.ids(), os.listdir(charged))
        assert r.returncode == 0, (r.stdout, r.stderr)
        assert [it for _, it in seen] == [1, 1, 1], seen  # charged in their iteration
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


YAML = """version: "1"
agent:
  command: sh .diverge/long.sh
  verifyCommand: "true"
  budgetUSD: "0.0035"
  maxIterations: 3
"""


def test_budget_pauses_mid_iteration_and_pushes_the_checkpoint():
    top = tempfile.mkdtemp(prefix="diverge-livesrv-")
    bare = make_repo(top, YAML)
    # The long agent goes into the base branch next to the others.
    src = os.path.join(top, "src")
    git("checkout", "-q", "main", cwd=src)
    with open(os.path.join(src, ".diverge", "long.sh"), "w") as f:
        f.write(LONG_AGENT)
    git("add", "-A", cwd=src)
    git("commit", "-q", "-m", "long agent", cwd=src)
    git("checkout", "-q", "feature", cwd=src)
    git("merge", "-q", "main", cwd=src)
    git("push", "-q", bare, "main", "feature", cwd=src)
    with Server(["--sandbox-provider", PROVIDER], env=ENV) as srv, Clean(srv):
        r = srv.cli("local", "pr", "open", "acme/live#6", "--repo", "file://" + bare,
                    "--head", "feature")
        assert r.returncode == 0, r
        r = srv.cli("local", "comment", "acme/live#6", "/diverge fix it", "--as", "alice")
        assert r.returncode == 0, r
        # Spend shows while the first iteration still runs.
        t = wait(lambda: (lambda t: t if t and t["status"]["phase"] == "Active" and
                          t["status"]["tokensConsumed"] >= 20 else None)(
            get_task(srv, "acme-live", "fix-pr-6")), what="live spend")
        assert t["status"]["iteration"] == 1, t["status"]
        t = wait(lambda: (lambda t: t if t and t["status"]["phase"] == "Paused" else None)(
            get_task(srv, "acme-live", "fix-pr-6")), what="paused")
        assert t["status"]["reason"] == "BudgetExceeded", t["status"]
        log = wait(lambda: (lambda l: l if "pushed the last checkpoint" in l else None)(
            srv.cli("task", "logs", "fix-pr-6", "-n", "acme-live").stdout), what="wip pushed")
        assert "agent finished" not in log, log
        assert "iteration 2/" not in log, log
        text = git("--git-dir", bare, "show", "refs/heads/diverge/wip/fix-pr-6:work.txt")
        assert text.startswith("step 1\n") and "step 60" not in text, text
        assert "diverge/wip/fix-pr-6" in refs(bare)
        t = wait(lambda: (lambda t: t if t["metadata"]["annotations"].get(
            "divergedev.com/wip-branch") else None)(get_task(srv, "acme-live", "fix-pr-6")),
            what="wip annotation")
        assert t["metadata"]["annotations"]["divergedev.com/wip-branch"] == \
            "diverge/wip/fix-pr-6", t["metadata"]
    shutil.rmtree(top, ignore_errors=True)


if __name__ == "__main__":
    run_tests([test_runner_stops_a_long_iteration_at_the_budget,
               test_a_usage_line_is_charged_when_written_and_before_verify,
               test_budget_pauses_mid_iteration_and_pushes_the_checkpoint])
