# SPDX-License-Identifier: Apache-2.0
"""Runs the README's shell blocks as a reader would, in a fresh folder of their own.

A reader follows README.md from the top in a checkout: terminal 1 runs the server
(`make run …`, `diverge serve … &`), terminal 2 the other commands, with `./var` as the
data dir. A Walk does the same in a new temporary folder that holds copies of
`examples/` and `sdk/` and a link `build` to the built programs (`diverge` is on PATH,
as after `make install`), so nothing is written into the checkout.

What differs from a reader's terminal, and why:
- Ports: the README's fixed `127.0.0.1:8080` and `127.0.0.1:8443` would collide with
  other servers on a shared machine. Every server the walk starts listens on a free
  port through `DIVERGE_LISTEN` (which `diverge serve` honours), the CLI finds it
  through `DIVERGE_SERVER`, and the literal addresses in commands (curl, exports,
  `--tls-listen`) are rewritten to the same ports. The README itself stays plain.
- `/tmp/…` paths in commands become `<walk folder>/tmp/…`.
- A line that starts a server (`make run [ARGS=…]`, which is `build/diverge serve $ARGS`
  once built, or `diverge serve …`, with or without a trailing `&`) runs in the
  background; the walk waits until its `/readyz` answers 200. Starting the next one
  first stops the running one with SIGINT (Ctrl-C), which the README must say there.
- A command whose comment says "until Ctrl-C" gets SIGINT once it printed something.
- Each block runs in a fresh `bash` with `set -e` and a check before every command, so
  a failure in the middle of `a && b` fails the block too.
- No traffic leaves the machine: HTTP(S) proxies point at a closed loopback port (so a
  stray download fails instead of reaching out), npm runs offline on the tests' shared
  cache (npm_pin.py). The servers' output goes to $HOME/server-N.log.

A block preceded by `<!-- walk: skip (why) -->` is not run (GitHub, GitLab, a cluster)."""
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

import npm_pin
from harness import BUILD_DIR, SOURCE_DIR

README = os.path.join(SOURCE_DIR, "README.md")
SKIP_RE = re.compile(r"^<!--\s*walk:\s*skip\b(.*?)-->\s*$")
SERVE_RE = re.compile(r"^\s*(make run\b|(build/)?diverge serve\b)")
BG_RE = re.compile(r"\s&(\s+#.*)?$")


class Block:
    def __init__(self, section, line, text, skip):
        self.section = section  # the nearest heading above it
        self.line = line        # the line of its opening fence (1-based)
        self.text = text
        self.skip = skip        # the reason given in the skip marker, or None

    def __repr__(self):
        return "README.md:%d (%s)" % (self.line, self.section)


def shell_blocks(path=README):
    """The ```sh blocks of the README, in order."""
    blocks, section, fence, body, start, skip, prev = [], "", None, [], 0, None, ""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    for no, line in enumerate(lines, 1):
        if fence is not None:
            if line.startswith("```"):
                if fence == "sh":
                    blocks.append(Block(section, start, "\n".join(body) + "\n", skip))
                fence, body = None, []
            else:
                body.append(line)
            continue
        if line.startswith("```"):
            fence, start = line[3:].strip(), no
            m = SKIP_RE.match(prev)
            skip = (m.group(1).strip(" ()") or "marked") if m else None
        elif line.startswith("#"):
            section = line.lstrip("#").strip()
        if line.strip():
            prev = line.strip()
    return blocks


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


PREAMBLE = r"""
set -e
__walk_make_run() {  # make run [ARGS=…]: build/diverge serve $ARGS (the programs are built)
    local ARGS=""
    for a in "$@"; do case "$a" in ARGS=*) ARGS=${a#ARGS=} ;; esac; done
    eval "exec build/diverge serve $ARGS"
}
__walk_until_ctrl_c() {  # runs "$@" until it printed something, then Ctrl-C
    local out rc
    out=$(mktemp)
    "$@" >"$out" 2>&1 &
    local pid=$!
    while [ ! -s "$out" ] && kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
    local stopped=0
    if kill -INT "$pid" 2>/dev/null; then stopped=1; fi
    # a background job of a script may start with SIGINT ignored: then, after a while, KILL
    local n=0
    while kill -0 "$pid" 2>/dev/null && [ "$n" -lt 100 ]; do sleep 0.1; n=$((n + 1)); done
    kill -KILL "$pid" 2>/dev/null || true
    rc=0; wait "$pid" || rc=$?
    cat "$out"; rm -f "$out"
    [ "$stopped" -eq 1 ] && return 0  # whatever it exits with on Ctrl-C
    return "$rc"
}
trap '__walk_rc=$?; if [ "$__walk_rc" -ne 0 ]; then echo "walk: a command exited with status $__walk_rc (next: $BASH_COMMAND)" >&2; exit "$__walk_rc"; fi' DEBUG
"""


class Walk:
    """A reader's fresh checkout-like folder, their environment and their terminal 1."""

    def __init__(self, extra_path=()):
        self.dir = tempfile.mkdtemp(prefix="diverge-walk-")
        # Like a checkout under /home or /srv. Under a 0700 parent (a clone in /root) the
        # sandbox user cannot reach the O_PATH binds of ./var: every task fails in bwrap.
        os.chmod(self.dir, 0o755)
        for sub in ("examples", "sdk"):
            shutil.copytree(os.path.join(SOURCE_DIR, sub), os.path.join(self.dir, sub),
                            ignore=shutil.ignore_patterns("node_modules", "__pycache__"))
        os.symlink(os.path.realpath(BUILD_DIR), os.path.join(self.dir, "build"))
        self.tmp = os.path.join(self.dir, "tmp")
        self.home = os.path.join(self.dir, "home")
        os.makedirs(self.tmp)
        os.makedirs(self.home)
        self.port, self.tls_port = free_port(), free_port()
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("DIVERGE_", "KUBE", "GIT_", "npm_config_"))
               and k.lower() not in ("http_proxy", "https_proxy", "all_proxy", "no_proxy")}
        closed = "http://127.0.0.1:%d" % free_port()
        env.update({
            "PATH": os.pathsep.join([os.path.realpath(BUILD_DIR)] + list(extra_path) +
                                    [env.get("PATH", "/usr/bin:/bin")]),
            "HOME": self.home, "LANG": "C.UTF-8",
            "DIVERGE_LISTEN": "127.0.0.1:%d" % self.port,
            "DIVERGE_SERVER": "http://127.0.0.1:%d" % self.port,
            "http_proxy": closed, "https_proxy": closed, "HTTP_PROXY": closed,
            "HTTPS_PROXY": closed, "all_proxy": closed,
            "no_proxy": "127.0.0.1,localhost,::1", "NO_PROXY": "127.0.0.1,localhost,::1",
            "GIT_CONFIG_NOSYSTEM": "1",
            "npm_config_offline": "true", "npm_config_audit": "false",
            "npm_config_fund": "false", "npm_config_update_notifier": "false",
            "npm_config_cache": os.path.join(npm_pin.cache_dir(), "npm-cache"),
        })
        self.env = env
        self.server = None
        self.server_log = None
        self.servers = 0

    def rewrite(self, text):
        text = text.replace("127.0.0.1:8080", "127.0.0.1:%d" % self.port)
        text = text.replace("127.0.0.1:8443", "127.0.0.1:%d" % self.tls_port)
        return re.sub(r"(?<![\w.])/tmp/", self.tmp + "/", text)

    def segments(self, block):
        """BLOCK as [("sh", text) | ("serve", line)] in order."""
        out, sh = [], []
        for line in block.text.split("\n"):
            if SERVE_RE.match(line):
                if sh:
                    out.append(("sh", "\n".join(sh) + "\n"))
                    sh = []
                out.append(("serve", line))
            else:
                if re.search(r"#[^\n]*until Ctrl-C", line):
                    line = "__walk_until_ctrl_c " + line
                sh.append(line)
        if "".join(sh).strip():
            out.append(("sh", "\n".join(sh) + "\n"))
        return out

    def run(self, block, timeout=120):
        """Runs BLOCK; returns its output (stdout and stderr); AssertionError on failure."""
        output = []
        for kind, text in self.segments(block):
            if kind == "serve":
                self.serve(block, text)
            else:
                output.append(self.sh(block, text, timeout))
        return "".join(output)

    def sh(self, block, text, timeout=120):
        script = PREAMBLE + self.rewrite(text)
        r = subprocess.run(["bash", "-c", script], cwd=self.dir, env=self.env, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
        assert r.returncode == 0, "%r exited with status %d:\n%s\n--- its output:\n%s%s" % (
            block, r.returncode, text, r.stdout, self.server_tail())
        return r.stdout

    def server_tail(self):
        if self.server_log is None:
            return ""
        with open(self.server_log, errors="replace") as f:
            return "\n--- the server's output (last 40 lines):\n" + "".join(
                f.readlines()[-40:])

    def serve(self, block, line):
        if self.server is not None:
            assert "Ctrl-C" in block.text, (
                "%r starts a server while another runs, and does not say to stop it" % block)
            self.stop()
        line = BG_RE.sub(lambda m: m.group(1) or "", line)
        if line.lstrip().startswith("make run"):
            line = "__walk_make_run" + line.lstrip()[len("make run"):]
        else:
            line = "exec " + line.lstrip()
        self.servers += 1
        self.server_log = os.path.join(self.home, "server-%d.log" % self.servers)
        log = open(self.server_log, "wb")
        self.server = subprocess.Popen(["bash", "-c", PREAMBLE + self.rewrite(line)],
                                       cwd=self.dir, env=self.env, stdout=log,
                                       stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        url = "http://127.0.0.1:%d/readyz" % self.port
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        deadline = time.monotonic() + 60
        while True:
            assert self.server.poll() is None, "%r: the server exited (%s)%s" % (
                block, self.server.returncode, self.server_tail())
            assert time.monotonic() < deadline, "%r: not ready in 60 s%s" % (
                block, self.server_tail())
            try:
                if opener.open(url, timeout=5).status == 200:
                    return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.05)

    def stop(self):
        """Ctrl-C on terminal 1: the server must shut down cleanly."""
        if self.server is None:
            return
        proc, self.server = self.server, None
        proc.send_signal(signal.SIGINT)
        try:
            rc = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError("the server did not stop on SIGINT")
        assert rc == 0, "the server exited with status %d on SIGINT%s" % (rc, self.server_tail())

    def cleanup(self):
        try:
            if self.server is not None:
                self.server.kill()
                self.server.wait()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.cleanup()
