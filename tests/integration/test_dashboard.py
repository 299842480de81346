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


if __name__ == "__main__":
    run_tests([test_pages_headers_and_auth, test_login_url_only_on_a_terminal,
               test_tls_session_cookie, test_sticky_links_the_task_page_with_public_url,
               test_browser])
