# SPDX-License-Identifier: Apache-2.0
"""GET /api/v1/events (SPEC §12) with a plain HTTP client: SSE framing, the snapshot, task
changes in order, Last-Event-ID resume across a burst (nothing lost, nothing repeated),
the task log tail (no file yet, partial lines, the cap replacing the file, CR in a line),
`end` when the task completes, deletions, auth, the subscriber cap, and 200 concurrent
subscribers next to a working task API."""
import http.client
import json
import os
import queue
import threading
import time

from harness import API, Server, run_tests, task_obj

NS = API + "/namespaces/default/agenttasks"


class SSE:
    """One event stream read by a background thread into a queue of dicts
    {event, id, data} (comments come as {"comment": text})."""

    def __init__(self, srv, path="/api/v1/events", headers=None, auth=True, source_ip=None):
        host, port = srv.url[len("http://"):].split(":")
        self.conn = http.client.HTTPConnection(
            host, int(port), timeout=60,
            source_address=(source_ip, 0) if source_ip else None)
        hdrs = dict(headers or {})
        if auth:
            hdrs.setdefault("Authorization", "Bearer " + srv.token)
        self.conn.request("GET", path, headers=hdrs)
        self.resp = self.conn.getresponse()
        self.status = self.resp.status
        self.headers = {k.lower(): v for k, v in self.resp.getheaders()}
        self.q = queue.Queue()
        self.last_id = None
        if self.status == 200:
            threading.Thread(target=self._read, daemon=True).start()
        else:
            self.body = self.resp.read()

    def _read(self):
        ev = {}
        try:
            while True:
                line = self.resp.readline()
                if not line:
                    break
                line = line.decode("utf-8").rstrip("\n")
                if line == "":
                    if ev:
                        if "data" in ev:
                            ev["data"] = "\n".join(ev["data"])
                        self.q.put(ev)
                    ev = {}
                    continue
                if line.startswith(":"):
                    self.q.put({"comment": line[1:].strip()})
                    continue
                field, _, value = line.partition(":")
                value = value[1:] if value.startswith(" ") else value
                if field == "data":
                    ev.setdefault("data", []).append(value)
                else:
                    ev[field] = value
        except Exception:  # closed under the reader by close(): the stream just ends
            pass
        self.q.put(None)

    def next(self, timeout=10, kinds=("task", "log", "end", "reset")):
        """The next event of one of KINDS (others skipped); None at end of stream."""
        deadline = time.time() + timeout
        while True:
            left = deadline - time.time()
            if left <= 0:
                raise AssertionError("no event within %ss" % timeout)
            try:
                ev = self.q.get(timeout=left)
            except queue.Empty:
                raise AssertionError("no event within %ss" % timeout)
            if ev is None:
                return None
            if "id" in ev:
                self.last_id = ev["id"]
            if ev.get("event") in kinds:
                return ev

    def quiet(self, seconds, kinds=("task", "log", "end", "reset")):
        """Asserts no event of KINDS arrives for SECONDS."""
        try:
            ev = self.next(timeout=seconds, kinds=kinds)
        except AssertionError:
            return
        raise AssertionError("unexpected event %r" % ev)

    def close(self):
        try:
            self.conn.sock.shutdown(2)
        except OSError:
            pass
        self.conn.close()


def create(srv, name, objective="do it", **spec):
    """Creates a task and waits until the controller made it Active (sandbox provider
    none), so that the controller's own change does not race a test's events."""
    st, _, body = srv.request("POST", NS, task_obj(name, objective=objective, **spec))
    assert st == 201, body
    deadline = time.time() + 10
    while time.time() < deadline:
        st, _, body = srv.request("GET", NS + "/" + name)
        if body["status"].get("phase") == "Active":
            return body
        time.sleep(0.02)
    raise AssertionError("task %s never became Active" % name)


def until_rv(s, rv, timeout=10):
    """Events of S up to and including the one with resourceVersion RV."""
    out = []
    while not out or rv_of(out[-1]) < rv:
        out.append(s.next(timeout=timeout, kinds=("task",)))
    return out


def annotate(srv, name, value):
    st, _, body = srv.request("PATCH", NS + "/" + name,
                              {"metadata": {"annotations": {"test/v": str(value)}}},
                              headers={"Content-Type": "application/merge-patch+json"})
    assert st == 200, body
    return int(body["metadata"]["resourceVersion"])


def set_phase(srv, name, phase):
    st, _, body = srv.request("PATCH", NS + "/" + name + "/status",
                              {"status": {"phase": phase}},
                              headers={"Content-Type": "application/merge-patch+json"})
    assert st == 200, body
    return body


def rv_of(ev):
    return int(json.loads(ev["data"])["metadata"]["resourceVersion"])


def log_path(srv, name, ns="default"):
    d = os.path.join(srv.data_dir, "logs", ns)
    os.makedirs(d, exist_ok=True)
    return os.path.join(d, name + ".log")


def append(path, text):
    with open(path, "a") as f:
        f.write(text)


class Checked(Server):
    """A server whose clean exit (status 0: no sanitizer report, no crash) is checked."""

    def __exit__(self, exc_type, *exc):
        rc = self.stop()
        self.cleanup()
        if exc_type is None:
            assert rc == 0, "server exit status %r\n%s" % (rc, self.stderr()[-3000:])


def server(env=None):
    return Checked(args=["--sandbox-provider", "none"], env=env)


def test_auth_headers_and_refusals():
    with server() as srv:
        s = SSE(srv, auth=False)
        assert s.status == 401, s.status
        assert b"diverge_token" in s.body, s.body
        s = SSE(srv, auth=False, headers={"Cookie": "diverge_token=wrong"})
        assert s.status == 401
        # The cookie holds a login session, never the admin token.
        s = SSE(srv, auth=False, headers={"Cookie": "diverge_token=" + srv.token})
        assert s.status == 401, s.status
        c = http.client.HTTPConnection(*srv.url[len("http://"):].split(":"), timeout=30)
        c.request("GET", "/ui/login?token=" + srv.token)
        r = c.getresponse()
        r.read()
        c.close()
        session = r.getheader("Set-Cookie").split(";")[0]
        s = SSE(srv, auth=False, headers={"Cookie": session})
        assert s.status == 200, s.status
        assert s.headers["content-type"] == "text/event-stream", s.headers
        assert s.headers.get("cache-control") == "no-cache", s.headers
        s.close()
        s = SSE(srv, headers={"Origin": "http://evil.example"})
        assert s.status == 403, s.status
        host = srv.url[len("http://"):]
        s = SSE(srv, headers={"Origin": "http://" + host})
        assert s.status == 200
        s.close()
        for bad in ("1-2", "x-0-0-0", "1-0-0-7", "1-0-0-0-0", "-1-0-0-0"):
            s = SSE(srv, headers={"Last-Event-ID": bad})
            assert s.status == 400, (bad, s.status)
        for bad in ("nosuchslash", "Bad/Name", "a/../../etc", "/x"):
            s = SSE(srv, path="/api/v1/events?task=" + bad)
            assert s.status == 400, (bad, s.status)


def test_snapshot_then_changes_in_order():
    with server() as srv:
        for n in ("c", "a", "b"):
            create(srv, n)
        s = SSE(srv)
        snap = [s.next() for _ in range(3)]
        names = [json.loads(e["data"])["metadata"]["name"] for e in snap]
        assert names == ["a", "b", "c"], names
        # Inside the snapshot the ids say so; the last one is a live cursor.
        assert [e["id"].split("-")[3] for e in snap] == ["2", "2", "0"], snap
        rvs = [annotate(srv, n, i) for i, n in enumerate(["a", "b", "c", "a", "b"])]
        got = [s.next() for _ in range(5)]
        assert [rv_of(e) for e in got] == rvs, (got, rvs)
        assert [int(e["id"].split("-")[0]) for e in got] == rvs
        s.close()


def test_resume_across_burst_loses_and_repeats_nothing():
    with server() as srv:
        names = ["r%d" % i for i in range(5)]
        for n in names:
            create(srv, n)
        ref = SSE(srv)  # never interrupted: the truth
        s = SSE(srv)
        for _ in names:
            ref.next()
            s.next()
        stop = threading.Event()
        rvs = []

        def burst():
            i = 0
            while not stop.is_set() or i < 60:
                rvs.append(annotate(srv, names[i % len(names)], i))
                i += 1
                if i >= 200:
                    break

        t = threading.Thread(target=burst)
        t.start()
        seen = []
        for cut in range(4):  # reconnect four times while the burst goes on
            for _ in range(7):
                seen.append(s.next())
            last = s.last_id
            s.close()
            s = SSE(srv, headers={"Last-Event-ID": last})
            assert s.status == 200
        stop.set()
        t.join()
        seen += until_rv(s, max(rvs))
        s.quiet(0.6)
        got = [rv_of(e) for e in seen]
        assert len(set(got)) == len(got) and got == sorted(got), got
        assert set(rvs) <= set(got), sorted(set(rvs) - set(got))
        want = [rv_of(e) for e in until_rv(ref, max(rvs))]
        assert got == want, (got, want)
        s.close()
        ref.close()


def test_log_tail_resume_cap_and_end():
    with server() as srv:
        create(srv, "lg")
        path = "/api/v1/events?task=default/lg"
        s = SSE(srv, path=path)
        assert json.loads(s.next()["data"])["metadata"]["name"] == "lg"
        s.quiet(0.8, kinds=("log", "end"))  # no file yet: no log events
        lp = log_path(srv, "lg")
        append(lp, "2026-11-30T10:00:00Z line one\n"
                   "2026-11-30T10:00:01Z two <img src=x onerror=alert(1)>\n3 part")
        ev = s.next(kinds=("log",))
        assert ev["data"].split("\n") == [
            "2026-11-30T10:00:00Z line one",
            "2026-11-30T10:00:01Z two <img src=x onerror=alert(1)>"], ev
        s.quiet(0.6, kinds=("log",))  # the partial line waits for its newline
        append(lp, "ial\n4 cr\revent: end\n")
        ev = s.next(kinds=("log",))
        assert ev["data"].split("\n") == ["3 partial", "4 cr event: end"], ev
        # Disconnect, more lines, resume: exactly the new ones.
        last = s.last_id
        s.close()
        append(lp, "5 while away\n")
        s = SSE(srv, path=path, headers={"Last-Event-ID": last})
        ev = s.next(kinds=("log",))
        assert ev["data"] == "5 while away", ev
        # The cap replaces the file: newest part kept, a first line says what was dropped.
        last = s.last_id
        s.close()
        with open(lp) as f:
            old = f.read()
        keep_from = old.index("4 cr")
        tmp = lp + ".cut"
        with open(tmp, "w") as f:
            f.write("2026-11-30T10:00:05Z [log] %d older bytes dropped (log cap 100)\n" % keep_from)
            f.write(old[keep_from:] + "6 after the cut\n")
        os.rename(tmp, lp)
        s = SSE(srv, path=path, headers={"Last-Event-ID": last})
        ev = s.next(kinds=("log",))
        assert ev["data"] == "6 after the cut", ev
        # Completion: `end` after the last lines, then the stream stays for task events.
        append(lp, "7 last words\n")
        time.sleep(0.4)
        set_phase(srv, "lg", "Completed")
        kinds = []
        while "end" not in kinds:
            ev = s.next(kinds=("log", "end", "task"))
            kinds.append(ev["event"])
            if ev["event"] == "log":
                assert ev["data"] == "7 last words", ev
        assert kinds.index("end") == len(kinds) - 1, kinds
        assert ev["id"].endswith("-1"), ev
        append(lp, "8 after the end\n")
        s.quiet(0.8, kinds=("log", "end"))
        rv = annotate(srv, "lg", "x")
        assert rv_of(until_rv(s, rv)[-1]) == rv
        # Resuming after `end` neither repeats it nor tails again.
        last = s.last_id
        s.close()
        s = SSE(srv, path=path, headers={"Last-Event-ID": last})
        s.quiet(1.0, kinds=("log", "end", "task"))
        s.close()
        # A stream opened on a finished task: its log, then `end` at once.
        s = SSE(srv, path=path)
        kinds = []
        while "end" not in kinds:
            kinds.append(s.next(kinds=("log", "end", "task"))["event"])
        assert kinds[0] == "task" and "log" in kinds, kinds
        s.close()


def test_long_log_goes_out_whole_in_steps_then_end():
    with server() as srv:
        create(srv, "big")
        lines = ["2026-11-30T10:00:00Z line %06d %s" % (i, "x" * (i % 97)) for i in range(30000)]
        with open(log_path(srv, "big"), "w") as f:
            f.write("\n".join(lines) + "\n")
        set_phase(srv, "big", "Completed")  # finished before the stream opens
        s = SSE(srv, path="/api/v1/events?task=default/big")
        got = []
        while True:
            ev = s.next(kinds=("log", "end"))
            if ev["event"] == "end":
                break
            got += ev["data"].split("\n")
        assert got == lines, (len(got), len(lines))
        s.close()


def test_deleted_task_event():
    with server() as srv:
        create(srv, "gone")
        s = SSE(srv, path="/api/v1/events?task=default/gone")
        s.next()
        st, _, _ = srv.request("DELETE", NS + "/gone")
        assert st == 200, st
        ev = s.next()
        obj = json.loads(ev["data"])
        assert obj["metadata"]["name"] == "gone" and obj["metadata"].get("deletionTimestamp")
        assert s.next(kinds=("end",))["event"] == "end"
        s.close()


def test_subscriber_cap_is_503_and_slots_come_back():
    with server(env={"DIVERGE_EVENTS_MAX": "3"}) as srv:
        subs = [SSE(srv) for _ in range(3)]
        assert all(x.status == 200 for x in subs)
        extra = SSE(srv)
        assert extra.status == 503, extra.status
        assert b"too many event streams" in extra.body
        subs.pop().close()
        deadline = time.time() + 10
        while True:
            s = SSE(srv)
            if s.status == 200:
                break
            assert time.time() < deadline, "slot of a closed stream not freed"
            time.sleep(0.2)
        s.close()
        for x in subs:
            x.close()


def test_200_subscribers_and_the_api_keeps_answering():
    with server() as srv:
        create(srv, "load")
        subs = []
        # Several loopback source addresses: the per-address connection cap is 128.
        for i in range(200):
            subs.append(SSE(srv, source_ip="127.0.0.%d" % (2 + i % 4)))
        assert all(x.status == 200 for x in subs), [x.status for x in subs if x.status != 200]
        for x in subs:
            x.next()
        for _ in range(100):
            st, _, _ = srv.request("GET", NS + "/load")
            assert st == 200
        rv = annotate(srv, "load", 1)
        for x in subs:
            assert rv_of(until_rv(x, rv)[-1]) == rv
        for x in subs:
            x.close()


def test_ping_and_shutdown():
    with server(env={"DIVERGE_EVENTS_PING_MS": "300"}) as srv:
        s = SSE(srv)
        pings = 0
        while pings < 2:
            ev = s.q.get(timeout=10)
            assert ev is not None and "event" not in ev, ev
            pings += ev.get("comment") == "ping"
        t0 = time.time()
        rc = srv.stop()
        assert rc == 0, rc
        assert s.next(timeout=10) is None
        assert time.time() - t0 < 15


if __name__ == "__main__":
    run_tests([test_auth_headers_and_refusals, test_snapshot_then_changes_in_order,
               test_resume_across_burst_loses_and_repeats_nothing,
               test_log_tail_resume_cap_and_end,
               test_long_log_goes_out_whole_in_steps_then_end, test_deleted_task_event,
               test_subscriber_cap_is_503_and_slots_come_back,
               test_200_subscribers_and_the_api_keeps_answering, test_ping_and_shutdown])
