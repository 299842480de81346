# SPDX-License-Identifier: Apache-2.0
"""The queue of SPEC §14 with the real runner (local sandbox; process where bubblewrap
cannot run): with --max-running-tasks 1, a task holds the one slot while its agent waits
for a file the test writes into its workspace; later tasks stay Pending with reason
Queued and status.queuePosition, in round-robin order across namespaces (beta's only task
goes before alpha's second, though it came later); `task list` and /metrics
(diverge_tasks_queued) show them; each one starts when the slot frees, or at once when a
SpendQuota's maxRunningTasks is raised (no task event needed)."""
import os
import shutil
import tempfile

from harness import API, Server, run_tests
from sandbox_helpers import git, task_log
from test_local_pr import SERVE, ENV, Clean, get_task, wait

AGENT = "while [ ! -e go ]; do sleep 0.1; done"
ARGS = [a for a in SERVE if a not in ("--agent-cmd", "--verify-cmd", "exit 9")] + [
    "--agent-cmd", AGENT, "--verify-cmd", "true", "--max-running-tasks", "1"]


def make_repo(top):
    src = os.path.join(top, "src")
    os.makedirs(src)
    with open(os.path.join(src, "README"), "w") as f:
        f.write("queue\n")
    git("init", "-q", "-b", "main", cwd=src)
    git("add", "-A", cwd=src)
    git("commit", "-q", "-m", "init", cwd=src)
    bare = os.path.join(top, "origin.git")
    git("init", "-q", "--bare", "-b", "main", bare)
    git("push", "-q", bare, "main", cwd=src)
    os.chmod(top, 0o755)
    return "file://" + bare


def create(srv, ns, name, url):
    r = srv.cli("task", "create", "wait for go", "--name", name, "-n", ns, "--repo", url,
                "--budget", "1.00")
    assert r.returncode == 0, r


def phase(srv, ns, name):
    return get_task(srv, ns, name)["status"]


def release(srv, ns, name):
    """Lets the agent of NS/NAME finish (it waits for ./go in its workspace)."""
    ws = os.path.join(srv.data_dir, "workspaces", ns, name)
    wait(lambda: os.path.isdir(os.path.join(ws, ".git")), what="workspace of " + name)
    with open(os.path.join(ws, "go"), "w") as f:
        f.write("go\n")


def start_active(srv, ns, name, url):
    """Creates NS/NAME and waits until it runs (it holds a slot)."""
    create(srv, ns, name, url)
    wait(lambda: phase(srv, ns, name)["phase"] == "Active", what=name + " Active")


def queued_metric(srv):
    st, _, body = srv.request("GET", "/metrics", auth=False, raw=True)
    for line in body.decode().splitlines():
        if line.startswith("diverge_tasks_queued "):
            return int(line.split()[1])
    return None


def test_one_slot_round_robin_queue():
    top = tempfile.mkdtemp(prefix="diverge-queue-")
    url = make_repo(top)
    with Server(ARGS, env=ENV) as srv, Clean(srv):
        start_active(srv, "alpha", "a1", url)
        create(srv, "alpha", "a2", url)
        create(srv, "beta", "b1", url)
        s = wait(lambda: (lambda s: s if s.get("queuePosition") == 2 else None)(
            phase(srv, "alpha", "a2")), what="a2 queued at 2")
        assert s["phase"] == "Pending" and s["reason"] == "Queued", s
        s = wait(lambda: (lambda s: s if s.get("queuePosition") == 1 else None)(
            phase(srv, "beta", "b1")), what="b1 queued at 1")
        assert s["phase"] == "Pending" and s["reason"] == "Queued", s
        assert "--max-running-tasks" in s["message"], s
        assert phase(srv, "alpha", "a1")["phase"] == "Active"
        r = srv.cli("task", "list", "-A")
        assert r.returncode == 0 and "Pending (queued #1)" in r.stdout, r.stdout
        assert "Pending (queued #2)" in r.stdout, r.stdout
        assert queued_metric(srv) == 2
        # The slot frees: b1 (beta's first) goes before a2.
        release(srv, "alpha", "a1")
        wait(lambda: phase(srv, "alpha", "a1")["phase"] == "Completed", what="a1 Completed")
        s = wait(lambda: (lambda s: s if s["phase"] == "Active" else None)(
            phase(srv, "beta", "b1")), what="b1 Active")
        assert "queuePosition" not in s and s["reason"] == "", s
        s = wait(lambda: (lambda s: s if s.get("queuePosition") == 1 else None)(
            phase(srv, "alpha", "a2")), what="a2 next")
        assert s["phase"] == "Pending", s
        assert wait(lambda: queued_metric(srv) == 1, what="metric 1")
        release(srv, "beta", "b1")
        wait(lambda: phase(srv, "alpha", "a2")["phase"] == "Active", what="a2 Active")
        release(srv, "alpha", "a2")
        wait(lambda: phase(srv, "alpha", "a2")["phase"] == "Completed", what="a2 Completed")
        assert phase(srv, "beta", "b1")["phase"] == "Completed"
        assert queued_metric(srv) == 0
    shutil.rmtree(top, ignore_errors=True)


def test_spendquota_caps_a_projects_running_tasks():
    """SPEC §15: a SpendQuota's maxRunningTasks caps its namespace's slots, also without a
    server-wide limit; another namespace is not held back."""
    top = tempfile.mkdtemp(prefix="diverge-queue-")
    url = make_repo(top)
    assert ARGS[-2:] == ["--max-running-tasks", "1"]
    args = ARGS[:-2] + ["--max-running-tasks", "0"]
    with Server(args, env=ENV) as srv, Clean(srv):
        st, _, b = srv.request("POST", API + "/namespaces/alpha/spendquotas", {
            "apiVersion": "divergedev.com/v1alpha1", "kind": "SpendQuota",
            "metadata": {"name": "team"}, "spec": {"maxRunningTasks": 1}})
        assert st == 201, b
        create(srv, "alpha", "a1", url)
        wait(lambda: phase(srv, "alpha", "a1")["phase"] == "Active", what="a1 Active")
        create(srv, "alpha", "a2", url)
        create(srv, "beta", "b1", url)
        wait(lambda: phase(srv, "beta", "b1")["phase"] == "Active", what="b1 Active")
        s = wait(lambda: (lambda s: s if s.get("queuePosition") == 1 else None)(
            phase(srv, "alpha", "a2")), what="a2 queued")
        assert s["phase"] == "Pending" and s["reason"] == "Queued", s
        assert "SpendQuota maxRunningTasks" in s["message"], s
        release(srv, "alpha", "a1")
        wait(lambda: phase(srv, "alpha", "a2")["phase"] == "Active", what="a2 Active")
        release(srv, "alpha", "a2")
        release(srv, "beta", "b1")
        wait(lambda: phase(srv, "alpha", "a2")["phase"] == "Completed", what="a2 Completed")
        # A PR's task in a project that may run none: `/diverge status` shows it queued.
        st, _, b = srv.request("POST", API + "/namespaces/acme-q/spendquotas", {
            "apiVersion": "divergedev.com/v1alpha1", "kind": "SpendQuota",
            "metadata": {"name": "frozen"}, "spec": {"maxRunningTasks": 0}})
        assert st == 201, b
        r = srv.cli("local", "comment", "acme/q#1", "/diverge fix wait", "--as", "alice")
        assert r.returncode == 0, r
        wait(lambda: ((get_task(srv, "acme-q", "fix-pr-1") or {}).get("status") or {}).get(
            "queuePosition") == 1, what="fix-pr-1 queued")
        r = srv.cli("local", "comment", "acme/q#1", "/diverge status", "--as", "alice")
        assert r.returncode == 0, r
        out = wait(lambda: (lambda o: o if "queued #1" in o else None)(
            srv.cli("local", "thread", "acme/q#1").stdout), what="status reply")
        assert "`fix-pr-1` | Pending (queued #1) | $0.00 / $" in out, out
    shutil.rmtree(top, ignore_errors=True)


def test_raised_quota_starts_the_queued_task():
    """A SpendQuota's maxRunningTasks raised from 1 to 2 through the API: the queued task
    starts while the first still runs (the quota change runs a queue pass)."""
    top = tempfile.mkdtemp(prefix="diverge-queue-")
    url = make_repo(top)
    args = ARGS[:-2] + ["--max-running-tasks", "0"]
    quota = API + "/namespaces/gamma/spendquotas/team"
    with Server(args, env=ENV) as srv, Clean(srv):
        st, _, b = srv.request("POST", API + "/namespaces/gamma/spendquotas", {
            "apiVersion": "divergedev.com/v1alpha1", "kind": "SpendQuota",
            "metadata": {"name": "team"}, "spec": {"maxRunningTasks": 1}})
        assert st == 201, b
        create(srv, "gamma", "g1", url)
        wait(lambda: phase(srv, "gamma", "g1")["phase"] == "Active", what="g1 Active")
        create(srv, "gamma", "g2", url)
        s = wait(lambda: (lambda s: s if s.get("queuePosition") == 1 else None)(
            phase(srv, "gamma", "g2")), what="g2 queued")
        assert s["phase"] == "Pending" and s["reason"] == "Queued", s
        st, _, b = srv.request("PATCH", quota, {"spec": {"maxRunningTasks": 2}},
                               headers={"Content-Type": "application/merge-patch+json"})
        assert st == 200 and b["spec"]["maxRunningTasks"] == 2, (st, b)
        s = wait(lambda: (lambda s: s if s["phase"] == "Active" else None)(
            phase(srv, "gamma", "g2")), what="g2 Active after the raise")
        assert "queuePosition" not in s and s["reason"] == "", s
        assert phase(srv, "gamma", "g1")["phase"] == "Active"  # both run at once
        release(srv, "gamma", "g1")
        release(srv, "gamma", "g2")
        wait(lambda: phase(srv, "gamma", "g2")["phase"] == "Completed", what="g2 Completed")
    shutil.rmtree(top, ignore_errors=True)


def test_queued_task_starts_on_the_head_of_its_start():
    """A new task's mirror fetch starts with the task, before the queue admits it; a task
    the queue makes wait does not start on that fetch: main moved on while it waited, and
    its workspace has main's new commit."""
    top = tempfile.mkdtemp(prefix="diverge-queue-")
    url = make_repo(top)
    with Server(ARGS, env=ENV) as srv, Clean(srv):
        start_active(srv, "delta", "d1", url)
        create(srv, "delta", "d2", url)
        wait(lambda: phase(srv, "delta", "d2").get("queuePosition") == 1, what="d2 queued")
        # The fetch made when d2 was created is over (it logs when done).
        wait(lambda: "repository mirror" in task_log(srv, "d2", ns="delta"), what="d2's fetch")
        src = os.path.join(top, "src")
        with open(os.path.join(src, "LATER"), "w") as f:
            f.write("pushed while d2 waited\n")
        git("add", "-A", cwd=src)
        git("commit", "-q", "-m", "later", cwd=src)
        git("push", "-q", url[len("file://"):], "main", cwd=src)
        release(srv, "delta", "d1")
        wait(lambda: phase(srv, "delta", "d2")["phase"] == "Active", what="d2 Active")
        ws = os.path.join(srv.data_dir, "workspaces", "delta", "d2")
        wait(lambda: os.path.exists(os.path.join(ws, ".git", "index")), what="d2's checkout")
        assert os.path.exists(os.path.join(ws, "LATER")), (os.listdir(ws),
                                                           task_log(srv, "d2", ns="delta"))
        release(srv, "delta", "d2")
        wait(lambda: phase(srv, "delta", "d2")["phase"] == "Completed", what="d2 Completed")
    shutil.rmtree(top, ignore_errors=True)


def test_long_queue_positions():
    """25 tasks behind one slot: each shows Queued and its exact place once it waits; when
    the slot frees, the first ten places are exact again at once, and a place further back
    is written again only once it moved by a tenth (12 stays 12 for the task now 11th)."""
    top = tempfile.mkdtemp(prefix="diverge-queue-")
    url = make_repo(top)
    names = ["q%02d" % i for i in range(1, 26)]
    with Server(ARGS, env=ENV) as srv, Clean(srv):
        start_active(srv, "eps", "holder", url)
        for name in names:
            st, _, b = srv.request("POST", API + "/namespaces/eps/agenttasks", {
                "metadata": {"name": name},
                "spec": {"objective": "wait for go", "budgetUSD": "1.00",
                         "repository": {"url": url}}})
            assert st == 201, b

        def places():
            st, _, b = srv.request("GET", API + "/namespaces/eps/agenttasks")
            assert st == 200, b
            return {t["metadata"]["name"]: (t["status"].get("reason"),
                                            t["status"].get("queuePosition"))
                    for t in b["items"] if t["metadata"]["name"] != "holder"}

        want = {n: ("Queued", i + 1) for i, n in enumerate(names)}
        got = wait(lambda: (lambda p: p if p == want else None)(places()), what="25 places")
        assert got == want, got
        release(srv, "eps", "holder")
        wait(lambda: phase(srv, "eps", "q01")["phase"] == "Active", what="q01 Active")
        want = {n: ("Queued", i) for i, n in enumerate(names) if 1 <= i <= 10}
        got = wait(lambda: (lambda p: p if all(p.get(n) == w for n, w in want.items())
                            else None)(places()), what="the first ten moved up")
        # q12 is 11th now and shows 12: moved by less than a tenth, not written again.
        assert got["q12"] == ("Queued", 12) and got["q25"] == ("Queued", 25), got
        assert queued_metric(srv) == 24
    shutil.rmtree(top, ignore_errors=True)


if __name__ == "__main__":
    run_tests([test_one_slot_round_robin_queue, test_spendquota_caps_a_projects_running_tasks,
               test_queued_task_starts_on_the_head_of_its_start,
               test_raised_quota_starts_the_queued_task, test_long_queue_positions])
