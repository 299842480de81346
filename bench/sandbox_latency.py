#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Sandbox latencies of issue 9 with the `local` (bubblewrap) provider and the real
diverge-agent-runner, against a `diverge serve` this script starts on a free loopback
port with a fresh data dir (and stops at the end):

  start   the time from creating a task (a `/diverge fix` comment on a local PR bound to a
          repository when `diverge local pr open` exists, else POST …/agenttasks with
          spec.repository.url = a file:// bare repository) to the agent command running
          in the sandbox: the agent writes `date +%s%N` (CLOCK_REALTIME) into its $HOME
          (the task's state dir, outside the git tree), compared with the time just before
          the request. A first task warms the repository mirror and is not counted. Each
          task runs to Completed before the next one is made.
  pause   PATCH spec.suspended=true → every process of the sandbox frozen: the cgroup's
          freezer.state reads FROZEN (v1) / cgroup.events `frozen 1` (v2), or, without a
          cgroup, every process of the sandbox is in state T (SIGSTOP).
  resume  PATCH spec.suspended=false → the runner metering again: the runner's usage
          offset file (<usage>.offset, rewritten only after the meter answered 200 for a
          line) changes. The agent appends one usage line per iteration and fails, so the
          runner meters a line before every iteration.

usage: python3 bench/sandbox_latency.py [build-dir] [-n 50] [--cycles 50]
                                        [--only start|pause] [--path auto|api|comment]
Needs root (the sandbox user is created by the server), bubblewrap and git. Only
loopback and file:// are used: the server listens on 127.0.0.1, its GitHub/GitLab API
URLs point at a closed loopback port, SCM tokens and proxies are removed from its
environment, and sandboxes run with network `none`."""
import argparse
import glob
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

API = "/apis/divergedev.com/v1alpha1"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROJECT = "bench/sandbox"
# Start bench agent: says when it runs, then makes a change so the task completes.
START_AGENT = 'date +%s%N > "$HOME/started"; echo "$DIVERGE_TASK_NAME" > bench.txt'
# Pause/resume agent: a process that left the session, then one usage line per
# iteration and a failure, so the runner meters before every iteration.
LOOP_AGENT = ('[ -f "$HOME/bg" ] || { touch "$HOME/bg"; setsid sleep 100000 >/dev/null 2>&1 & }; '
              'echo \'{"tokensUsed":1,"costUSD":0.000001}\' >> "$DIVERGE_USAGE_FILE"; '
              'sleep 0.02; exit 1')
SCRUB = ("GITHUB_TOKEN", "GH_TOKEN", "GITLAB_TOKEN", "DIVERGE_GITLAB_TOKEN",
         "DIVERGE_NOTIFIER_TOKEN", "DIVERGE_GITHUB_APP_ID", "DIVERGE_GITHUB_APP_KEY_FILE",
         "http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY")


def git(*args, cwd=None):
    env = dict(os.environ, GIT_AUTHOR_NAME="b", GIT_AUTHOR_EMAIL="b@example.invalid",
               GIT_COMMITTER_NAME="b", GIT_COMMITTER_EMAIL="b@example.invalid")
    return subprocess.run(["git"] + list(args), cwd=cwd, check=True, capture_output=True,
                          text=True, env=env).stdout


def bare_repo(top, branches=0):
    """TOP/repo.git with main (one commit) and branches bench-1..N at main."""
    bare, work = os.path.join(top, "repo.git"), os.path.join(top, "work")
    git("init", "-q", "--bare", "-b", "main", bare)
    git("init", "-q", "-b", "main", work)
    with open(os.path.join(work, "README"), "w") as f:
        f.write("bench\n")
    git("add", "README", cwd=work)
    git("commit", "-q", "-m", "initial", cwd=work)
    git("push", "-q", bare, "main", cwd=work)
    for i in range(1, branches + 1):
        git("--git-dir", bare, "branch", "bench-%d" % i, "main")
    os.chmod(top, 0o755)
    return bare


class Server:
    def __init__(self, binary, agent_cmd, extra=()):
        self.binary = binary
        self.data = tempfile.mkdtemp(prefix="diverge-bench-")
        env = {k: v for k, v in os.environ.items() if k not in SCRUB}
        env["NO_PROXY"] = env["no_proxy"] = "*"
        closed = "http://127.0.0.1:9"  # discard port: nothing listens, nothing leaves
        self.proc = subprocess.Popen(
            [binary, "serve", "--listen", "127.0.0.1:0", "--data-dir", self.data,
             "--log-format", "json", "--sandbox-provider", "local", "--agent-cmd", agent_cmd,
             "--github-api-url", closed, "--gitlab-url", closed] + list(extra),
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        self.url = None
        for line in self.proc.stdout:
            m = re.search(r"http://127\.0\.0\.1:\d+", line)
            self.url = self.url or (m.group(0) if m else None)
            if "admin token" in line:
                break
        if self.url is None or urllib.parse.urlsplit(self.url).hostname != "127.0.0.1":
            self.stop()
            raise SystemExit("bench: the server did not start on 127.0.0.1")
        threading.Thread(target=lambda: [None for _ in self.proc.stdout], daemon=True).start()
        with open(os.path.join(self.data, "api-token")) as f:
            self.token = f.read().strip()
        wait(lambda: self.ready(), 10, 0.05, "readyz")

    def ready(self):
        try:
            self.call("GET", "/readyz")
            return True
        except OSError:
            return False

    def call(self, method, path, body=None, ctype="application/json"):
        assert self.url.startswith("http://127.0.0.1:")
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method, headers={
            "Authorization": "Bearer " + self.token, "Content-Type": ctype})
        with urllib.request.urlopen(req, timeout=30) as r:
            text = r.read().decode()
        try:
            return json.loads(text)
        except ValueError:
            return text

    def cli(self, *args):
        env = {k: v for k, v in os.environ.items() if k not in SCRUB}
        env.update({"DIVERGE_SERVER": self.url, "DIVERGE_API_TOKEN": self.token})
        return subprocess.run([self.binary] + list(args), capture_output=True, text=True,
                              env=env, timeout=30)

    def task(self, ns, name):
        return self.call("GET", "%s/namespaces/%s/agenttasks/%s" % (API, ns, name))

    def patch(self, ns, name, spec):
        return self.call("PATCH", "%s/namespaces/%s/agenttasks/%s" % (API, ns, name),
                         {"spec": spec}, "application/merge-patch+json")

    def log(self, ns, name):
        try:
            with open(os.path.join(self.data, "logs", ns, name + ".log"), errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.data, ignore_errors=True)


def wait(pred, timeout, interval, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(interval)
    raise SystemExit("bench: timed out waiting for " + what)


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))]


def report(name, xs, target=None):
    line = "%-44s n=%-3d p50 %7.1f  p90 %7.1f  p99 %7.1f  max %7.1f ms" % (
        name, len(xs), pct(xs, 50), pct(xs, 90), pct(xs, 99), max(xs))
    print(line + ("   (target %s)" % target if target else ""), flush=True)


# --- start: request → agent running -------------------------------------------------

def has_pr_open(srv):
    """Whether this build's CLI has `diverge local pr open` (SPEC §10)."""
    r = srv.cli("local", "--help")
    if "pr open" in r.stdout + r.stderr:
        return True
    r = srv.cli("local", "pr", "open", "--help")
    return r.returncode == 0 and "--repo" in r.stdout + r.stderr


def finished(srv, ns, name):
    try:
        phase = srv.task(ns, name)["status"].get("phase")
    except OSError:
        return None
    return phase if phase in ("Completed", "Failed") else None


def start_one(srv, repo, i, comment):
    """Makes task I; returns (ms until the agent ran, final phase, ns, name)."""
    if comment:
        ns, name = None, "fix-pr-%d" % i
        t0 = time.time()
        srv.call("POST", "/api/v1/local/comments",
                 {"project": PROJECT, "number": i, "body": "/diverge fix bench %d" % i,
                  "author": "alice", "permission": "admin"})
    else:
        ns, name = "bench", "start-%d" % i
        obj = {"apiVersion": "divergedev.com/v1alpha1", "kind": "AgentTask",
               "metadata": {"name": name, "namespace": ns},
               "spec": {"objective": "bench %d" % i, "maxIterations": 1,
                        "repository": {"url": "file://" + repo}}}
        t0 = time.time()
        srv.call("POST", "%s/namespaces/%s/agenttasks" % (API, ns), obj)
    pattern = os.path.join(srv.data, "state", "*", name, "started")

    def started():
        for p in glob.glob(pattern):
            v = (read(p) or "").strip()
            if v.isdigit():
                return p, int(v)
        return None
    path, ns_at = wait(started, 60, 0.002, "the agent of " + name)
    ns = ns or path.split(os.sep)[-3]
    stages(srv, ns, name, t0)  # while the sandbox's files are still there
    phase = wait(lambda: finished(srv, ns, name), 60, 0.02, name + " to finish")
    return ns_at / 1e6 - t0 * 1000.0, phase, ns, name


# Where a start's time goes, from the modification times of what each step writes
# (ext4 timestamps are coarse: a few ms). Relative to the request, in ms.
STAGES = (("token file written (plan + Provisioning txns done)", "tokens/{ns}/{name}/token"),
          ("mirror fetched from the remote", "mirrors/*/FETCH_HEAD"),
          ("staging repo created", "staging/{ns}/{name}.git/HEAD"),
          ("sandbox spawned (bwrap forked)", "run/{ns}.{name}"),
          ("runner's clone started (git init in /workspace)",
           "workspaces/{ns}/{name}/.git/description"),
          ("runner's clone + checkout done", "workspaces/{ns}/{name}/.git/HEAD"),
          ("agent running", "state/{ns}/{name}/started"))
BREAKDOWN = {}


def stages(srv, ns, name, t0):
    for label, pattern in STAGES:
        paths = glob.glob(os.path.join(srv.data, pattern.format(ns=ns, name=name)))
        if paths:
            ms = max(os.stat(p).st_mtime_ns for p in paths) / 1e6 - t0 * 1000.0
            BREAKDOWN.setdefault(label, []).append(ms)


def report_breakdown():
    print("where the time goes (file mtimes, ms after the request; p50 / p90):")
    for label, _ in STAGES:
        xs = BREAKDOWN.get(label)
        if xs:
            print("  %-52s %7.1f / %7.1f" % (label, pct(xs, 50), pct(xs, 90)))


def start_series(srv, repo, n, comment):
    """One warm-up task (it also warms the mirror) and N measured ones; returns the ms."""
    xs, bad = [], []
    for i in range(1, n + 2):
        ms, phase, ns, name = start_one(srv, repo, i, comment)
        if i == 1:
            if phase != "Completed":
                raise SystemExit("bench: warm-up task %s: %s\n%s" % (name, phase,
                                                                     srv.log(ns, name)))
            print("warm-up task: %.1f ms" % ms, flush=True)
            BREAKDOWN.clear()
            continue
        xs.append(ms)
        if phase != "Completed":
            bad.append((name, phase))
    if bad:
        print("tasks not Completed: %r" % bad)
    print("samples ms: " + " ".join("%.0f" % x for x in xs), flush=True)
    report_breakdown()
    return xs


def bench_start(binary, n, path):
    top = tempfile.mkdtemp(prefix="diverge-bench-repo-")
    repo = bare_repo(top, branches=n + 1)
    srv = Server(binary, START_AGENT)
    target = "p50 ≤ 300, p99 ≤ 1000"
    try:
        pr_open = has_pr_open(srv)
        if path == "comment" and not pr_open:
            # A comment on a local PR with no repository bound makes a task whose
            # repository is local://…, which fails with SandboxError (nothing to clone).
            raise SystemExit("bench: this build has no `diverge local pr open`; "
                             "use --path api")
        if pr_open and path != "api":
            for i in range(1, n + 2):
                r = srv.cli("local", "pr", "open", "%s#%d" % (PROJECT, i), "--repo",
                            "file://" + repo, "--head", "bench-%d" % i)
                if r.returncode != 0:
                    raise SystemExit("bench: local pr open: " + r.stderr.strip())
            print("== start: `/diverge fix` comment (POST /api/v1/local/comments) on a local "
                  "PR opened with `diverge local pr open … --repo file://… --head …`", flush=True)
            xs = start_series(srv, repo, n, True)
            report("start: comment → agent running", xs, target)
        else:
            print("== start: POST …/agenttasks with spec.repository.url = file:// bare repo%s"
                  % ("" if pr_open else " (this build has no `diverge local pr open`: "
                     "comment-made tasks would have no repository)"), flush=True)
            xs = start_series(srv, repo, n, False)
            report("start: task API → agent running", xs, target)
        return xs
    finally:
        srv.stop()
        shutil.rmtree(top, ignore_errors=True)


# --- pause / resume ------------------------------------------------------------------

def cgroup_of(log):
    m = re.search(r"cgroup (v1|v2) (/\S+): ", log)
    if not m:
        return None, False
    return m.group(2), m.group(1) == "v2"


def sandbox_pids(srv, ns, name, cg):
    """Every process of the sandbox: the cgroup's, else the leader's process group and
    the processes whose session leader is one of those (a setsid'd child)."""
    if cg:
        return [int(p) for p in (read(os.path.join(cg, "cgroup.procs")) or "").split()]
    leader = int((read(os.path.join(srv.data, "run", "%s.%s" % (ns, name))) or "0").split()[0])
    out, members = [], {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            st = read("/proc/%s/stat" % d)
            if st:
                f = st.rsplit(")", 1)[1].split()
                members[int(d)] = (int(f[1]), int(f[2]), int(f[3]), f[0])  # ppid pgid sid
    kids = {leader}
    changed = True
    while changed:
        changed = False
        for pid, (ppid, _, _, _) in members.items():
            if ppid in kids and pid not in kids:
                kids.add(pid)
                changed = True
    out = [p for p in kids if p in members and members[p][3] != "Z"]
    return out


def frozen(srv, ns, name, cg, v2):
    if cg:
        if v2:
            return "frozen 1" in (read(os.path.join(cg, "cgroup.events")) or "")
        return (read(os.path.join(cg, "freezer.state")) or "").strip() == "FROZEN"
    states = [(read("/proc/%d/stat" % p) or ") Z").rsplit(")", 1)[1].split()[0]
              for p in sandbox_pids(srv, ns, name, None)]
    states = [s for s in states if s != "Z"]
    return bool(states) and all(s == "T" for s in states)


class LoopTask:
    """A task whose runner meters before every iteration (LOOP_AGENT)."""

    def __init__(self, srv, repo, k):
        self.srv, self.ns, self.name = srv, "bench", "loop-%d" % k
        srv.call("POST", "%s/namespaces/%s/agenttasks" % (API, self.ns), {
            "apiVersion": "divergedev.com/v1alpha1", "kind": "AgentTask",
            "metadata": {"name": self.name, "namespace": self.ns},
            "spec": {"objective": "loop", "maxIterations": 10000,
                     "repository": {"url": "file://" + repo}}})
        self.offset = os.path.join(srv.data, "state", self.ns, self.name, "usage.jsonl.offset")
        wait(lambda: read(self.offset), 60, 0.01, "the first meter call")
        self.cg, self.v2 = cgroup_of(srv.log(self.ns, self.name))

    def phase(self):
        return self.srv.task(self.ns, self.name)["status"].get("phase")

    def leader(self):
        return read(os.path.join(self.srv.data, "run", "%s.%s" % (self.ns, self.name)))

    def frozen(self):
        return frozen(self.srv, self.ns, self.name, self.cg, self.v2)

    def pids(self):
        return sandbox_pids(self.srv, self.ns, self.name, self.cg)


def thread_states(pids, seen):
    for pid in pids:  # evidence: what the kernel says of each thread once frozen
        for t in glob.glob("/proc/%d/task/*/stat" % pid):
            st = (read(t) or ") ?").rsplit(")", 1)[1].split()[0]
            seen[st] = seen.get(st, 0) + 1


def bench_pause(binary, cycles):
    top = tempfile.mkdtemp(prefix="diverge-bench-repo-")
    repo = bare_repo(top)
    srv = Server(binary, LOOP_AGENT)
    try:
        t = LoopTask(srv, repo, 1)
        how = ("cgroup %s freezer (%s)" % ("v2" if t.v2 else "v1", t.cg) if t.cg else
               "SIGSTOP (no cgroup): every process in state T")
        print("== pause/resume: agent = one usage line + exit 1 per iteration (the runner "
              "meters before each); frozen = %s" % how, flush=True)
        pause, paused, resume, thaw, restarts, lost = [], [], [], [], 0, []
        nprocs, seen = [], {}
        for _ in range(cycles):
            time.sleep(0.3)  # running and metering
            t0 = time.monotonic()
            t.srv.patch(t.ns, t.name, {"suspended": True})
            wait(t.frozen, 10, 0.0005, "frozen")
            pause.append((time.monotonic() - t0) * 1000.0)
            wait(lambda: t.phase() == "Paused", 10, 0.002, "Paused")
            paused.append((time.monotonic() - t0) * 1000.0)
            pids = t.pids()
            nprocs.append(len(pids))
            thread_states(pids, seen)
            time.sleep(0.1)
            before, leader = read(t.offset), t.leader()
            t0, thawed_at = time.monotonic(), []

            def metering():
                if not thawed_at and not t.frozen():
                    thawed_at.append(time.monotonic())
                return read(t.offset) not in (before, None) or \
                    t.phase() in ("Failed", "Completed")
            srv.patch(t.ns, t.name, {"suspended": False})
            try:
                wait(metering, 10, 0.0005, "metering again")
            except SystemExit:
                print("log tail:\n" + "\n".join(srv.log(t.ns, t.name).splitlines()[-20:]))
                raise
            if read(t.offset) in (before, None):
                # The runner stopped instead of metering: say why, go on with a new task.
                log = [ln for ln in srv.log(t.ns, t.name).splitlines() if "meter:" in ln]
                lost.append("%s: %s (%s)" % (t.name, t.phase(), log[-1] if log else "?"))
                t = LoopTask(srv, repo, len(lost) + 1)
                continue
            resume.append((time.monotonic() - t0) * 1000.0)
            thaw.append(((thawed_at or [time.monotonic()])[0] - t0) * 1000.0)
            if t.leader() != leader:
                restarts += 1
        st = srv.task(t.ns, t.name)["status"]
        report("pause: PATCH → every process frozen", pause, "≤ 100")
        report("pause: PATCH → phase Paused (GET polled)", paused)
        report("resume: PATCH → thawed", thaw)
        report("resume: PATCH → a meter call charged", resume, "≤ 300")
        print("processes in the sandbox when frozen: %d–%d; new runner after a resume: %d; "
              "last task %s, iteration %s, tokens %s" % (
                  min(nprocs), max(nprocs), restarts, st.get("phase"), st.get("iteration"),
                  st.get("tokensConsumed")), flush=True)
        print("thread states of the sandbox's processes once frozen (all cycles): " +
              ", ".join("%s %d" % kv for kv in sorted(seen.items())), flush=True)
        print("resumes after which the runner stopped instead of metering: %d of %d%s" % (
            len(lost), cycles, "".join("\n  " + x for x in lost)), flush=True)
        return pause, resume
    finally:
        srv.stop()
        shutil.rmtree(top, ignore_errors=True)


def machine():
    model = ""
    for line in (read("/proc/cpuinfo") or "").splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    bw = subprocess.run(["bwrap", "--version"], capture_output=True, text=True).stdout.strip()
    return "%d cores (%s), kernel %s, %s, load average %s" % (
        os.cpu_count(), model, platform.release(), bw,
        " ".join((read("/proc/loadavg") or "").split()[:3]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build", nargs="?", default="build")
    ap.add_argument("-n", type=int, default=50, help="start samples (after one warm-up)")
    ap.add_argument("--cycles", type=int, default=50, help="pause/resume cycles")
    ap.add_argument("--only", choices=("start", "pause"))
    ap.add_argument("--path", choices=("auto", "api", "comment"), default="auto")
    a = ap.parse_args()
    build = a.build if os.path.isabs(a.build) else os.path.join(ROOT, a.build)
    binary = os.path.join(build, "diverge")
    if os.geteuid() != 0:
        raise SystemExit("bench: run as root (the local provider's sandbox user and cgroups)")
    for tool in ("bwrap", "git"):
        if shutil.which(tool) is None:
            raise SystemExit("bench: %s is not installed" % tool)
    print("== machine: " + machine(), flush=True)
    if a.only in (None, "start"):
        bench_start(binary, a.n, a.path)
    if a.only in (None, "pause"):
        bench_pause(binary, a.cycles)
    print("== load average at the end: " + (read("/proc/loadavg") or "").strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
