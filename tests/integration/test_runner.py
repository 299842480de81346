# SPDX-License-Identifier: Apache-2.0
"""diverge-agent-runner (SPEC §9) run directly against the real `diverge serve
--sandbox-provider none` and a bare git repository made from examples/demo-repo: the
demo agent fails its first iteration and passes the second, the commit lands on the
working branch, the spend equals the usage lines (each charged once, also across a
restart), a budget stop exits 0 with the task Paused, a disallowed model exits 3, and a
rotated token file is read again. A scripted fake meter on a unix socket covers the
transport, retries, guidance, the preview check and the exit codes 4 and 5."""
import http.server
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time

from harness import Server, run_tests, task_obj
from runner_helpers import (DEMO_AGENT, METER, NS, RUNNER_BIN, FakeMeter, branch_log, git,
                            make_bare_repo, run_runner, runner_env, show_file, usage_lines)

ARGS = ["--sandbox-provider", "none"]


def wait_phase(srv, name, phase, timeout=10):
    deadline = time.time() + timeout
    b = None
    while time.time() < deadline:
        st, _, b = srv.request("GET", NS + "/" + name)
        if st == 200 and b["status"]["phase"] == phase:
            return b
        time.sleep(0.02)
    raise AssertionError("task %s never reached %s: %s" % (name, phase, b))


def create_task(srv, name, **spec):
    st, _, b = srv.request("POST", NS, task_obj(name, objective="fix the greeting", **spec))
    assert st == 201, b
    wait_phase(srv, name, "Active")
    st, _, tok = srv.request("GET", NS + "/" + name + "/token")
    assert st == 200, tok
    return tok.strip()


def token_file(srv, name):
    # The file the server writes (and rewrites on resume): the sandbox's token file.
    return os.path.join(srv.data_dir, "tokens", "default", name, "token")


def server_env(srv, tmp, name, repo, **extra):
    return runner_env(tmp, name, repo, DIVERGE_METER_URL=srv.url + METER,
                      DIVERGE_TOKEN_FILE=token_file(srv, name), **extra)


def status_of(srv, name):
    st, _, b = srv.request("GET", NS + "/" + name)
    assert st == 200, b
    return b["status"]


def micros(s):
    whole, _, frac = str(s).partition(".")
    return int(whole) * 1000000 + int((frac + "000000")[:6])


def usage_totals(path):
    lines = usage_lines(path)
    return sum(l["tokensUsed"] for l in lines), sum(micros(l["costUSD"]) for l in lines)


def check_out(r, code):
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)


def test_demo_fails_then_passes_and_pushes():
    tmp = tempfile.mkdtemp(prefix="runner-")
    try:
        with Server(ARGS) as srv:
            tok = create_task(srv, "demo", budgetUSD="5.00", maxIterations=5)
            repo = make_bare_repo(tmp)
            env = server_env(srv, tmp, "demo", repo, DEMO_AGENT_CALLS="2")
            r = run_runner(env)
            check_out(r, 0)
            assert "iteration 1/5: agent exit 0, verify exit 1" in r.stdout, r.stdout
            assert "iteration 2/5: agent exit 0, verify exit 0" in r.stdout, r.stdout
            assert "iteration 3/5" not in r.stdout
            assert tok not in r.stdout and tok not in r.stderr  # never print the token
            # The fix is on the working branch of the remote, with the SPEC subject.
            subject, author = branch_log(repo, "agent/demo")
            assert subject == "fix(demo): fix the greeting", subject
            assert author == "diverge-agent <agent@diverge.invalid>", author
            assert show_file(repo, "agent/demo", "greeting.txt") == "Hello, world!\n"
            assert branch_log(repo, "main")[0] == "demo"  # the base is untouched
            # Spend equals the usage lines: 2 iterations x 2 lines.
            usage = env["DIVERGE_USAGE_FILE"]
            tokens, cost = usage_totals(usage)
            assert (tokens, cost) == (4800, 72000), (tokens, cost)
            s = status_of(srv, "demo")
            assert s["tokensConsumed"] == tokens and micros(s["costUSD"]) == cost, s
            assert s["iteration"] == 2, s
            ids = s["lastMeterRequestIds"]
            assert "demo-u0" in ids and "demo-i1-h" in ids, ids
            with open(usage + ".offset") as f:
                assert int(f.readline()) == os.path.getsize(usage)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_restart_continues_and_charges_each_line_once():
    tmp = tempfile.mkdtemp(prefix="runner-")
    try:
        with Server(ARGS) as srv:
            create_task(srv, "again", budgetUSD="5.00")
            repo = make_bare_repo(tmp)
            env = server_env(srv, tmp, "again", repo, DIVERGE_MAX_ITERATIONS="1")
            r = run_runner(env)
            check_out(r, 1)  # its only iteration failed
            assert "iteration 1/1: agent exit 0, verify exit 1" in r.stdout, r.stdout
            s = status_of(srv, "again")
            assert s["tokensConsumed"] == 1200 and s["costUSD"] == "0.018", s
            assert branch_log(repo, "agent/again") is None
            # The state write after the answer was lost (a crash): the same requestIds
            # are sent again and the server charges nothing twice.
            os.unlink(env["DIVERGE_USAGE_FILE"] + ".offset")
            env.update(DIVERGE_START_ITERATION="2", DIVERGE_MAX_ITERATIONS="3")
            r = run_runner(env)
            check_out(r, 0)
            assert "already holds a clone" in r.stdout, r.stdout
            assert "iteration 1/" not in r.stdout
            assert "iteration 2/3: agent exit 0, verify exit 0" in r.stdout, r.stdout
            tokens, cost = usage_totals(env["DIVERGE_USAGE_FILE"])
            assert (tokens, cost) == (2400, 36000)
            s = status_of(srv, "again")
            assert s["tokensConsumed"] == tokens and micros(s["costUSD"]) == cost, s
            assert branch_log(repo, "agent/again")[0] == "fix(again): fix the greeting"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_budget_stop_pauses_then_resume_completes():
    tmp = tempfile.mkdtemp(prefix="runner-")
    try:
        with Server(ARGS) as srv:
            create_task(srv, "broke", budgetUSD="0.03")
            repo = make_bare_repo(tmp)
            env = server_env(srv, tmp, "broke", repo, DEMO_AGENT_COST="0.05")
            r = run_runner(env)
            check_out(r, 0)  # 429: the task is paused, the runner stops at once
            assert "task paused" in r.stdout, r.stdout
            assert "iteration 2/" not in r.stdout, r.stdout
            s = status_of(srv, "broke")
            assert s["phase"] == "Paused" and s["reason"] == "BudgetExceeded", s
            assert s["costUSD"] == "0.05", s
            assert branch_log(repo, "agent/broke") is None  # nothing pushed
            # Resume with more budget: a new token in the same file, a new runner
            # continues from the next iteration and completes.
            st, _, b = srv.request("PATCH", NS + "/broke",
                                   {"spec": {"suspended": False, "budgetUSD": "1.00"}},
                                   headers={"Content-Type": "application/merge-patch+json"})
            assert st == 200, b
            wait_phase(srv, "broke", "Active")
            env["DIVERGE_START_ITERATION"] = "2"
            r = run_runner(env)
            check_out(r, 0)
            assert "iteration 2/5: agent exit 0, verify exit 0" in r.stdout, r.stdout
            s = status_of(srv, "broke")
            assert s["costUSD"] == "0.10" and s["tokensConsumed"] == 2400, s
            assert branch_log(repo, "agent/broke")[0] == "fix(broke): fix the greeting"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_models_restricted():
    tmp = tempfile.mkdtemp(prefix="runner-")
    try:
        with Server(ARGS) as srv:
            # An allowed model completes; the heartbeats without usage carry an allowed
            # model (from the token), so they are not refused.
            create_task(srv, "models-ok", capabilities=["claude-*"])
            repo = make_bare_repo(os.path.join(tmp, "a"))
            env = server_env(srv, os.path.join(tmp, "a"), "models-ok", repo,
                             DEMO_AGENT_MODEL="claude-3-7-sonnet")
            r = run_runner(env)
            check_out(r, 0)
            assert status_of(srv, "models-ok")["tokensConsumed"] == 2400
            # A disallowed model: 403 -> exit 3, nothing charged, the line not consumed.
            create_task(srv, "models-no", capabilities=["claude-*"])
            repo = make_bare_repo(os.path.join(tmp, "b"))
            env = server_env(srv, os.path.join(tmp, "b"), "models-no", repo,
                             DEMO_AGENT_MODEL="gpt-4o")
            r = run_runner(env)
            check_out(r, 3)
            assert "HTTP 403" in r.stdout, r.stdout
            s = status_of(srv, "models-no")
            assert s["tokensConsumed"] == 0 and s["phase"] == "Active", s
            state = env["DIVERGE_USAGE_FILE"] + ".offset"
            assert not os.path.exists(state) or open(state).readline().strip() == "0"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


ROTATE = r'''
import json, os, sys, time, urllib.request
if os.environ.get("DIVERGE_ITERATION") != "1":
    sys.exit(0)
url, tok, name = sys.argv[1], sys.argv[2], sys.argv[3]
def call(method, body=None):
    req = urllib.request.Request(url + "/" + name, method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": "Bearer " + tok,
                 "Content-Type": "application/merge-patch+json"})
    return json.loads(urllib.request.urlopen(req, timeout=30).read())
def wait(phase):
    for _ in range(500):
        if call("GET")["status"]["phase"] == phase:
            return
        time.sleep(0.02)
    sys.exit("never " + phase)
call("PATCH", {"spec": {"suspended": True}}); wait("Paused")
call("PATCH", {"spec": {"suspended": False}}); wait("Active")
'''


def test_rotated_token_file_is_read_again():
    tmp = tempfile.mkdtemp(prefix="runner-")
    try:
        with Server(ARGS) as srv:
            tok1 = create_task(srv, "rot", budgetUSD="5.00")
            repo = make_bare_repo(tmp)
            helper = os.path.join(tmp, "rotate.py")
            with open(helper, "w") as f:
                f.write(ROTATE)
            # Iteration 1 pauses and resumes the task: the server revokes tok1 and writes
            # a new token to the same file; the next heartbeat must use it.
            cmd = "sh %s && python3 %s %s %s rot" % (DEMO_AGENT, helper, srv.url + NS,
                                                     srv.token)
            env = server_env(srv, tmp, "rot", repo, DIVERGE_AGENT_CMD=cmd)
            r = run_runner(env)
            check_out(r, 0)
            with open(token_file(srv, "rot")) as f:
                assert f.read().strip() != tok1
            s = status_of(srv, "rot")
            assert s["tokensConsumed"] == 2400 and s["phase"] == "Active", s
            # With the revoked token given in the environment instead: 401 -> exit 4.
            shutil.rmtree(os.path.join(tmp, "workspace"))
            os.unlink(env["DIVERGE_USAGE_FILE"] + ".offset")
            env["DIVERGE_MACAROON_TOKEN"] = tok1
            r = run_runner(env)
            check_out(r, 4)
            assert tok1 not in r.stdout and tok1 not in r.stderr
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class Preview:
    """A loopback preview answering STATUS_FN(); records the header it got."""

    def __init__(self, status_fn):
        self.status_fn = status_fn
        self.seen = []
        p = self

        class H(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                p.seen.append(self.headers.get("x-diverge-env"))
                self.send_response(p.status_fn())
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = "http://127.0.0.1:%d/?_diverge_env=agent-preview-x" % self.srv.server_port
        threading.Thread(target=self.srv.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


def test_fake_meter_socket_retry_guidance_preview():
    tmp = tempfile.mkdtemp(prefix="runner-")
    sock = os.path.join(tmp, "meter.sock")
    seen = {"n": 0}

    def answer(body, headers):
        seen["n"] += 1
        if seen["n"] == 1:
            return 503, {"error": "busy"}  # retried with the same requestId
        return 200, {"allowed": True, "guidance": "check the case of every letter"}

    meter = FakeMeter(sock, answer)
    # The preview turns healthy once the agent says so (iteration 2).
    preview = Preview(lambda: 200 if os.path.exists(os.path.join(tmp, "preview-ok")) else 503)
    try:
        repo = make_bare_repo(tmp)
        tokfile = os.path.join(tmp, "token")
        with open(tmp + "/token", "w") as f:
            f.write("tok-abc\n")
        agent = os.path.join(tmp, "agent.sh")
        with open(agent, "w") as f:
            # Records what the runner hands over, appends usage (one junk line, one line
            # with an exponent, one finer than a micro-dollar: charged as one), and lets the
            # preview pass from iteration 2 on.
            f.write('printf "%s|%s\\n" "$DIVERGE_ITERATION" "$DIVERGE_GUIDANCE" >> ../seen\n'
                    'printf "%s\\n---\\n" "$DIVERGE_LAST_FAILURE" >> ../failures\n'
                    'echo "not json" >> "$DIVERGE_USAGE_FILE"\n'
                    'echo \'{"model":"m","tokensUsed":7,"costUSD":2.5e-2}\' >> "$DIVERGE_USAGE_FILE"\n'
                    'echo \'{"model":"m","tokensUsed":1,"costUSD":0.00000049}\' >> "$DIVERGE_USAGE_FILE"\n'
                    'echo "$DIVERGE_ITERATION" > iteration.txt\n'
                    '[ "$DIVERGE_ITERATION" = 1 ] || touch ../preview-ok\n')
        env = runner_env(tmp, "fake", repo, DIVERGE_METER_SOCKET=sock, DIVERGE_TOKEN_FILE=tokfile,
                         DIVERGE_METER_URL="http://127.0.0.1:9/unused",
                         DIVERGE_AGENT_CMD="sh " + agent, DIVERGE_VERIFY_CMD="true",
                         DIVERGE_PREVIEW_URL=preview.url,
                         DIVERGE_PREVIEW_HEADER_KEY="x-diverge-env",
                         DIVERGE_PREVIEW_HEADER_VALUE="agent-preview-x",
                         DIVERGE_PUSH_URL=repo)
        r = run_runner(env)
        check_out(r, 0)
        assert "iteration 1/5: agent exit 0, verify exit 0, preview HTTP 503" in r.stdout, r.stdout
        assert "iteration 2/5: agent exit 0, verify exit 0, preview HTTP 200" in r.stdout, r.stdout
        assert set(preview.seen) == {"agent-preview-x"}, preview.seen
        ids = meter.ids()
        # 503 then the same id again; then usage lines by offset, each once.
        assert ids[0] == ids[1] == "fake-i1-h", ids
        usage_ids = [i for i in ids[2:] if "-u" in i]
        assert len(usage_ids) == len(set(usage_ids)) == 4, ids
        both = [c[2] for c in meter.calls if "-u" in c[2]["requestId"]]
        bodies = [b for b in both if b["tokensUsed"] == 7]
        assert len(bodies) == 2 and all(b["costUSD"] == "0.025" and b["model"] == "m"
                                        for b in bodies), both
        fine = [b for b in both if b["tokensUsed"] == 1]
        assert len(fine) == 2 and all(b["costUSD"] == "0.000001" for b in fine), both
        # Iteration 1's line goes out while the agent runs (live metering: iteration 1) or,
        # when the agent exits before the follower reads it, with iteration 2's first call.
        assert bodies[0]["iteration"] in (1, 2) and bodies[1]["iteration"] == 2, bodies
        assert all(c[1]["authorization"] == "Bearer tok-abc" for c in meter.calls)
        assert all(c[0] == METER for c in meter.calls)
        assert "tok-abc" not in r.stdout and "tok-abc" not in r.stderr
        with open(os.path.join(tmp, "seen")) as f:
            seen_lines = f.read().splitlines()
        assert seen_lines == ["1|check the case of every letter",
                              "2|check the case of every letter"], seen_lines
        with open(os.path.join(tmp, "failures")) as f:
            fails = f.read().split("---\n")
        assert fails[0].strip() == "", fails
        assert fails[1].startswith("iteration 1: the preview answered HTTP 503"), fails
        assert "ignored" in r.stdout  # the junk lines
        assert branch_log(repo, "agent/fake")[0] == "fix(fake): fix the greeting"
        assert show_file(repo, "agent/fake", "iteration.txt") == "2\n"
    finally:
        meter.close()
        preview.close()
        shutil.rmtree(tmp, ignore_errors=True)


def test_fake_meter_exit_codes():
    tmp = tempfile.mkdtemp(prefix="runner-")
    try:
        repo = make_bare_repo(tmp)
        base = dict(DIVERGE_MACAROON_TOKEN="tok-xyz", DIVERGE_METER_ATTEMPTS="2",
                    DIVERGE_METER_UNREACHABLE_MS="0")
        # Nothing listens on the socket: retried, then exit 5.
        env = runner_env(tmp, "codes", repo, DIVERGE_METER_SOCKET=os.path.join(tmp, "none.sock"),
                         **base)
        r = run_runner(env)
        check_out(r, 5)
        assert "attempt 2/2" in r.stdout, r.stdout
        # 401 -> exit 4; 400 -> exit 7; a bad environment -> exit 2.
        for status, code in ((401, 4), (400, 7), (500, 5)):
            sock = os.path.join(tmp, "m%d.sock" % status)
            meter = FakeMeter(sock, lambda b, h, s=status: (s, {"error": "no"}))
            try:
                env = runner_env(tmp, "codes", repo, DIVERGE_METER_SOCKET=sock, **base)
                r = run_runner(env)
                check_out(r, code)
                if status == 500:
                    assert len(meter.calls) == 2, meter.calls
            finally:
                meter.close()
        env = runner_env(tmp, "Bad_Name", repo, DIVERGE_METER_SOCKET="x", **base)
        r = run_runner(env)
        check_out(r, 2)
        assert "DIVERGE_TASK_NAME" in r.stderr, r.stderr
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_unreachable_meter_is_waited_for():
    """A meter socket that takes no connection (a sandbox's socket whose connections are
    all held) is tried again past DIVERGE_METER_ATTEMPTS, with backoff, for up to
    DIVERGE_METER_UNREACHABLE_MS (60 s by default): the runner goes on once it answers."""
    tmp = tempfile.mkdtemp(prefix="runner-")
    sock = os.path.join(tmp, "late.sock")
    meter = None
    try:
        repo = make_bare_repo(tmp)
        env = runner_env(tmp, "late", repo, DIVERGE_METER_SOCKET=sock,
                         DIVERGE_MACAROON_TOKEN="t")
        p = subprocess.Popen([RUNNER_BIN], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
        killer = threading.Timer(240, p.kill)
        killer.start()
        out = []
        for line in p.stdout:
            out.append(line)
            # The default 8 attempts are over: only the longer wait keeps it trying.
            if meter is None and "unreachable for late-i1-h (attempt 9," in line:
                meter = FakeMeter(sock)
        rc = p.wait()
        killer.cancel()
        text = "".join(out)
        assert rc == 0, text
        assert meter is not None and meter.ids()[0] == "late-i1-h", text
        assert "attempt 8/8" in text, text
    finally:
        if meter is not None:
            meter.close()
        shutil.rmtree(tmp, ignore_errors=True)


def test_fake_meter_restart_sends_each_line_once():
    tmp = tempfile.mkdtemp(prefix="runner-")
    sock = os.path.join(tmp, "meter.sock")
    meter = FakeMeter(sock)
    try:
        repo = make_bare_repo(tmp)
        env = runner_env(tmp, "once", repo, DIVERGE_METER_SOCKET=sock,
                         DIVERGE_MACAROON_TOKEN="t", DIVERGE_MAX_ITERATIONS="1",
                         DEMO_AGENT_CALLS="3")
        check_out(run_runner(env), 1)
        env.update(DIVERGE_START_ITERATION="2", DIVERGE_MAX_ITERATIONS="4")
        check_out(run_runner(env), 0)
        ids = meter.ids()
        assert len(ids) == len(set(ids)), ids
        usage = [i for i in ids if "-u" in i]
        size = os.path.getsize(env["DIVERGE_USAGE_FILE"])
        line = size // 6
        assert usage == ["once-u%d" % (k * line) for k in range(6)], (usage, size)
        # Lines are metered as the agent writes them (SPEC §14), or by the final heartbeat
        # when the agent ended before the runner read the file; a final heartbeat that
        # finds nothing new reports the iteration without usage ("-f").
        assert [i for i in ids if not i.endswith("-f")] == [
            "once-i1-h", "once-u0", "once-u%d" % line, "once-u%d" % (2 * line),
            "once-i2-h", "once-u%d" % (3 * line), "once-u%d" % (4 * line),
            "once-u%d" % (5 * line)], ids
        assert set(i for i in ids if i.endswith("-f")) <= {"once-i1-f", "once-i2-f"}, ids
    finally:
        meter.close()
        shutil.rmtree(tmp, ignore_errors=True)


def test_existing_working_branch_is_continued():
    tmp = tempfile.mkdtemp(prefix="runner-")
    sock = os.path.join(tmp, "meter.sock")
    meter = FakeMeter(sock)
    try:
        repo = make_bare_repo(tmp)
        # The working branch already exists on the remote (a PR head) with a commit of
        # its own: the runner tracks it and pushes a fast-forward on top.
        src = os.path.join(tmp, "src")
        git("checkout", "-q", "-b", "agent/cont", cwd=src)
        with open(os.path.join(src, "notes.txt"), "w") as f:
            f.write("work in progress\n")
        git("add", "-A", cwd=src)
        git("-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-q", "-m",
            "wip", cwd=src)
        git("push", "-q", repo[len("file://"):], "agent/cont", cwd=src)
        env = runner_env(tmp, "cont", repo, DIVERGE_METER_SOCKET=sock,
                         DIVERGE_MACAROON_TOKEN="t")
        r = run_runner(env)
        check_out(r, 0)
        assert "exists on the remote" in r.stdout, r.stdout
        bare = repo[len("file://"):]
        parents = git("--git-dir", bare, "log", "-1", "--format=%P", "agent/cont").split()
        wip = git("--git-dir", bare, "rev-parse", "agent/cont~1").strip()
        assert len(parents) == 1 and parents[0] == wip, (parents, wip)
        assert git("--git-dir", bare, "log", "-1", "--format=%s", "agent/cont~1").strip() == "wip"
        assert show_file(repo, "agent/cont", "notes.txt") == "work in progress\n"
        assert show_file(repo, "agent/cont", "greeting.txt") == "Hello, world!\n"
    finally:
        meter.close()
        shutil.rmtree(tmp, ignore_errors=True)


def test_background_child_does_not_block():
    tmp = tempfile.mkdtemp(prefix="runner-")
    sock = os.path.join(tmp, "meter.sock")
    meter = FakeMeter(sock)
    try:
        repo = make_bare_repo(tmp)
        # The agent leaves a process behind that holds its stdout open (a dev server):
        # the runner goes on once the agent itself exited.
        env = runner_env(tmp, "bg", repo, DIVERGE_METER_SOCKET=sock, DIVERGE_MACAROON_TOKEN="t",
                         DIVERGE_AGENT_CMD="sleep 60 & echo $! >> ../bg.pids; sh %s" % DEMO_AGENT)
        r = run_runner(env, timeout=50)
        check_out(r, 0)
        assert "iteration 2/5: agent exit 0, verify exit 0" in r.stdout, r.stdout
    finally:
        try:
            with open(os.path.join(tmp, "bg.pids")) as f:
                for pid in f.read().split():
                    try:
                        os.kill(int(pid), signal.SIGTERM)
                    except OSError:
                        pass
        except OSError:
            pass
        meter.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    run_tests([test_demo_fails_then_passes_and_pushes,
               test_restart_continues_and_charges_each_line_once,
               test_budget_stop_pauses_then_resume_completes,
               test_models_restricted,
               test_rotated_token_file_is_read_again,
               test_fake_meter_socket_retry_guidance_preview,
               test_fake_meter_exit_codes,
               test_unreachable_meter_is_waited_for,
               test_fake_meter_restart_sends_each_line_once,
               test_existing_working_branch_is_continued,
               test_background_child_does_not_block])
