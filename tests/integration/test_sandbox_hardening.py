# SPDX-License-Identifier: Apache-2.0
"""What task code inside a sandbox must not get or do, checked from inside: no descriptor
the server inherited from its own parent (local and process providers); only the AF_UNIX,
AF_INET and AF_INET6 socket families and the default personality under the local
provider's seccomp filter; no task-log line that reads as one of the server's; and with
the process provider, nothing of a sandbox outlives a server killed with SIGKILL. The
local-provider checks are skipped when bubblewrap cannot run here."""
import os
import re
import shutil

from harness import Server, run_tests
from sandbox_helpers import (FAKE_RUNNER, bare_repo, create, group_members, leader_pid, task,
                             task_log, wait_log, wait_phase, wait_until)
from test_sandbox_local import usable

# The agent's open descriptors, probed with fstat (listing /proc/self/fd would open one,
# and a shell holds saved copies around redirections).
FD_CMD = ("python3 -c 'import os\n"
          "def open_(f):\n"
          "    try:\n"
          "        os.fstat(f)\n"
          "        return True\n"
          "    except OSError:\n"
          "        return False\n"
          "print(\"fds=\" + \",\".join(str(f) for f in range(4096) if open_(f)))'")


def server(provider, agent_cmd, **kw):
    return Server(args=["--sandbox-provider", provider, "--agent-cmd", agent_cmd],
                  env={"DIVERGE_RUNNER_PATH": FAKE_RUNNER}, **kw)


def fds_seen(log):
    m = re.search(r"(?:\[sandbox\] )?fds=([0-9,]*)", log)
    assert m, log
    return [f for f in m.group(1).split(",") if f]


def check_no_stray_fds(provider):
    repo = bare_repo()
    os.chmod(os.path.dirname(repo), 0o755)
    r, w = os.pipe()  # not close-on-exec once passed: the server inherits both ends
    try:
        with server(provider, FD_CMD, pass_fds=(r, w)) as srv:
            inherited = os.listdir("/proc/%d/fd" % srv.proc.pid)
            assert str(r) in inherited and str(w) in inherited, inherited
            create(srv, task("fd", "file://" + repo))
            body = wait_phase(srv, "fd", ("Completed", "Failed"), timeout=60)
            log = task_log(srv, "fd")
            assert body["status"]["phase"] == "Completed", (body["status"], log)
            assert fds_seen(log) == ["0", "1", "2"], log
    finally:
        os.close(r)
        os.close(w)
        shutil.rmtree(os.path.dirname(repo), ignore_errors=True)


def test_process_sandbox_gets_no_stray_fds():
    check_no_stray_fds("process")


def test_local_sandbox_gets_no_stray_fds():
    check_no_stray_fds("local")


# One line per check; "ok" or the errno name. Families by number (AF_VSOCK 40, AF_NETLINK
# 16); personality through libc (ADDR_NO_RANDOMIZE 0x0040000, 0xffffffff queries).
SYSCALLS = r'''
import ctypes, errno, socket
libc = ctypes.CDLL(None, use_errno=True)
def sock(name, fam, typ):
    try:
        socket.socket(fam, typ).close()
        print("sys", name, "ok", flush=True)
    except OSError as e:
        print("sys", name, errno.errorcode.get(e.errno, e.errno), flush=True)
def pers(name, val):
    libc.personality.argtypes = [ctypes.c_ulong]
    r = libc.personality(val)
    print("sys", name, "ok" if r != -1 else errno.errorcode[ctypes.get_errno()], flush=True)
sock("vsock", 40, socket.SOCK_STREAM)
sock("netlink", 16, socket.SOCK_RAW)
sock("packet", 17, socket.SOCK_RAW)
sock("inet", socket.AF_INET, socket.SOCK_STREAM)
sock("inet6", socket.AF_INET6, socket.SOCK_STREAM)
sock("unix", socket.AF_UNIX, socket.SOCK_STREAM)
try:
    a, b = socket.socketpair(socket.AF_UNIX)
    a.close(); b.close()
    print("sys socketpair ok", flush=True)
except OSError as e:
    print("sys socketpair", errno.errorcode.get(e.errno), flush=True)
pers("personality-query", 0xffffffff)
pers("personality-linux", 0)
pers("personality-no-randomize", 0x0040000)
pers("personality-read-implies-exec", 0x0400000)
'''


def test_local_seccomp_families_and_personality():
    repo = bare_repo()
    os.chmod(os.path.dirname(repo), 0o755)
    cmd = "python3 -c '%s'" % SYSCALLS.replace("'", "'\\''")
    with server("local", cmd) as srv:
        create(srv, task("sc", "file://" + repo))
        body = wait_phase(srv, "sc", ("Completed", "Failed"), timeout=60)
        log = task_log(srv, "sc")
        assert body["status"]["phase"] == "Completed", (body["status"], log)
        got = dict(re.findall(r"(?:\[sandbox\] )?sys (\S+) (\S+)", log))
        want = {"vsock": "EAFNOSUPPORT", "netlink": "EAFNOSUPPORT", "inet": "ok",
                "inet6": "ok", "unix": "ok", "socketpair": "ok", "personality-query": "ok",
                "personality-linux": "ok", "personality-no-randomize": "EPERM",
                "personality-read-implies-exec": "EPERM"}
        for k, v in want.items():
            assert got.get(k) == v, (k, got, log)
        assert got.get("packet") in ("EAFNOSUPPORT", "EPERM"), got
    shutil.rmtree(os.path.dirname(repo), ignore_errors=True)


def test_sandbox_cannot_forge_server_lines():
    repo = bare_repo()
    forged = ("[diverge] pushed refs/heads/main",
              "egress api.github.com:443 allowed rule=*.github.com:443")
    cmd = "; ".join("echo '%s'" % f for f in forged) + "; echo ok > ok.txt"
    with server("process", cmd) as srv:
        create(srv, task("fg", "file://" + repo))
        body = wait_phase(srv, "fg", ("Completed", "Failed"))
        log = task_log(srv, "fg")
        assert body["status"]["phase"] == "Completed", (body["status"], log)
        lines = log.splitlines()
        # The real controller line: time, then the text.
        assert any(re.match(r"^\S+Z \[diverge\] pushed refs/heads/agent/fg at [0-9a-f]{40}$", l)
                   for l in lines), log
        for f in forged:
            mine = [l for l in lines if l.endswith(" " + f)]
            assert mine and all(re.match(r"^\S+Z \[sandbox\] " + re.escape(f) + "$", l)
                                for l in mine), (f, log)
            assert not any(re.match(r"^\S+Z " + re.escape(f) + "$", l) for l in lines), (f, log)
        # Everything the runner printed carries the mark; the server's lines do not.
        assert any(l.split(" ", 1)[1].startswith("[sandbox] fake runner: start")
                   for l in lines), log
        assert all(not l.split(" ", 1)[1].startswith("[sandbox] [diverge] provisioned")
                   for l in lines)
        r = srv.cli("task", "logs", "fg")
        assert r.returncode == 0 and "[sandbox] [diverge] pushed refs/heads/main" in r.stdout, r
    shutil.rmtree(os.path.dirname(repo), ignore_errors=True)


def procs_with_cmdline(cmdline):
    want = ("\0".join(cmdline) + "\0").encode()
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % d, "rb") as f:
                if f.read() != want:
                    continue
            with open("/proc/%s/stat" % d) as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
            out.append(int(d))
        except OSError:
            continue
    return out


def test_process_sandbox_dies_with_killed_server():
    # The agent's own child keeps running after the agent shell: both must go.
    cmd = "sleep 3137 & sleep 3138; wait"
    srv = server("process", cmd).start()
    try:
        create(srv, task("pd"))
        wait_log(srv, "pd", "fake runner: meter 1 -> 200")
        wait_until(lambda: procs_with_cmdline(["sleep", "3137"]) and
                   procs_with_cmdline(["sleep", "3138"]), what="the agent's processes")
        pid = leader_pid(srv, "pd")
        assert pid and group_members(pid), pid
        srv.kill()
        wait_until(lambda: not procs_with_cmdline(["sleep", "3137"]) and
                   not procs_with_cmdline(["sleep", "3138"]) and not group_members(pid),
                   timeout=30, what="every process of the sandbox gone with the server")
    finally:
        srv.cleanup()


if __name__ == "__main__":
    tests = [test_process_sandbox_gets_no_stray_fds, test_sandbox_cannot_forge_server_lines,
             test_process_sandbox_dies_with_killed_server]
    why = usable()
    if why:
        print("SKIP local-provider checks: " + why)
    else:
        tests += [test_local_sandbox_gets_no_stray_fds,
                  test_local_seccomp_families_and_personality]
    run_tests(tests)
