# SPDX-License-Identifier: Apache-2.0
"""The dashboard (SPEC §12): headers, auth, the login cookie, the embedded files, a login
URL that never reaches the logs; then a real browser (Debian's chromium, headless, driven
by a pinned puppeteer-core) that shows every task with phase and spend, follows a change
without reload, renders hostile text as text, follows the log, and writes screenshots
under the build dir (build/dashboard/)."""
import http.client
import json
import os
import pty
import re
import select
import shutil
import subprocess
import tempfile
import time

import npm_pin
from harness import API, BUILD_DIR, DIVERGE_BIN, run_tests, task_obj
from test_events import Checked as Server

NS = API + "/namespaces/%s/agenttasks"
XSS = "<img src=x onerror=alert(1)>"


def create(srv, name, ns="default", status=None, annotations=None, **spec):
    obj = task_obj(name, ns=ns, **spec)
    if annotations:
        obj["metadata"]["annotations"] = annotations
    st, _, body = srv.request("POST", NS % ns, obj)
    assert st == 201, body
    deadline = time.time() + 10
    while time.time() < deadline:  # the controller (provider none) makes it Active
        st, _, body = srv.request("GET", NS % ns + "/" + name)
        if body["status"].get("phase") == "Active":
            break
        time.sleep(0.02)
    if status:
        st, _, body = srv.request("PATCH", NS % ns + "/" + name + "/status", {"status": status},
                                  headers={"Content-Type": "application/merge-patch+json"})
        assert st == 200, body
    return body


def no_redirect(srv, path, method="GET", headers=None):
    host, port = srv.url[len("http://"):].split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=30)
    c.request(method, path, headers=headers or {})
    r = c.getresponse()
    r.read()
    c.close()
    return r.status, {k.lower(): v for k, v in r.getheaders()}


SESSION_COOKIE = re.compile(r"^diverge_token=([0-9a-f]{64}); HttpOnly; SameSite=Strict; Path=/$")


def login(srv):
    """Logs in through /ui/login; returns the session id the cookie carries."""
    st, h = no_redirect(srv, "/ui/login?token=" + srv.token)
    assert st == 303 and h["location"] == "/", (st, h)
    m = SESSION_COOKIE.match(h["set-cookie"])
    assert m, h["set-cookie"]
    return m.group(1)


def test_pages_headers_and_auth():
    with Server(args=["--sandbox-provider", "none"]) as srv:
        # Standard output is a pipe here: the line says where the token is, never the token.
        login_line = [l for l in srv.lines if l.strip().startswith("dashboard:")]
        assert login_line == ["  dashboard: %s/ (log in with the token in %s/api-token)"
                              % (srv.url, srv.data_dir)], srv.lines
        assert not any(srv.token in l for l in srv.lines), srv.lines
        for path in ("/", "/ui/app.js", "/ui/app.css", "/ui/index.html"):
            st, h, body = srv.request("GET", path, auth=False)
            assert st == 401, (path, st)
            assert h["content-type"].startswith("text/html"), h
            assert "/ui/login?token=" in body and "api-token" in body, body
        st, h, body = srv.request("GET", "/ui/login?token=wrong", auth=False)
        assert st == 401 and "set-cookie" not in h, h
        st, h, body = srv.request("GET", "/", headers={"Cookie": "diverge_token=" + srv.token[:-1]},
                                  auth=False)
        assert st == 401
        st, h, body = srv.request("GET", "/")  # bearer
        assert st == 200, st
        assert h["content-security-policy"] == "default-src 'self'", h
        assert h["x-content-type-options"] == "nosniff", h
        assert h["content-type"] == "text/html; charset=utf-8", h
        # No inline script or style, no third-party origin.
        assert "<script src=\"/ui/app.js\"" in body and "<script>" not in body, body
        assert "style=" not in body and "http" not in body.split("<body>")[1], body
        assert " on" not in body.replace(" one", ""), body
        for path, ctype in (("/ui/app.js", "text/javascript"), ("/ui/app.css", "text/css"),
                            ("/ui/favicon.svg", "image/svg+xml")):
            st, h, text = srv.request("GET", path)
            assert st == 200 and h["content-type"].startswith(ctype), (path, h)
            assert h["content-security-policy"] == "default-src 'self'"
            with open(os.path.join(os.path.dirname(__file__), "..", "..", "ui",
                                   path.split("/")[-1])) as f:
                assert f.read() == text, path  # byte for byte what ui/ holds
        st, _, _ = srv.request("GET", "/ui/nope.js")
        assert st == 404
        st, _, _ = srv.request("POST", "/")
        assert st == 405
        # The page never writes innerHTML: text goes in through textContent.
        st, _, js = srv.request("GET", "/ui/app.js")
        assert "innerHTML" not in js and "insertAdjacentHTML" not in js and "eval(" not in js
        # Login: a session cookie (never the admin token) then 303 to /.
        session = login(srv)
        assert session != srv.token and srv.token not in session
        assert login(srv) != session  # a new random id per login
        cookie = {"Cookie": "diverge_token=" + session}
        st, _, _ = srv.request("GET", "/", headers=cookie, auth=False)
        assert st == 200
        # The admin token itself, or a made-up id, is no session.
        for bad in (srv.token, "0" * 64, session[:-1] + ("0" if session[-1] != "0" else "1"),
                    session + "0", ""):
            st, _, _ = srv.request("GET", "/", headers={"Cookie": "diverge_token=" + bad},
                                   auth=False)
            assert st == 401, (bad, st)
        # The cookie opens the dashboard only, never the task API (no CSRF surface there).
        st, _, _ = srv.request("GET", NS % "default", auth=False, headers=cookie)
        assert st == 401
        # Logout: needs the session, refuses a foreign Origin, then ends the session.
        st, _ = no_redirect(srv, "/ui/logout", method="POST")
        assert st == 401, st
        st, _ = no_redirect(srv, "/ui/logout", method="POST",
                            headers=dict(cookie, Origin="http://evil.example"))
        assert st == 403, st
        st, _, _ = srv.request("GET", "/", headers=cookie, auth=False)
        assert st == 200, st
        st, h = no_redirect(srv, "/ui/logout", method="POST",
                            headers=dict(cookie, Origin=srv.url))
        assert st == 303 and h["location"] == "/ui/login", (st, h)
        assert h["set-cookie"] == "diverge_token=; Max-Age=0; HttpOnly; SameSite=Strict; Path=/", h
        st, _, _ = srv.request("GET", "/", headers=cookie, auth=False)
        assert st == 401, st
        st, _ = no_redirect(srv, "/ui/logout", method="POST", headers=cookie)
        assert st == 401, st
        srv.stop()
        logged = srv.stderr()
        assert "/ui/login" in logged and srv.token not in logged, "token in the logs"
        assert "token=" not in logged


def test_login_url_only_on_a_terminal():
    """The login URL (which holds the admin token) is printed only when standard output is
    a terminal; through a pipe (logs) the line says where the token file is."""
    with Server(args=["--sandbox-provider", "none"]) as srv:
        assert not any(srv.token in l for l in srv.lines), srv.lines
        assert any(l == "  dashboard: %s/ (log in with the token in %s/api-token)"
                   % (srv.url, srv.data_dir) for l in srv.lines), srv.lines
        srv.stop()
        assert srv.token not in srv.stderr()
    data_dir = tempfile.mkdtemp(prefix="diverge-test-")
    master, slave = pty.openpty()
    proc = subprocess.Popen([DIVERGE_BIN, "serve", "--listen", "127.0.0.1:0", "--data-dir",
                             data_dir, "--log-format", "json", "--sandbox-provider", "none"],
                            stdout=slave, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    os.close(slave)
    out = b""
    try:
        deadline = time.time() + 30
        while b"admin token:" not in out and time.time() < deadline:
            ready, _, _ = select.select([master], [], [], 1)
            if ready:
                try:
                    out += os.read(master, 4096)
                except OSError:
                    break
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        os.close(master)
    try:
        with open(os.path.join(data_dir, "api-token")) as f:
            token = f.read().strip()
        text = out.decode()
        m = re.search(r"listening on (http://[0-9.]+:\d+)", text)
        assert m, text
        assert "  dashboard: %s/ui/login?token=%s\r\n" % (m.group(1), token) in text, text
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def test_tls_session_cookie():
    """Over TLS the session cookie is __Host-diverge_token with Secure."""
    import ssl
    with Server(args=["--sandbox-provider", "none", "--tls-listen", "127.0.0.1:0"]) as srv:
        with open(os.path.join(srv.data_dir, "tls-endpoint")) as f:
            ep = json.load(f)
        port = int(ep["server"].rsplit(":", 1)[1])
        ctx = ssl.create_default_context(cafile=ep["certificateAuthority"])

        def get(path, headers=None, method="GET"):
            c = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=30)
            c.request(method, path, headers=headers or {})
            r = c.getresponse()
            r.read()
            c.close()
            return r.status, {k.lower(): v for k, v in r.getheaders()}

        st, h = get("/ui/login?token=" + srv.token)
        assert st == 303, st
        m = re.match(r"^__Host-diverge_token=([0-9a-f]{64}); Secure; HttpOnly; SameSite=Strict; "
                     r"Path=/$", h["set-cookie"])
        assert m, h["set-cookie"]
        session = m.group(1)
        assert session != srv.token
        st, _ = get("/", {"Cookie": "__Host-diverge_token=" + session})
        assert st == 200, st
        st, _ = get("/", {"Cookie": "__Host-diverge_token=" + srv.token})
        assert st == 401, st
        st, h = get("/ui/logout", {"Cookie": "__Host-diverge_token=" + session}, method="POST")
        assert st == 303 and h["set-cookie"].startswith("__Host-diverge_token=; Max-Age=0; "
                                                        "Secure;"), h
        st, _ = get("/", {"Cookie": "__Host-diverge_token=" + session})
        assert st == 401, st


def chromium_or_skip():
    if os.path.exists("/usr/bin/chromium"):
        return True
    try:
        npm_pin.apt_ensure({"chromium": None})
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as e:
        print("apt-get: %s" % e)
    if not os.path.exists("/usr/bin/chromium"):
        print("SKIP test_browser: Debian's chromium is not installed and apt-get could not "
              "install it (apt-get install chromium)")
        return False
    return True


def test_browser():
    if not chromium_or_skip():
        return
    modules = npm_pin.install(*npm_pin.PUPPETEER)
    out_dir = os.path.join(BUILD_DIR, "dashboard")
    os.makedirs(out_dir, exist_ok=True)
    profile = tempfile.mkdtemp(prefix="diverge-chromium-")
    with Server(args=["--sandbox-provider", "none"]) as srv:
        create(srv, "fix-checkout-latency",
               objective="Diagnose and fix N+1 query in /api/v1/checkout",
               maxIterations=8, budgetUSD="5.00", budgetTokens=200000,
               repository={"url": "https://github.com/myorg/checkout-service"},
               annotations={"divergedev.com/provider": "github",
                            "divergedev.com/project": "myorg/checkout-service",
                            "divergedev.com/pr-number": "42"},
               status={"iteration": 3, "tokensConsumed": 48000, "costUSD": "1.20",
                       "previewUrl": "https://preview.example.test/?_diverge_env=env-42"})
        # Spend is shown exactly, as the CLI and the sticky comment show it: $0.036, not
        # $0.04; the forecast as the sticky comment words it.
        create(srv, "xss", objective=XSS, budgetUSD="2.00", maxIterations=8,
               status={"tokensConsumed": 1500, "costUSD": "0.036", "iteration": 3,
                       "forecastUSD": "0.108", "forecastPerIterationUSD": "0.018",
                       "forecastIterationsLeft": 6, "forecastBudgetHolds": True,
                       "previewUrl": "https://preview.example.test/?_diverge_env=env-7"})
        create(srv, "flaky-test", ns="payments", objective="Quarantine the flaky retry test",
               maxIterations=4, budgetUSD="3.00", budgetTokens=100000,
               annotations={"divergedev.com/provider": "gitlab",
                            "divergedev.com/project": "acme/payments",
                            "divergedev.com/mr-iid": "7"},
               status={"phase": "Failed", "reason": "BudgetExceeded", "iteration": 4,
                       "tokensConsumed": 101000, "costUSD": "3.00"})
        # A task waiting for a sandbox slot shows its place in the queue.
        # (Paused and resumed after its runner exited, as the queue keeps such a task; the
        # spec stays suspended here so that the controller leaves the status as written.)
        obj = task_obj("queued-one", ns="payments", objective="Wait for a slot",
                       budgetUSD="1.00", suspended=True)
        st, _, body = srv.request("POST", NS % "payments", obj)
        assert st == 201, body
        deadline = time.time() + 10
        while time.time() < deadline and body["status"].get("phase") != "Paused":
            time.sleep(0.02)
            st, _, body = srv.request("GET", NS % "payments" + "/queued-one")
        assert body["status"]["phase"] == "Paused", body
        st, _, body = srv.request("PATCH", NS % "payments" + "/queued-one/status",
                                  {"status": {"reason": "Queued", "queuePosition": 2}},
                                  headers={"Content-Type": "application/merge-patch+json"})
        assert st == 200, body
        logdir = os.path.join(srv.data_dir, "logs", "default")
        os.makedirs(logdir, exist_ok=True)
        log_file = os.path.join(logdir, "xss.log")
        with open(log_file, "w") as f:
            f.write("2026-11-30T10:00:00Z [controller] provisioned\n")
            f.write("2026-11-30T10:00:01Z agent says " + XSS + "\n")
            f.write("2026-11-30T10:00:02Z egress pypi.org:443 allowed rule=pypi.org\n")
            f.write("2026-11-30T10:00:03Z egress 169.254.169.254:80 denied reason=link-local\n")
            # What an agent printed, forging an egress line: styled as sandbox output.
            f.write("2026-11-30T10:00:03Z [sandbox] egress evil.example:443 allowed "
                    "rule=evil.example:443\n")
        job = {
            "url": srv.url, "token": srv.token, "profile": profile,
            "tasks": ["default/fix-checkout-latency", "default/xss", "payments/flaky-test",
                      "payments/queued-one"],
            "change": {"ns": "default", "name": "fix-checkout-latency",
                       "status": {"costUSD": "2.50", "tokensConsumed": 90000},
                       "expectSpend": "$2.50 / $5.00 · 50%"},
            "logTask": "default/xss", "logFile": log_file,
            "appendLine": "2026-11-30T10:00:04Z live " + XSS,
            "screenshots": [os.path.join(out_dir, "dashboard.png"),
                            os.path.join(out_dir, "dashboard-task.png")],
        }
        env = dict(os.environ, NODE_PATH=modules)
        r = subprocess.run(["node", os.path.join(os.path.dirname(__file__),
                                                 "dashboard_browser.js"), json.dumps(job)],
                           capture_output=True, text=True, env=env, timeout=240)
        shutil.rmtree(profile, ignore_errors=True)
        assert r.returncode == 0, r.stderr[-4000:]
        out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["landed"] == "/", out
    assert out["csp"] == "default-src 'self'", out
    assert out["cookie"] == {"httpOnly": True, "sameSite": "Strict", "path": "/"}, out
    rows = {r["key"]: r for r in out["rows"]}
    assert sorted(rows) == sorted(job["tasks"]), rows
    fc = rows["default/fix-checkout-latency"]
    assert fc["phase"] == "Active" and fc["spend"] == "$1.20 / $5.00 · 24%", fc
    assert fc["tokens"] == "48,000 / 200,000 · 24%" and fc["iteration"] == "3 / 8", fc
    assert fc["pr"] == "https://github.com/myorg/checkout-service/pull/42", fc
    assert rows["default/xss"]["objective"] == XSS, rows["default/xss"]
    assert rows["default/xss"]["spend"] == "$0.036 / $2.00 · 2%", rows["default/xss"]
    assert out["statusRows"]["Spend"] == "$0.036 / $2.00", out["statusRows"]
    assert out["statusRows"]["Forecast"] == (
        "≈ $0.108 more to finish at $0.018/iteration · 6 iterations left · budget holds"), out
    assert rows["payments/queued-one"]["phase"] == "Paused · queued #2", rows
    ft = rows["payments/flaky-test"]
    assert ft["phase"] == "Failed" and ft["spend"] == "$3.00 / $3.00 · 100%", ft
    assert ft["pr"] == "https://gitlab.com/acme/payments/-/merge_requests/7", ft
    assert out["imgsInTable"] == 0 and out["imgsInLog"] == 0, out
    after = {r["key"]: r for r in out["afterChange"]}
    assert after["default/fix-checkout-latency"]["spend"] == "$2.50 / $5.00 · 50%"
    assert out["navigations"] == 1, out  # no reload
    assert out["filtered"] == ["payments/flaky-test"], out
    assert out["filteredNs"] == ["default/fix-checkout-latency", "default/xss"], out
    assert out["followedBottom"] and out["pausedTop"] == 0 and out["followedAgain"], out
    texts = [l["text"] for l in out["log"]]
    assert "2026-11-30T10:00:01Z agent says " + XSS in texts, texts
    assert job["appendLine"] in texts, texts
    assert texts[-1] == "2026-11-30T10:00:07Z following again", texts[-3:]
    cls = {l["text"].split(" ")[2]: l["cls"] for l in out["log"] if " egress " in l["text"]}
    assert "egress-denied" in cls["169.254.169.254:80"] and "egress" in cls["pypi.org:443"], cls
    forged = [l for l in out["log"] if "[sandbox] egress evil.example" in l["text"]]
    assert forged and "sandbox" in forged[0]["cls"] and "egress" not in forged[0]["cls"], forged
    assert out["title"] == "default/xss"
    assert out["preview"] == ["https://preview.example.test/?_diverge_env=env-7",
                              "https://preview.example.test/?_diverge_env=clear"], out["preview"]
    assert XSS in out["spec"], out["spec"]
    assert out["dialogs"] == [], out["dialogs"]
    assert out["consoleErrors"] == [] and out["pageErrors"] == [], out
    for p in job["screenshots"]:
        assert os.path.getsize(p) > 10000, p
    print("screenshots: " + ", ".join(job["screenshots"]))


def test_sticky_links_the_task_page_with_public_url():
    """With --public-url the sticky comment links the task's dashboard page (SPEC §12)."""
    for public, want in (("http://diverge.example:8080/", True), (None, False)):
        args = ["--sandbox-provider", "none"]
        if public:
            args += ["--public-url", public]
        with Server(args=args) as srv:
            st, _, _ = srv.request("POST", "/api/v1/local/comments", {
                "project": "myorg/checkout", "number": 7, "author": "alice",
                "permission": "admin", "body": "/diverge fix the N+1 query"})
            assert st == 202, st
            sticky = ""
            deadline = time.time() + 20
            while time.time() < deadline and "diverge-agent-task" not in sticky:
                st, _, thread = srv.request("GET", "/api/v1/local/threads/myorg/checkout/7")
                assert st == 200, st
                for c in thread["comments"]:
                    if c.get("body", "").startswith("<!-- diverge-agent-task -->"):
                        sticky = c["body"]
                time.sleep(0.05)
            assert sticky, "no sticky comment"
            link = ("- **Task page:** [myorg-checkout/fix-pr-7]"
                    "(http://diverge.example:8080/#/task/myorg-checkout/fix-pr-7)")
            assert (link in sticky) == want, sticky


METER = "/api/v1/agenttask/meter"
QUOTAS = API + "/namespaces/%s/spendquotas"


def meter(srv, token, rid, cost, iteration, tokens=1000):
    st, _, b = srv.request("POST", METER, json.dumps({"requestId": rid, "iteration": iteration,
                                                      "tokensUsed": tokens, "costUSD": cost}),
                           headers={"Authorization": "Bearer " + token}, auth=False)
    assert st == 200 and b["allowed"] is True, (st, b)


def wait_phase(srv, ns, name, phase):
    deadline = time.time() + 20
    while time.time() < deadline:
        st, _, body = srv.request("GET", NS % ns + "/" + name)
        if body["status"].get("phase") == phase:
            return body
        time.sleep(0.02)
    raise AssertionError("%s/%s never %s: %s" % (ns, name, phase, body["status"]))


def set_suspended(srv, ns, name, value):
    st, _, body = srv.request("PATCH", NS % ns + "/" + name, {"spec": {"suspended": value}},
                              headers={"Content-Type": "application/merge-patch+json"})
    assert st == 200, body


def test_history_route():
    """GET /ui/api/history/{ns}/{name}: the task's cumulative spend from the charges the
    meter recorded, capped in points; auth as the page; 404 for an unknown task."""
    with Server(args=["--sandbox-provider", "none"]) as srv:
        create(srv, "h", maxIterations=50, budgetUSD="100.00")
        st, _, token = srv.request("GET", NS % "default" + "/h/token")
        assert st == 200
        token = token.strip()
        for i in range(1, 451):  # more charges than points
            meter(srv, token, "h-%d" % i, 0.01, 1 + i // 10, tokens=10)
        st, _, h = srv.request("GET", "/ui/api/history/default/h")
        assert st == 200, h
        assert h["chargesKept"] is True and h["chargeCount"] == 450, h
        assert h["pointsMax"] == 400 and 2 <= len(h["charges"]) <= 400, len(h["charges"])
        last = h["charges"][-1]
        assert last["costUSD"] == "4.50" and last["tokens"] == 4500, last
        times = [p["timeMs"] for p in h["charges"]]
        assert times == sorted(times)
        costs = [p["costUSD"] for p in h["charges"]]
        assert costs == sorted(costs, key=float)
        st, _, body = srv.request("GET", "/ui/api/history/default/nope")
        assert st == 404, body
        st, _, body = srv.request("GET", "/ui/api/history/default/h", auth=False)
        assert st == 401, body
        session = login(srv)
        st, _, body = srv.request("GET", "/ui/api/history/default/h", auth=False,
                                  headers={"Cookie": "diverge_token=" + session})
        assert st == 200 and body["chargeCount"] == 450
        st, _, q = srv.request("POST", QUOTAS % "default", {
            "apiVersion": "divergedev.com/v1alpha1", "kind": "SpendQuota",
            "metadata": {"name": "team"}, "spec": {"monthlyUSD": "10.00"}})
        assert st == 201, q
        st, _, body = srv.request("GET", "/ui/api/spendquotas", auth=False,
                                  headers={"Cookie": "diverge_token=" + session})
        assert st == 200 and [i["metadata"]["name"] for i in body["items"]] == ["team"], body
        st, _, body = srv.request("GET", "/ui/api/spendquotas", auth=False)
        assert st == 401


def seed_task_page(srv, with_egress=True):
    """A task metered over five iterations with a pause and a resume in between (the
    real meter and controller), a SpendQuota on its namespace, and the runner's iteration
    lines and egress decisions in its log. Returns the job fields for the browser."""
    st, _, q = srv.request("POST", QUOTAS % "default", {
        "apiVersion": "divergedev.com/v1alpha1", "kind": "SpendQuota",
        "metadata": {"name": "team"},
        "spec": {"monthlyUSD": "10.00", "monthlyTokens": 500000, "maxRunningTasks": 2}})
    assert st == 201, q
    create(srv, "spend-chart", objective="Speed up checkout " + XSS, maxIterations=8,
           budgetUSD="1.00", budgetTokens=200000,
           repository={"url": "https://github.com/myorg/checkout-service.git"},
           annotations={"divergedev.com/provider": "github",
                        "divergedev.com/project": "myorg/checkout-service",
                        "divergedev.com/pr-number": "42",
                        "divergedev.com/wip-branch": "diverge/wip/spend-chart"})
    create(srv, "other", ns="payments", objective="Quarantine the flaky test", budgetUSD="2.00")
    st, _, token = srv.request("GET", NS % "default" + "/spend-chart/token")
    token = token.strip()
    log_file = os.path.join(srv.data_dir, "logs", "default", "spend-chart.log")
    os.makedirs(os.path.dirname(log_file), exist_ok=True)

    def log(text, at=None):  # what the controller writes: "<RFC 3339 time> <text>"
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at or time.time()))
        with open(log_file, "a") as f:
            f.write(stamp + " " + text + "\n")

    meter(srv, token, "hb1", 0, 1)
    meter(srv, token, "u2", 0.036, 2)
    meter(srv, token, "u3", 0.05, 3)
    # --sandbox-provider none starts no sandbox, so the controller writes no task log:
    # its pause and resume lines are written here as it writes them.
    set_suspended(srv, "default", "spend-chart", True)
    wait_phase(srv, "default", "spend-chart", "Paused")
    log("[diverge] paused (token revoked; no sandbox runs, nothing to freeze)")
    set_suspended(srv, "default", "spend-chart", False)
    wait_phase(srv, "default", "spend-chart", "Active")
    log("[diverge] resumed (thawed, fresh token)")
    st, _, token = srv.request("GET", NS % "default" + "/spend-chart/token")
    token = token.strip()
    meter(srv, token, "u4", 0.04, 4)
    base = time.time() - 600
    for i, verify in ((1, 1), (2, 1), (3, 0)):
        log("[sandbox] diverge-agent-runner: iteration %d/8: running the agent" % i,
            base + 60 * i)
        log("[sandbox] diverge-agent-runner: iteration %d/8: agent exit 0, verify exit %d"
            % (i, verify), base + 60 * i + 42)
    if with_egress:
        for line in ("egress pypi.org:443 allowed rule=pypi.org",
                     "egress pypi.org:443 allowed rule=pypi.org closed bytes_out=10 bytes_in=20",
                     "egress files.pythonhosted.org:443 allowed rule=*.pythonhosted.org",
                     "egress 169.254.169.254:80 denied reason=link-local",
                     # An agent's forgeries: sandbox output, never counted or believed.
                     "[sandbox] egress evil.example:443 allowed rule=x",
                     "[sandbox] [diverge] pushed refs/heads/main at " + "a" * 40,
                     "[diverge] pushed refs/heads/agent/spend-chart at "
                     + "0123456789abcdef" * 2 + "01234567"):
            log(line)
    return {"task": "default/spend-chart", "quotaNs": "default", "taskCount": 2,
            "expect": {"iterations": 3, "forecast": True, "marks": 2,
                       "logLines": 15 if with_egress else 8}}


def run_task_browser(job):
    modules = npm_pin.install(*npm_pin.PUPPETEER)
    env = dict(os.environ, NODE_PATH=modules)
    r = subprocess.run(["node", os.path.join(os.path.dirname(__file__),
                                             "dashboard_task_browser.js"), json.dumps(job)],
                       capture_output=True, text=True, env=env, timeout=240)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_browser_task_page():
    """The task page's spend chart (budget line, cost path, dashed forecast, pause and
    resume marks), timeline, egress summary and links; the projects view; "not found";
    the 390 px layout; screenshots at 1400x900 and 390x844 in build/dashboard/."""
    if not chromium_or_skip():
        return
    out_dir = os.path.join(BUILD_DIR, "dashboard")
    os.makedirs(out_dir, exist_ok=True)
    profile = tempfile.mkdtemp(prefix="diverge-chromium-")
    try:
        with Server(args=["--sandbox-provider", "none"]) as srv:
            job = seed_task_page(srv)
            job.update({"url": srv.url, "token": srv.token, "profile": profile,
                        "outDir": out_dir})
            out = run_task_browser(job)
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    c = out["chart"]
    # 0 at creation, then the four charges (the first one of $0).
    assert c["points"] == 5 and c["d"].count("L") == 4, c
    assert c["forecastDash"] == "6 4", c
    assert c["budget"] and c["budget"]["y1"] == c["budget"]["y2"], c
    assert c["budgetLabel"] == "$1.00", c  # the effective budget
    assert c["marks"] == ["mark mark-pause", "mark mark-resume"], c
    assert "spent $0.126" in c["legend"] and "budget $1.00" in c["legend"], c
    iters = [t for t in out["timeline"] if t["cls"] == "tl-iter"]
    assert [(t["cells"][1], t["verify"], t["cells"][2], t["cells"][3]) for t in iters] == [
        ("Iteration 3 / 8", "pass", "✓ pass", "42 s"),
        ("Iteration 2 / 8", "fail", "✗ fail (exit 1)", "42 s"),
        ("Iteration 1 / 8", "fail", "✗ fail (exit 1)", "42 s")], iters
    phases = [t["cells"][1] for t in out["timeline"] if t["cls"] == "tl-phase"]
    assert any(p.startswith("paused") for p in phases), phases
    assert any(p.startswith("resumed") for p in phases), phases
    assert not any("refs/heads/main" in p for p in phases), phases  # the forged line
    assert out["egress"] == "2 allowed · 1 denied", out["egress"]
    assert sorted(out["egressHosts"]) == [["169.254.169.254:80", "0", "1"],
                                          ["files.pythonhosted.org:443", "1", "0"],
                                          ["pypi.org:443", "1", "0"]], out["egressHosts"]
    links = {l["cls"] or l["text"]: l["href"] for l in out["links"]}
    assert links["commit-link"] == ("https://github.com/myorg/checkout-service/commit/"
                                    + "0123456789abcdef" * 2 + "01234567"), links
    assert links["wip-link"] == ("https://github.com/myorg/checkout-service/tree/diverge/wip/"
                                 "spend-chart"), links
    assert "https://github.com/myorg/checkout-service/pull/42" in links.values(), links
    assert out["statusRows"]["Spend"] == "$0.126 / $1.00", out["statusRows"]
    assert out["logBox"]["top"] + 150 < 900, out["logBox"]  # the log is above the fold
    assert out["imgs"] == 0, out
    assert out["taskScrollWidthNarrow"] <= 390, out
    assert out["projectsScrollWidthNarrow"] <= 390, out
    assert out["listScrollWidthNarrow"] <= 390, out
    projects = {p["ns"]: p for p in out["projects"]}
    d = projects["default"]
    assert d["usd"] == "team: $0.126 / $10.00 · 1%", d
    assert d["tokens"] == "team: 4,000 / 500,000 · 1%", d
    assert d["maxRunning"] == "2" and d["running"] == "1" and d["tasks"] == "1", d
    p = projects["payments"]
    assert p["usd"] == "no quota" and p["tokens"] == "no quota" and p["maxRunning"] == "—", p
    assert out["notFound"] == "Task default/no-such-task not found.", out
    assert out["notFoundBodyHidden"] is True, out
    assert out["dialogs"] == [] and out["pageErrors"] == [], out
    assert out["consoleErrors"] == [], out
    for name in ("dashboard-task-1400x900.png", "dashboard-task-390x844.png"):
        assert os.path.getsize(os.path.join(out_dir, name)) > 10000, name
    print("screenshots: " + ", ".join(out["shots"]))


if __name__ == "__main__":
    run_tests([test_pages_headers_and_auth, test_login_url_only_on_a_terminal,
               test_tls_session_cookie, test_sticky_links_the_task_page_with_public_url,
               test_history_route, test_browser, test_browser_task_page])
