# SPDX-License-Identifier: Apache-2.0
"""`diverge local pr open` and `diverge local demo` (SPEC §10), end to end with the local
SCM provider, the default local sandbox (bubblewrap; the `process` provider where
bubblewrap cannot run here), the real runner and the demo agent, on bare git repositories
in temporary directories:

- `/diverge fix` on an opened PR makes a task that clones the base, works on the PR head,
  runs the commands of the base branch's `.diverge/agent.yaml` (not the server's
  --agent-cmd/--verify-cmd), fails verify on iteration 1, passes on 2, pushes
  `fix(<task>): …` onto the head branch of the bare repository; spend equals the usage
  lines; the sticky comment in the thread says ✅ Completed;
- `local demo` creates its repository once, opens demo/greeting#1, prints the next
  commands, and those commands complete the task;
- a bad agent.yaml key is answered in the thread with file, line and key; no task;
- `local pr open` usage errors exit 2 with one `diverge: ` line; the server's refusals
  exit 1; comments on PRs never opened behave as before."""
import glob
import json
import os
import re
import shutil
import subprocess
import tempfile
import time

from harness import API, BUILD_DIR, SOURCE_DIR, Server, run_tests
from sandbox_helpers import git
from test_sandbox_local import usable

DEMO_REPO = os.path.join(SOURCE_DIR, "examples", "demo-repo")
DEMO_AGENT = os.path.join(SOURCE_DIR, "examples", "agents", "demo-agent.sh")
MARKER = "<!-- diverge-agent-task -->"



def sanitized():
    """Whether the runner is an ASan/TSan build: their runtimes need ptrace/personality,
    which the local sandbox's seccomp filter denies, so such runners exit 1 in there."""
    try:
        with open(os.path.join(BUILD_DIR, "diverge-agent-runner"), "rb") as f:
            data = f.read()
    except OSError:
        return False
    return b"__asan_init" in data or b"__tsan_init" in data


# The server's own defaults would fail every iteration: only agent.yaml's commands pass.
SERVE = ["--agent-cmd", "exit 9", "--verify-cmd", "exit 9", "--notifier-min-interval", "1",
         "--sandbox-provider", "local" if usable() is None and not sanitized() else "process"]
ENV = {"GITHUB_TOKEN": None, "DIVERGE_NOTIFIER_TOKEN": None, "DIVERGE_AGENT_CMD": None,
       "DIVERGE_VERIFY_CMD": None, "DIVERGE_DATA_DIR": None}

AGENT_YAML = """version: "1"
agent:
  command: DEMO_AGENT_CALLS=2 sh .diverge/demo-agent.sh
  verifyCommand: sh test.sh
  budgetUSD: "2.00"
  maxIterations: 4
sandbox:
  network: none
"""


class Clean:
    """Stops SRV at the end of the block and checks that it said nothing of a sanitizer
    (ASan/UBSan/LSan builds: a leak or error in the server fails the test)."""

    def __init__(self, srv):
        self.srv = srv

    def __enter__(self):
        return self.srv

    def __exit__(self, *exc):
        self.srv.stop()
        if exc[0] is None:
            err = self.srv.stderr()
            assert "Sanitizer" not in err and "runtime error" not in err, err[-4000:]
        else:
            self.tell()

    def tell(self):
        """On a failure: what the server and its sandboxes said last (a rare failure in CI
        is then read from its output, not rerun blind)."""
        print("---- server output, last 40 lines:")
        print("\n".join(self.srv.lines[-40:]))
        print("---- server stderr, end:")
        print(self.srv.stderr()[-12000:])
        logs = sorted(p for p in glob.glob(os.path.join(self.srv.data_dir, "**", "*.log"),
                                           recursive=True) if p != self.srv.stderr_path)
        for path in logs[:12]:
            with open(path, errors="replace") as f:
                print("---- %s, end:" % os.path.relpath(path, self.srv.data_dir))
                print(f.read()[-1500:])


def wait(fn, timeout=60, what="condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError("timed out waiting for " + what)


def make_repo(top, agent_yaml=AGENT_YAML):
    """TOP/origin.git: main holds examples/demo-repo, the demo agent and AGENT_YAML; the
    PR branch `feature` has one more commit. Returns the bare repository's path."""
    src = os.path.join(top, "src")
    shutil.copytree(DEMO_REPO, src)
    os.makedirs(os.path.join(src, ".diverge"), exist_ok=True)
    shutil.copy(DEMO_AGENT, os.path.join(src, ".diverge", "demo-agent.sh"))
    with open(os.path.join(src, ".diverge", "agent.yaml"), "w") as f:
        f.write(agent_yaml)
    git("init", "-q", "-b", "main", cwd=src)
    git("add", "-A", cwd=src)
    git("commit", "-q", "-m", "demo", cwd=src)
    git("checkout", "-q", "-b", "feature", cwd=src)
    with open(os.path.join(src, "NOTES.md"), "w") as f:
        f.write("the PR's own change\n")
    git("add", "-A", cwd=src)
    git("commit", "-q", "-m", "pr work", cwd=src)
    bare = os.path.join(top, "origin.git")
    git("init", "-q", "--bare", "-b", "main", bare)
    git("push", "-q", bare, "main", "feature", cwd=src)
    os.chmod(top, 0o755)
    return bare


def thread(srv, ref):
    r = srv.cli("local", "thread", ref)
    assert r.returncode == 0, r
    return r.stdout


def stickies(srv, ref):
    """The thread's sticky comments, from its stored Markdown (the table hides markers)."""
    r = srv.cli("local", "thread", ref, "-o", "json")
    assert r.returncode == 0, r
    return [c for c in json.loads(r.stdout)["comments"] if c["body"].startswith(MARKER)]


def get_task(srv, ns, name):
    st, _, body = srv.request("GET", API + "/namespaces/%s/agenttasks/%s" % (ns, name))
    return body if st == 200 else None


def finished(srv, ns, name):
    t = get_task(srv, ns, name)
    return t if t and t["status"]["phase"] in ("Completed", "Failed") else None


def task_log(srv, ns, name):
    r = srv.cli("task", "logs", name, "-n", ns)
    return r.stdout


def test_pr_open_fix_completes_on_the_head_branch():
    top = tempfile.mkdtemp(prefix="diverge-localpr-")
    bare = make_repo(top)
    url = "file://" + bare
    head_before = git("--git-dir", bare, "rev-parse", "feature").strip()
    main_before = git("--git-dir", bare, "rev-parse", "main").strip()
    with Server(SERVE, env=ENV) as srv, Clean(srv):
        r = srv.cli("local", "pr", "open", "acme/shop#12", "--repo", url, "--head", "feature")
        assert r.returncode == 0, r
        assert "acme/shop#12 opened: feature -> main" in r.stdout, r.stdout
        st, _, pr = srv.request("GET", "/api/v1/local/pulls/acme/shop/12")
        assert st == 200 and pr["repository"] == url and pr["head"] == "feature", pr
        assert pr["base"] == "main", pr
        r = srv.cli("local", "comment", "acme/shop#12", "/diverge fix the greeting typo",
                    "--as", "alice")
        assert r.returncode == 0, r
        # The sticky comment shows up while the task is queued or running.
        wait(lambda: stickies(srv, "acme/shop#12"), what="sticky comment")
        t = wait(lambda: finished(srv, "acme-shop", "fix-pr-12"), what="task finished")
        log = task_log(srv, "acme-shop", "fix-pr-12")
        assert t["status"]["phase"] == "Completed", (t["status"], log)
        s = t["spec"]
        assert s["repository"] == {"url": url, "baseBranch": "main",
                                   "workingBranch": "feature"}, s
        # agent.yaml of the base branch: the runner's commands, budget, limits, network.
        assert s["runner"] == {"command": "DEMO_AGENT_CALLS=2 sh .diverge/demo-agent.sh",
                               "verifyCommand": "sh test.sh"}, s
        assert s["budgetUSD"] == "2.00" and s["maxIterations"] == 4, s
        assert s["sandbox"]["network"] == "none", s
        assert "iteration 1/4: agent exit 0, verify exit 1" in log, log
        assert "iteration 2/4: agent exit 0, verify exit 0" in log, log
        assert "exit 9" not in log
        # Two usage lines per iteration, two iterations: 4 x (1200 tokens, $0.0180).
        st_ = t["status"]
        assert st_["iteration"] == 2 and st_["tokensConsumed"] == 4800, st_
        assert st_["costUSD"] in ("0.072", "0.0720", "0.072000"), st_
        # The fix is a new commit on the PR head (a fast-forward); main is untouched.
        subject = git("--git-dir", bare, "log", "-1", "--format=%s", "feature").strip()
        assert subject == "fix(fix-pr-12): the greeting typo", subject
        parent = git("--git-dir", bare, "rev-parse", "feature^").strip()
        assert parent == head_before, (parent, head_before)
        assert git("--git-dir", bare, "show", "feature:greeting.txt") == "Hello, world!\n"
        assert git("--git-dir", bare, "rev-parse", "main").strip() == main_before
        out = wait(lambda: (lambda o: o if "✅ Completed" in o else None)(
            thread(srv, "acme/shop#12")), what="sticky says Completed")
        assert len(stickies(srv, "acme/shop#12")) == 1 and "<!--" not in out, out
        assert "[+1]" in out, out
        st, _, th = srv.request("GET", "/api/v1/local/threads/acme/shop/12")
        assert st == 200 and any("✅ Completed" in c["body"] for c in th["comments"]), th
    shutil.rmtree(top, ignore_errors=True)


def test_demo_end_to_end_and_idempotent():
    with Server(SERVE, env=ENV) as srv, Clean(srv):
        env = {"DIVERGE_DATA_DIR": srv.data_dir}
        r = srv.cli("local", "demo", env=env)
        assert r.returncode == 0, r
        bare = os.path.join(os.path.realpath(srv.data_dir), "demo", "greeting.git")
        assert "demo repository created: " + bare in r.stdout, r.stdout
        assert "local PR demo/greeting#1 opened: fix-greeting -> main" in r.stdout, r.stdout
        steps = r.stdout[r.stdout.index("Next"):]
        # Run again: it says the repository exists and prints the same next steps.
        again = srv.cli("local", "demo", env=env)
        assert again.returncode == 0, again
        assert "demo repository exists: " + bare in again.stdout, again.stdout
        assert "is open" in again.stdout and again.stdout.endswith(steps), again.stdout
        assert git("--git-dir", bare, "branch", "--format=%(refname:short)").split() == \
            ["fix-greeting", "main"]
        # The printed commands, as printed (the program is the one we ran).
        lines = [l.split("#   ")[0].split("# ")[0].strip() for l in steps.splitlines()
                 if "local comment" in l or "local thread" in l]
        comment = [l for l in lines if "local comment" in l][0]
        m = re.match(r'^(\S+) local comment demo/greeting#1 "(/diverge fix [^"]+)"$', comment)
        assert m, comment
        r = srv.cli("local", "comment", "demo/greeting#1", m.group(2), env=env)
        assert r.returncode == 0, r
        t = wait(lambda: finished(srv, "demo-greeting", "fix-pr-1"), what="demo task")
        log = task_log(srv, "demo-greeting", "fix-pr-1")
        assert t["status"]["phase"] == "Completed", (t["status"], log)
        assert t["spec"]["runner"]["command"] == "sh .diverge/demo-agent.sh", t["spec"]
        assert "verify exit 1" in log and "verify exit 0" in log, log
        subject = git("--git-dir", bare, "log", "-1", "--format=%s", "fix-greeting").strip()
        assert subject.startswith("fix(fix-pr-1): "), subject
        wait(lambda: "✅ Completed" in thread(srv, "demo/greeting#1"), what="demo sticky")
        # Still idempotent once the PR branch moved.
        r = srv.cli("local", "demo", env=env)
        assert r.returncode == 0 and "exists" in r.stdout, r


def test_bad_agent_yaml_key_is_answered_with_file_line_and_key():
    top = tempfile.mkdtemp(prefix="diverge-localpr-")
    bare = make_repo(top, agent_yaml='version: "1"\nagent:\n  commands: sh x.sh\n')
    with Server(SERVE, env=ENV) as srv, Clean(srv):
        r = srv.cli("local", "pr", "open", "acme/bad#3", "--repo", "file://" + bare,
                    "--head", "feature", "--base", "main")
        assert r.returncode == 0, r
        r = srv.cli("local", "comment", "acme/bad#3", "/diverge fix it", "--as", "alice")
        assert r.returncode == 0, r
        out = wait(lambda: (lambda o: o if "agent.commands" in o else None)(
            thread(srv, "acme/bad#3")), what="refusal naming the key")
        assert ".diverge/agent.yaml:3: agent.commands: unknown key" in out, out
        assert get_task(srv, "acme-bad", "fix-pr-3") is None
    shutil.rmtree(top, ignore_errors=True)


def one_error_line(p, code, pattern=None):
    assert p.returncode == code, (p.returncode, p.stdout, p.stderr)
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("diverge: "), p.stderr
    if pattern:
        assert re.search(pattern, lines[0]), lines[0]
    return lines[0]


def test_pr_open_errors_and_unopened_prs():
    top = tempfile.mkdtemp(prefix="diverge-localpr-")
    bare = make_repo(top)
    url = "file://" + bare
    with Server(SERVE, env=ENV) as srv, Clean(srv):
        usage = [
            (["o/r#1", "--head", "f"], r"--repo URL is required"),
            (["o/r#1", "--repo", url], r"--head BRANCH is required"),
            (["o/r#1", "--repo", "/tmp/x.git", "--head", "f"], r"file:///absolute/path"),
            (["o/r#1", "--repo", "ssh://h/r", "--head", "f"], r"file:///absolute/path"),
            (["o/r#1", "--repo", url, "--head", "main"], r"different branches"),
            (["o/r#1", "--repo", url, "--head", "-x"], r"--head is not a branch name"),
            (["o/r#1", "--repo", url, "--head", "f", "--base", "a..b"],
             r"--base is not a branch name"),
            (["nonsense", "--repo", url, "--head", "f"], r"expected OWNER/REPO#NUMBER"),
            (["o/r#0", "--repo", url, "--head", "f"], r"positive integer"),
            (["o/r#1", "--repo", url, "--head", "f", "--bogus"], r"unknown flag --bogus"),
            (["o/r#1", "--repo", url, "--head"], r"needs a value"),
            ([], None),
        ]
        for args, pattern in usage:
            one_error_line(srv.cli("local", "pr", "open", *args), 2, pattern)
        one_error_line(srv.cli("local", "pr", "close", "o/r#1"), 2)
        # The server's refusal: no repository at that path -> exit 1.
        one_error_line(srv.cli("local", "pr", "open", "o/r#1", "--repo",
                               "file://" + top + "/missing.git", "--head", "f"), 1,
                       r"no git repository")
        st, _, body = srv.request("PUT", "/api/v1/local/pulls/o/r/1",
                                  {"repository": url, "head": "f", "base": "f"})
        assert st == 422, (st, body)
        st, _, body = srv.request("GET", "/api/v1/local/pulls/o/r/1")
        assert st == 404, (st, body)
        # Opening again with the same values: 200, still bound; other values rebind.
        st, _, b = srv.request("PUT", "/api/v1/local/pulls/o/r/1",
                               {"repository": url, "head": "feature"})
        assert st == 201 and b["created"] is True and b["base"] == "main", (st, b)
        st, _, b = srv.request("PUT", "/api/v1/local/pulls/o/r/1",
                               {"repository": url, "head": "feature"})
        assert st == 200 and b["created"] is False, (st, b)
        r = srv.cli("local", "pr", "open", "o/r#1", "--repo", url, "--head", "feature2", "-o",
                    "json")
        assert r.returncode == 0 and json.loads(r.stdout)["head"] == "feature2", r
        # A PR never opened: as before, the task records a local:// placeholder.
        r = srv.cli("local", "comment", "o/plain#5", "/diverge fix it", "--as", "alice")
        assert r.returncode == 0, r
        t = wait(lambda: get_task(srv, "o-plain", "fix-pr-5"), what="task on unopened PR")
        assert t["spec"]["repository"] == {"url": "local://o/plain", "baseBranch": "pr-5",
                                           "workingBranch": "pr-5"}, t["spec"]
        assert "runner" not in t["spec"], t["spec"]
    shutil.rmtree(top, ignore_errors=True)


if __name__ == "__main__":
    run_tests([test_pr_open_fix_completes_on_the_head_branch,
               test_demo_end_to_end_and_idempotent,
               test_bad_agent_yaml_key_is_answered_with_file_line_and_key,
               test_pr_open_errors_and_unopened_prs])
