# SPDX-License-Identifier: Apache-2.0
"""Warm slots of the local provider (--sandbox-warm-slots, default 2), with real bubblewrap
and the real diverge-agent-runner. After a first task of a repository, a sandbox is
started ahead for it (bound to folders of its own and that repository's mirror; its runner
waits at its gate knowing no task). The next new task of that repository takes it: the
slot's folders become the task's (the same inodes, which the sandbox's binds follow), its
runner gets the task's environment through the gate and runs the task as any other. The
task sees only its own workspace, token and state; a slot of one repository is never
taken by a task of another; at most two slots exist however many tasks come; nothing of a
slot is left after its task is deleted, after the server stops, or after it was killed.
Skipped with a message when bubblewrap or user namespaces are missing."""
import glob
import os
import re
import shutil
import sys
import time

from harness import API, Server, run_tests
from sandbox_helpers import (bare_repo, create, git, task, task_log, wait_log, wait_phase,
                             wait_until)
from test_sandbox_local import usable

# What the agent sees: its environment, its workspace, state and token folders.
AGENT = ('echo "env: task=$DIVERGE_TASK_NAME token=$DIVERGE_TOKEN_FILE '
         'ws=$DIVERGE_WORKSPACE_DIR slotflag=${DIVERGE_START_GATE_ENV:-unset}"; '
         'echo "ws: $(ls -A /workspace | tr "\\n" " ")"; '
         'echo "state: $(ls -A /diverge/state | tr "\\n" " ")"; '
         'echo "tokens: $(ls -A /etc/diverge/token | tr "\\n" " ")"; '
         'echo "mine: $(cat /etc/diverge/token/token | wc -c)"; '
         'echo "$DIVERGE_TASK_NAME" > "$DIVERGE_TASK_NAME.txt"; '
         'echo "$DIVERGE_TASK_NAME" > "/diverge/state/$DIVERGE_TASK_NAME.mark"')
CLAIMED = "taken from the warm slot of this repository"


def slots(srv):
    """The slots not taken yet: {id: workspace inode} from their folders."""
    out = {}
    for d in glob.glob(os.path.join(srv.data_dir, "slots", "s*")):
        if os.path.isdir(d):
            try:
                out[os.path.basename(d)] = os.stat(os.path.join(d, "workspace")).st_ino
            except OSError:
                pass
    return out


def slot_records(srv):
    return glob.glob(os.path.join(srv.data_dir, "run", "_slot.*"))


def subtree(log):
    """This server's cgroup subtree id (from a task's log line), or None without cgroups."""
    m = re.search(r"cgroup v[12] \S*/diverge/([0-9a-f]{16})/", log)
    return m.group(1) if m else None


def slot_cgroups(tree):
    """The cgroup folders of this server's slot sandboxes (claimed or not: a claimed one
    keeps its cgroups until its task's sandbox stops)."""
    if tree is None:
        return []
    return (glob.glob("/sys/fs/cgroup/*/diverge/%s/_slot.*" % tree) +
            glob.glob("/sys/fs/cgroup/diverge/%s/_slot.*" % tree))


def slot_procs(tree):
    """Live processes in this server's slot cgroups."""
    out = set()
    for d in slot_cgroups(tree):
        try:
            with open(os.path.join(d, "cgroup.procs")) as f:
                out.update(int(x) for x in f.read().split())
        except OSError:
            pass
    return sorted(p for p in out if os.path.exists("/proc/%d" % p))


def line(log, prefix):
    found = [l.split(prefix, 1)[1] for l in log.splitlines() if prefix in l]
    assert found, (prefix, log)
    return found[0]


def repo_url():
    repo = bare_repo()
    os.chmod(os.path.dirname(repo), 0o755)
    return "file://" + repo, os.path.dirname(repo)


def run_task(srv, name, url):
    create(srv, task(name, url, maxIterations=1))
    wait_log(srv, name, "mine:", timeout=60)
    wait_phase(srv, name, ("Completed", "Failed"), timeout=60)
    return task_log(srv, name)


def test_claimed_slot_runs_the_task_on_its_own_files_only():
    url, top = repo_url()
    with Server(args=["--sandbox-provider", "local", "--sandbox-warm-slots", "2", "--agent-cmd", AGENT]) as srv:
        log = run_task(srv, "first", url)
        assert CLAIMED not in log, log  # no mirror before it: no slot
        made = wait_until(lambda: slots(srv), timeout=30, what="a warm slot")
        (sid, ino), = made.items()
        assert len(slot_records(srv)) == 1
        log = run_task(srv, "second", url)
        assert CLAIMED in log, log
        # The task's log says where it runs: the slot's cgroups, under the same limits.
        assert "sandbox local (bubblewrap) as uid" in log, log
        assert subtree(log) is None or "/_slot.%s: memory limited" % sid in log, log
        env = line(log, "env: ")
        assert "task=second " in env and "token=/etc/diverge/token/token " in env, env
        assert "ws=/workspace " in env and "slotflag=unset" in env, env
        # Only its own files: the repository's, its state, its token.
        ws = line(log, "ws: ").split()
        assert "README" in ws and "first.txt" not in ws, ws
        assert "first.mark" not in line(log, "state: ").split(), log
        assert line(log, "tokens: ").split() == ["token"], log
        # The slot's folder is the task's now (the inode the sandbox's bind follows): what
        # the agent wrote inside is there.
        mine = os.path.join(srv.data_dir, "workspaces", "default", "second")
        assert os.stat(mine).st_ino == ino
        with open(os.path.join(mine, "second.txt")) as f:
            assert f.read() == "second\n"
        state = os.path.join(srv.data_dir, "state", "default", "second", "second.mark")
        assert os.path.exists(state)
        assert sid not in slots(srv), "a taken slot's folder stays"
        assert not os.path.exists(os.path.join(srv.data_dir, "slots", sid + ".log"))
        # Deleted: its folders go as any task's, and a new slot comes for the repository.
        st, _, body = srv.request("DELETE", API + "/namespaces/default/agenttasks/second")
        assert st in (200, 202), (st, body)
        wait_until(lambda: not os.path.exists(mine), timeout=30, what="the task's folders")
        wait_until(lambda: slots(srv), timeout=30, what="a new warm slot")
    shutil.rmtree(top, ignore_errors=True)


def test_slot_serves_its_repository_only_and_the_bound_holds():
    urls = [repo_url() for _ in range(4)]
    with Server(args=["--sandbox-provider", "local", "--sandbox-warm-slots", "2", "--agent-cmd", AGENT]) as srv:
        run_task(srv, "a1", urls[0][0])
        ino_a = list(wait_until(lambda: slots(srv), timeout=30, what="A's slot").values())[0]
        # A task of B does not take A's slot.
        log = run_task(srv, "b1", urls[1][0])
        assert CLAIMED not in log, log
        assert ino_a in slots(srv).values()
        assert os.stat(os.path.join(srv.data_dir, "workspaces", "default", "b1")).st_ino != ino_a
        wait_until(lambda: len(slots(srv)) == 2, timeout=30, what="B's slot")
        # Many tasks of many repositories: never more than two slots.
        most = 0
        names = []
        for k in range(3):
            for i, (url, _) in enumerate(urls):
                name = "m%d-%d" % (k, i)
                names.append(name)
                create(srv, task(name, url, maxIterations=1))
                most = max(most, len(slots(srv)), len(slot_records(srv)))
        pending = list(names)
        while pending:
            most = max(most, len(slots(srv)), len(slot_records(srv)))
            st, _, body = srv.request("GET", API + "/namespaces/default/agenttasks/" + pending[0])
            if st == 200 and body["status"].get("phase") in ("Completed", "Failed"):
                pending.pop(0)
            time.sleep(0.01)
        for name in names:
            log = task_log(srv, name)
            assert "mine:" in log, log
            assert "task=%s " % name in line(log, "env: "), log
        assert most <= 2, most
    for _, top in urls:
        shutil.rmtree(top, ignore_errors=True)


def test_comments_without_permission_make_no_slot():
    url, top = repo_url()
    git("--git-dir", url[len("file://"):], "branch", "feature", "main")
    with Server(args=["--sandbox-provider", "local", "--sandbox-warm-slots", "2", "--agent-cmd", AGENT]) as srv:
        r = srv.cli("local", "pr", "open", "acme/r0#1", "--repo", url, "--head", "feature")
        assert r.returncode == 0, r
        for i in range(20):
            st, _, body = srv.request("POST", "/api/v1/local/comments", {
                "project": "acme/r0", "number": 1, "body": "/diverge fix it %d" % i,
                "author": "mallory", "permission": "read"})
            assert st in (200, 202), (st, body)
        r = srv.cli("local", "comment", "acme/r0#1", "/diverge fix it", "--as", "alice")
        assert r.returncode == 0, r
        # The bot takes comments in order: by the time alice's task is there, mallory's
        # twenty were refused, and made neither a task nor a slot.
        wait_until(lambda: srv.request("GET", API + "/namespaces/acme-r0/agenttasks/fix-pr-1")[0]
                   == 200, timeout=60, what="alice's task")
        st, _, body = srv.request("GET", API + "/namespaces/acme-r0/agenttasks")
        assert st == 200 and len(body["items"]) == 1, body
        assert not slots(srv) and not slot_records(srv)
        wait_until(lambda: "mine:" in task_log(srv, "fix-pr-1", ns="acme-r0"), timeout=60,
                   what="alice's agent")
        assert "task=fix-pr-1 " in line(task_log(srv, "fix-pr-1", ns="acme-r0"), "env: ")
        assert len(wait_until(lambda: slots(srv), timeout=30, what="the repository's slot")) == 1
    shutil.rmtree(top, ignore_errors=True)


def test_slot_of_a_replaced_mirror_is_not_taken():
    """A slot binds its repository's mirror at its start: when the mirror folder is another
    one by the next start (cloned again, here copied and put in its place), the slot is
    stopped, not taken; the task starts a sandbox of its own on the mirror as it is now."""
    url, top = repo_url()
    with Server(args=["--sandbox-provider", "local", "--sandbox-warm-slots", "2", "--agent-cmd", AGENT]) as srv:
        tree = subtree(run_task(srv, "first", url))
        (sid, _), = wait_until(lambda: slots(srv), timeout=30, what="a warm slot").items()
        mirror, = glob.glob(os.path.join(srv.data_dir, "mirrors", "*.git"))
        old_ino = os.stat(mirror).st_ino
        shutil.copytree(mirror, mirror + ".new", symlinks=True, copy_function=shutil.copy2)
        st = os.stat(mirror)
        for d, _, files in os.walk(mirror + ".new"):  # the owner as before: the server's
            for x in [d] + [os.path.join(d, f) for f in files]:
                os.lchown(x, st.st_uid, st.st_gid)
        os.rename(mirror, mirror + ".old")
        os.rename(mirror + ".new", mirror)
        assert os.stat(mirror).st_ino != old_ino
        log = run_task(srv, "second", url)
        assert CLAIMED not in log, log
        assert "task=second " in line(log, "env: "), log
        assert "README" in line(log, "ws: ").split(), log
        assert sid not in slots(srv), "the stale slot's folder stays"
        assert not [r for r in slot_records(srv) if r.endswith("." + sid)], slot_records(srv)
        assert tree is None or not glob.glob("/sys/fs/cgroup/*/diverge/%s/_slot.%s" % (tree, sid))
        # A slot on the mirror as it is now comes for the next task.
        wait_until(lambda: slots(srv), timeout=30, what="a slot on the new mirror")
        log = run_task(srv, "third", url)
        assert CLAIMED in log, log
    shutil.rmtree(top, ignore_errors=True)


def runner_in(pids):
    """Whether one of PIDS is a diverge-agent-runner."""
    for pid in pids:
        try:
            with open("/proc/%d/comm" % pid) as f:
                if f.read().startswith("diverge-agent-r"):
                    return True
        except OSError:
            pass
    return False


def sandbox_records(srv):
    """Every sandbox of the server, a task's or a slot's: its record <ns>.<name> in run/."""
    run = os.path.join(srv.data_dir, "run")
    try:
        names = os.listdir(run)
    except OSError:
        return []
    return [n for n in names if n.count(".") == 1 and not n.startswith("mirror.")]


def test_slots_hold_places_under_max_running_tasks():
    """SPEC §14: every existing sandbox holds a place of --max-running-tasks, a warm one
    too. With a limit of 1: no slot while a task runs; one once it ended; that slot is
    stopped before a task of another repository starts, and a task of its own repository
    takes it. Never more than one sandbox at a time."""
    (url_a, top_a), (url_b, top_b) = repo_url(), repo_url()
    agent = AGENT + '; case "$DIVERGE_TASK_NAME" in long*) sleep 3;; esac'
    with Server(args=["--sandbox-provider", "local", "--sandbox-warm-slots", "2",
                      "--max-running-tasks", "1", "--agent-cmd", agent]) as srv:
        tree = subtree(run_task(srv, "a1", url_a))
        wait_until(lambda: slots(srv), timeout=30, what="A's slot")
        create(srv, task("long-b1", url_b, maxIterations=1))
        most, seen_running = 0, False
        while True:
            # In this order: the task's sandbox was there (so A's slot was stopped before),
            # then the slots, then the phase. A task holds its place until its phase says it
            # ended (its sandbox's record goes a moment later, once nothing of it runs, and
            # B's slot may be made in that moment): a slot seen before that phase is one too
            # many.
            recs = sandbox_records(srv)
            made = slots(srv)
            st, _, body = srv.request("GET", API + "/namespaces/default/agenttasks/long-b1")
            ended = st == 200 and body["status"].get("phase") in ("Completed", "Failed")
            most = max(most, len(recs) if not ended else 0)
            if "default.long-b1" in recs and not ended:
                seen_running = seen_running or "mine:" in task_log(srv, "long-b1")
                assert not made, made  # none while the task holds its place, A's neither
            if ended:
                break
            time.sleep(0.01)
        assert seen_running
        log = task_log(srv, "long-b1")
        assert CLAIMED not in log, log
        # It ended: a slot for B, the repository started last, which B's next task takes
        # once the slot's runner runs (a start before that starts its own sandbox).
        wait_until(lambda: slots(srv), timeout=30, what="B's slot")
        if tree is None:
            time.sleep(1)
        else:
            wait_until(lambda: runner_in(slot_procs(tree)), timeout=30, what="the slot's runner")
        # (long-b1 ended: its record may outlive it by a moment, it holds no place)
        most = max(most, len([r for r in sandbox_records(srv) if r != "default.long-b1"]))
        log = run_task(srv, "b2", url_b)
        assert CLAIMED in log, (log, [l for l in srv.stderr().splitlines() if "slot" in l])
        assert "task=b2 " in line(log, "env: "), log
        assert most <= 1, most
        assert "warm_slot_stopped" in srv.stderr()
    shutil.rmtree(top_a, ignore_errors=True)
    shutil.rmtree(top_b, ignore_errors=True)


def test_nothing_of_a_slot_outlives_the_server():
    url, top = repo_url()
    srv = Server(args=["--sandbox-provider", "local", "--sandbox-warm-slots", "2", "--agent-cmd", AGENT])
    srv2 = srv3 = None
    srv.start()
    try:
        tree = subtree(run_task(srv, "one", url))
        wait_until(lambda: slots(srv) and slot_records(srv), timeout=30, what="a warm slot")
        assert tree is None or slot_procs(tree)
        srv.stop()
        assert not slots(srv) and not slot_records(srv)
        assert not slot_cgroups(tree) and not slot_procs(tree), slot_cgroups(tree)
        # Killed: the slot dies with it; the next server removes what is left.
        srv2 = Server(args=["--sandbox-provider", "local", "--sandbox-warm-slots", "2", "--agent-cmd", AGENT],
                      data_dir=srv.data_dir)
        srv2.start()
        run_task(srv2, "two", url)
        left = wait_until(lambda: slots(srv2), timeout=30, what="a warm slot")
        srv2.kill()
        wait_until(lambda: not slot_procs(tree), timeout=30, what="the slot to die")
        assert slots(srv2) == left and slot_records(srv2)
        srv3 = Server(args=["--sandbox-provider", "local", "--sandbox-warm-slots", "2", "--agent-cmd", AGENT,
                            "--sandbox-warm-slots", "0"], data_dir=srv.data_dir)
        srv3.start()
        assert not slots(srv3) and not slot_records(srv3)
        assert not slot_cgroups(tree), slot_cgroups(tree)
        log = run_task(srv3, "three", url)
        assert CLAIMED not in log, log
        srv3.stop()
    finally:
        for s in (srv3, srv2, srv):
            if s is not None:
                s.stop()
        shutil.rmtree(srv.data_dir, ignore_errors=True)
        shutil.rmtree(top, ignore_errors=True)


TESTS = [test_claimed_slot_runs_the_task_on_its_own_files_only,
         test_slot_serves_its_repository_only_and_the_bound_holds,
         test_comments_without_permission_make_no_slot,
         test_slot_of_a_replaced_mirror_is_not_taken,
         test_slots_hold_places_under_max_running_tasks,
         test_nothing_of_a_slot_outlives_the_server]

if __name__ == "__main__":
    if usable() is not None:
        sys.exit(print("SKIP: " + usable()))  # bubblewrap cannot run here
    run_tests(TESTS)
