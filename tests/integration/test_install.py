#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""`make install DESTDIR=<tmp>` on this test's build dir (already built: nothing is
rebuilt) puts runnable `diverge` and `diverge-agent-runner` under <tmp>/usr/local/bin;
every command has --help; the installed server finds the installed runner next to it."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import BUILD_DIR, SOURCE_DIR, run_tests  # noqa: E402

COMMANDS = ["", "serve", "task", "task init", "task create", "task list", "task status",
            "task logs", "task guide", "task pause", "task resume", "task token", "token",
            "token inspect", "local", "local demo", "local comment", "local thread", "local pr",
            "local pr open", "mcp", "kubeconfig", "version", "help"]

STATE = {}


def installed():
    if "root" not in STATE:
        root = tempfile.mkdtemp(prefix="diverge-install-")
        env = dict(os.environ)
        env.pop("MAKEFLAGS", None)
        env.pop("MFLAGS", None)
        env.pop("MAKELEVEL", None)  # as from a shell: `make test` runs this test inside make
        p = subprocess.run(["make", "install", "BUILD=" + os.path.abspath(BUILD_DIR),
                            "DESTDIR=" + root, "JOBS=1"], cwd=SOURCE_DIR, env=env,
                           capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, "make install failed:\n%s\n%s" % (p.stdout, p.stderr)
        STATE["root"] = root
        STATE["out"] = p.stdout
    return STATE["root"]


def test_make_install_puts_both_programs_under_destdir_prefix():
    root = installed()
    for name in ("diverge", "diverge-agent-runner"):
        path = os.path.join(root, "usr", "local", "bin", name)
        assert os.path.isfile(path) and os.access(path, os.X_OK), path
    # Nothing else is installed: the UI and the demo repository are compiled in.
    found = [os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs]
    assert sorted(found) == ["usr/local/bin/diverge", "usr/local/bin/diverge-agent-runner"], found
    # Short output: progress, not a line per object or make's directory chatter.
    assert "Entering directory" not in STATE["out"], STATE["out"]
    assert len(STATE["out"].splitlines()) < 40, STATE["out"]


def test_installed_programs_run_and_every_command_has_help():
    bindir = os.path.join(installed(), "usr", "local", "bin")
    diverge = os.path.join(bindir, "diverge")
    p = subprocess.run([diverge, "--version"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0 and p.stdout.startswith("diverge "), (p.returncode, p.stdout)
    for cmd in COMMANDS:
        p = subprocess.run([diverge] + cmd.split() + ["--help"], capture_output=True, text=True,
                           timeout=30)
        assert p.returncode == 0, (cmd, p.returncode, p.stderr)
        assert p.stdout.lower().startswith("usage:"), (cmd, p.stdout[:200])
    p = subprocess.run([os.path.join(bindir, "diverge-agent-runner"), "--help"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0 and p.stdout.startswith("Usage: diverge-agent-runner"), p.stdout
    assert "DIVERGE_AGENT_CMD" in p.stdout and "Exit codes" in p.stdout


def test_installed_server_finds_the_installed_runner():
    bindir = os.path.join(installed(), "usr", "local", "bin")
    saved = harness.DIVERGE_BIN
    harness.DIVERGE_BIN = os.path.join(bindir, "diverge")
    try:
        srv = harness.Server(args=["--sandbox-provider", "process"],
                             env={"DIVERGE_RUNNER_PATH": None})
        srv.start()
        try:
            with urllib.request.urlopen(srv.url + "/readyz", timeout=10) as r:
                ready = json.loads(r.read())
        finally:
            srv.stop()
    finally:
        harness.DIVERGE_BIN = saved
    # A runner that cannot be executed would be named here ("sandbox": "the runner …").
    assert ready == {"status": "ok"}, ready


if __name__ == "__main__":
    try:
        run_tests([test_make_install_puts_both_programs_under_destdir_prefix,
                   test_installed_programs_run_and_every_command_has_help,
                   test_installed_server_finds_the_installed_runner])
    finally:
        if "root" in STATE:
            shutil.rmtree(STATE["root"], ignore_errors=True)
