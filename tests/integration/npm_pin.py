# SPDX-License-Identifier: Apache-2.0
"""Installs a pinned npm package into the build's cache folder (once) for tests that use
real third-party data or code, with install scripts off (npm 11 skips them by default,
Debian's npm 9 would run them, and some try to download from outside the npm registry,
which is not reachable here). A missing node/npm is installed with apt-get; a
TLS-intercepting proxy whose CA is not trusted here is retried with --strict-ssl=false
(npm still checks the tarball's integrity)."""
import json
import os
import shutil
import subprocess

from harness import BUILD_DIR


def ensure_node():
    if shutil.which("node") and shutil.which("npm"):
        return
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "install", "-y", "-qq", "nodejs", "npm"], env=env,
                   capture_output=True, timeout=900)
    if not (shutil.which("node") and shutil.which("npm")):
        raise RuntimeError("node/npm are missing and apt-get could not install them")


def install(package, version):
    """Returns the node_modules folder holding PACKAGE@VERSION (installed when needed)."""
    prefix = os.path.join(BUILD_DIR, "npm-cache", package.replace("/", "_") + "-" + version)
    pkg_json = os.path.join(prefix, "node_modules", package, "package.json")
    try:
        with open(pkg_json) as f:
            if json.load(f).get("version") == version:
                return os.path.join(prefix, "node_modules")
    except (OSError, ValueError):
        pass
    ensure_node()
    os.makedirs(prefix, exist_ok=True)
    cmd = ["npm", "install", "--prefix", prefix, "%s@%s" % (package, version), "--no-audit",
           "--no-fund", "--no-save",
           "--ignore-scripts"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if r.returncode != 0 and ("CERT" in r.stderr or "certificate" in r.stderr):
        r = subprocess.run(cmd + ["--strict-ssl=false"], capture_output=True, text=True,
                           timeout=600)
    if r.returncode != 0 or not os.path.exists(pkg_json):
        raise RuntimeError("cannot install npm %s@%s: %s" % (package, version, r.stderr[-800:]))
    return os.path.join(prefix, "node_modules")


def install_many(name, packages):
    """Installs every PACKAGE@VERSION of the dict PACKAGES together into one prefix named
    NAME (once); returns that prefix's node_modules folder. For tools that must resolve
    one another, such as a code generator and its runtime."""
    tag = "-".join("%s@%s" % (p.replace("/", "_"), v) for p, v in sorted(packages.items()))
    prefix = os.path.join(BUILD_DIR, "npm-cache", name)
    stamp = os.path.join(prefix, ".pinned")
    modules = os.path.join(prefix, "node_modules")
    try:
        with open(stamp) as f:
            if f.read() == tag:
                return modules
    except OSError:
        pass
    ensure_node()
    os.makedirs(prefix, exist_ok=True)
    cmd = ["npm", "install", "--prefix", prefix, "--no-audit", "--no-fund", "--no-save",
           "--ignore-scripts"]
    cmd += ["%s@%s" % (p, v) for p, v in sorted(packages.items())]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if r.returncode != 0 and ("CERT" in r.stderr or "certificate" in r.stderr):
        r = subprocess.run(cmd + ["--strict-ssl=false"], capture_output=True, text=True,
                           timeout=900)
    for p, v in packages.items():
        try:
            with open(os.path.join(modules, p, "package.json")) as f:
                ok = json.load(f).get("version") == v
        except (OSError, ValueError):
            ok = False
        if r.returncode != 0 or not ok:
            raise RuntimeError("cannot install npm %s@%s: %s" % (p, v, r.stderr[-800:]))
    with open(stamp, "w") as f:
        f.write(tag)
    return modules
