# SPDX-License-Identifier: Apache-2.0
"""The LLM gateway (SPEC §13) against the real `diverge serve --sandbox-provider none` and a
scripted fake upstream on loopback (tests/fakes/fake_llm.py): exact metering from the
provider's usage, budgets that hold under concurrent calls, 402 and the pause, streams cut
mid-way, upstream errors passed through and not charged, models outside the capabilities,
and the server's key never leaving the server."""
import concurrent.futures
import http.client
import json
import os
import sys
import threading
import time
from decimal import Decimal, ROUND_CEILING

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "fakes"))

from fake_llm import FakeLLM  # noqa: E402
from harness import Server, run_tests  # noqa: E402
from llm_helpers import NS, LLMGateway, start_task, wait_charges, wait_phase  # noqa: E402,F401

MSG = "/api/v1/llm/anthropic/v1/messages"
KEY = "sk-ant-server-key-5e1f0c4a9b7d"
MODEL = "claude-sonnet-4-5-20250929"
# The built-in price of claude-sonnet-4*: USD per million tokens.
PRICE = {"input": Decimal("3.00"), "output": Decimal("15.00"),
         "cache_write": Decimal("3.75"), "cache_read": Decimal("0.30")}


class Gateway(LLMGateway):
    def __init__(self, extra_args=(), env=None):
        super().__init__("anthropic", KEY, extra_args, env)


def task(srv, name):
    st, _, b = srv.request("GET", NS + "/" + name)
    assert st == 200, b
    return b


def post(srv, path, body, headers, raw=False):
    """POSTs BODY (dict) to the gateway; returns (status, headers, bytes)."""
    data = json.dumps(body).encode() if not isinstance(body, bytes) else body
    h = {"Content-Type": "application/json"}
    h.update(headers)
    return srv.request("POST", path, data, headers=h, auth=False, raw=True)


def msg_body(max_tokens=100, stream=False, **extra):
    b = {"model": MODEL, "max_tokens": max_tokens, "stream": stream,
         "messages": [{"role": "user", "content": "say hello"}]}
    b.update(extra)
    return b


def cost_micros(u):
    total = sum(Decimal(u[k]) * PRICE[k] for k in PRICE)  # micro-dollars: tokens * $/MTok
    return int(total.to_integral_value(rounding=ROUND_CEILING))


def usd(micros):
    return Decimal(micros) / Decimal(1000000)


def read_log(srv, name):
    with open(os.path.join(srv.data_dir, "logs", "default", name + ".log")) as f:
        return f.read()


def stream_raw(srv, path, body, headers, watch=None):
    """Reads a streamed answer with http.client; returns (status, bytes, error or None).
    WATCH, (marker, event): the event is set once the marker has reached the client."""
    host, port = srv.url.split("//")[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    h = {"Content-Type": "application/json"}
    h.update(headers)
    conn.request("POST", path, json.dumps(body).encode(), h)
    resp = conn.getresponse()
    data, err = b"", None
    try:
        while True:
            chunk = resp.read1(65536)
            if not chunk:
                break
            data += chunk
            if watch is not None and watch[0] in data:
                watch[1].set()
    except (http.client.IncompleteRead, ConnectionError) as e:
        err = e
    conn.close()
    return resp.status, data, err


def test_exact_spend_streaming_and_not():
    with Gateway() as gw:
        srv, fake = gw.srv, gw.fake
        tok = start_task(srv, "exact", budgetUSD="5.00")
        fake.usage = {"input": 100, "output": 50, "cache_write": 10, "cache_read": 20}
        st, h, raw = post(srv, MSG, msg_body(), {"x-api-key": tok,
                                                  "anthropic-version": "2023-06-01"})
        assert st == 200, raw
        b = json.loads(raw)
        assert b["usage"]["input_tokens"] == 100 and b["content"][0]["text"] == "hello", b
        assert h.get("request-id") == "req_fake", h
        one = cost_micros(fake.usage)
        assert one == 1094  # 300 + 750 + 37.5 + 6 micro-dollars, rounded up
        wait_charges(srv, "exact", 1)
        t = task(srv, "exact")
        assert Decimal(t["status"]["costUSD"]) == usd(one), t["status"]
        assert t["status"]["tokensConsumed"] == 180, t["status"]
        # The upstream got the server's key, the version header, and never the task token.
        r0 = fake.requests[-1]
        assert r0["headers"]["x-api-key"] == KEY and r0["headers"]["anthropic-version"] == \
            "2023-06-01", r0["headers"]
        assert tok not in json.dumps(r0), r0
        assert r0["body"]["max_tokens"] == 100 and "system" not in r0["body"], r0["body"]
        # Streamed, with Authorization: Bearer and ?beta=true: message_start + message_delta.
        st, data, err = stream_raw(srv, MSG + "?beta=true", msg_body(stream=True),
                                   {"Authorization": "Bearer " + tok,
                                    "anthropic-beta": "prompt-caching-2024-07-31"})
        assert st == 200 and err is None, (st, data, err)
        text = data.decode()
        assert text.count("event: ") == 8 and "message_stop" in text, text
        r1 = fake.requests[-1]
        assert r1["path"] == "/v1/messages?beta=true", r1["path"]
        assert r1["headers"]["anthropic-beta"] == "prompt-caching-2024-07-31"
        assert r1["headers"]["x-api-key"] == KEY and "authorization" not in r1["headers"]
        wait_charges(srv, "exact", 2)
        t = task(srv, "exact")
        assert Decimal(t["status"]["costUSD"]) == usd(2 * one), t["status"]
        assert t["status"]["tokensConsumed"] == 360
        log = read_log(srv, "exact")
        line = ("llm anthropic %s input=100 output=50 cache_write=10 cache_read=20 usd=0.001094"
                % MODEL)
        assert log.count(line) == 2, log


def test_upstream_connection_is_kept_alive_across_calls():
    """Calls one after another reuse the gateway's kept-alive upstream connection (no new
    TCP or TLS handshake per call), streamed or not, and each is charged once."""
    with Gateway() as gw:
        srv, fake = gw.srv, gw.fake
        tok = start_task(srv, "reuse", budgetUSD="5.00")
        for stream in (False, True, False, True):
            if stream:
                st, data, err = stream_raw(srv, MSG, msg_body(stream=True), {"x-api-key": tok})
                assert st == 200 and err is None and b"message_stop" in data, (st, data, err)
            else:
                st, _, raw = post(srv, MSG, msg_body(), {"x-api-key": tok})
                assert st == 200, raw
        peers = [r["peer"] for r in fake.requests]
        assert len(peers) == 4 and len(set(peers)) == 1, peers
        wait_charges(srv, "reuse", 4)
        t = task(srv, "reuse")
        assert Decimal(t["status"]["costUSD"]) == usd(4 * cost_micros(fake.usage)), t["status"]


def test_stream_charged_at_its_final_usage_before_it_ends():
    """A stream's charge starts when its final usage arrives (message_delta), beside the
    relay of the rest: with the upstream holding message_stop back, the call is already
    charged its real usage, once; the stream then ends whole and nothing more is charged."""
    with Gateway() as gw:
        srv, fake = gw.srv, gw.fake
        tok = start_task(srv, "early", budgetUSD="5.00")
        paused, resume = threading.Event(), threading.Event()
        # message_start ... message_delta (events 0-6) go out; message_stop waits.
        fake.script.append({"pause_after": 7, "paused": paused, "resume": resume})
        with concurrent.futures.ThreadPoolExecutor(1) as ex:
            f = ex.submit(stream_raw, srv, MSG, msg_body(stream=True), {"x-api-key": tok})
            try:
                assert paused.wait(30), "the stream never reached message_stop at the fake"
                one = usd(cost_micros(fake.usage))
                deadline = time.monotonic() + 30
                while Decimal(task(srv, "early")["status"].get("costUSD", "0")) != one:
                    assert time.monotonic() < deadline, task(srv, "early")["status"]
                    time.sleep(0.02)
                assert not f.done()
            finally:
                resume.set()
            st, data, err = f.result()
        assert st == 200 and err is None, (st, data, err)
        assert data.decode().count("event: ") == 8 and b"message_stop" in data, data
        t = task(srv, "early")
        assert Decimal(t["status"]["costUSD"]) == one, t["status"]
        # The log line follows the charge's commit (the spend can be read a moment before).
        assert len(wait_charges(srv, "early", 1)) == 1
        assert read_log(srv, "early").count("llm anthropic ") == 1


def test_upstream_errors_pass_through_uncharged():
    with Gateway() as gw:
        srv, fake = gw.srv, gw.fake
        tok = start_task(srv, "errs", budgetUSD="5.00")
        for status, etype in ((500, "api_error"), (529, "overloaded_error"),
                              (429, "rate_limit_error")):
            body = {"type": "error", "error": {"type": etype, "message": "upstream says no"}}
            fake.script.append({"status": status, "body": body})
            st, _, raw = post(srv, MSG, msg_body(), {"x-api-key": tok})
            assert st == status and json.loads(raw) == body, (st, raw)
            # Streamed calls get the error whole, too.
            fake.script.append({"status": status, "body": body})
            st, data, _ = stream_raw(srv, MSG, msg_body(stream=True), {"x-api-key": tok})
            assert st == status and json.loads(data) == body, (st, data)
        t = task(srv, "errs")
        assert Decimal(t["status"].get("costUSD", "0")) == 0, t["status"]
        assert t["status"].get("tokensConsumed", 0) == 0
        assert t["status"]["phase"] == "Active"


def test_stream_cut_charges_the_reservation():
    with Gateway() as gw:
        srv, fake = gw.srv, gw.fake
        tok = start_task(srv, "cut", budgetUSD="5.00")
        body = msg_body(max_tokens=200, stream=True)
        fake.script.append({"cut_after": 3})  # message_start, block start, ping: no delta
        st, data, err = stream_raw(srv, MSG, body, {"x-api-key": tok})
        assert st == 200 and b"message_start" in data and b"message_delta" not in data
        assert err is not None, "the client must see the stream cut, not a normal end"
        n = len(json.dumps(body).encode())
        # Input priced at the dearest input kind (cache write), output at max_tokens.
        reserve = int((Decimal(n) * PRICE["cache_write"] + 200 * PRICE["output"])
                      .to_integral_value(rounding=ROUND_CEILING))
        wait_charges(srv, "cut", 1)
        t = task(srv, "cut")
        assert Decimal(t["status"]["costUSD"]) == usd(reserve), (t["status"], reserve)
        assert t["status"]["tokensConsumed"] == n + 200
        log = read_log(srv, "cut")
        assert "ended before its usage arrived: charged the reservation" in log, log


def test_auth_and_models():
    with Gateway() as gw:
        srv, fake = gw.srv, gw.fake
        tok = start_task(srv, "caps", budgetUSD="5.00", capabilities=["claude-haiku-*"])
        st, _, raw = post(srv, MSG, msg_body(), {"x-api-key": tok})
        b = json.loads(raw)
        assert st == 403 and b["type"] == "error" and \
            b["error"]["type"] == "permission_error", (st, b)
        # The meter's own reason, not an internal error's "retry".
        assert b["error"]["message"] == "diverge: model not allowed", b
        st, _, raw = post(srv, MSG, dict(msg_body(), model="no-such-model"), {"x-api-key": tok})
        b = json.loads(raw)
        assert st == 403 and b["error"]["message"] == "diverge: no price for model no-such-model"
        # A refused token is 401 before anything else is refused (SPEC §13, as the meter).
        for body in (dict(msg_body(), model="no-such-model"), {"messages": []}, [1]):
            st, _, raw = post(srv, MSG, body, {"x-api-key": "not-a-token"})
            assert st == 401 and json.loads(raw)["error"]["type"] == "authentication_error", \
                (body, st, raw)
        for hdrs in ({}, {"x-api-key": "not-a-token"}, {"Authorization": "Basic eDp5"},
                     {"x-api-key": tok, "Authorization": "Bearer " + tok}):
            st, _, raw = post(srv, MSG, dict(msg_body(), model="claude-haiku-4-5"), hdrs)
            b = json.loads(raw)
            assert st == 401 and b["error"]["type"] == "authentication_error", (hdrs, st, b)
        assert fake.requests == [], fake.requests
        st, _, raw = post(srv, MSG, dict(msg_body(), model="claude-haiku-4-5"),
                          {"x-api-key": tok})
        assert st == 200, raw
        wait_charges(srv, "caps", 1)
        # count_tokens: forwarded, not charged; the probe answers 200.
        before = task(srv, "caps")["status"]["costUSD"]
        st, _, raw = post(srv, MSG + "/count_tokens", dict(msg_body(), model="claude-haiku-4-5"),
                          {"x-api-key": tok})
        assert st == 200 and json.loads(raw) == {"input_tokens": 42}, raw
        assert fake.requests[-1]["headers"]["x-api-key"] == KEY
        assert task(srv, "caps")["status"]["costUSD"] == before
        for method in ("GET", "HEAD"):
            st, _, _ = srv.request(method, "/api/v1/llm/anthropic/api/hello", auth=False)
            assert st == 200, (method, st)
        # A paused task's token is refused.
        srv.request("PATCH", NS + "/caps", {"spec": {"suspended": True}},
                    headers={"Content-Type": "application/merge-patch+json"})
        wait_phase(srv, "caps", "Paused")
        st, _, raw = post(srv, MSG, dict(msg_body(), model="claude-haiku-4-5"),
                          {"x-api-key": tok})
        assert st == 401, raw
        # Said as the meter says it (a client must not be told to retry).
        assert json.loads(raw)["error"]["message"] == "diverge: token revoked", raw


def test_no_key_configured_is_503():
    fake = FakeLLM().start()
    try:
        with Server(["--sandbox-provider", "none", "--llm-upstream", "anthropic=" + fake.url],
                    env={"DIVERGE_ANTHROPIC_API_KEY": None}) as srv:
            tok = start_task(srv, "nokey")
            st, _, raw = post(srv, MSG, msg_body(), {"x-api-key": tok})
            assert st == 503 and json.loads(raw)["type"] == "error", raw
            # A refused token is still 401 there (SPEC §13: verified as the meter verifies).
            st, _, raw = post(srv, MSG, msg_body(), {"x-api-key": "not-a-token"})
            assert st == 401, raw
            assert fake.requests == []
    finally:
        fake.stop()


def test_budget_lowers_max_tokens_then_402_and_pause():
    with Gateway() as gw:
        srv, fake = gw.srv, gw.fake
        tok = start_task(srv, "poor", budgetUSD="0.01")
        body = msg_body(max_tokens=4096, system="x" * 900)
        n = len(json.dumps(body).encode())
        assert 1000 < n < 1100, n
        in_cost = Decimal(n) * PRICE["cache_write"]
        allowed = int((Decimal(10000) - in_cost) / PRICE["output"])
        # The last token must fit after rounding up too.
        while (in_cost + allowed * PRICE["output"]).to_integral_value(ROUND_CEILING) > 10000:
            allowed -= 1
        fake.usage = {"input": 100, "output": 400, "cache_write": 0, "cache_read": 0}
        st, _, raw = post(srv, MSG, body, {"x-api-key": tok})
        assert st == 200, raw
        assert fake.requests[-1]["body"]["max_tokens"] == allowed, \
            (fake.requests[-1]["body"], allowed)
        spent = cost_micros(fake.usage)  # 300 + 6000
        wait_charges(srv, "poor", 1)
        assert Decimal(task(srv, "poor")["status"]["costUSD"]) == usd(spent)
        # What remains (3700 micro-dollars) cannot pay for this input: 402, task paused.
        calls = len(fake.requests)
        st, _, raw = post(srv, MSG, body, {"x-api-key": tok})
        b = json.loads(raw)
        assert st == 402 and b["type"] == "error", (st, b)
        assert b["error"]["message"].startswith("diverge: budget exceeded"), b
        assert len(fake.requests) == calls
        t = wait_phase(srv, "poor", "Paused")
        assert t["status"]["reason"] == "BudgetExceeded", t["status"]
        assert Decimal(t["status"]["costUSD"]) == usd(spent) <= Decimal("0.01")
        st, _, _ = srv.request("GET", NS + "/poor/token")
        assert st == 404
        st, _, raw = post(srv, MSG, body, {"x-api-key": tok})
        assert st == 401, raw
        assert "refused: budget exceeded, task paused" in read_log(srv, "poor")


def test_budget_pause_of_a_task_with_capabilities():
    # The pause of a refused call checks the call's model against spec.capabilities as a
    # meter call does (it was checked without one: Forbidden, so the task stayed Active).
    with Gateway() as gw:
        srv = gw.srv
        tok = start_task(srv, "capspoor", budgetUSD="0.01", capabilities=["claude-sonnet-4*"])
        st, _, raw = post(srv, MSG, msg_body(system="x" * 4000), {"x-api-key": tok})
        assert st == 402 and json.loads(raw)["error"]["message"].startswith(
            "diverge: budget exceeded"), (st, raw)
        t = wait_phase(srv, "capspoor", "Paused")
        assert t["status"]["reason"] == "BudgetExceeded", t["status"]
        assert "refused: budget exceeded, task paused" in read_log(srv, "capspoor")
        assert gw.fake.requests == []


def test_concurrent_calls_never_pass_the_budget():
    with Gateway() as gw:
        srv, fake = gw.srv, gw.fake
        fake.worst_case = True  # every call uses all it may: body bytes in, max_tokens out
        tok = start_task(srv, "race", budgetUSD="0.20")

        def one(i):
            stream = i % 2 == 0
            body = msg_body(max_tokens=3000, stream=stream)
            if stream:
                st, _, _ = stream_raw(srv, MSG, body, {"x-api-key": tok})
            else:
                st, _, _ = post(srv, MSG, body, {"x-api-key": tok})
            return st

        with concurrent.futures.ThreadPoolExecutor(16) as ex:
            statuses = list(ex.map(one, range(48)))
        assert set(statuses) <= {200, 402, 401}, statuses
        assert statuses.count(200) >= 4, statuses
        wait_charges(srv, "race", statuses.count(200))
        t = task(srv, "race")
        assert Decimal(t["status"]["costUSD"]) <= Decimal("0.20"), t["status"]
        assert Decimal(t["status"]["costUSD"]) > Decimal("0.15"), t["status"]


def test_key_never_leaves_the_server():
    with Gateway() as gw:
        srv, fake = gw.srv, gw.fake
        tok = start_task(srv, "leak", budgetUSD="5.00")
        # An upstream that echoes the key it got has it masked.
        fake.script.append({"status": 401, "body": {"type": "error", "error": {
            "type": "authentication_error", "message": "invalid x-api-key " + KEY}}})
        st, _, raw = post(srv, MSG, msg_body(), {"x-api-key": tok})
        assert st == 401 and KEY.encode() not in raw, raw
        post(srv, MSG, msg_body(), {"x-api-key": tok})
        stream_raw(srv, MSG, msg_body(stream=True), {"x-api-key": tok})
        wait_charges(srv, "leak", 2)  # the log holds both calls' lines
        _, _, metrics = srv.request("GET", "/metrics")
        assert KEY not in metrics
        assert KEY not in read_log(srv, "leak")
        assert KEY not in srv.stderr()
        st, _, b = srv.request("GET", NS + "/leak")
        assert KEY not in json.dumps(b)
        for r in fake.requests:
            assert tok not in json.dumps(r)


def test_guidance_reaches_the_system_prompt():
    with Gateway() as gw:
        srv, fake = gw.srv, gw.fake
        tok = start_task(srv, "guide", budgetUSD="5.00")
        post(srv, MSG, msg_body(), {"x-api-key": tok})
        assert "guidanceDeliveredAt" not in srv.request("GET", NS + "/guide")[2]["status"]
        srv.request("PATCH", NS + "/guide",
                    {"metadata": {"annotations": {"divergedev.com/guidance": "use the ORM"}}},
                    headers={"Content-Type": "application/merge-patch+json"})
        post(srv, MSG, msg_body(system="You are terse."), {"x-api-key": tok})
        assert fake.requests[-1]["body"]["system"] == \
            "You are terse.\n\nReviewer guidance from the pull request: use the ORM"
        post(srv, MSG, msg_body(system=[{"type": "text", "text": "A"}]), {"x-api-key": tok})
        assert fake.requests[-1]["body"]["system"][-1] == {
            "type": "text", "text": "Reviewer guidance from the pull request: use the ORM"}
        post(srv, MSG, msg_body(), {"x-api-key": tok})
        assert fake.requests[-1]["body"]["system"] == \
            "Reviewer guidance from the pull request: use the ORM"
        # The first charged call that carried it recorded the delivery (sticky comment).
        status = srv.request("GET", NS + "/guide")[2]["status"]
        assert len(status["guidanceHash"]) == 16, status
        assert status["guidanceDeliveredAt"].endswith("Z"), status


def test_flags_and_key_files():
    import subprocess
    from harness import DIVERGE_BIN
    r = subprocess.run([DIVERGE_BIN, "serve", "--help"], capture_output=True, text=True)
    for flag in ("--llm-upstream", "--llm-key-file", "--llm-prices", "DIVERGE_LLM_PRICES"):
        assert flag in r.stdout, r.stdout
    fake = FakeLLM().start()
    d = Server().data_dir  # a scratch dir of the harness's kind
    try:
        keyf = os.path.join(d, "anthropic.key")
        with open(keyf, "w") as f:
            f.write("sk-from-file-0001\n")
        os.chmod(keyf, 0o644)
        srv = Server(["--sandbox-provider", "none", "--llm-key-file", "anthropic=" + keyf])
        try:
            srv.start()
            raise AssertionError("a key file others can read must be refused")
        except Exception as e:  # noqa: BLE001
            assert "sk-from-file" not in str(e) and "sk-from-file" not in srv.stderr()
        finally:
            srv.cleanup()
        os.chmod(keyf, 0o600)
        prices = os.path.join(d, "prices.yaml")
        with open(prices, "w") as f:
            f.write('version: "1"\nmodels:\n  - match: "my-model*"\n    inputPerMTok: "1.00"\n'
                    '    outputPerMTok: "2.00"\n    maxOutputTokens: 10\n')
        with Server(["--sandbox-provider", "none", "--llm-key-file", "anthropic=" + keyf,
                     "--llm-prices", prices, "--llm-upstream", "anthropic=" + fake.url],
                    env={"DIVERGE_ANTHROPIC_API_KEY": None}) as srv:
            tok = start_task(srv, "files", budgetUSD="5.00")
            # At most the body's 39 bytes of input (a call's charge is capped at its
            # reservation).
            fake.usage = {"input": 30, "output": 10, "cache_write": 0, "cache_read": 0}
            st, _, raw = post(srv, MSG, {"model": "my-model-1", "messages": []},
                              {"x-api-key": tok})
            assert st == 200, raw
            assert fake.requests[-1]["headers"]["x-api-key"] == "sk-from-file-0001"
            # No max_tokens in the request: the table's maxOutputTokens.
            assert fake.requests[-1]["body"]["max_tokens"] == 10
            wait_charges(srv, "files", 1)
            assert task(srv, "files")["status"]["costUSD"] == "0.00005"  # 30 + 20 micros
            st, _, raw = post(srv, MSG, msg_body(), {"x-api-key": tok})
            assert st == 403, raw  # not in this table
    finally:
        fake.stop()


if __name__ == "__main__":
    run_tests([test_exact_spend_streaming_and_not,
               test_upstream_connection_is_kept_alive_across_calls,
               test_stream_charged_at_its_final_usage_before_it_ends,
               test_upstream_errors_pass_through_uncharged,
               test_stream_cut_charges_the_reservation, test_auth_and_models,
               test_no_key_configured_is_503, test_budget_lowers_max_tokens_then_402_and_pause,
               test_budget_pause_of_a_task_with_capabilities,
               test_concurrent_calls_never_pass_the_budget, test_key_never_leaves_the_server,
               test_guidance_reaches_the_system_prompt, test_flags_and_key_files])
