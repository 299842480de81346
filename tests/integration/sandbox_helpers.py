# SPDX-License-Identifier: Apache-2.0
"""Helpers of the sandbox tests: a bare git repository to work on, task polling, and
the pid of a task's sandbox leader (from the server's record under <data-dir>/run)."""
import os
import subprocess
import time

from harness import API, SOURCE_DIR, scratch_dir

FAKE_RUNNER = os.path.join(SOURCE_DIR, "tests", "fakes", "fake_runner.sh")


def git(*args, cwd=None):
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.invalid",
               GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@example.invalid")
    return subprocess.run(["git"] + list(args), cwd=cwd, check=True, capture_output=True,
                          text=True, env=env).stdout


def bare_repo():
    """A bare repository with one commit on main; returns its directory."""
    top = scratch_dir("diverge-repo-")  # callers that remove it first: no harm
    bare = os.path.join(top, "repo.git")
    work = os.path.join(top, "work")
    git("init", "-q", "--bare", "-b", "main", bare)
    git("init", "-q", "-b", "main", work)
    with open(os.path.join(work, "README"), "w") as f:
        f.write("hello\n")
    git("add", "README", cwd=work)
    git("commit", "-q", "-m", "initial", cwd=work)
    git("push", "-q", bare, "main", cwd=work)
    return bare


def task(name, url=None, **spec):
    s = {"objective": "fix the thing"}
    if url:
        s["repository"] = {"url": url}
    s.update(spec)
    return {"apiVersion": "divergedev.com/v1alpha1", "kind": "AgentTask",
            "metadata": {"name": name, "namespace": "default"}, "spec": s}


def create(srv, obj):
    st, _, body = srv.request("POST", API + "/namespaces/default/agenttasks", obj)
    assert st == 201, (st, body)
    return body


def get(srv, name):
    st, _, body = srv.request("GET", API + "/namespaces/default/agenttasks/" + name)
    assert st == 200, (st, body)
    return body


def wait_phase(srv, name, phases, timeout=30):
    if isinstance(phases, str):
        phases = (phases,)
    deadline = time.time() + timeout
    body = None
    while time.time() < deadline:
        body = get(srv, name)
        if body["status"]["phase"] in phases:
            return body
        time.sleep(0.05)
    raise AssertionError("task %s never reached %s: %r\nlog:\n%s" %
                         (name, phases, body and body["status"], task_log(srv, name)))


def patch(srv, name, spec):
    st, _, body = srv.request("PATCH", API + "/namespaces/default/agenttasks/" + name,
                              {"spec": spec},
                              headers={"Content-Type": "application/merge-patch+json"})
    assert st == 200, (st, body)
    return body


def task_log(srv, name, ns="default"):
    path = os.path.join(srv.data_dir, "logs", ns, name + ".log")
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def wait_log(srv, name, text, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if text in task_log(srv, name):
            return
        time.sleep(0.05)
    raise AssertionError("%r never in the log of %s:\n%s" % (text, name, task_log(srv, name)))


def leader_pid(srv, name):
    """The pid of the task's sandbox leader, or None (no sandbox, or its record not
    written yet: a read can come between the file's creation and its write)."""
    try:
        with open(os.path.join(srv.data_dir, "run", "default." + name)) as f:
            words = f.read().split()
    except OSError:
        return None
    return int(words[0]) if words else None


def proc_state(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def group_members(pgid):
    """Live (non-zombie) processes of process group PGID."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append((int(d), fields[0]))
    return out


def wait_until(fn, timeout=20, what="condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError("timed out waiting for " + what)
