#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Makes the README's dashboard screenshot (docs/dashboard.png) from a clean demo: a real
`diverge serve` with its defaults (local sandboxes) in a fresh directory, the task made
the README's way (`diverge local demo`, then a `/diverge fix …` comment on the local PR),
a SpendQuota on its namespace, and the page shot at 1400x900 by Debian's chromium through
the tests' pinned puppeteer-core once the task has finished. Every shot (task page at
1400x900 and 390x844, list, projects) goes to BUILD/dashboard-demo/; the task page
becomes docs/dashboard.png.

    python3 scripts/dashboard_screenshot.py [BUILD_DIR]     (default: build)
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import npm_pin  # noqa: E402  (the tests' pinned npm packages and their cache)

API = "/apis/divergedev.com/v1alpha1/namespaces/"
NS, TASK = "demo-greeting", "fix-pr-1"


def request(url, token, method="GET", body=None):
    req = urllib.request.Request(url, method=method, data=None if body is None else
                                 json.dumps(body).encode(),
                                 headers={"Authorization": "Bearer " + token,
                                          "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def wait(what, fn, timeout=300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(0.5)
    raise SystemExit("dashboard_screenshot: timed out waiting for " + what)


def main():
    build = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build"))
    diverge = os.path.join(build, "diverge")
    out_dir = os.path.join(build, "dashboard-demo")
    os.makedirs(out_dir, exist_ok=True)
    work = tempfile.mkdtemp(prefix="diverge-shot-")  # ./var lives here, as in the README
    os.chmod(work, 0o711)  # the sandbox user passes through it to ./var (README)
    profile = tempfile.mkdtemp(prefix="diverge-chromium-")
    serve = subprocess.Popen([diverge, "serve", "--listen", "127.0.0.1:0"], cwd=work,
                             stdout=subprocess.PIPE, stderr=open(os.path.join(work, "serve.err"), "w"),
                             text=True)
    try:
        line = serve.stdout.readline()
        m = re.search(r"listening on (http://[0-9.]+:\d+)", line)
        if not m:
            raise SystemExit("dashboard_screenshot: serve said %r" % line)
        url = m.group(1)
        with open(os.path.join(work, "var", "api-token")) as f:
            token = f.read().strip()
        env = dict(os.environ, DIVERGE_SERVER=url)
        wait("/readyz", lambda: subprocess.run(["curl", "-fs", url + "/readyz"],
                                               capture_output=True).returncode == 0, 60)
        subprocess.run([diverge, "local", "demo"], cwd=work, env=env, check=True,
                       stdout=subprocess.DEVNULL)
        request(url + API + NS + "/spendquotas", token, "POST", {
            "apiVersion": "divergedev.com/v1alpha1", "kind": "SpendQuota",
            "metadata": {"name": "team"},
            "spec": {"monthlyUSD": "10.00", "monthlyTokens": 1000000, "maxRunningTasks": 2}})
        subprocess.run([diverge, "local", "comment", "demo/greeting#1",
                        "/diverge fix the typo in greeting.txt"], cwd=work, env=env, check=True,
                       stdout=subprocess.DEVNULL)

        def finished():
            try:
                t = request(url + API + NS + "/agenttasks/" + TASK, token)
            except OSError:
                return None
            return t if t["status"].get("phase") in ("Completed", "Failed") else None

        task = wait(NS + "/" + TASK + " finished", finished)
        print("task %s/%s: %s, %s USD, iteration %s" % (NS, TASK, task["status"]["phase"],
                                                        task["status"].get("costUSD"),
                                                        task["status"].get("iteration")))
        log = os.path.join(work, "var", "logs", NS, TASK + ".log")
        with open(log) as f:
            text = f.read()
        if task["status"]["phase"] != "Completed":
            raise SystemExit("dashboard_screenshot: the demo task did not complete: %s\n%s"
                             % (task["status"].get("message"), text[-3000:]) + "\n" +
                             open(os.path.join(work, "serve.err")).read()[-3000:])
        log_lines = text.count("\n")
        job = {"url": url, "token": token, "profile": profile, "outDir": out_dir,
               "screenshotOnly": True, "task": NS + "/" + TASK, "quotaNs": NS,
               "taskCount": 1,
               "expect": {"iterations": 2, "forecast": False, "marks": 0,
                          "logLines": log_lines}}
        modules = npm_pin.install(*npm_pin.PUPPETEER)
        r = subprocess.run(["node", os.path.join(ROOT, "tests", "integration",
                                                 "dashboard_task_browser.js"), json.dumps(job)],
                           capture_output=True, text=True, timeout=240,
                           env=dict(os.environ, NODE_PATH=modules))
        if r.returncode != 0:
            raise SystemExit("dashboard_screenshot: browser failed:\n" + r.stderr[-3000:])
        out = json.loads(r.stdout.strip().splitlines()[-1])
        shutil.copyfile(os.path.join(out_dir, "dashboard-task-1400x900.png"),
                        os.path.join(ROOT, "docs", "dashboard.png"))
        print("shots: " + ", ".join(out["shots"]))
        print("docs/dashboard.png: the task page at 1400x900")
    finally:
        serve.terminate()
        serve.wait(timeout=30)
        shutil.rmtree(profile, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
