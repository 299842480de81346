# SPDX-License-Identifier: Apache-2.0
"""The local (bubblewrap) provider with the fake runner: isolation checked from inside the
sandbox (not root, cannot read /root or the data dir's root key, cannot reach the
server's TCP port, cannot make a user namespace), the working branch pushed from staging,
pause by freezing. Skipped with a message when bubblewrap or user namespaces are missing."""
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from harness import API, Server, run_tests
from sandbox_helpers import (FAKE_RUNNER, bare_repo, create, get, git, patch, task, task_log,
                             wait_log, wait_phase, wait_until)

CHECKS = ("echo uid=$(id -u); "
          "if ls /root >/dev/null 2>&1; then echo root=readable; else echo root=denied; fi; "
          "if cat {data}/macaroon-root-key >/dev/null 2>&1; then echo key=readable; "
          "else echo key=hidden; fi; "
          "if curl -s -m 3 -o /dev/null \"$DIVERGE_METER_URL\"; then echo server=reachable; "
          "else echo server=unreachable; fi; "
          "curl -s -m 3 -o /dev/null http://127.0.0.1:{port}/; "
          "if [ $? -eq 7 ]; then echo host=unreachable; else echo host=reachable; fi; "
          "echo proxyenv=${HTTPS_PROXY:-}${HTTP_PROXY:-}${ALL_PROXY:-}${https_proxy:-}"
          "${http_proxy:-}${all_proxy:-}${DIVERGE_EGRESS_SOCKET:-}; "
          "if unshare -U true 2>/dev/null; then echo userns=allowed; else echo userns=denied; fi; "
          "if ls {data} >/dev/null 2>&1; then echo datadir=visible; else echo datadir=hidden; fi; "
          "if ls {data}/workspaces/default/other >/dev/null 2>&1; then echo other=visible; "
          "else echo other=hidden; fi; "
          "python3 -c 'import ctypes; l=ctypes.CDLL(None, use_errno=True); "
          "r=l.ptrace(16, 1, 0, 0); print(\"ptrace=\" + (\"denied\" if r != 0 else \"allowed\"))'; "
          "echo isolated > isolated.txt")


def usable():
    if shutil.which("bwrap") is None:
        return "bubblewrap is not installed"
    cmd = ["bwrap", "--unshare-all", "--unshare-user", "--disable-userns", "--ro-bind", "/usr",
           "/usr", "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/lib", "/lib", "--",
           "/usr/bin/true"]
    if os.geteuid() == 0 and shutil.which("setpriv"):
        # As the server will run it: as an unprivileged user (root may pass where that fails).
        cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] + cmd
    r = subprocess.run(cmd, capture_output=True, cwd="/")
    if r.returncode != 0:
        return "bubblewrap cannot create namespaces here: " + r.stderr.decode(errors="replace")
    return None


def test_isolation_from_inside():
    repo = bare_repo()
    os.chmod(os.path.dirname(repo), 0o755)
    data = tempfile.mkdtemp(prefix="diverge-test-")
    # The paths are written into the command: the sandbox gets no environment of ours.
    # Another loopback port of the host (not the server's): a listener that answers HTTP.
    host = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    host.bind(("127.0.0.1", 0))
    host.listen(8)
    host.settimeout(0)
    cmd = CHECKS.replace("{data}", data).replace("{port}", str(host.getsockname()[1]))
    srv = Server(args=["--sandbox-provider", "local", "--agent-cmd", cmd],
                 env={"DIVERGE_RUNNER_PATH": FAKE_RUNNER}, data_dir=data)
    with srv:
        # Another task's workspace, there on the host while this task runs.
        os.makedirs(os.path.join(data, "workspaces", "default", "other"))
        create(srv, task("iso", "file://" + repo))
        body = wait_phase(srv, "iso", ("Completed", "Failed"), timeout=60)
        log = task_log(srv, "iso")
        assert body["status"]["phase"] == "Completed", (body["status"], log)
        assert "sandbox local (bubblewrap)" in log, log
        uid = [l for l in log.splitlines() if " uid=" in l]
        assert uid and not uid[0].endswith("uid=0"), log
        # ... and it is the sandbox user's (as the provider logged it).
        as_uid = re.search(r"sandbox local \(bubblewrap\) as uid (\d+)", log)
        assert as_uid and uid[0].endswith("uid=" + as_uid.group(1)), log
        if os.geteuid() == 0:
            import pwd
            assert int(as_uid.group(1)) == pwd.getpwnam("diverge-sandbox").pw_uid, log
        # The host's loopback listener saw no connection; no proxy variables in none mode.
        try:
            host.accept()
            reached = True
        except BlockingIOError:
            reached = False
        assert not reached and "host=unreachable" in log, log
        assert re.search(r" proxyenv=$", log, re.M), log
        assert "network proxy" not in log, log
        # No network, yet the runner meters through the server's unix socket.
        assert "meter 1 -> 200 (unix socket)" in log, log
        for want in ("root=denied", "key=hidden", "server=unreachable", "userns=denied",
                     "datadir=hidden", "other=hidden", "ptrace=denied"):
            assert want in log, (want, log)
        assert git("--git-dir", repo, "show", "agent/iso:isolated.txt") == "isolated\n"
        # The same checks outside a sandbox do see them (the probes are not vacuous).
        out = subprocess.run(["sh", "-c", cmd.split("; python3")[0]], capture_output=True,
                             text=True, cwd=data).stdout
        assert "key=readable" in out and "datadir=visible" in out and "other=visible" in out, out
        assert "host=reachable" in out, out
    host.close()
    shutil.rmtree(os.path.dirname(repo), ignore_errors=True)
    shutil.rmtree(data, ignore_errors=True)


def test_hostile_staging_repo_runs_nothing_on_the_host():
    """The sandbox owns its staging repo; the server pushes from it as root after the
    runner exited. Hooks and config planted there must not run nor redirect the push."""
    repo = bare_repo()
    other = bare_repo()
    for r in (repo, other):
        os.chmod(os.path.dirname(r), 0o755)
    marker = "/tmp/diverge-hook-ran-%d" % os.getpid()
    cmd = ("echo ok > ok.txt; S=/diverge/staging.git; "
           "printf '#!/bin/sh\\ntouch %s\\n' > $S/hooks/pre-push; chmod +x $S/hooks/pre-push; "
           "git config --file $S/config url.file://%s.insteadOf file://%s; "
           "echo /etc > $S/objects/info/alternates" % (marker, other, repo))
    with Server(args=["--sandbox-provider", "local", "--agent-cmd", cmd],
                env={"DIVERGE_RUNNER_PATH": FAKE_RUNNER}) as srv:
        create(srv, task("hs", "file://" + repo))
        body = wait_phase(srv, "hs", ("Completed", "Failed"), timeout=60)
        log = task_log(srv, "hs")
        assert "agent exited 0" in log, log
        assert not os.path.exists(marker), "a hook of the staging repo ran on the host"
        assert "agent/hs" not in git("--git-dir", other, "branch"), "the push was redirected"
        assert body["status"]["phase"] == "Completed", (body["status"], log)
        assert git("--git-dir", repo, "show", "agent/hs:ok.txt") == "ok\n"
    for r in (repo, other):
        shutil.rmtree(os.path.dirname(r), ignore_errors=True)


def cgroup_dirs(srv, name):
    """(freezer dir, pids dir, v2) of the task's cgroups from its log; dirs None without."""
    m = re.search(r"cgroup (v1|v2) (/\S+): ", task_log(srv, name))
    if not m:
        return None, None, False
    d = m.group(2)
    if m.group(1) == "v2":
        return d, d, True
    return d, d.replace("/freezer/", "/pids/", 1), False


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def test_pause_freezes_setsid_and_fork_bomb():
    # A child that left the session and a fork bomb capped by the pids limit.
    cmd = ("setsid sleep 300 & (i=0; while [ $i -lt 100 ]; do sleep 300 & i=$((i+1)); done) "
           "2>/dev/null; echo bombed; exec sleep 300")
    with Server(args=["--sandbox-provider", "local", "--agent-cmd", cmd, "--sandbox-pids", "40"],
                env={"DIVERGE_RUNNER_PATH": FAKE_RUNNER}) as srv:
        create(srv, task("fz"))
        wait_phase(srv, "fz", "Active")
        wait_log(srv, "fz", "bombed")
        freezer, pids, v2 = cgroup_dirs(srv, "fz")
        cg = freezer is not None and os.path.isdir(freezer)
        if cg:
            assert int(read(os.path.join(pids, "pids.current")) or 0) <= 40
            assert "pids limited" in task_log(srv, "fz"), task_log(srv, "fz")
        patch(srv, "fz", {"suspended": True})
        wait_phase(srv, "fz", "Paused")
        assert "every process frozen" in task_log(srv, "fz"), task_log(srv, "fz")
        if cg:
            if v2:
                assert "frozen 1" in read(os.path.join(freezer, "cgroup.events"))
            else:
                assert read(os.path.join(freezer, "freezer.state")).strip() == "FROZEN"
            procs = read(os.path.join(freezer, "cgroup.procs")).split()
            # The setsid'd sleep is in the frozen cgroup too.
            sids = set()
            for p in procs:
                stat = read("/proc/%s/stat" % p)
                if stat:
                    sids.add(stat.rsplit(")", 1)[1].split()[3])
            assert len(sids) >= 2, sids
        patch(srv, "fz", {"suspended": False})
        wait_phase(srv, "fz", "Active")
        wait_log(srv, "fz", "resumed (thawed")
        if cg:
            assert read(os.path.join(freezer, "freezer.state")).strip() in ("THAWED", "") or v2
        st, _, _ = srv.request("DELETE", API + "/namespaces/default/agenttasks/fz")
        assert st == 200
        if cg:
            wait_until(lambda: not os.path.exists(freezer), what="cgroup removed")


def test_restart_after_kill9():
    # The first runner marks the workspace and waits; the one started after the restart
    # finds the mark (same workspace) and finishes.
    cmd = "if [ -f restarted ]; then exit 0; fi; touch restarted; echo marked; exec sleep 300"
    args = ["--sandbox-provider", "local", "--agent-cmd", cmd]
    env = {"DIVERGE_RUNNER_PATH": FAKE_RUNNER}
    srv = Server(args=args, env=env).start()
    try:
        create(srv, task("rs"))
        wait_phase(srv, "rs", "Active")
        wait_log(srv, "rs", "marked")
        freezer, _, _ = cgroup_dirs(srv, "rs")
        srv.kill()
        srv2 = Server(args=args, env=env, data_dir=srv.data_dir).start()
        try:
            body = wait_phase(srv2, "rs", ("Completed", "Failed"), timeout=60)
            log = task_log(srv2, "rs")
            assert "restarted after server restart" in log, log
            assert body["status"]["phase"] == "Completed", (body["status"], log)
            if freezer is not None:
                wait_until(lambda: not os.path.exists(freezer), what="cgroup removed")
        finally:
            srv2.cleanup()
    finally:
        srv.cleanup()
        shutil.rmtree(srv.data_dir, ignore_errors=True)


def test_frozen_sandbox_swept_after_kill9():
    """Frozen processes ignore the parent-death signal until thawed: the next server of
    the data dir kills them; the task stays Paused and resumes with a new runner."""
    cmd = "if [ -f restarted ]; then exit 0; fi; touch restarted; echo marked; exec sleep 300"
    args = ["--sandbox-provider", "local", "--agent-cmd", cmd]
    env = {"DIVERGE_RUNNER_PATH": FAKE_RUNNER}
    srv = Server(args=args, env=env).start()
    try:
        create(srv, task("fk"))
        wait_log(srv, "fk", "marked")
        freezer, _, _ = cgroup_dirs(srv, "fk")
        patch(srv, "fk", {"suspended": True})
        wait_phase(srv, "fk", "Paused")
        srv.kill()
        if freezer is not None:
            assert read(os.path.join(freezer, "cgroup.procs")).split(), "frozen procs expected"
        srv2 = Server(args=args, env=env, data_dir=srv.data_dir).start()
        try:
            if freezer is not None:
                wait_until(lambda: not os.path.exists(freezer), what="frozen cgroup swept")
            assert get(srv2, "fk")["status"]["phase"] == "Paused"
            patch(srv2, "fk", {"suspended": False})
            body = wait_phase(srv2, "fk", ("Completed", "Failed"), timeout=60)
            assert body["status"]["phase"] == "Completed", (body["status"], task_log(srv2, "fk"))
        finally:
            srv2.cleanup()
    finally:
        srv.cleanup()
        shutil.rmtree(srv.data_dir, ignore_errors=True)


def test_stopped_server_leaves_no_cgroup():
    """A server stopped by SIGTERM removes its cgroups: those of a running sandbox (it dies
    with the server) and those made ahead for a start that never came (a task waiting for
    the one running slot). A data dir never served again kept them for good before."""
    cmd = "echo marked; exec sleep 300"
    srv = Server(args=["--sandbox-provider", "local", "--agent-cmd", cmd,
                       "--max-running-tasks", "1"],
                 env={"DIVERGE_RUNNER_PATH": FAKE_RUNNER}).start()
    try:
        create(srv, task("runs"))
        wait_log(srv, "runs", "marked")
        create(srv, task("waits"))
        freezer, _, v2 = cgroup_dirs(srv, "runs")
        if freezer is None:
            print("  (no cgroup here: nothing to check)")
            return
        root = os.path.dirname(freezer)
        roots = [root]
        if not v2:
            roots = [root.replace("/freezer/", "/%s/" % h, 1) for h in os.listdir("/sys/fs/cgroup")]
            roots = [r for r in roots if os.path.isdir(r)]
        wait_until(lambda: os.path.isdir(os.path.join(root, "default.waits")),
                   what="the cgroup made ahead for the waiting task")
        if not v2:
            # The v1 freezer's kernel switch is kept on by an empty frozen cgroup (a pause's
            # write of FROZEN then skips rewriting kernel text): no process in it, ever.
            pin = os.path.join(root, "freeze-pin")
            with open(os.path.join(pin, "freezer.state")) as f:
                assert f.read().strip() == "FROZEN"
            with open(os.path.join(pin, "cgroup.procs")) as f:
                assert f.read() == ""
        assert get(srv, "waits")["status"]["phase"] == "Pending"
        assert srv.stop() == 0, srv.stderr()
        left = [r for r in roots if os.path.exists(r)]
        assert not left, "cgroups left after the server stopped: %s" % left
    finally:
        srv.cleanup()

def test_server_stops_while_a_fetch_hangs():
    """A remote that takes the connection and never answers holds a start's mirror fetch;
    SIGTERM still stops the server at once (its git killed, nothing of it left), and the
    next server of the data dir starts the task again."""
    mute = socket.socket()
    mute.bind(("127.0.0.1", 0))
    mute.listen(8)
    url = "http://127.0.0.1:%d/repo.git" % mute.getsockname()[1]
    args = ["--sandbox-provider", "local", "--agent-cmd", "true"]
    env = {"DIVERGE_RUNNER_PATH": FAKE_RUNNER}
    srv = Server(args=args, env=env).start()
    try:
        create(srv, task("hangs", url))
        wait_until(lambda: gits_of(url), what="the mirror's git on the mute remote")
        t0 = time.time()
        assert srv.stop() == 0, srv.stderr()
        assert time.time() - t0 < 10, "the stop waited %.1f s" % (time.time() - t0)
        wait_until(lambda: not gits_of(url), what="the fetch's git gone")
        assert "the server is stopping" in task_log(srv, "hangs"), task_log(srv, "hangs")
        srv2 = Server(args=args, env=env, data_dir=srv.data_dir).start()
        try:
            wait_until(lambda: gits_of(url), what="the next server's fetch")
            assert get(srv2, "hangs")["status"]["phase"] in ("Pending", "Provisioning")
        finally:
            srv2.cleanup()
    finally:
        mute.close()
        srv.cleanup()
        shutil.rmtree(srv.data_dir, ignore_errors=True)


def gits_of(url):
    """Pids of the processes whose command line names URL."""
    out = []
    for d in os.listdir("/proc"):
        try:
            with open("/proc/%s/cmdline" % d, "rb") as f:
                if url.encode() in f.read():
                    out.append(int(d))
        except (OSError, ValueError):
            continue
    return out


def states(cmdline):
    want = ("\0".join(cmdline) + "\0").encode()
    out = []
    for d in os.listdir("/proc"):
        try:
            with open("/proc/%s/cmdline" % d, "rb") as f:
                if f.read() != want:
                    continue
            with open("/proc/%s/stat" % d) as f:
                out.append(f.read().rsplit(")", 1)[1].split()[0])
        except OSError:
            continue
    return [s for s in out if s != "Z"]


def test_unprivileged_server_pauses_by_sigstop():
    """A server that is not root has no cgroup: pause stops every process of the sandbox
    (also one that left the session, inside bubblewrap's pid namespace) with SIGSTOP."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        print("SKIP test_unprivileged_server_pauses_by_sigstop: needs root and setpriv")
        return
    import harness
    top = tempfile.mkdtemp(prefix="diverge-unpriv-")
    os.chmod(top, 0o755)
    data = os.path.join(top, "data")
    os.mkdir(data, 0o700)
    os.chown(data, 65534, 65534)
    wrapper = os.path.join(top, "diverge")
    with open(wrapper, "w") as f:
        f.write("#!/bin/sh\nexec setpriv --reuid=65534 --regid=65534 --clear-groups %s \"$@\"\n"
                % harness.DIVERGE_BIN)
    os.chmod(wrapper, 0o755)
    saved = harness.DIVERGE_BIN
    harness.DIVERGE_BIN = wrapper
    cmd = "setsid sleep 302 & exec sleep 303"
    srv = Server(args=["--sandbox-provider", "local", "--agent-cmd", cmd],
                 env={"DIVERGE_RUNNER_PATH": FAKE_RUNNER}, data_dir=data)
    try:
        srv.start()
        create(srv, task("up"))
        wait_phase(srv, "up", "Active")
        wait_until(lambda: states(["sleep", "302"]) and states(["sleep", "303"]),
                   what="the agent's processes")
        assert "no cgroup" in task_log(srv, "up"), task_log(srv, "up")
        assert "uid 65534" in task_log(srv, "up"), task_log(srv, "up")
        patch(srv, "up", {"suspended": True})
        wait_phase(srv, "up", "Paused")
        assert states(["sleep", "302"]) == ["T"] and states(["sleep", "303"]) == ["T"], (
            states(["sleep", "302"]), states(["sleep", "303"]))
        patch(srv, "up", {"suspended": False})
        wait_phase(srv, "up", "Active")
        wait_until(lambda: "T" not in states(["sleep", "302"]) + states(["sleep", "303"]),
                   what="thawed")
        st, _, _ = srv.request("DELETE", API + "/namespaces/default/agenttasks/up")
        assert st == 200
        wait_until(lambda: not states(["sleep", "302"]) and not states(["sleep", "303"]),
                   what="every process gone")
    finally:
        harness.DIVERGE_BIN = saved
        srv.cleanup()
        shutil.rmtree(top, ignore_errors=True)


def test_sandbox_tools_folder():
    """--sandbox-tools: a host folder seen read-only at its own path, its bin/ first on
    PATH; refused at start when not a folder or when it holds the data dir; a folder the
    sandbox user cannot reach makes sandboxes unavailable, saying why."""
    from harness import DIVERGE_BIN
    top = tempfile.mkdtemp(prefix="diverge-tools-")
    os.chmod(top, 0o755)
    tools = os.path.join(top, "tools")
    os.makedirs(os.path.join(tools, "bin"))
    with open(os.path.join(tools, "bin", "hello-tool"), "w") as f:
        f.write("#!/bin/sh\necho hello from the tools folder\n")
    os.chmod(os.path.join(tools, "bin", "hello-tool"), 0o755)
    data = tempfile.mkdtemp(prefix="diverge-test-")
    try:
        for bad, why in (("tools", "is not the absolute path of a folder"),
                         (os.path.join(top, "none"), "is not the absolute path of a folder"),
                         (data, "holds or lies inside the data dir")):
            r = subprocess.run([DIVERGE_BIN, "serve", "--data-dir", data, "--sandbox-tools", bad],
                               capture_output=True, text=True, timeout=30)
            assert r.returncode == 2 and why in r.stderr, (bad, r.returncode, r.stderr)
        repo = bare_repo()
        os.chmod(os.path.dirname(repo), 0o755)
        cmd = ("hello-tool; echo path=$PATH; if touch %s/new 2>/dev/null; then "
               "echo tools=writable; else echo tools=readonly; fi" % tools)
        srv = Server(args=["--sandbox-provider", "local", "--agent-cmd", cmd,
                           "--sandbox-tools", tools],
                     env={"DIVERGE_RUNNER_PATH": FAKE_RUNNER}, data_dir=data)
        with srv:
            create(srv, task("tools", "file://" + repo))
            body = wait_phase(srv, "tools", ("Completed", "Failed"), timeout=60)
            log = task_log(srv, "tools")
            assert body["status"]["phase"] == "Completed", (body["status"], log)
            assert "hello from the tools folder" in log, log
            assert "path=%s/bin:/usr/local/bin:/usr/bin:/bin" % tools in log, log
            assert "tools=readonly" in log and not os.path.exists(os.path.join(tools, "new"))
        if os.geteuid() == 0:
            # Root's 0700 folders are not the sandbox user's to reach.
            hidden = tempfile.mkdtemp(prefix="diverge-hidden-")
            os.makedirs(os.path.join(hidden, "tools"))
            try:
                with Server(args=["--sandbox-provider", "local", "--sandbox-tools",
                                  os.path.join(hidden, "tools")]) as srv:
                    _, _, body = srv.request("GET", "/readyz", auth=False)
                    assert "cannot reach it" in body["sandbox"], body
                    assert "--sandbox-tools" in srv.stderr(), srv.stderr()
            finally:
                shutil.rmtree(hidden, ignore_errors=True)
            # A data dir below a folder the sandbox user cannot search (./var of a clone
            # under /root): sandboxes are unavailable, saying which folder and what to do,
            # instead of every task failing with bubblewrap's "Permission denied".
            hidden = tempfile.mkdtemp(prefix="diverge-hidden-")
            for sub in ("var", "var2"):
                os.mkdir(os.path.join(hidden, sub), 0o700)
            try:
                with Server(args=["--sandbox-provider", "local"],
                            data_dir=os.path.join(hidden, "var")) as srv:
                    _, _, body = srv.request("GET", "/readyz", auth=False)
                    assert "cannot reach it: %s is not searchable" % hidden in body["sandbox"], body
                    assert "chmod o+x" in body["sandbox"], body
                os.chmod(hidden, 0o755)
                with Server(args=["--sandbox-provider", "local"],
                            data_dir=os.path.join(hidden, "var2")) as srv:
                    _, _, body = srv.request("GET", "/readyz", auth=False)
                    assert "sandbox" not in body, body
            finally:
                shutil.rmtree(hidden, ignore_errors=True)
    finally:
        shutil.rmtree(top, ignore_errors=True)
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    why = usable()
    if why:
        print("SKIP test_sandbox_local: " + why)
        sys.exit(0)
    run_tests([test_isolation_from_inside, test_pause_freezes_setsid_and_fork_bomb,
               test_restart_after_kill9, test_hostile_staging_repo_runs_nothing_on_the_host,
               test_unprivileged_server_pauses_by_sigstop, test_frozen_sandbox_swept_after_kill9,
               test_sandbox_tools_folder, test_stopped_server_leaves_no_cgroup,
               test_server_stops_while_a_fetch_hangs])
