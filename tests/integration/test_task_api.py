# SPDX-License-Identifier: Apache-2.0
"""Task API end to end against the real `diverge serve`: every status code of SPEC §3 is
produced by a request that provokes it; resourceVersion races; watch; restart; kill -9."""
import concurrent.futures
import json
import os
import socket
import sqlite3
import subprocess
import threading
import time
import urllib.request

from harness import API, Server, run_tests, task_obj

# Tasks must stay Pending in these tests: a provider this build does not run keeps them
# there (local and process now start sandboxes, none activates at once).
PENDING_ARGS = ["--sandbox-provider", "agent-sandbox"]

NS = API + "/namespaces/default/agenttasks"


def create(srv, name, ns="default", **spec):
    """Creates a task and waits until the controller has looked at it (with the default
    sandbox provider it notes in status.message why the task waits), so later
    resourceVersion checks in a test are not raced by the controller."""
    path = API + "/namespaces/%s/agenttasks" % ns
    res = srv.request("POST", path, task_obj(name, ns=ns, **spec))
    if res[0] == 201:
        deadline = time.time() + 10
        while time.time() < deadline:
            st, _, b = srv.request("GET", path + "/" + name)
            if st != 200 or b["status"].get("message"):
                break
            time.sleep(0.01)
    return res


def test_health_ready_metrics():
    with Server(args=PENDING_ARGS) as srv:
        st, _, body = srv.request("GET", "/healthz", auth=False)
        assert st == 200 and body["status"] == "ok", body
        st, _, _ = srv.request("GET", "/readyz", auth=False)
        assert st == 200
        create(srv, "m1")
        st, h, text = srv.request("GET", "/metrics", auth=False)
        assert st == 200 and h["content-type"].startswith("text/plain"), h
        assert 'diverge_http_requests_total{route="tasks.create",code="201"} 1' in text, text
        assert 'diverge_http_request_duration_seconds_bucket{route="tasks.create",le="+Inf"} 1' in text
        assert 'diverge_tasks{phase="Pending"} 1' in text
        for name in ("diverge_spend_usd", "diverge_inbox_pending", "diverge_outbox_pending",
                     "diverge_scm_calls_total", "diverge_scm_rate_limit_waits_total",
                     "diverge_meter_requests_total"):
            assert "\n" + name + " " in text, name


def test_create_get_list_roundtrip():
    with Server(args=PENDING_ARGS) as srv:
        spec = {"objective": "Diagnose and fix N+1 query in /api/v1/checkout", "draftPR": True,
                "repository": {"url": "https://github.com/myorg/checkout-service",
                               "baseBranch": "main", "workingBranch": "fix/checkout-n-plus-1"},
                "maxIterations": 8, "budgetUSD": "5.00", "budgetTokens": 200000,
                "capabilities": ["claude-3-7-sonnet", "gemini-2.5-pro"],
                "allowedTools": ["git", "go"],
                "sandbox": {"provider": "agent-sandbox", "timeoutSeconds": 1800},
                "suspended": False}
        obj = {"apiVersion": "divergedev.com/v1alpha1", "kind": "AgentTask",
               "metadata": {"name": "fix-checkout-latency", "namespace": "default",
                            "annotations": {"divergedev.com/preview-enabled": "true"}},
               "spec": spec}
        st, h, body = srv.request("POST", NS, obj)
        assert st == 201, body
        assert h["content-type"].startswith("application/json")
        assert body["spec"] == spec, body["spec"]
        md = body["metadata"]
        assert md["uid"] and md["resourceVersion"] and md["creationTimestamp"].endswith("Z")
        assert body["status"]["phase"] == "Pending"
        assert body["status"]["costUSD"] == "0.00"
        st, _, got = srv.request("GET", NS + "/fix-checkout-latency")
        # The controller may have written status since (e.g. why the task waits).
        assert st == 200 and got["spec"] == body["spec"]
        assert got["metadata"]["uid"] == md["uid"]
        st, _, lst = srv.request("GET", NS)
        assert st == 200 and lst["kind"] == "AgentTaskList" and len(lst["items"]) == 1
        create(srv, "x", ns="other")
        st, _, all_ = srv.request("GET", API + "/agenttasks")
        assert [i["metadata"]["namespace"] for i in all_["items"]] == ["default", "other"]
        st, _, one = srv.request("GET", API + "/namespaces/other/agenttasks")
        assert len(one["items"]) == 1
        # Defaults: workingBranch agent/<name>, baseBranch main.
        st, _, x = srv.request("GET", API + "/namespaces/other/agenttasks/x")
        assert x["spec"]["repository"] == {"baseBranch": "main", "workingBranch": "agent/x"}


def is_error(body, reason=None):
    assert isinstance(body, dict) and "error" in body, body
    if reason:
        assert body["reason"] == reason, body
    return True


def test_status_codes():
    with Server(args=PENDING_ARGS) as srv:
        # 401: no token, wrong token
        st, _, b = srv.request("GET", NS, auth=False)
        assert st == 401 and is_error(b, "Unauthorized")
        st, _, b = srv.request("GET", NS, auth=False, headers={"Authorization": "Bearer nope"})
        assert st == 401 and b["kind"] == "Status" and b["code"] == 401
        # 400: bad JSON, empty body
        st, _, b = srv.request("POST", NS, "{not json")
        assert st == 400 and is_error(b, "BadRequest")
        st, _, b = srv.request("POST", NS, b"", headers={"Content-Type": "application/json"})
        assert st == 400
        # 422: invalid name, invalid money, unknown field; causes carry the field path
        st, _, b = create(srv, "Bad_Name")
        assert st == 422 and is_error(b, "Invalid")
        assert b["details"]["causes"][0]["field"] == "metadata.name", b
        st, _, b = create(srv, "ok", budgetUSD="1.0000001")
        assert st == 422 and b["details"]["causes"][0]["field"] == "spec.budgetUSD"
        st, _, b = create(srv, "ok", budgetTokens=-5)
        assert st == 422
        st, _, b = create(srv, "ok", bogus=1)
        assert st == 422 and b["details"]["causes"][0]["field"] == "spec.bogus"
        # 201 then 409 AlreadyExists
        st, _, b = create(srv, "dup")
        assert st == 201
        st, _, b = create(srv, "dup")
        assert st == 409 and is_error(b, "AlreadyExists")
        # 404: unknown task, unknown path
        st, _, b = srv.request("GET", NS + "/nope")
        assert st == 404 and is_error(b, "NotFound")
        st, _, b = srv.request("GET", "/no/such/path")
        assert st == 404 and is_error(b, "NotFound")
        assert "kind" not in b  # outside /apis/ errors are {"error","reason"}
        # 405: wrong method on a known path
        st, _, b = srv.request("DELETE", NS)
        assert st == 405 and is_error(b, "MethodNotAllowed")
        st, _, b = srv.request("POST", "/healthz", {})
        assert st == 405
        # 415: PATCH without merge-patch content type
        st, _, b = srv.request("PATCH", NS + "/dup", {"spec": {"objective": "y"}})
        assert st == 415
        # ... and the message never echoes the request's Content-Type.
        st, _, b = srv.request("PATCH", NS + "/dup", '{"spec":{}}',
                               headers={"Content-Type": "text/evil<script>"})
        assert st == 415 and "script" not in json.dumps(b) and "evil" not in json.dumps(b), b
        # 413: body over 1 MiB (declared length, and chunked without length)
        big = json.dumps(task_obj("big", objective="x" * (1024 * 1024 + 10)))
        st, _, b = srv.request("POST", NS, big)
        assert st == 413 and is_error(b, "RequestEntityTooLarge")
        assert chunked_post(srv, NS, big.encode()) == 413
        # 409 Conflict on a stale resourceVersion
        st, _, cur = srv.request("GET", NS + "/dup")
        rv = cur["metadata"]["resourceVersion"]
        st, _, b = merge(srv, "dup", {"metadata": {"resourceVersion": rv},
                                      "spec": {"objective": "v2"}})
        assert st == 200 and b["spec"]["objective"] == "v2"
        st, _, b = merge(srv, "dup", {"metadata": {"resourceVersion": rv},
                                      "spec": {"objective": "v3"}})
        assert st == 409 and is_error(b, "Conflict")
        # 410: watch from a resourceVersion the feed no longer has (before a restart)
        # is covered in test_restart_keeps_everything.


def chunked_post(srv, path, data):
    s = socket.create_connection(("127.0.0.1", srv.port))
    s.sendall(("POST %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
               "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
               % (path, srv.token)).encode())
    try:
        for i in range(0, len(data), 65536):
            part = data[i:i + 65536]
            s.sendall(b"%x\r\n%s\r\n" % (len(part), part))
        s.sendall(b"0\r\n\r\n")
    except OSError:
        pass
    resp = s.recv(4096).decode()
    s.close()
    return int(resp.split()[1])


def merge(srv, name, patch, sub=""):
    return srv.request("PATCH", NS + "/" + name + sub, patch,
                       headers={"Content-Type": "application/merge-patch+json"})


def test_merge_patch_and_status_subresource():
    with Server(args=PENDING_ARGS) as srv:
        create(srv, "p", budgetUSD="5.00", capabilities=["a"])
        st, _, b = merge(srv, "p", {"metadata": {"annotations": {"divergedev.com/guidance": "hint"}},
                                    "spec": {"budgetUSD": "20.00", "capabilities": None},
                                    "status": {"phase": "Completed"}})
        assert st == 200, b
        assert b["metadata"]["annotations"]["divergedev.com/guidance"] == "hint"
        assert b["spec"]["budgetUSD"] == "20.00" and "capabilities" not in b["spec"]
        assert b["status"]["phase"] == "Pending"  # status ignored on the main resource
        st, _, b = merge(srv, "p", {"status": {"phase": "Active", "costUSD": "0.0675",
                                               "previewUrl": "http://p/?_diverge_env=x"},
                                    "spec": {"objective": "ignored"}}, "/status")
        assert st == 200, b
        assert b["status"]["phase"] == "Active" and b["status"]["costUSD"] == "0.0675"
        assert b["spec"]["objective"] == "do it"
        st, _, b = srv.request("GET", NS + "/p/status")
        assert st == 200 and b["status"]["phase"] == "Active"
        st, _, b = merge(srv, "p", {"status": {"phase": "Sleeping"}}, "/status")
        assert st == 422
        st, _, b = merge(srv, "p", {"metadata": {"name": "other"}})
        assert st == 422
        st, _, b = merge(srv, "missing", {"spec": {}})
        assert st == 404
        st, _, b = merge(srv, "p", [1, 2])
        assert st == 400
        # Unchanged patch: same resourceVersion.
        st, _, before = srv.request("GET", NS + "/p")
        st, _, after = merge(srv, "p", {"spec": {"objective": "do it"}})
        assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
        # PUT replaces spec wholesale.
        before["spec"] = {"objective": "replaced"}
        st, _, b = srv.request("PUT", NS + "/p", before)
        assert st == 200 and b["spec"]["objective"] == "replaced" and "budgetUSD" not in b["spec"]
        st, _, b = srv.request("PUT", NS + "/p", before)
        assert st == 409  # before's resourceVersion is stale now


def test_delete():
    with Server(args=PENDING_ARGS) as srv:
        create(srv, "d")
        st, _, b = srv.request("DELETE", NS + "/d", {"preconditions": {"resourceVersion": "999"}})
        assert st == 409
        st, _, b = srv.request("DELETE", NS + "/d")
        assert st == 200 and b["metadata"]["name"] == "d"
        st, _, b = srv.request("DELETE", NS + "/d")
        assert st == 404


def test_stale_resource_version_race_exactly_one_conflict():
    with Server(args=PENDING_ARGS) as srv:
        create(srv, "race")
        for round_ in range(5):
            st, _, cur = srv.request("GET", NS + "/race")
            rv = cur["metadata"]["resourceVersion"]
            barrier = threading.Barrier(2)
            results = []

            def client(i):
                barrier.wait()
                st, _, _ = merge(srv, "race", {"metadata": {"resourceVersion": rv},
                                               "spec": {"objective": "r%d-%d" % (round_, i)}})
                results.append(st)

            ts = [threading.Thread(target=client, args=(i,)) for i in range(2)]
            [t.start() for t in ts]
            [t.join() for t in ts]
            assert sorted(results) == [200, 409], results


def read_watch_lines(srv, path, n, timeout=10):
    req = urllib.request.Request(srv.url + path,
                                 headers={"Authorization": "Bearer " + srv.token})
    resp = urllib.request.urlopen(req, timeout=timeout)
    assert resp.status == 200
    out = []
    while len(out) < n:
        line = resp.readline()
        if not line:
            break
        out.append(json.loads(line))
    resp.close()
    return out


def read_watch_until_deleted(srv, path, name, timeout=10):
    req = urllib.request.Request(srv.url + path,
                                 headers={"Authorization": "Bearer " + srv.token})
    resp = urllib.request.urlopen(req, timeout=timeout)
    out = []
    while True:
        line = resp.readline()
        if not line:
            break
        ev = json.loads(line)
        out.append(ev)
        if ev["type"] == "DELETED" and ev["object"]["metadata"]["name"] == name:
            break
    resp.close()
    return out


def test_watch_streams_events():
    with Server(args=PENDING_ARGS) as srv:
        create(srv, "w0")
        events = []

        def watcher():
            events.extend(read_watch_until_deleted(srv, NS + "?watch=true", "w1"))

        t = threading.Thread(target=watcher)
        t.start()
        time.sleep(0.3)
        create(srv, "w1")
        merge(srv, "w1", {"spec": {"objective": "changed"}})
        srv.request("DELETE", NS + "/w1")
        t.join(15)
        # The controller adds status-only MODIFIED events of its own; the user's changes
        # appear in order: synthetic ADDED of w0, ADDED w1, the spec change, DELETED.
        assert events[0]["type"] == "ADDED" and events[0]["object"]["metadata"]["name"] == "w0"
        w1 = [e for e in events if e["object"]["metadata"]["name"] == "w1"]
        assert w1[0]["type"] == "ADDED" and w1[-1]["type"] == "DELETED", events
        changed = [i for i, e in enumerate(w1) if e["object"]["spec"]["objective"] == "changed"]
        assert changed and w1[changed[0]]["type"] == "MODIFIED", events
        rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
        assert rvs[1:] == sorted(rvs[1:]), rvs
        # From a resourceVersion: only what came after it.
        st, _, lst = srv.request("GET", NS)
        rv = int(lst["metadata"]["resourceVersion"])
        create(srv, "w2")
        ev = read_watch_lines(srv, NS + "?watch=true&resourceVersion=%d" % rv, 1)
        assert ev[0]["type"] == "ADDED" and ev[0]["object"]["metadata"]["name"] == "w2"
        # timeoutSeconds ends the stream.
        time.sleep(0.3)
        st, _, lst = srv.request("GET", NS)
        t0 = time.time()
        ev = read_watch_lines(srv, NS + "?watch=1&resourceVersion=%s&timeoutSeconds=1"
                              % lst["metadata"]["resourceVersion"], 99)
        assert ev == [] and time.time() - t0 < 5


def test_watch_started_during_concurrent_creates_sees_each_task_once():
    """Watches started while creates stream in (their first list comes from a read
    connection, beside the writer): the synthetic ADDED list and the events after its
    resourceVersion name every task exactly once, none missed, none repeated."""
    with Server(args=PENDING_ARGS) as srv:
        for i in range(10):
            assert srv.request("POST", NS, task_obj("pre%d" % i))[0] == 201
        n = 300
        acked = []
        lock = threading.Lock()
        watchers = []

        def one(i):
            st, _, body = srv.request("POST", NS, task_obj("c%d" % i), timeout=30)
            assert st == 201, body
            with lock:
                acked.append(i)

        def watch(events):
            req = urllib.request.Request(srv.url + NS + "?watch=true",
                                         headers={"Authorization": "Bearer " + srv.token})
            with urllib.request.urlopen(req, timeout=30) as resp:
                while True:
                    line = resp.readline()
                    assert line, "the stream ended before the sentinel"
                    ev = json.loads(line)
                    events.append(ev)
                    if ev["object"]["metadata"]["name"] == "sentinel":
                        return

        with concurrent.futures.ThreadPoolExecutor(max_workers=16) as ex:
            futs = [ex.submit(one, i) for i in range(n)]
            for start_at in (30, 100, 200):
                deadline = time.time() + 30
                while len(acked) < start_at and time.time() < deadline:
                    time.sleep(0.001)
                events = []
                t = threading.Thread(target=watch, args=(events,))
                t.start()
                watchers.append((t, events))
            [f.result() for f in futs]
        # Every watcher started before this create, so each must reach it.
        assert srv.request("POST", NS, task_obj("sentinel"))[0] == 201
        want = {"pre%d" % i for i in range(10)} | {"c%d" % i for i in range(n)} | {"sentinel"}
        for t, events in watchers:
            t.join(60)
            assert not t.is_alive()
            added = {}
            for ev in events:
                if ev["type"] == "ADDED":
                    name = ev["object"]["metadata"]["name"]
                    added[name] = added.get(name, 0) + 1
            assert set(added) == want, sorted(want ^ set(added))
            assert all(c == 1 for c in added.values()), {k: c for k, c in added.items() if c != 1}


def test_restart_keeps_everything_and_sigterm_is_graceful():
    srv = Server(args=PENDING_ARGS).start()
    try:
        for i in range(5):
            create(srv, "r%d" % i)
        merge(srv, "r0", {"spec": {"objective": "after"}})
        rc = srv.stop()
        assert rc == 0, srv.stderr()
        assert "server_stopped" in srv.stderr()
        srv2 = Server(args=PENDING_ARGS, data_dir=srv.data_dir).start()
        try:
            st, _, lst = srv2.request("GET", NS)
            assert [i["metadata"]["name"] for i in lst["items"]] == ["r%d" % i for i in range(5)]
            assert lst["items"][0]["spec"]["objective"] == "after"
            assert srv2.token == srv.token  # the admin token file is kept
            # The old feed is gone: watching from before the restart is 410 Expired.
            ev = read_watch_lines(srv2, NS + "?watch=true&resourceVersion=1", 1)
            assert ev[0]["type"] == "ERROR" and ev[0]["object"]["code"] == 410, ev
            st, _, b = create(srv2, "r5")
            assert int(b["metadata"]["resourceVersion"]) > int(lst["metadata"]["resourceVersion"])
        finally:
            srv2.stop()
        mode = os.stat(os.path.join(srv.data_dir, "api-token")).st_mode & 0o777
        assert mode == 0o600, oct(mode)
        mode = os.stat(os.path.join(srv.data_dir, "macaroon-root-key")).st_mode & 0o777
        assert mode == 0o600, oct(mode)
    finally:
        srv.cleanup()


def test_kill9_during_200_concurrent_creates_loses_nothing_acknowledged():
    srv = Server(args=PENDING_ARGS).start()
    try:
        acked = []
        lock = threading.Lock()

        def one(i):
            try:
                st, _, _ = srv.request("POST", NS, task_obj("k%d" % i), timeout=10)
                if st == 201:
                    with lock:
                        acked.append("k%d" % i)
            except Exception:
                pass

        with concurrent.futures.ThreadPoolExecutor(max_workers=32) as ex:
            futs = [ex.submit(one, i) for i in range(200)]
            # Kill while creates are still in flight.
            deadline = time.time() + 30
            while len(acked) < 60 and time.time() < deadline:
                time.sleep(0.001)
            srv.kill()
            concurrent.futures.wait(futs)
        db = os.path.join(srv.data_dir, "diverge.db")
        con = sqlite3.connect(db)
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        con.close()
        srv2 = Server(args=PENDING_ARGS, data_dir=srv.data_dir).start()
        try:
            st, _, lst = srv2.request("GET", NS)
            names = {i["metadata"]["name"] for i in lst["items"]}
            missing = [n for n in acked if n not in names]
            assert not missing, missing
            assert len(acked) >= 60 and len(acked) <= len(names)
            print("acknowledged %d, present %d" % (len(acked), len(names)))
        finally:
            srv2.stop()
        con = sqlite3.connect(db)
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        con.close()
    finally:
        srv.cleanup()


def test_env_list_and_log_format():
    with Server(log_format="text") as srv:
        st, _, b = srv.request("GET", API + "/namespaces/default/environments")
        assert st == 200 and b["items"] == []
        st, _, b = srv.request("GET", API + "/namespaces/default/environments/nope")
        assert st == 404
        create(srv, "lg")
    err = srv.stderr()
    assert "info request method=POST" in err and "task_changed change=created" in err, err
    with Server(log_format="json") as srv:
        create(srv, "lg")
    line = [l for l in srv.stderr().splitlines() if '"task_changed"' in l][0]
    assert json.loads(line)["name"] == "lg"


def test_serve_flags_and_env():
    # Unknown flag: usage error 2; env var honoured; --help exits 0.
    r = subprocess.run([os.environ.get("DIVERGE_BIN", "build/diverge"), "serve", "--bogus"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.startswith("diverge: "), r
    r = subprocess.run([os.environ.get("DIVERGE_BIN", "build/diverge"), "serve", "--help"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "--listen" in r.stdout and "DIVERGE_DATA_DIR" in r.stdout
    with Server(env={"DIVERGE_PUBLIC_URL": "http://example.test:9"}) as srv:
        assert any("http://example.test:9/apis/" in l for l in srv.lines), srv.lines


def test_lists_of_different_sizes_at_once_each_get_their_own_items():
    """Large list bodies are written into memory kept from earlier ones (server/http): a
    short list after a long one, and lists sent at the same time, each carry exactly their
    own items, complete, with a Content-Length that matches."""
    with Server(args=PENDING_ARGS) as srv:
        big, small = API + "/namespaces/big/agenttasks", API + "/namespaces/small/agenttasks"
        def make(k):
            for i in range(k, 240, 8):
                st, _, b = srv.request("POST", big, task_obj("b%03d" % i, ns="big",
                                                             objective="o%03d " % i + "x" * 2000))
                assert st == 201, b
        with concurrent.futures.ThreadPoolExecutor(8) as ex:
            list(ex.map(make, range(8)))
        assert srv.request("POST", small, task_obj("s1", ns="small", objective="short"))[0] == 201
        want = {big: ["b%03d" % i for i in range(240)], small: ["s1"]}
        deadline = time.time() + 30  # the controller notes why each waits: then none changes
        while time.time() < deadline:
            items = srv.request("GET", big)[2]["items"] + srv.request("GET", small)[2]["items"]
            if all(i["status"].get("message") for i in items):
                break
            time.sleep(0.1)

        def check(path):
            st, h, raw = srv.request("GET", path, raw=True)
            assert st == 200 and int(h["content-length"]) == len(raw), (st, h)
            doc = json.loads(raw)
            assert doc["kind"] == "AgentTaskList" and int(doc["metadata"]["resourceVersion"]) > 0
            assert [i["metadata"]["name"] for i in doc["items"]] == want[path]
            if path == big:
                assert all(i["spec"]["objective"] == "o%s " % i["metadata"]["name"][1:] + "x" * 2000
                           for i in doc["items"])
            return len(raw)

        sizes = [check(p) for p in (big, small, big, small, small, big)]
        assert sizes[0] > 480000 and sizes[1] < 4000 and sizes[0] == sizes[2] == sizes[5]
        with concurrent.futures.ThreadPoolExecutor(6) as ex:
            got = list(ex.map(check, [big, small] * 30))
        assert got == [sizes[0], sizes[1]] * 30


if __name__ == "__main__":
    run_tests([test_health_ready_metrics, test_create_get_list_roundtrip, test_status_codes,
               test_merge_patch_and_status_subresource, test_delete,
               test_stale_resource_version_race_exactly_one_conflict, test_watch_streams_events,
               test_watch_started_during_concurrent_creates_sees_each_task_once,
               test_restart_keeps_everything_and_sigterm_is_graceful,
               test_kill9_during_200_concurrent_creates_loses_nothing_acknowledged,
               test_env_list_and_log_format, test_serve_flags_and_env,
               test_lists_of_different_sizes_at_once_each_get_their_own_items])
