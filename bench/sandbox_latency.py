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
          cgroup, every process of the sandbox is in state T (SIGSTOP). Also from the
          PATCH's answer on (after its fsync'd commit: what the controller adds; negative
          when the sandbox was frozen before the answer). The freezer is polled from the
          moment the PATCH is sent, in a thread beside the request: a server may freeze
          before its answer.
  resume  PATCH spec.suspended=false → the runner metering again: the runner's usage
          offset file (<usage>.offset, rewritten only after the meter answered 200 for a
          line) changes. The agent appends one usage line per iteration and fails, so the
          runner meters a line before every iteration. That figure holds the wait for
          the agent's next line, so it is also split: PATCH → thawed (the server),
          thawed → a line to charge (the usage file holds bytes past the charged offset
          and the sandbox is thawed: mostly the runner's work between two agent runs,
          its checkpoint, the next heartbeat and the next agent's start; an agent frozen
          in its 0.02 s sleep ends it at once on thaw, its deadline passed), and that
          moment → charged (the runner's meter call, the server's durable commit, the
          runner's offset saved).

  iterations (--only iterations) iterations per second of a task whose agent only
          appends its usage line and fails: the runner's own time per iteration.

usage: python3 bench/sandbox_latency.py [build-dir] [-n 50] [--cycles 50]
                                        [--only start|pause|iterations]
                                        [--path auto|api|comment]
                                        [--reference other-build-dir] [--gap seconds]
                                        [--serve-args ARGS] [--reference-serve-args ARGS]
With --reference, a second server runs the other build (each with its own data dir and
bare repository) and the two are measured in turn, task by task and cycle by cycle (the
order swapped every round), so the figures and their reference come from one run under
the same load; the ratio (this build / reference) is printed for p50, p90 and p99.
--serve-args (and --reference-serve-args for the reference) adds `diverge serve` flags,
e.g. --serve-args "--sandbox-warm-slots 0" to measure without warm slots; a reference
built before a flag existed must not be given it.
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
import shlex
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
        extra = list(SERVE_EXTRA.get(binary, ())) + list(extra)
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
    stages(srv, ns, name, t0, srv.breakdown)  # while the sandbox's files are still there
    phase = wait(lambda: finished(srv, ns, name), 60, 0.02, name + " to finish")
    return ns_at / 1e6 - t0 * 1000.0, phase, ns, name


# Where a start's time goes, from the modification times of what each step writes
# (ext4 timestamps are coarse: a few ms). Relative to the request, in ms.
STAGES = (("token file written (plan + Provisioning txns done)", "tokens/{ns}/{name}/token"),
          ("mirror fetched from the remote", "mirrors/*/FETCH_HEAD"),
          ("staging repo created", "staging/{ns}/{name}.git/HEAD"),
          ("sandbox spawned (bwrap forked)", "run/{ns}.{name}"),
          ("workspace .git/config (server, or the runner's clone)",
           "workspaces/{ns}/{name}/.git/config"),
          ("runner's clone started (git init in /workspace)",
           "workspaces/{ns}/{name}/.git/description"),
          ("runner's clone + checkout done (.git/HEAD)", "workspaces/{ns}/{name}/.git/HEAD"),
          ("checkout done (.git/index)", "workspaces/{ns}/{name}/.git/index"),
          ("agent running", "state/{ns}/{name}/started"))


def stages(srv, ns, name, t0, into):
    for label, pattern in STAGES:
        paths = glob.glob(os.path.join(srv.data, pattern.format(ns=ns, name=name)))
        if paths:
            ms = max(os.stat(p).st_mtime_ns for p in paths) / 1e6 - t0 * 1000.0
            into.setdefault(label, []).append(ms)


def report_breakdown(label, breakdown):
    print("where the time goes, %s (file mtimes, ms after the request; p50 / p90):" % label)
    for stage, _ in STAGES:
        xs = breakdown.get(stage)
        if xs:
            print("  %-52s %7.1f / %7.1f" % (stage, pct(xs, 50), pct(xs, 90)))


SERVE_EXTRA = {}  # binary -> more `diverge serve` flags (--serve-args, --reference-serve-args)
GAP = 0.0  # --gap: seconds of quiet after each task finished, before the next comment


def start_series(runs, n, comment):
    """One warm-up task per server (it also warms the mirror), then N measured ones on
    each, taken in turn (the order swapped every round, so load drift hits both alike);
    returns {label: [ms]}. With --gap, each task is followed by GAP seconds of quiet (what
    a server does after a task, e.g. start a warm slot, then hits no start)."""
    xs = {r["label"]: [] for r in runs}
    bad = []
    for i in range(1, n + 2):
        for r in (runs if i % 2 else runs[::-1]):
            srv = r["srv"]
            ms, phase, ns, name = start_one(srv, r["repo"], i, comment)
            time.sleep(GAP)
            if i == 1:
                if phase != "Completed":
                    raise SystemExit("bench: warm-up task %s: %s\n%s" % (name, phase,
                                                                         srv.log(ns, name)))
                print("warm-up task (%s): %.1f ms" % (r["label"], ms), flush=True)
                srv.breakdown.clear()
                continue
            xs[r["label"]].append(ms)
            if phase != "Completed":
                bad.append((r["label"], name, phase))
    if bad:
        print("tasks not Completed: %r" % bad)
    for r in runs:
        print("samples ms (%s): %s" % (r["label"], " ".join("%.0f" % x for x in xs[r["label"]])),
              flush=True)
        report_breakdown(r["label"], r["srv"].breakdown)
    return xs


def report_pair(name, xs, target=None):
    """The build's figures, the reference's from the same run, and their ratio."""
    for label, v in xs.items():
        report("%s [%s]" % (name, label), v, target if label == "this build" else None)
    if len(xs) == 2:
        a, b = xs["this build"], xs["reference"]
        def ratio(p):
            return pct(a, p) / pct(b, p) if pct(b, p) > 0 else float("nan")
        print("%-44s p50 %.2f×  p90 %.2f×  p99 %.2f×  (this build / reference)" % (
            name + " ratio", ratio(50), ratio(90), ratio(99)), flush=True)


def bench_start(builds, n, path):
    runs, tops = [], []
    target = "p50 ≤ 40, p99 ≤ 100"
    try:
        for label, binary in builds:
            top = tempfile.mkdtemp(prefix="diverge-bench-repo-")
            tops.append(top)
            srv = Server(binary, START_AGENT)
            srv.breakdown = {}
            runs.append({"label": label, "srv": srv, "repo": bare_repo(top, branches=n + 1)})
        pr_open = all(has_pr_open(r["srv"]) for r in runs)
        if path == "comment" and not pr_open:
            # A comment on a local PR with no repository bound makes a task whose
            # repository is local://…, which fails with SandboxError (nothing to clone).
            raise SystemExit("bench: this build has no `diverge local pr open`; "
                             "use --path api")
        if pr_open and path != "api":
            for r in runs:
                for i in range(1, n + 2):
                    c = r["srv"].cli("local", "pr", "open", "%s#%d" % (PROJECT, i), "--repo",
                                     "file://" + r["repo"], "--head", "bench-%d" % i)
                    if c.returncode != 0:
                        raise SystemExit("bench: local pr open: " + c.stderr.strip())
            print("== start: `/diverge fix` comment (POST /api/v1/local/comments) on a local "
                  "PR opened with `diverge local pr open … --repo file://… --head …`", flush=True)
            xs = start_series(runs, n, True)
            report_pair("start: comment → agent running", xs, target)
        else:
            print("== start: POST …/agenttasks with spec.repository.url = file:// bare repo%s"
                  % ("" if pr_open else " (this build has no `diverge local pr open`: "
                     "comment-made tasks would have no repository)"), flush=True)
            xs = start_series(runs, n, False)
            report_pair("start: task API → agent running", xs, target)
        return xs
    finally:
        for r in runs:
            r["srv"].stop()
        for top in tops:
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

    def uncharged(self, state):
        """Whether the usage file holds bytes past the offset charged in STATE (the
        offset file's text): a line the runner is to charge."""
        try:
            charged = int((state or "0").split("\n", 1)[0] or 0)
            return os.path.getsize(self.offset[:-len(".offset")]) > charged
        except (OSError, ValueError):
            return False


# How often a resume's wait asks the server whether the task ended (the files it polls every
# 0.5 ms are read directly).
PHASE_POLL_S = 0.02


def thread_states(pids, seen):
    for pid in pids:  # evidence: what the kernel says of each thread once frozen
        for t in glob.glob("/proc/%d/task/*/stat" % pid):
            st = (read(t) or ") ?").rsplit(")", 1)[1].split()[0]
            seen[st] = seen.get(st, 0) + 1


class PauseRun:
    """Pause/resume cycles of one build: a server, a LoopTask, the figures."""

    def __init__(self, label, binary):
        self.label = label
        self.top = tempfile.mkdtemp(prefix="diverge-bench-repo-")
        self.repo = bare_repo(self.top)
        self.srv = Server(binary, LOOP_AGENT)
        self.t = LoopTask(self.srv, self.repo, 1)
        self.pause, self.paused, self.resume, self.thaw = [], [], [], []
        self.pause_after, self.thaw_after = [], []  # from the PATCH's answer on
        self.pause_answer, self.line_wait, self.charge = [], [], []
        self.restarts, self.lost, self.nprocs, self.seen = 0, [], [], {}

    def how(self):
        t = self.t
        return ("cgroup %s freezer (%s)" % ("v2" if t.v2 else "v1", t.cg) if t.cg else
                "SIGSTOP (no cgroup): every process in state T")

    def cycle(self):
        t, srv = self.t, self.srv
        time.sleep(0.3)  # running and metering
        seen = []

        def poll_frozen():
            try:
                wait(t.frozen, 10, 0.0005, "frozen")
                seen.append(time.monotonic())
            except SystemExit:
                pass
        poller = threading.Thread(target=poll_frozen)
        t0 = time.monotonic()
        poller.start()
        srv.patch(t.ns, t.name, {"suspended": True})
        answered = time.monotonic()
        poller.join()
        if not seen:
            raise SystemExit("bench: timed out waiting for frozen")
        self.pause.append((seen[0] - t0) * 1000.0)
        self.pause_after.append((seen[0] - answered) * 1000.0)
        self.pause_answer.append((answered - t0) * 1000.0)
        wait(lambda: t.phase() == "Paused", 10, 0.002, "Paused")
        self.paused.append((time.monotonic() - t0) * 1000.0)
        pids = t.pids()
        self.nprocs.append(len(pids))
        thread_states(pids, self.seen)
        time.sleep(0.1)
        before, leader = read(t.offset), t.leader()
        t0, thawed_at, line_at = time.monotonic(), [], []
        asked = [t0]

        def ended():
            # The task's phase over HTTP at most every PHASE_POLL_S: asked at every 0.5 ms
            # poll, these GETs (a connection and a server thread each) competed for the
            # two cores with the thaw, the runner and the charge being measured.
            now = time.monotonic()
            if now - asked[0] < PHASE_POLL_S:
                return False
            asked[0] = now
            return t.phase() in ("Failed", "Completed")

        def metering():
            if not thawed_at and not t.frozen():
                thawed_at.append(time.monotonic())
            if thawed_at and not line_at and t.uncharged(before):
                line_at.append(time.monotonic())
            return read(t.offset) not in (before, None) or ended()
        srv.patch(t.ns, t.name, {"suspended": False})
        answered = time.monotonic()
        try:
            wait(metering, 10, 0.0005, "metering again")
        except SystemExit:
            print("[%s] %s: log tail:\n%s" % (
                self.label, "frozen" if t.frozen() else "not frozen",
                "\n".join(srv.log(t.ns, t.name).splitlines()[-20:])))
            raise
        if read(t.offset) in (before, None):
            # The runner stopped instead of metering: say why, go on with a new task.
            log = [ln for ln in srv.log(t.ns, t.name).splitlines() if "meter:" in ln]
            self.lost.append("%s: %s (%s)" % (t.name, t.phase(), log[-1] if log else "?"))
            self.t = LoopTask(srv, self.repo, len(self.lost) + 1)
            return
        charged = time.monotonic()
        self.resume.append((charged - t0) * 1000.0)
        thawed = (thawed_at or [charged])[0]
        line = max(thawed, (line_at or [charged])[0])
        self.line_wait.append((line - thawed) * 1000.0)
        self.charge.append((charged - line) * 1000.0)
        self.thaw.append(((thawed_at or [time.monotonic()])[0] - t0) * 1000.0)
        self.thaw_after.append(((thawed_at or [time.monotonic()])[0] - answered) * 1000.0)
        if t.leader() != leader:
            self.restarts += 1

    def summary(self, cycles):
        t = self.t
        st = self.srv.task(t.ns, t.name)["status"]
        print("[%s] processes in the sandbox when frozen: %d–%d; new runner after a resume: %d; "
              "last task %s, iteration %s, tokens %s" % (
                  self.label, min(self.nprocs), max(self.nprocs), self.restarts,
                  st.get("phase"), st.get("iteration"), st.get("tokensConsumed")), flush=True)
        print("[%s] thread states of the sandbox's processes once frozen (all cycles): %s" % (
            self.label, ", ".join("%s %d" % kv for kv in sorted(self.seen.items()))), flush=True)
        print("[%s] resumes after which the runner stopped instead of metering: %d of %d%s" % (
            self.label, len(self.lost), cycles, "".join("\n  " + x for x in self.lost)),
            flush=True)

    def stop(self):
        self.srv.stop()
        shutil.rmtree(self.top, ignore_errors=True)


def bench_pause(builds, cycles):
    runs = []
    try:
        for label, binary in builds:
            runs.append(PauseRun(label, binary))
        print("== pause/resume: agent = one usage line + exit 1 per iteration (the runner "
              "meters before each); frozen = %s" % runs[0].how(), flush=True)
        for i in range(cycles):
            for r in (runs if i % 2 == 0 else runs[::-1]):
                r.cycle()
        figures = (("pause: PATCH → every process frozen", "pause", "≤ 5 (p99)"),
                   ("pause: PATCH answered → every process frozen", "pause_after", None),
                   ("pause: PATCH → answered (its fsync'd commit)", "pause_answer", None),
                   ("pause: PATCH → phase Paused (GET polled)", "paused", None),
                   ("resume: PATCH → thawed", "thaw", None),
                   ("resume: PATCH answered → thawed", "thaw_after", None),
                   ("resume: PATCH → a meter call charged", "resume", "≤ 10 (p99)"),
                   ("resume: thawed → a line to charge (runner+agent)", "line_wait", None),
                   ("resume: line to charge → charged (runner+server)", "charge", None))
        for name, attr, target in figures:
            report_pair(name, {r.label: getattr(r, attr) for r in runs}, target)
        for r in runs:
            r.summary(cycles)
        return runs[0].pause, runs[0].resume
    finally:
        for r in runs:
            r.stop()


# Iteration rate: the agent only appends its usage line and fails, so an iteration is the
# runner's own work (spawn and reap the agent, checkpoint, meter the line).
RATE_AGENT = 'echo \'{"tokensUsed":1,"costUSD":0.000001}\' >> "$DIVERGE_USAGE_FILE"; exit 1'


def bench_rate(builds, rounds, secs=5.0):
    """Iterations per second of a task whose agent does nothing, each build in turn."""
    rates = {label: [] for label, _ in builds}
    print("== iterations: agent = one usage line + exit 1, %.0f s per sample" % secs, flush=True)
    for i in range(rounds):
        for label, binary in (builds if i % 2 == 0 else builds[::-1]):
            top = tempfile.mkdtemp(prefix="diverge-bench-repo-")
            srv = Server(binary, RATE_AGENT)
            try:
                t = LoopTask(srv, bare_repo(top), 1)
                i0, t0 = srv.task(t.ns, t.name)["status"].get("iteration", 0), time.monotonic()
                time.sleep(secs)
                i1, t1 = srv.task(t.ns, t.name)["status"].get("iteration", 0), time.monotonic()
                rates[label].append((i1 - i0) / (t1 - t0))
            finally:
                srv.stop()
                shutil.rmtree(top, ignore_errors=True)
    for label, xs in rates.items():
        print("iterations per second [%s]: %s" % (label, " ".join("%.1f" % x for x in xs)),
              flush=True)
    if len(rates) == 2:
        a, b = rates["this build"], rates["reference"]
        print("iterations per second ratio: median %.2f× (this build / reference)" % (
            pct(a, 50) / pct(b, 50)), flush=True)


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
    ap.add_argument("--only", choices=("start", "pause", "iterations"))
    ap.add_argument("--path", choices=("auto", "api", "comment"), default="auto")
    ap.add_argument("--reference", metavar="DIR",
                    help="a second build (e.g. main's) measured in the same run, task by task "
                         "in turn with this one; its figures and the ratio are printed")
    ap.add_argument("--gap", type=float, default=0.0, metavar="SECONDS",
                    help="start: quiet after each task finished, before the next comment "
                         "(comments on a real server are seldom back to back)")
    ap.add_argument("--serve-args", default="", metavar="ARGS",
                    help="more `diverge serve` flags for this build (one string)")
    ap.add_argument("--reference-serve-args", default="", metavar="ARGS",
                    help="more `diverge serve` flags for the reference build")
    a = ap.parse_args()
    global GAP
    GAP = a.gap

    def binary_of(d):
        return os.path.join(d if os.path.isabs(d) else os.path.join(ROOT, d), "diverge")
    builds = [("this build", binary_of(a.build))]
    SERVE_EXTRA[builds[0][1]] = shlex.split(a.serve_args)
    if a.reference:
        builds.append(("reference", binary_of(a.reference)))
        if builds[1][1] == builds[0][1] and a.serve_args != a.reference_serve_args:
            raise SystemExit("bench: --reference is this build; give a copy in another dir "
                             "to compare flags")
        SERVE_EXTRA[builds[1][1]] = shlex.split(a.reference_serve_args)
    if os.geteuid() != 0:
        raise SystemExit("bench: run as root (the local provider's sandbox user and cgroups)")
    for tool in ("bwrap", "git"):
        if shutil.which(tool) is None:
            raise SystemExit("bench: %s is not installed" % tool)
    print("== machine: " + machine(), flush=True)
    for label, binary in builds:
        print("== %s: %s %s" % (label, binary, " ".join(SERVE_EXTRA[binary])), flush=True)
    if a.only in (None, "start"):
        bench_start(builds, a.n, a.path)
    if a.only in (None, "pause"):
        bench_pause(builds, a.cycles)
    if a.only == "iterations":
        bench_rate(builds, 4)
    print("== load average at the end: " + (read("/proc/loadavg") or "").strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
