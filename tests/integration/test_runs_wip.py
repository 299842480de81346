# SPDX-License-Identifier: Apache-2.0
"""Work is never thrown away (SPEC §14 "Work in progress"), with the real runner:

- the runner checkpoints the workspace after every iteration on
  refs/heads/diverge/wip/<task> of the staging repository, and a runner starting on a
  fresh clone continues from that checkpoint;
- a run that fails (every iteration failed verify) has its checkpoint pushed to the
  remote as diverge/wip/<task> (working and base branches untouched), recorded in the
  annotation divergedev.com/wip-branch and status.lastFailure, and the sticky comment of
  the local PR links it with the failure's last lines; --push-wip=false keeps it local;
- past 80 % of sandbox.timeoutSeconds the agent's guidance says how long is left, and the
  timed-out task's checkpoint is pushed;
- the next run of a failed task (`diverge task rerun`) starts from its checkpoint: its
  agent sees the work of the failed run, and the passing run's push lands on the working
  branch without the checkpoint's history (with --push-wip=false too: staging alone)."""
import os
import shutil
import subprocess
import tempfile

from harness import API, Server, run_tests
from runner_helpers import FakeMeter, make_bare_repo, run_runner, runner_env
from sandbox_helpers import git
from test_local_pr import Clean, sanitized, thread, wait
from test_sandbox_local import usable

PROVIDER = "local" if usable() is None and not sanitized() else "process"
ENV = {"GITHUB_TOKEN": None, "DIVERGE_NOTIFIER_TOKEN": None, "DIVERGE_AGENT_CMD": None,
       "DIVERGE_VERIFY_CMD": None, "DIVERGE_DATA_DIR": None}
MARKER = "<!-- diverge-agent-task -->"

AGENT = """set -eu
echo "partial work $DIVERGE_ITERATION" >>work.txt
if [ -n "${DIVERGE_GUIDANCE:-}" ]; then echo "agent heard: $DIVERGE_GUIDANCE"; fi
printf '{"model":"m","tokensUsed":10,"costUSD":0.001}\\n' >>"$DIVERGE_USAGE_FILE"
sleep "${AGENT_SLEEP:-0}"
"""
VERIFY = """echo "expected: Hello, world!"
echo "got: Hello, World! ${VERIFY_SUFFIX:-}"
exit 1
"""


def make_repo(top, agent_yaml, agent=AGENT):
    """TOP/origin.git: main holds the agent, the failing check and AGENT_YAML; branch
    `feature` one more commit (the PR head)."""
    src = os.path.join(top, "src")
    os.makedirs(os.path.join(src, ".diverge"))
    for name, text in ((".diverge/agent.sh", agent), ("check.sh", VERIFY),
                       (".diverge/agent.yaml", agent_yaml), ("README", "hello\n")):
        with open(os.path.join(src, name), "w") as f:
            f.write(text)
    git("init", "-q", "-b", "main", cwd=src)
    git("add", "-A", cwd=src)
    git("commit", "-q", "-m", "base", cwd=src)
    git("checkout", "-q", "-b", "feature", cwd=src)
    git("commit", "-q", "--allow-empty", "-m", "pr work", cwd=src)
    bare = os.path.join(top, "origin.git")
    git("init", "-q", "--bare", "-b", "main", bare)
    git("push", "-q", bare, "main", "feature", cwd=src)
    os.chmod(top, 0o755)
    return bare


YAML = """version: "1"
agent:
  command: sh .diverge/agent.sh
  verifyCommand: sh check.sh
  budgetUSD: "2.00"
  maxIterations: 2
"""


def get_task(srv, ns, name):
    st, _, body = srv.request("GET", API + "/namespaces/%s/agenttasks/%s" % (ns, name))
    return body if st == 200 else None


def refs(bare):
    return git("--git-dir", bare, "for-each-ref", "--format=%(refname) %(objectname)")


def failed_pr_run(serve_args, agent_yaml=YAML, agent=AGENT):
    """Opens a local PR whose task fails verify twice; returns (srv, bare, task, top)."""
    top = tempfile.mkdtemp(prefix="diverge-wip-")
    bare = make_repo(top, agent_yaml, agent)
    srv = Server(["--sandbox-provider", PROVIDER, "--notifier-min-interval", "1"] + serve_args,
                 env=ENV)
    srv.__enter__()
    r = srv.cli("local", "pr", "open", "acme/wip#3", "--repo", "file://" + bare, "--head",
                "feature")
    assert r.returncode == 0, r
    r = srv.cli("local", "comment", "acme/wip#3", "/diverge fix the greeting", "--as", "alice")
    assert r.returncode == 0, r
    t = wait(lambda: (lambda t: t if t and t["status"]["phase"] == "Failed" else None)(
        get_task(srv, "acme-wip", "fix-pr-3")), what="task failed")
    return srv, bare, t, top


def test_failed_run_pushes_its_checkpoint_and_the_sticky_links_it():
    srv, bare, t, top = failed_pr_run([])
    with Clean(srv):
        before = refs(bare)
        assert t["status"]["reason"] == "RunnerFailed", t["status"]
        wip = "diverge/wip/fix-pr-3"
        # The checkpoint holds the work of both iterations; nothing else moved.
        text = git("--git-dir", bare, "show", "refs/heads/%s:work.txt" % wip)
        assert text == "partial work 1\npartial work 2\n", text
        assert "refs/heads/feature" in before and "refs/heads/main" in before
        subject = git("--git-dir", bare, "log", "-1", "--format=%s", "feature").strip()
        assert subject == "pr work", subject
        ann = t["metadata"]["annotations"]
        assert ann.get("divergedev.com/wip-branch") == wip, ann
        last = t["status"]["lastFailure"]
        assert "the verify command failed (exit 1)" in last, last
        assert "got: Hello, World!" in last, last
        r = srv.cli("task", "logs", "fix-pr-3", "-n", "acme-wip")
        assert "checkpoint %s: saved" % wip in r.stdout, r.stdout
        assert "[diverge] pushed the last checkpoint to refs/heads/" + wip in r.stdout, r.stdout
        out = wait(lambda: (lambda o: o if "Work in progress" in o else None)(
            thread(srv, "acme/wip#3")), what="sticky links the checkpoint")
        assert wip in out and "got: Hello, World!" in out, out
    shutil.rmtree(top, ignore_errors=True)


def test_push_wip_false_keeps_the_checkpoint_in_staging():
    srv, bare, t, top = failed_pr_run(["--push-wip=false"])
    with Clean(srv):
        assert "diverge/wip" not in refs(bare), refs(bare)
        assert "divergedev.com/wip-branch" not in t["metadata"].get("annotations", {}), t
        staging = os.path.join(srv.data_dir, "staging", "acme-wip", "fix-pr-3.git")
        assert "refs/heads/diverge/wip/fix-pr-3" in refs(staging), refs(staging)
    shutil.rmtree(top, ignore_errors=True)


# One iteration per run; verify passes once work.txt holds the work of two iterations,
# which only a run that starts from the failed run's checkpoint can have.
RERUN_YAML = """version: "1"
agent:
  command: sh .diverge/agent.sh
  verifyCommand: 'test "$(grep -c partial work.txt)" -ge 2'
  budgetUSD: "2.00"
  maxIterations: 1
"""
RERUN_AGENT = """set -eu
if [ -f work.txt ]; then echo "agent saw: $(cat work.txt)"; fi
echo "partial work $DIVERGE_ITERATION" >>work.txt
printf '{"model":"m","tokensUsed":10,"costUSD":0.001}\\n' >>"$DIVERGE_USAGE_FILE"
"""


def rerun_from_checkpoint(serve_args):
    srv, bare, t, top = failed_pr_run(serve_args, RERUN_YAML, RERUN_AGENT)
    wip = "diverge/wip/fix-pr-3"
    with Clean(srv):
        assert t["status"]["reason"] == "RunnerFailed", t["status"]
        head = git("--git-dir", bare, "rev-parse", "feature").strip()
        staging = os.path.join(srv.data_dir, "staging", "acme-wip", "fix-pr-3.git")
        checkpoint = git("--git-dir", staging, "rev-parse", "refs/heads/" + wip).strip()
        r = srv.cli("task", "rerun", "fix-pr-3", "-n", "acme-wip")
        assert r.returncode == 0 and "run 2 started" in r.stdout, r
        t = wait(lambda: (lambda t: t if t and t["status"].get("run") == 2 and t["status"][
            "phase"] in ("Completed", "Failed") else None)(get_task(srv, "acme-wip", "fix-pr-3")),
            what="run 2 finished")
        log = srv.cli("task", "logs", "fix-pr-3", "-n", "acme-wip").stdout
        assert t["status"]["phase"] == "Completed", (t["status"], log)
        assert "run 2 starts from the checkpoint %s of the previous run" % wip in log, log
        assert "continuing from the checkpoint %s of an earlier run" % wip in log, log
        # The agent of run 2 saw the work of run 1 ...
        assert "agent saw: partial work 1" in log, log
        # ... and the push of run 2 lands on the working branch: one commit on the PR
        # head with both runs' work, none of the checkpoint's commits in its history.
        assert git("--git-dir", bare, "show", "feature:work.txt") == \
            "partial work 1\npartial work 1\n"
        assert git("--git-dir", bare, "rev-parse", "feature~1").strip() == head
        assert git("--git-dir", bare, "log", "-1", "--format=%s", "feature").startswith(
            "fix(fix-pr-3): ")
        known = subprocess.run(["git", "--git-dir", bare, "cat-file", "-e", checkpoint])
        if known.returncode == 0:  # pushed as diverge/wip/<task>: still not in feature
            anc = subprocess.run(["git", "--git-dir", bare, "merge-base", "--is-ancestor",
                                  checkpoint, "feature"])
            assert anc.returncode == 1, anc
        remote = refs(bare)
        assert "refs/heads/main" in remote, remote
    shutil.rmtree(top, ignore_errors=True)
    return remote


def test_rerun_starts_from_the_failed_runs_checkpoint():
    remote = rerun_from_checkpoint([])
    assert "refs/heads/diverge/wip/fix-pr-3" in remote, remote


def test_rerun_starts_from_the_checkpoint_kept_in_staging_only():
    remote = rerun_from_checkpoint(["--push-wip=false"])
    assert "diverge/wip" not in remote, remote


def test_timeout_tells_the_agent_then_pushes_the_checkpoint():
    top = tempfile.mkdtemp(prefix="diverge-wipto-")
    bare = make_repo(top, YAML)
    with Server(["--sandbox-provider", PROVIDER], env=ENV) as srv, Clean(srv):
        body = {"apiVersion": "divergedev.com/v1alpha1", "kind": "AgentTask",
                "metadata": {"name": "slow", "namespace": "default"},
                "spec": {"objective": "x", "maxIterations": 1000,
                         "repository": {"url": "file://" + bare},
                         "runner": {"command": "AGENT_SLEEP=0.5 sh .diverge/agent.sh",
                                    "verifyCommand": "VERIFY_SUFFIX=$(date +%s%N) sh check.sh"},
                         "sandbox": {"timeoutSeconds": 15}}}
        st, _, b = srv.request("POST", API + "/namespaces/default/agenttasks", body)
        assert st == 201, (st, b)
        t = wait(lambda: (lambda t: t if t and t["status"]["phase"] == "Failed" else None)(
            get_task(srv, "default", "slow")), timeout=90, what="timeout")
        assert t["status"]["reason"] == "Timeout", t["status"]
        log = srv.cli("task", "logs", "slow").stdout
        assert "agent heard: 1 minute left: commit what works." in log, log
        assert "diverge/wip/slow" in refs(bare), (refs(bare), log)
        text = git("--git-dir", bare, "show", "refs/heads/diverge/wip/slow:work.txt")
        assert text.startswith("partial work 1\n"), text
    shutil.rmtree(top, ignore_errors=True)


def runner_with_staging(tmp, task, **extra):
    """The runner's environment for TASK in TMP: a fresh repository, TMP/staging.git as
    DIVERGE_PUSH_URL and a fake meter (close it). Returns (env, staging, meter)."""
    repo = make_bare_repo(tmp)
    staging = os.path.join(tmp, "staging.git")
    git("init", "-q", "--bare", staging)
    sock = os.path.join(tmp, "meter.sock")
    meter = FakeMeter(sock)
    env = runner_env(tmp, task, repo, DIVERGE_METER_SOCKET=sock, DIVERGE_MACAROON_TOKEN="t",
                     DIVERGE_PUSH_URL="file://" + staging, **extra)
    return env, staging, meter


def test_runner_continues_from_the_checkpoint_on_a_fresh_clone():
    tmp = tempfile.mkdtemp(prefix="diverge-wiprun-")
    try:
        agent = "echo more >>work.txt; cat work.txt"
        env, staging, meter = runner_with_staging(tmp, "cp", DIVERGE_MAX_ITERATIONS="2",
                                                  DIVERGE_AGENT_CMD=agent,
                                                  DIVERGE_VERIFY_CMD="exit 1")
        r = run_runner(env)
        assert r.returncode == 1, (r.stdout, r.stderr)
        assert "checkpoint diverge/wip/cp: saved" in r.stdout, r.stdout
        wip = "refs/heads/diverge/wip/cp"
        assert git("--git-dir", staging, "show", wip + ":work.txt") == "more\nmore\n"
        # The agent's own branch and index are untouched by a checkpoint.
        ws = env["DIVERGE_WORKSPACE_DIR"]
        assert "work.txt" in git("status", "--porcelain", cwd=ws)
        first = git("--git-dir", staging, "rev-parse", wip).strip()
        # A fresh clone (the workspace is gone) starts from the checkpoint; the next
        # checkpoint follows the first one (a fast-forward).
        shutil.rmtree(ws)
        os.unlink(os.path.join(tmp, "usage.jsonl.offset")) if os.path.exists(
            os.path.join(tmp, "usage.jsonl.offset")) else None
        env["DIVERGE_VERIFY_CMD"] = "grep -c more work.txt | grep -qx 3"
        env["DIVERGE_MAX_ITERATIONS"] = "1"
        r = run_runner(env)
        assert r.returncode == 0, (r.stdout, r.stderr)
        assert "continuing from the checkpoint diverge/wip/cp" in r.stdout, r.stdout
        second = git("--git-dir", staging, "rev-parse", wip).strip()
        assert second != first
        subprocess.run(["git", "--git-dir", staging, "merge-base", "--is-ancestor", first,
                        second], check=True)
        assert git("--git-dir", staging, "show", "refs/heads/agent/cp:work.txt") == \
            "more\nmore\nmore\n"
        meter.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_a_checkpoint_whose_push_failed_is_pushed_again_when_nothing_changed():
    tmp = tempfile.mkdtemp(prefix="diverge-wipretry-")
    try:
        # Iteration 1 changes a file and takes the staging repository away (its checkpoint
        # push fails); iteration 2 changes nothing and puts it back.
        agent = ('if [ "$DIVERGE_ITERATION" = 1 ]; then echo one >work.txt; '
                 'mv "$STAGING" "$STAGING.off"; else mv "$STAGING.off" "$STAGING"; fi')
        env, staging, meter = runner_with_staging(tmp, "rt", DIVERGE_MAX_ITERATIONS="2",
                                                  DIVERGE_AGENT_CMD=agent,
                                                  DIVERGE_VERIFY_CMD="exit 1")
        env["STAGING"] = staging
        r = run_runner(env)
        assert r.returncode == 1, (r.stdout, r.stderr)
        assert "checkpoint failed" in r.stdout, r.stdout
        assert "nothing changed since the last one, which is pushed now" in r.stdout, r.stdout
        assert git("--git-dir", staging, "show",
                   "refs/heads/diverge/wip/rt:work.txt") == "one\n"
        meter.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


AGENT_MOVES = """w=$(git rev-parse -q --verify refs/diverge/wip || echo none); echo "$w" >>%(log)s
case $DIVERGE_ITERATION in
1) echo a >a.txt ;;
3) git add -A && git -c user.name=a -c user.email=a@example.invalid commit -qm mine ;;
5) git update-ref -d refs/diverge/wip ;;
6) echo b >a.txt ;;
7) git update-ref refs/diverge/wip "$(sed -n 2p %(log)s)" ;;
esac
"""


def test_checkpoint_follows_what_moved_between_iterations():
    """Each checkpoint compares with what HEAD and refs/diverge/wip hold when it runs, not
    with what the runner remembers: an agent's commit, a deleted or moved checkpoint ref."""
    tmp = tempfile.mkdtemp(prefix="diverge-wipmove-")
    try:
        log = os.path.join(tmp, "wips")
        with open(os.path.join(tmp, "agent.sh"), "w") as f:
            f.write(AGENT_MOVES % {"log": log})
        env, staging, meter = runner_with_staging(
            tmp, "mv", DIVERGE_MAX_ITERATIONS="7", DIVERGE_VERIFY_CMD="exit 1",
            DIVERGE_AGENT_CMD="sh " + os.path.join(tmp, "agent.sh"))
        r = run_runner(env)
        meter.close()
        assert r.returncode == 1, (r.stdout, r.stderr)
        said = [ln.split(": ", 2)[2] for ln in r.stdout.splitlines() if ": checkpoint " in ln]
        same, saved = "nothing changed since the last one", "saved"
        assert said == [saved, same, saved, same, saved, saved, saved], r.stdout
        ws = env["DIVERGE_WORKSPACE_DIR"]
        with open(log) as f:
            w = f.read().split()  # the checkpoint ref before each iteration
        head = git("rev-parse", "HEAD", cwd=ws).strip()
        base = git("rev-parse", "HEAD~1", cwd=ws).strip()

        def parents(c):
            return git("rev-parse", c + "^@", cwd=ws).split()
        assert w[0] == "none" and w[1] == w[2] and w[3] == w[4], w
        assert parents(w[1]) == [base]          # iteration 1: after HEAD
        assert parents(w[3]) == [w[1], head]    # the agent's commit joins in
        assert parents(w[5]) == [head]          # the ref deleted: starts again after HEAD
        assert parents(w[6]) == [w[5]]          # HEAD already in: follows the last one
        last = git("rev-parse", "refs/diverge/wip", cwd=ws).strip()
        assert parents(last) == [w[1], head]    # the ref moved back by the agent
        assert git("--git-dir", staging, "rev-parse", "refs/heads/diverge/wip/mv").strip() == last
        assert git("--git-dir", staging, "show", last + ":a.txt") == "b\n"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# A checkpoint that finds the workspace as the last one left it runs no git process; any
# change it must see (a same-size rewrite, a new directory, the excludes) is still
# saved. A change stamped as late as the checkpoint's own stamp is not trusted (it could
# change again within the same time stamp), so the agent waits longer than a whole-second
# stamp before the checkpoints whose successor must run no git (after iterations 3 and 8).
AGENT_AGES = """echo "agent $DIVERGE_ITERATION" >>%(calls)s
case $DIVERGE_ITERATION in
1) echo a >a.txt ;;
2|6) sleep 1.1 ;;
4) echo b >a.txt ;;
5) mkdir -p d/e && : >d/e/new ;;
7) echo a.txt >>.git/info/exclude; sleep 1.1 ;;
esac
"""


def test_an_unchanged_checkpoint_runs_no_git_and_every_change_is_saved():
    tmp = tempfile.mkdtemp(prefix="diverge-wipstat-")
    try:
        calls, bindir = os.path.join(tmp, "calls"), os.path.join(tmp, "bin")
        os.mkdir(bindir)
        with open(os.path.join(bindir, "git"), "w") as f:  # logs every git the runner runs
            f.write('#!/bin/sh\necho "git $*" >>%s\nexec %s "$@"\n' % (
                calls, shutil.which("git")))
        os.chmod(os.path.join(bindir, "git"), 0o755)
        with open(os.path.join(tmp, "agent.sh"), "w") as f:
            f.write(AGENT_AGES % {"calls": calls})
        home = os.path.join(tmp, "home")  # no user git config of the machine's
        os.mkdir(home)
        env, staging, meter = runner_with_staging(
            tmp, "st", DIVERGE_MAX_ITERATIONS="8", DIVERGE_VERIFY_CMD="exit 1",
            DIVERGE_AGENT_CMD="sh " + os.path.join(tmp, "agent.sh"), HOME=home,
            XDG_CONFIG_HOME=None, GIT_CONFIG_GLOBAL=None,
            PATH=bindir + os.pathsep + os.environ["PATH"])
        r = run_runner(env)
        meter.close()
        assert r.returncode == 1, (r.stdout, r.stderr)
        said = [ln.split(": ", 2)[2] for ln in r.stdout.splitlines() if ": checkpoint " in ln]
        same, saved = "nothing changed since the last one", "saved"
        assert said == [saved, same, same, saved, saved, same, saved, same], r.stdout
        with open(calls) as f:
            log = f.read().split("agent ")
        after = {int(part.split("\n", 1)[0]): part.split("\n", 1)[1] for part in log[1:]}
        assert after[3] == "" and after[8] == "", log  # no git process at all
        assert all("write-tree" in after[i] for i in (4, 5, 7)), log  # changed: git asked
        wip = "refs/heads/diverge/wip/st"
        show = lambda rev: git("--git-dir", staging, "show", rev)  # noqa: E731
        assert show(wip + "~3:a.txt") == "a\n"   # iteration 1
        assert show(wip + "~2:a.txt") == "b\n"   # 4: the same size, rewritten
        assert show(wip + "~1:d/e/new") == ""     # 5: a new directory
        names = git("--git-dir", staging, "ls-tree", "-r", "--name-only", wip)
        assert "a.txt" not in names.split() and "d/e/new" in names, names  # 7: excluded
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

if __name__ == "__main__":
    run_tests([test_runner_continues_from_the_checkpoint_on_a_fresh_clone,
               test_an_unchanged_checkpoint_runs_no_git_and_every_change_is_saved,
               test_checkpoint_follows_what_moved_between_iterations,
               test_failed_run_pushes_its_checkpoint_and_the_sticky_links_it,
               test_push_wip_false_keeps_the_checkpoint_in_staging,
               test_rerun_starts_from_the_failed_runs_checkpoint,
               test_rerun_starts_from_the_checkpoint_kept_in_staging_only,
               test_timeout_tells_the_agent_then_pushes_the_checkpoint,
               test_a_checkpoint_whose_push_failed_is_pushed_again_when_nothing_changed])
