# SPDX-License-Identifier: Apache-2.0
"""`--sandbox-network proxy` end to end with the local (bubblewrap) provider and the real
diverge-agent-runner (SPEC §9 "Network"): from inside the sandbox an allowed loopback test
host is reached only through the runner's relay on 127.0.0.1:3128 and the server's
per-task CONNECT proxy; a loopback port that is not allowed, `localhost` when only
`127.0.0.1:PORT` is allowed, and an unlisted name get 403 with X-Proxy-Error (the denied
listener sees no connection); direct connects fail; every decision is an egress line in
the task log; the proxy socket is gone once the task completes or is deleted. Only
loopback listeners and `.invalid` names: nothing can leave the host even if the code is
broken. Skipped when bubblewrap cannot run here."""
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading

import harness
from harness import API, Server, run_tests
from sandbox_helpers import create, git, task, task_log, wait_log, wait_phase, wait_until
from test_sandbox_local import usable

PROBE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_probe.py")
NS = API + "/namespaces/default/agenttasks/"


class Listener:
    """A loopback TCP listener that records every connection and answers "pong" to a
    line."""

    def __init__(self):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.peers = []
        self.lines = []
        self.closing = False
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self):
        while not self.closing:
            try:
                conn, peer = self.sock.accept()
            except OSError:
                return
            self.peers.append(peer)
            try:
                conn.settimeout(10)
                data = b""
                while not data.endswith(b"\n"):
                    chunk = conn.recv(64)
                    if not chunk:
                        break
                    data += chunk
                self.lines.append(data)
                conn.sendall(b"pong\n")
            except OSError:
                pass
            conn.close()

    def close(self):
        self.closing = True
        self.sock.close()


def probe_repo(allowed, denied):
    """A bare repository whose main holds the probe script; returns (top dir, bare)."""
    top = tempfile.mkdtemp(prefix="diverge-egress-")
    os.chmod(top, 0o755)
    bare = os.path.join(top, "repo.git")
    work = os.path.join(top, "work")
    git("init", "-q", "--bare", "-b", "main", bare)
    git("init", "-q", "-b", "main", work)
    shutil.copy(PROBE, os.path.join(work, "probe.py"))
    git("add", "probe.py", cwd=work)
    git("commit", "-q", "-m", "probe", cwd=work)
    git("push", "-q", bare, "main", cwd=work)
    return top, bare


def add_file(bare, name, text):
    """Commits NAME with TEXT on main of BARE."""
    work = tempfile.mkdtemp(prefix="diverge-egress-work-")
    git("clone", "-q", bare, work)
    with open(os.path.join(work, name), "w") as f:
        f.write(text)
    git("add", name, cwd=work)
    git("commit", "-q", "-m", "add " + name, cwd=work)
    git("push", "-q", "origin", "main", cwd=work)
    shutil.rmtree(work, ignore_errors=True)


def egress_dirs(data):
    root = os.path.join(data, "egress")
    return sorted(os.listdir(root)) if os.path.isdir(root) else []


def probe_lines(log):
    return [l.split(" probe ", 1)[1] for l in log.splitlines() if " probe " in l]


def test_proxy_mode_from_inside():
    allowed, denied = Listener(), Listener()
    top, bare = probe_repo(allowed.port, denied.port)
    data = tempfile.mkdtemp(prefix="diverge-test-")
    # The server's port is known once it runs: the probe reads it from a file committed
    # to the repository then.
    srv = Server(args=["--sandbox-provider", "local", "--sandbox-network", "proxy",
                       "--sandbox-allow-host", "127.0.0.1:%d" % allowed.port,
                       "--sandbox-allow-host", "*.example.invalid",
                       "--agent-cmd", "python3 probe.py %d %d $(cat server-port)" % (
                           allowed.port, denied.port)], data_dir=data)
    try:
        with srv:
            # The server's own port, even when a task lists it, stays refused.
            add_file(bare, "server-port", "%d\n" % srv.port)
            create(srv, task("egr", "file://" + bare,
                             sandbox={"allowedHosts": ["127.0.0.1:%d" % srv.port]}))
            body = wait_phase(srv, "egr", ("Completed", "Failed"), timeout=90)
            log = task_log(srv, "egr")
            assert body["status"]["phase"] == "Completed", (body["status"], log)
            probes = probe_lines(log)
            want = [
                "env HTTPS_PROXY=http://127.0.0.1:3128",
                "env HTTP_PROXY=http://127.0.0.1:3128",
                "env ALL_PROXY=http://127.0.0.1:3128",
                "env https_proxy=http://127.0.0.1:3128",
                "env http_proxy=http://127.0.0.1:3128",
                "env all_proxy=http://127.0.0.1:3128",
                "env NO_PROXY=localhost,127.0.0.1,::1",
                "env no_proxy=localhost,127.0.0.1,::1",
                "env DIVERGE_EGRESS_SOCKET=/diverge/egress/proxy.sock",
                "proxy-allowed 200 pong",
            ]
            for w in want:
                assert w in probes, (w, log)
            # Without the proxy nothing of the host is reachable (own network namespace).
            assert any(p.startswith("direct-allowed refused") for p in probes), log
            assert any(p.startswith("direct-denied refused") for p in probes), log
            for name in ("proxy-denied-port", "proxy-localhost", "proxy-invalid-name",
                         "proxy-server"):
                line = [p for p in probes if p.startswith(name + " ")]
                assert line and line[0].startswith(name + " 403 x-proxy-error="), (name, log)
                assert "x-proxy-error=<none>" not in line[0], (name, log)
            # The allowed listener saw exactly the proxied connection; the denied one none.
            assert allowed.lines == [b"ping\n"], allowed.lines
            assert denied.peers == [], denied.peers
            # One egress line per decision, and the close with bytes each way.
            rule = "rule=127.0.0.1:%d" % allowed.port
            assert "egress 127.0.0.1:%d allowed %s" % (allowed.port, rule) in log, log
            assert "egress 127.0.0.1:%d allowed %s closed bytes_out=5 bytes_in=5" % (
                allowed.port, rule) in log, log
            assert "egress 127.0.0.1:%d denied" % denied.port in log, log
            assert "egress localhost:%d denied" % allowed.port in log, log
            assert "egress nowhere.invalid:443 denied" in log, log
            assert "egress 127.0.0.1:%d denied reason=own-address" % srv.port in log, log
            assert "proxy-server 403 x-proxy-error=own-address" in probes, log
            assert "network proxy: egress only through the server's proxy (3 allowlist rules)" \
                in log, log
            # The work was pushed; the proxy went with the sandbox.
            assert git("--git-dir", bare, "show", "agent/egr:probe-done.txt") == "done\n"
            wait_until(lambda: egress_dirs(data) == [], what="the proxy socket removed")
    finally:
        allowed.close()
        denied.close()
        shutil.rmtree(top, ignore_errors=True)
        shutil.rmtree(data, ignore_errors=True)


def socket_files(data):
    out = []
    for d in egress_dirs(data):
        p = os.path.join(data, "egress", d, "proxy.sock")
        if os.path.exists(p):
            out.append(p)
    return out


def thread_count(pid):
    return len(os.listdir("/proc/%d/task" % pid))


def test_proxy_gone_when_task_deleted_and_per_task_network():
    """spec.sandbox.network may lower the server's proxy to none; deleting a running task
    removes its proxy socket and threads."""
    top, bare = probe_repo(1, 2)
    data = tempfile.mkdtemp(prefix="diverge-test-")
    hold = "echo started; while [ ! -e /nonexistent ]; do sleep 0.2; done"
    srv = Server(args=["--sandbox-provider", "local", "--sandbox-network", "proxy",
                       "--agent-cmd", hold], data_dir=data)
    try:
        with srv:
            base = thread_count(srv.proc.pid)
            # A task asking for proxy (the server allows it) gets one.
            create(srv, task("px", "file://" + bare, sandbox={"network": "proxy",
                                                              "allowedHosts": ["x.invalid"]}))
            wait_log(srv, "px", "started", timeout=60)
            socks = socket_files(data)
            assert len(socks) == 1, (socks, task_log(srv, "px"))
            assert "(1 allowlist rule)" in task_log(srv, "px")
            st, _, _ = srv.request("DELETE", NS + "px")
            assert st == 200, st
            wait_until(lambda: egress_dirs(data) == [], what="the proxy socket removed")
            assert not os.path.exists(socks[0])
            wait_until(lambda: thread_count(srv.proc.pid) <= base, what="proxy threads gone")
            # An explicit none on the task: no proxy, no proxy variables.
            create(srv, task("nx", "file://" + bare, sandbox={"network": "none"}))
            wait_log(srv, "nx", "started", timeout=60)
            assert egress_dirs(data) == [], egress_dirs(data)
            assert "network proxy" not in task_log(srv, "nx")
    finally:
        shutil.rmtree(top, ignore_errors=True)
        shutil.rmtree(data, ignore_errors=True)


def test_proxy_restarted_after_kill9():
    """serve killed with a sandbox running: the next server sweeps the dead proxy's socket
    and starts a new proxy with the restarted sandbox, which reaches the allowed host."""
    allowed, denied = Listener(), Listener()
    top, bare = probe_repo(allowed.port, denied.port)
    cmd = ("if [ -f restarted ]; then exec python3 probe.py %d %d; fi; touch restarted; "
           "echo marked; exec sleep 300" % (allowed.port, denied.port))
    args = ["--sandbox-provider", "local", "--sandbox-network", "proxy",
            "--sandbox-allow-host", "127.0.0.1:%d" % allowed.port, "--agent-cmd", cmd]
    srv = Server(args=args).start()
    data = srv.data_dir
    try:
        create(srv, task("rk", "file://" + bare))
        wait_log(srv, "rk", "marked", timeout=60)
        old = egress_dirs(data)
        assert len(old) == 1 and len(socket_files(data)) == 1, old
        srv.kill()
        assert egress_dirs(data) == old  # a killed server cannot clean up
        srv2 = Server(args=args, data_dir=data).start()
        try:
            body = wait_phase(srv2, "rk", ("Completed", "Failed"), timeout=90)
            log = task_log(srv2, "rk")
            assert body["status"]["phase"] == "Completed", (body["status"], log)
            after = log.split("restarted after server restart", 1)
            assert len(after) == 2, log
            # A proxy for the first sandbox, a new one for the restarted sandbox.
            assert log.count("network proxy: egress only through the server's proxy") == 2, log
            assert "probe proxy-allowed 200 pong" in after[1], log
            assert "probe proxy-denied-port 403" in after[1], log
            assert allowed.lines == [b"ping\n"] and denied.peers == []
            wait_until(lambda: egress_dirs(data) == [], what="every proxy socket removed")
        finally:
            srv2.cleanup()
    finally:
        allowed.close()
        denied.close()
        srv.cleanup()
        shutil.rmtree(top, ignore_errors=True)
        shutil.rmtree(data, ignore_errors=True)


def test_proxy_stops_with_runner_and_starts_on_resume():
    """The runner stops on a 429 (budget): its sandbox and proxy go; the task resumed with
    more budget gets a new runner and a new proxy, which reaches the allowed host."""
    allowed, denied = Listener(), Listener()
    top, bare = probe_repo(allowed.port, denied.port)
    # First run: one usage line over the budget (the runner stops on the 429); the next
    # runner finds the mark in the state dir and probes.
    cmd = ("if [ -f \"$DIVERGE_USAGE_FILE.mark\" ]; then exec python3 probe.py %d %d; fi; "
           "touch \"$DIVERGE_USAGE_FILE.mark\"; "
           "printf '{\"model\":\"m\",\"tokensUsed\":10,\"costUSD\":0.05}\\n' "
           ">> \"$DIVERGE_USAGE_FILE\"" % (allowed.port, denied.port))
    srv = Server(args=["--sandbox-provider", "local", "--sandbox-network", "proxy",
                       "--sandbox-allow-host", "127.0.0.1:%d" % allowed.port,
                       "--agent-cmd", cmd])
    try:
        with srv:
            create(srv, task("bud", "file://" + bare, budgetUSD="0.03"))
            body = wait_phase(srv, "bud", "Paused", timeout=90)
            assert body["status"]["reason"] == "BudgetExceeded", body["status"]
            wait_log(srv, "bud", "runner exited (status 0)")
            # The runner is gone: so is its proxy.
            wait_until(lambda: egress_dirs(srv.data_dir) == [], what="the proxy removed")
            assert allowed.peers == []
            st, _, b = srv.request("PATCH", NS + "bud",
                                   {"spec": {"suspended": False, "budgetUSD": "1.00"}},
                                   headers={"Content-Type": "application/merge-patch+json"})
            assert st == 200, b
            body = wait_phase(srv, "bud", ("Completed", "Failed"), timeout=90)
            log = task_log(srv, "bud")
            assert body["status"]["phase"] == "Completed", (body["status"], log)
            assert log.count("network proxy: egress only through the server's proxy") == 2, log
            assert "probe proxy-allowed 200 pong" in log.split("resumed", 1)[1], log
            assert allowed.lines == [b"ping\n"] and denied.peers == []
            wait_until(lambda: egress_dirs(srv.data_dir) == [], what="the proxy removed")
    finally:
        allowed.close()
        denied.close()
        shutil.rmtree(top, ignore_errors=True)


def free_port():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def yaml_pr(top, agent_cmd, allowed_hosts):
    """TOP/origin.git whose main holds the probe and a .diverge/agent.yaml asking for
    network proxy and ALLOWED_HOSTS; the PR branch `feature` has one more commit."""
    src = os.path.join(top, "src")
    os.makedirs(os.path.join(src, ".diverge"))
    shutil.copy(PROBE, os.path.join(src, "probe.py"))
    with open(os.path.join(src, ".diverge", "agent.yaml"), "w") as f:
        f.write('version: "1"\nagent:\n  command: %s\n  verifyCommand: "true"\n'
                'sandbox:\n  network: proxy\n  allowedHosts: [%s]\n'
                % (agent_cmd, ", ".join('"%s"' % h for h in allowed_hosts)))
    git("init", "-q", "-b", "main", cwd=src)
    git("add", "-A", cwd=src)
    git("commit", "-q", "-m", "probe", cwd=src)
    git("checkout", "-q", "-b", "feature", cwd=src)
    with open(os.path.join(src, "NOTES.md"), "w") as f:
        f.write("pr\n")
    git("add", "-A", cwd=src)
    git("commit", "-q", "-m", "pr", cwd=src)
    bare = os.path.join(top, "origin.git")
    git("init", "-q", "--bare", "-b", "main", bare)
    git("push", "-q", bare, "main", "feature", cwd=src)
    os.chmod(top, 0o755)
    return bare


def run_pr(srv, ref, bare):
    """Opens local PR REF on BARE, comments /diverge fix and waits for the task; its log."""
    r = srv.cli("local", "pr", "open", ref, "--repo", "file://" + bare, "--head", "feature")
    assert r.returncode == 0, r
    r = srv.cli("local", "comment", ref, "/diverge fix look around", "--as", "alice")
    assert r.returncode == 0, r
    ns, name = ref.split("#")[0].replace("/", "-"), "fix-pr-" + ref.split("#")[1]
    path = API + "/namespaces/%s/agenttasks/%s" % (ns, name)

    def finished():
        st, _, b = srv.request("GET", path)
        return b if st == 200 and b["status"].get("phase") in ("Completed", "Failed") else None
    wait_until(finished, timeout=90, what="the PR task finished")
    st, _, log = srv.request("GET", path + "/log")
    assert st == 200, st
    return log


def test_repository_cannot_open_host_loopback():
    """A repository's agent.yaml asks for network proxy and host-loopback services: under
    --sandbox-network none it gets no network at all; under proxy its 127.0.0.1 rules open
    nothing (only the operator's --sandbox-allow-host does), and the server's TLS listener
    stays refused even to the operator's rule."""
    host, ops = Listener(), Listener()
    tls = free_port()
    top = tempfile.mkdtemp(prefix="diverge-egress-")
    cmd = "python3 probe.py targets host=127.0.0.1:%d tls=127.0.0.1:%d ops=127.0.0.1:%d" % (
        host.port, tls, ops.port)
    bare = yaml_pr(top, cmd, ["127.0.0.1:%d" % host.port, "127.0.0.1:%d" % tls])
    base = ["--sandbox-provider", "local", "--agent-cmd", "exit 9", "--verify-cmd", "exit 9",
            "--tls-listen", "127.0.0.1:%d" % tls]
    env = {"GITHUB_TOKEN": None, "DIVERGE_NOTIFIER_TOKEN": None, "DIVERGE_AGENT_CMD": None,
           "DIVERGE_VERIFY_CMD": None, "DIVERGE_SANDBOX_NETWORK": None,
           "DIVERGE_SANDBOX_ALLOW_HOSTS": None}
    try:
        # The operator's none is a ceiling agent.yaml cannot raise.
        with Server(args=base, env=env) as srv:
            log = run_pr(srv, "octo/loop#1", bare)
            probes = probe_lines(log)
            assert "sandbox.network proxy ignored" in log, log
            assert "network proxy: egress only" not in log, log
            line = [p for p in probes if p.startswith("host ")]
            assert line and line[0].startswith("host no-proxy direct=refused"), log
            assert host.peers == [] and ops.peers == [], (host.peers, ops.peers)
        # Proxy allowed by the operator: only the operator's loopback rule opens anything.
        args = base + ["--sandbox-network", "proxy",
                       "--sandbox-allow-host", "127.0.0.1:%d" % ops.port,
                       "--sandbox-allow-host", "127.0.0.1:%d" % tls]
        with Server(args=args, env=env) as srv:
            log = run_pr(srv, "octo/loop#2", bare)
            probes = probe_lines(log)
            assert "ops 200 pong" in probes, log
            assert "host 403 x-proxy-error=loopback-address" in probes, log
            assert "tls 403 x-proxy-error=own-address" in probes, log
            assert "egress 127.0.0.1:%d denied reason=loopback-address rule=127.0.0.1:%d" % (
                host.port, host.port) in log, log
            assert "egress 127.0.0.1:%d denied reason=own-address" % tls in log, log
            assert host.peers == [], host.peers
            assert ops.lines == [b"ping\n"], ops.lines
    finally:
        host.close()
        ops.close()
        shutil.rmtree(top, ignore_errors=True)


def test_bad_network_flags_refused():
    for args, env in ((["--sandbox-network", "open"], {}),
                      (["--sandbox-allow-host", "exa mple.com"], {}),
                      ([], {"DIVERGE_SANDBOX_ALLOW_HOSTS": "ok.example.com,*.*.bad"})):
        r = subprocess.run([harness.DIVERGE_BIN, "serve", "--listen", "127.0.0.1:0",
                            "--data-dir", tempfile.mkdtemp(prefix="diverge-test-")] + args,
                           capture_output=True, text=True, timeout=30,
                           env=dict(os.environ, **env))
        assert r.returncode == 2, (args, r.returncode, r.stderr)
        assert "--sandbox-network must be none or proxy" in r.stderr or \
            "--sandbox-allow-host" in r.stderr, r.stderr


if __name__ == "__main__":
    why = usable()
    if why:
        print("SKIP test_sandbox_egress: " + why)
        sys.exit(0)
    run_tests([test_bad_network_flags_refused, test_repository_cannot_open_host_loopback,
               test_proxy_mode_from_inside,
               test_proxy_gone_when_task_deleted_and_per_task_network,
               test_proxy_restarted_after_kill9,
               test_proxy_stops_with_runner_and_starts_on_resume])
