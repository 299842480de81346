# SPDX-License-Identifier: Apache-2.0
"""The `diverge` CLI (SPEC §10) end to end against the real `diverge serve`: every verb,
every output format, agent.yaml defaults, and the exit codes 0/1/2/3."""
import concurrent.futures
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time

from harness import API, DIVERGE_BIN, Server, run_tests, task_obj

NS = API + "/namespaces/default/agenttasks"
SERVE_ARGS = ["--sandbox-provider", "none"]

try:
    import yaml  # optional: when present, -o yaml is checked by a full round trip
except ImportError:
    yaml = None


def run(*args, env=None, cwd=None):
    """`diverge ARGS` without any server settings from the environment."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("DIVERGE_")}
    e.update(env or {})
    return subprocess.run([DIVERGE_BIN] + list(args), capture_output=True, text=True, env=e,
                          cwd=cwd, timeout=30)


def one_error_line(p, code, pattern=None):
    """Exit CODE, and stderr is exactly one line starting `diverge: `."""
    assert p.returncode == code, (p.returncode, p.stdout, p.stderr)
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("diverge: "), p.stderr
    if pattern:
        assert re.search(pattern, lines[0]), lines[0]
    return lines[0]


def ok(p):
    assert p.returncode == 0, (p.returncode, p.stdout, p.stderr)
    return p.stdout


def get(srv, name, ns="default"):
    st, _, body = srv.request("GET", API + "/namespaces/%s/agenttasks/%s" % (ns, name))
    return st, body


def wait_active(srv, name, ns="default", timeout=20):
    """The controller moves a new task Pending -> Active (provider none) in the background;
    tests that compare two reads wait for that first, so the task stays put between them."""
    deadline = time.monotonic() + timeout
    while True:
        st, body = get(srv, name, ns)
        if st == 200 and body.get("status", {}).get("phase") == "Active":
            return body
        assert time.monotonic() < deadline, (st, body)
        time.sleep(0.05)


class TempDir:
    def __enter__(self):
        self.path = tempfile.mkdtemp(prefix="diverge-cli-")
        return self.path

    def __exit__(self, *exc):
        shutil.rmtree(self.path, ignore_errors=True)


def closed_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_help_everywhere():
    for args in (["--help"], ["-h"], ["help"], ["task", "--help"], ["help", "task"],
                 ["version", "--help"], ["token", "--help"], ["help", "task", "create"]):
        out = ok(run(*args))
        assert out.startswith("Usage: diverge"), (args, out)
    for sub in ("init", "create", "list", "status", "logs", "guide", "pause", "resume",
                "token"):
        out = ok(run("task", sub, "--help"))
        assert out.startswith("Usage: diverge task " + sub), out
        # --help wins over missing arguments and comes with the global options.
        assert "--namespace" in out
    out = ok(run("task", "create", "--help"))
    for flag in ("--name", "--budget", "--tokens", "--max-iterations", "--base-branch",
                 "--working-branch", "--repo", "--model", "--draft-pr"):
        assert flag in out, flag
    assert ok(run("version")).startswith("diverge ")


def test_usage_errors_exit_2():
    one_error_line(run(), 2, "missing command")
    one_error_line(run("bogus"), 2, 'unknown command "bogus"')
    one_error_line(run("task"), 2, "missing command")
    one_error_line(run("task", "bogus"), 2, 'unknown command "bogus"')
    one_error_line(run("task", "list", "--bogus"), 2, "unknown flag --bogus")
    one_error_line(run("task", "list", "--budget", "5"), 2, "unknown flag --budget")
    one_error_line(run("task", "status"), 2, "expected 1 argument")
    one_error_line(run("task", "status", "a", "b"), 2, "expected 1 argument")
    one_error_line(run("task", "list", "-o", "xml"), 2, 'unknown output format "xml"')
    one_error_line(run("task", "list", "--server"), 2, "needs a value")
    one_error_line(run("task", "create", "x"), 2, "--name is required")
    one_error_line(run("task", "create", "", "--name", "a"), 2, "objective")
    one_error_line(run("task", "create", "x", "--name", "a", "--budget", "abc"), 2, "--budget")
    one_error_line(run("task", "create", "x", "--name", "a", "--budget", "+5"), 2, "--budget")
    one_error_line(run("task", "create", "x", "--name", "a", "--tokens", "1.5"), 2, "--tokens")
    one_error_line(run("task", "create", "x", "--name", "a", "--max-iterations", "-1"), 2,
                   "--max-iterations")
    one_error_line(run("task", "resume", "a", "--budget", "x"), 2, "--budget")
    one_error_line(run("task", "resume", "a", "--tokens", "lots"), 2, "--tokens")
    one_error_line(run("version", "extra"), 2, "expected 0 arguments, got 1")
    one_error_line(run("token", "inspect"), 2)
    one_error_line(run("token", "frobnicate", "x"), 2)
    # A malformed token is a failed operation, not a usage error.
    one_error_line(run("token", "inspect", "x"), 1, "malformed token")


def test_server_down_exit_3():
    url = "http://127.0.0.1:%d" % closed_port()
    for args in (["task", "list"], ["task", "list", "-A"], ["task", "status", "a"],
                 ["task", "create", "x", "--name", "a"], ["task", "guide", "a", "h"],
                 ["task", "pause", "a"], ["task", "resume", "a"],
                 ["task", "resume", "a", "--budget", "+1"]):
        with TempDir() as d:
            one_error_line(run("--server", url, *args, cwd=d), 3, "cannot reach the server")
    # DIVERGE_SERVER is read too.
    one_error_line(run("task", "list", env={"DIVERGE_SERVER": url}), 3, re.escape(url))


def test_init():
    with TempDir() as d:
        assert ok(run("task", "init", cwd=d)) == "wrote .diverge/agent.yaml\n"
        path = os.path.join(d, ".diverge", "agent.yaml")
        with open(path) as f:
            text = f.read()
        assert 'version: "1"' in text and 'budgetUSD: "5.00"' in text
        one_error_line(run("task", "init", cwd=d), 1,
                       r"^diverge: \.diverge/agent\.yaml already exists \(use --force")
        with open(path, "w") as f:
            f.write("junk\n")
        ok(run("task", "init", "--force", cwd=d))
        with open(path) as f:
            assert f.read() == text


def test_create_without_agent_yaml():
    with Server(SERVE_ARGS) as srv, TempDir() as d:
        out = ok(srv.cli("task", "create", "Fix the N+1 query", "--name", "t1",
                         "--budget", "2.5", "--tokens", "200k", "--max-iterations", "3",
                         "--repo", "https://github.com/o/r", "--base-branch", "dev",
                         "--working-branch", "wb", "--model", "m1", "--model", "claude-*",
                         "--draft-pr", cwd=d))
        assert out == "agenttask.divergedev.com/t1 created\n", out
        st, t = get(srv, "t1")
        assert st == 200, t
        s = t["spec"]
        assert s["objective"] == "Fix the N+1 query"
        assert s["budgetUSD"] == "2.50" and s["budgetTokens"] == 200000
        assert s["maxIterations"] == 3 and s["draftPR"] is True
        assert s["repository"] == {"url": "https://github.com/o/r", "baseBranch": "dev",
                                   "workingBranch": "wb"}, s
        assert s["capabilities"] == ["m1", "claude-*"]
        # Minimal: only the objective; the server fills its defaults.
        ok(srv.cli("task", "create", "x", "--name", "t2", cwd=d))
        st, t = get(srv, "t2")
        assert t["spec"]["repository"]["workingBranch"] == "agent/t2", t
        assert "budgetUSD" not in t["spec"] or t["spec"]["budgetUSD"] in ("", "0", "0.00"), t
        # The same name again: the server says no (409) -> exit 1.
        one_error_line(srv.cli("task", "create", "x", "--name", "t2", cwd=d), 1)
        # An invalid name: the server's 422 -> exit 1 with its message.
        one_error_line(srv.cli("task", "create", "x", "--name", "Bad_Name", cwd=d), 1)
        # -n and -o json on create.
        p = srv.cli("-n", "other", "task", "create", "x", "--name", "t3", "-o", "json", cwd=d)
        created = json.loads(ok(p))
        assert created["metadata"]["namespace"] == "other" and created["kind"] == "AgentTask"


def test_create_with_agent_yaml():
    with Server(SERVE_ARGS) as srv, TempDir() as d:
        ok(srv.cli("task", "init", cwd=d))
        ok(srv.cli("task", "create", "from file", "--name", "f1", cwd=d))
        st, t = get(srv, "f1")
        s = t["spec"]
        assert s["capabilities"] == ["claude-3-7-sonnet", "gemini-2.5-pro"], s
        assert s["allowedTools"] == ["git", "go"]
        assert s["budgetUSD"] == "5.00" and s["budgetTokens"] == 200000
        assert s["maxIterations"] == 8
        assert s["repository"]["baseBranch"] == "main"
        assert s["sandbox"] == {"provider": "local", "timeoutSeconds": 1800,
                                "network": "none"}, s
        assert "runner" not in s, s
        # Flags override the file.
        ok(srv.cli("task", "create", "override", "--name", "f2", "--budget", "7",
                   "--tokens", "2M", "--max-iterations", "2", "--base-branch", "release",
                   "--model", "only-this", cwd=d))
        s = get(srv, "f2")[1]["spec"]
        assert s["budgetUSD"] == "7.00" and s["budgetTokens"] == 2000000, s
        assert s["maxIterations"] == 2 and s["repository"]["baseBranch"] == "release"
        assert s["capabilities"] == ["only-this"] and s["allowedTools"] == ["git", "go"]
        # The runner's commands and the sandbox network (SPEC §10).
        with open(os.path.join(d, ".diverge", "agent.yaml"), "w") as f:
            f.write('version: "1"\nagent:\n  command: sh .diverge/agent.sh\n'
                    '  verifyCommand: make test\nsandbox:\n  network: proxy\n'
                    '  allowedHosts: [api.example.com, "*.pypi.org:443"]\n')
        ok(srv.cli("task", "create", "cmds", "--name", "f4", cwd=d))
        s = get(srv, "f4")[1]["spec"]
        assert s["runner"] == {"command": "sh .diverge/agent.sh", "verifyCommand": "make test"}, s
        assert s["sandbox"]["network"] == "proxy", s
        assert s["sandbox"]["allowedHosts"] == ["api.example.com", "*.pypi.org:443"], s
        with open(os.path.join(d, ".diverge", "agent.yaml"), "w") as f:
            f.write('version: "1"\nsandbox:\n  network: everywhere\n')
        one_error_line(srv.cli("task", "create", "x", "--name", "f3", cwd=d), 2,
                       r"agent\.yaml:3: sandbox\.network: expected none or proxy$")
        # A broken file: exit 2, one line naming file, line and key; nothing created.
        with open(os.path.join(d, ".diverge", "agent.yaml"), "w") as f:
            f.write('version: "1"\nagent:\n  budgetTokens: lots\n')
        line = one_error_line(srv.cli("task", "create", "x", "--name", "f3", cwd=d), 2)
        assert line == ("diverge: .diverge/agent.yaml:3: agent.budgetTokens: "
                        "expected a non-negative integer"), line
        with open(os.path.join(d, ".diverge", "agent.yaml"), "w") as f:
            f.write('version: "1"\nagent:\n  budgetUSD: 5\n  colour: blue\n')
        one_error_line(srv.cli("task", "create", "x", "--name", "f3", cwd=d), 2,
                       r"agent\.yaml:4: agent\.colour: unknown key$")
        assert get(srv, "f3")[0] == 404


def test_list():
    with Server(SERVE_ARGS) as srv, TempDir() as d:
        p = srv.cli("task", "list", cwd=d)
        assert p.returncode == 0 and p.stdout == "", p
        assert "No tasks found in namespace default" in p.stderr
        srv.request("POST", NS, task_obj("alpha", budgetUSD="5.00", budgetTokens=1000,
                                         maxIterations=4))
        srv.request("POST", NS, task_obj("a-much-longer-name"))
        srv.request("POST", API + "/namespaces/other/agenttasks", task_obj("beta", ns="other"))
        lines = ok(srv.cli("task", "list", cwd=d)).splitlines()
        assert re.match(r"^NAME +PHASE +ITERATION +COST +BUDGET +TOKENS +AGE$", lines[0]), lines
        assert len(lines) == 3, lines
        # Columns line up: every row's fields start where the header's do.
        starts = [m.start() for m in re.finditer(r"\S+", lines[0])]
        for row in lines[1:]:
            assert [m.start() for m in re.finditer(r"\S+", row)] == starts, (lines[0], row)
        alpha = next(l for l in lines if l.startswith("alpha ")).split()
        assert alpha[2] == "0/4" and alpha[4] == "5.00" and alpha[5] == "0/1000", alpha
        assert re.match(r"^\d+s$", alpha[6]), alpha
        assert "beta" not in "".join(lines)
        lines = ok(srv.cli("task", "list", "-A", cwd=d)).splitlines()
        assert lines[0].split() == ["NAMESPACE", "NAME", "PHASE", "ITERATION", "COST",
                                    "BUDGET", "TOKENS", "AGE"], lines
        assert any(l.split()[:2] == ["other", "beta"] for l in lines), lines
        assert len(lines) == 4
        # Global options before the verb.
        lines = ok(srv.cli("-n", "other", "task", "list", cwd=d)).splitlines()
        assert len(lines) == 2 and lines[1].startswith("beta "), lines
        # -o json is the server's list; -o yaml the same data.
        st, _, want = srv.request("GET", NS)
        assert json.loads(ok(srv.cli("task", "list", "-o", "json", cwd=d))) == want
        y = ok(srv.cli("task", "list", "-o", "yaml", cwd=d))
        assert "kind: AgentTaskList" in y and "- apiVersion: divergedev.com/v1alpha1" in y, y
        if yaml is not None:
            assert yaml.safe_load(y) == want
        p = srv.cli("-n", "empty", "task", "list", "-o", "json", cwd=d)
        assert json.loads(ok(p))["items"] == []


def test_status_formats():
    with Server(SERVE_ARGS) as srv, TempDir() as d:
        srv.request("POST", NS, task_obj(
            "st", objective="fix: it", budgetUSD="2.50", budgetTokens=1000, maxIterations=8,
            repository={"url": "https://github.com/o/r", "baseBranch": "main"}))
        wait_active(srv, "st")
        out = ok(srv.cli("task", "status", "st", cwd=d))
        fields = {}
        for line in out.splitlines():
            k, _, v = line.partition(":")
            fields[k] = v.strip()
        assert fields["Name"] == "st" and fields["Namespace"] == "default", out
        assert fields["Objective"] == "fix: it"
        assert fields["Repository"] == "https://github.com/o/r"
        assert fields["Base branch"] == "main" and fields["Working branch"] == "agent/st"
        assert fields["Iteration"] == "0/8" and fields["Tokens"] == "0/1000"
        assert fields["Cost (USD)"] == "0.00/2.50", fields
        assert fields["Suspended"] == "false" and fields["Guidance"] == "-"
        assert re.match(r"^\S+$", fields["Phase"]), fields
        assert re.match(r"^\d{4}-\d\d-\d\dT.*Z \(\d+s ago\)$", fields["Created"]), fields
        # Values line up in one column.
        cols = {line.index(v) for line in out.splitlines()
                for v in [line.split(":", 1)[1].strip()] if v}
        assert len(cols) == 1, out
        st, got = get(srv, "st")
        assert json.loads(ok(srv.cli("task", "status", "st", "-o", "json", cwd=d))) == got
        pretty = ok(srv.cli("task", "status", "st", "--output=json", cwd=d))
        assert pretty.startswith('{\n  "apiVersion": ') and pretty.endswith("}\n"), pretty
        y = ok(srv.cli("task", "status", "st", "-o", "yaml", cwd=d))
        assert 'budgetUSD: "2.50"' in y and "objective: 'fix: it'" not in y, y
        assert 'objective: "fix: it"' in y
        if yaml is not None:
            assert yaml.safe_load(y) == got
        # Unknown task: exit 1 with the server's message.
        one_error_line(srv.cli("task", "status", "nope", cwd=d), 1, "not found")
        one_error_line(srv.cli("task", "status", "nope", "-o", "yaml", cwd=d), 1)


def test_guide_pause_resume():
    with Server(SERVE_ARGS) as srv, TempDir() as d:
        srv.request("POST", NS, task_obj("g", budgetUSD="2.50", budgetTokens=1000))
        srv.request("POST", NS, task_obj("nobudget"))
        out = ok(srv.cli("task", "guide", "g", "try the cache first", cwd=d))
        assert out == "agenttask.divergedev.com/g guidance set\n", out
        ann = get(srv, "g")[1]["metadata"]["annotations"]
        assert ann["divergedev.com/guidance"] == "try the cache first", ann
        status = ok(srv.cli("task", "status", "g", cwd=d))
        assert re.search(r"^Guidance: +try the cache first$", status, re.M), status
        ok(srv.cli("task", "guide", "g", "", cwd=d))
        ann = get(srv, "g")[1]["metadata"].get("annotations") or {}
        assert "divergedev.com/guidance" not in ann, ann

        assert ok(srv.cli("task", "pause", "g", cwd=d)) == "agenttask.divergedev.com/g paused\n"
        assert get(srv, "g")[1]["spec"]["suspended"] is True
        out = ok(srv.cli("task", "resume", "g", "--budget", "+15.00", "--tokens", "2000000",
                         cwd=d))
        assert out == ("agenttask.divergedev.com/g resumed "
                       "(budget 17.50 USD, 2001000 tokens)\n"), out
        s = get(srv, "g")[1]["spec"]
        assert s["suspended"] is False and s["budgetUSD"] == "17.50", s
        assert s["budgetTokens"] == 2001000
        # Without spec budgets the server defaults (5.00 USD, 1000000 tokens) are the base.
        ok(srv.cli("task", "pause", "nobudget", cwd=d))
        out = ok(srv.cli("task", "resume", "nobudget", "--budget", "$1", "--tokens", "+500k",
                         cwd=d))
        s = get(srv, "nobudget")[1]["spec"]
        assert s["budgetUSD"] == "6.00" and s["budgetTokens"] == 1500000, (out, s)
        # Plain resume, and -o json on a mutation prints the object.
        ok(srv.cli("task", "pause", "nobudget", cwd=d))
        obj = json.loads(ok(srv.cli("task", "resume", "nobudget", "-o", "json", cwd=d)))
        assert obj["spec"]["suspended"] is False and obj["spec"]["budgetUSD"] == "6.00"
        # Unknown task: exit 1 for every mutation.
        for args in (["guide", "nope", "x"], ["pause", "nope"], ["resume", "nope"],
                     ["resume", "nope", "--budget", "+1"]):
            one_error_line(srv.cli("task", *args, cwd=d), 1, "not found")


def test_concurrent_resumes_lose_no_bump():
    """Each resume sends the resourceVersion it read; a 409 makes it read again, so N
    concurrent +1.00 bumps add exactly N dollars."""
    with Server(SERVE_ARGS) as srv, TempDir() as d:
        srv.request("POST", NS, task_obj("race", budgetUSD="5.00"))
        n = 4
        with concurrent.futures.ThreadPoolExecutor(n) as ex:
            procs = list(ex.map(lambda _: srv.cli("task", "resume", "race", "--budget", "+1",
                                                  cwd=d), range(n)))
        for p in procs:
            ok(p)
        assert get(srv, "race")[1]["spec"]["budgetUSD"] == "9.00"


def test_token_sources_and_auth():
    with Server(SERVE_ARGS) as srv, TempDir() as d:
        srv.request("POST", NS, task_obj("a"))
        # Wrong token: the server's 401 -> exit 1.
        one_error_line(srv.cli("task", "list", "--token", "wrong", cwd=d), 1)
        one_error_line(srv.cli("task", "list", env={"DIVERGE_API_TOKEN": "wrong"}, cwd=d), 1)
        # No flag, no env: $DIVERGE_DATA_DIR/api-token, else ./var/api-token.
        ok(srv.cli("task", "list", env={"DIVERGE_API_TOKEN": None,
                                        "DIVERGE_DATA_DIR": srv.data_dir}, cwd=d))
        os.makedirs(os.path.join(d, "var"))
        shutil.copy(os.path.join(srv.data_dir, "api-token"), os.path.join(d, "var"))
        ok(srv.cli("task", "list", env={"DIVERGE_API_TOKEN": None}, cwd=d))
        # --server overrides DIVERGE_SERVER, also before the verb.
        ok(srv.cli("--server", srv.url + "/", "task", "status", "a",
                   env={"DIVERGE_SERVER": "http://127.0.0.1:%d" % closed_port()}, cwd=d))


def test_logs_unavailable_and_token():
    # A provider this build does not run: the task waits, no token, an empty log.
    with Server(args=["--sandbox-provider", "agent-sandbox"]) as srv, TempDir() as d:
        srv.request("POST", NS, task_obj("a"))
        r = srv.cli("task", "logs", "a", cwd=d)
        assert r.returncode == 0 and r.stdout == "", (r.returncode, r.stdout, r.stderr)
        one_error_line(srv.cli("task", "logs", "missing", cwd=d), 1, "not found")
        # Without a running sandbox provider the task has no token yet: exit 1, one line
        # (after the CLI's wait for the token: 0.5 s here instead of 10, docs/testing.md).
        one_error_line(srv.cli("task", "token", "a", cwd=d,
                               env={"DIVERGE_TOKEN_WAIT_MS": "500"}), 1, "no token")
        one_error_line(srv.cli("task", "token", "missing", cwd=d), 1, "not found")


# SPEC §8 reference vector.
REF_TOKEN = ("AgEHZGl2ZXJnZQIIdGFzay0xMjMAAhJ0YXNrX2lkID0gdGFzay0xMjMAAhNtYXhfY29zdF91c2QgPSA1Lj"
             "AwAAAGINK-JhAmYkGspdMojx9f3ildDI80uEXIHF3q5jq8itwQ")
REF_SIG = "d2be2610266241aca5d3288f1f5fde295d0c8f34b845c81c5deae63abc8adc10"


def test_token_inspect_shows_no_signature():
    """`token inspect` prints location, identifier, caveats and a fingerprint, never the
    signature (security review finding 8: with it the output rebuilt a working token)."""
    import base64
    import hashlib
    for arg, stdin in ((REF_TOKEN, None), ("-", REF_TOKEN + "\n")):
        p = subprocess.run([DIVERGE_BIN, "token", "inspect", arg], capture_output=True,
                           text=True, input=stdin, timeout=30)
        assert p.returncode == 0 and p.stderr == "", p
        lines = p.stdout.splitlines()
        assert lines[:4] == ["location: diverge", "identifier: task-123",
                             "caveat: task_id = task-123", "caveat: max_cost_usd = 5.00"], lines
        fp = hashlib.sha256(bytes.fromhex(REF_SIG)).hexdigest()[:16]
        assert len(lines) == 5 and lines[4].startswith("fingerprint: sha256:" + fp + " "), lines
        assert "not the signature" in lines[4]
        sig = bytes.fromhex(REF_SIG)
        out = p.stdout.lower()
        for enc in (REF_SIG, base64.b64encode(sig).decode().rstrip("="),
                    base64.urlsafe_b64encode(sig).decode().rstrip("="), REF_TOKEN[-40:]):
            assert enc.lower()[:16] not in out, enc
        assert "signature:" not in p.stdout


if __name__ == "__main__":
    run_tests([test_help_everywhere, test_usage_errors_exit_2, test_server_down_exit_3,
               test_init, test_create_without_agent_yaml, test_create_with_agent_yaml,
               test_list, test_status_formats, test_guide_pause_resume,
               test_concurrent_resumes_lose_no_bump, test_token_sources_and_auth,
               test_logs_unavailable_and_token, test_token_inspect_shows_no_signature])
