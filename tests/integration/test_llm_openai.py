# SPDX-License-Identifier: Apache-2.0
"""The LLM gateway's OpenAI routes (SPEC §13: Responses, Chat Completions, the model list)
against the real `diverge serve --sandbox-provider none` and the scripted fake upstream on
loopback (tests/fakes/fake_llm.py): exact spend from the provider's usage (cached input as
cache read), Chat's usage chunk asked for and kept from the client, guidance, 429
insufficient_quota and the pause, upstream errors passed through uncharged, streams cut,
models outside the table, and the server's key reaching only the upstream."""
import json
import os
import sys
from decimal import Decimal, ROUND_CEILING

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "fakes"))

from harness import run_tests  # noqa: E402
from llm_helpers import LLMGateway, wait_charges  # noqa: E402
from test_llm_gateway import (NS, post, read_log, start_task, stream_raw, task,  # noqa: E402
                              usd, wait_phase)

RESP = "/api/v1/llm/openai/v1/responses"
CHAT = "/api/v1/llm/openai/v1/chat/completions"
MODELS = "/api/v1/llm/openai/v1/models"
KEY = "sk-proj-server-key-7c2d9e41a0b3"
MODEL = "gpt-4.1-2025-04-14"
# The built-in price of gpt-4.1*: USD per million tokens (cached input is the cache read).
PRICE = {"input": Decimal("2.00"), "output": Decimal("8.00"),
         "cache_write": Decimal("2.00"), "cache_read": Decimal("0.50")}
TABLE_MAX_OUTPUT = 32768


class Gateway(LLMGateway):
    def __init__(self, extra_args=(), env=None):
        super().__init__("openai", KEY, extra_args, env)


def bearer(tok):
    return {"Authorization": "Bearer " + tok}


def resp_body(stream=False, **extra):
    b = {"model": MODEL, "input": "say hello", "stream": stream}
    b.update(extra)
    return b


def chat_body(stream=False, **extra):
    b = {"model": MODEL, "stream": stream,
         "messages": [{"role": "user", "content": "say hello"}]}
    b.update(extra)
    return b


def cost_micros(u):
    total = sum(Decimal(u.get(k, 0)) * PRICE[k] for k in PRICE)
    return int(total.to_integral_value(rounding=ROUND_CEILING))


def sse_events(data):
    """The events of an SSE stream: a list of (event name or None, data text)."""
    out = []
    for block in data.decode().split("\n\n"):
        if not block.strip():
            continue
        name, datas = None, []
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                datas.append(line[6:])
        out.append((name, "\n".join(datas)))
    return out


def log_line(u):
    return ("llm openai %s input=%d output=%d cache_write=0 cache_read=%d usd=%s"
            % (MODEL, u["input"], u["output"], u["cache_read"], usd(cost_micros(u))))


def assert_upstream_saw_key(fake, tok):
    r = fake.requests[-1]
    assert r["headers"]["authorization"] == "Bearer " + KEY, r["headers"]
    assert "openai-organization" not in r["headers"] and \
        "openai-project" not in r["headers"], r["headers"]
    assert tok not in json.dumps(r), r


USAGE = {"input": 100, "output": 50, "cache_write": 0, "cache_read": 20}


def test_responses_exact_spend():
    with Gateway() as gw:
        srv, fake = gw.srv, gw.fake
        tok = start_task(srv, "resp", budgetUSD="5.00")
        fake.usage = dict(USAGE)
        one = cost_micros(USAGE)
        assert one == 610  # 200 + 400 + 10 micro-dollars
        hdrs = dict(bearer(tok), **{"OpenAI-Organization": "org-client",
                                    "OpenAI-Project": "proj-client", "Accept": "application/json"})
        st, h, raw = post(srv, RESP, resp_body(max_output_tokens=300), hdrs)
        assert st == 200, raw
        b = json.loads(raw)
        assert b["output"][0]["content"][0]["text"] == "hello" and \
            b["usage"]["input_tokens"] == 120, b
        assert h.get("x-request-id") is None or h.get("x-request-id") == "req_fake"
        assert_upstream_saw_key(fake, tok)
        r0 = fake.requests[-1]
        assert r0["path"] == "/v1/responses" and r0["headers"]["accept"] == "application/json"
        assert r0["body"]["max_output_tokens"] == 300 and "instructions" not in r0["body"], r0
        wait_charges(srv, "resp", 1)
        t = task(srv, "resp")["status"]
        assert Decimal(t["costUSD"]) == usd(one) and t["tokensConsumed"] == 170, t
        # Streamed: the usage of response.completed; no limit asked: the table's.
        st, data, err = stream_raw(srv, RESP, resp_body(stream=True), bearer(tok))
        assert st == 200 and err is None, (st, data, err)
        evs = sse_events(data)
        assert [e[0] for e in evs][-1] == "response.completed" and len(evs) == 8, evs
        assert_upstream_saw_key(fake, tok)
        assert fake.requests[-1]["body"]["max_output_tokens"] == TABLE_MAX_OUTPUT
        wait_charges(srv, "resp", 2)
        t = task(srv, "resp")["status"]
        assert Decimal(t["costUSD"]) == usd(2 * one) and t["tokensConsumed"] == 340, t
        assert read_log(srv, "resp").count(log_line(USAGE)) == 2, read_log(srv, "resp")


def test_chat_exact_spend_and_the_usage_chunk():
    with Gateway() as gw:
        srv, fake = gw.srv, gw.fake
        tok = start_task(srv, "chat", budgetUSD="5.00")
        fake.usage = dict(USAGE)
        one = cost_micros(USAGE)
        # Not streamed; the legacy max_tokens stays the field used.
        st, _, raw = post(srv, CHAT, chat_body(max_tokens=300), bearer(tok))
        assert st == 200 and json.loads(raw)["choices"][0]["message"]["content"] == "hello", raw
        assert_upstream_saw_key(fake, tok)
        r0 = fake.requests[-1]
        assert r0["path"] == "/v1/chat/completions" and r0["body"]["max_tokens"] == 300 and \
            "max_completion_tokens" not in r0["body"], r0["body"]
        assert r0["body"]["messages"] == chat_body()["messages"], r0["body"]
        # Streamed without include_usage: the gateway asks for it (keeping the client's
        # other stream options) and the client never sees the usage-only chunk. The fake
        # writes the stream a few bytes at a time, so events arrive split across reads.
        for split in (0, 7, 1):
            step = {"split": split} if split else {}
            fake.script.append(step)
            st, data, err = stream_raw(srv, CHAT, chat_body(
                stream=True, stream_options={"include_obfuscation": False}), bearer(tok))
            assert st == 200 and err is None, (st, data, err)
            sent = fake.requests[-1]["body"]
            assert sent["stream_options"] == {"include_obfuscation": False,
                                              "include_usage": True}, sent
            assert sent["max_completion_tokens"] == TABLE_MAX_OUTPUT, sent
            evs = sse_events(data)
            assert evs[-1] == (None, "[DONE]"), evs
            chunks = [json.loads(d) for _, d in evs[:-1]]
            assert len(chunks) == 4 and all(c["choices"] for c in chunks), chunks
            assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == \
                "hello"
        wait_charges(srv, "chat", 4)
        t = task(srv, "chat")["status"]
        assert Decimal(t["costUSD"]) == usd(4 * one) and t["tokensConsumed"] == 4 * 170, t
        # The client asked for the usage itself: it gets it, unchanged.
        st, data, err = stream_raw(srv, CHAT, chat_body(
            stream=True, stream_options={"include_usage": True}, max_completion_tokens=77),
            bearer(tok))
        assert st == 200 and err is None
        assert fake.requests[-1]["body"]["max_completion_tokens"] == 77
        evs = sse_events(data)
        last = json.loads(evs[-2][1])
        assert evs[-1] == (None, "[DONE]") and last["choices"] == [] and \
            last["usage"]["prompt_tokens"] == 120, evs
        wait_charges(srv, "chat", 5)
        t = task(srv, "chat")["status"]
        assert Decimal(t["costUSD"]) == usd(5 * one), t
        assert read_log(srv, "chat").count(log_line(USAGE)) == 5


def test_guidance():
    with Gateway() as gw:
        srv, fake = gw.srv, gw.fake
        tok = start_task(srv, "guide", budgetUSD="5.00")
        srv.request("PATCH", NS + "/guide",
                    {"metadata": {"annotations": {"divergedev.com/guidance": "use the ORM"}}},
                    headers={"Content-Type": "application/merge-patch+json"})
        g = "Reviewer guidance from the pull request: use the ORM"
        post(srv, RESP, resp_body(instructions="You are terse."), bearer(tok))
        assert fake.requests[-1]["body"]["instructions"] == "You are terse.\n\n" + g
        post(srv, RESP, resp_body(), bearer(tok))
        assert fake.requests[-1]["body"]["instructions"] == g
        stream_raw(srv, RESP, resp_body(stream=True, instructions=None), bearer(tok))
        assert fake.requests[-1]["body"]["instructions"] == g
        sys_msg = {"role": "developer", "content": "You are terse."}
        post(srv, CHAT, chat_body(messages=[sys_msg, {"role": "user", "content": "hi"}]),
             bearer(tok))
        assert fake.requests[-1]["body"]["messages"] == [
            {"role": "system", "content": g}, sys_msg, {"role": "user", "content": "hi"}]
        stream_raw(srv, CHAT, chat_body(stream=True), bearer(tok))
        assert fake.requests[-1]["body"]["messages"][0] == {"role": "system", "content": g}


def allowed_output(n, budget_micros, want):
    """The output limit the gateway lets a call with a body of N bytes have."""
    worst_in = max(PRICE["input"], PRICE["cache_write"], PRICE["cache_read"])
    out = want
    while (n * worst_in + out * PRICE["output"]).to_integral_value(ROUND_CEILING) > \
            budget_micros:
        out -= 1
    return out


def test_budget_lowers_the_limit_then_429_insufficient_quota():
    for path, body, field in ((RESP, resp_body, "max_output_tokens"),
                              (CHAT, chat_body, "max_completion_tokens")):
        with Gateway() as gw:
            srv, fake = gw.srv, gw.fake
            tok = start_task(srv, "poor", budgetUSD="0.01")
            small = body(**{field: 4096})
            n = len(json.dumps(small).encode())
            allowed = allowed_output(n, 10000, 4096)
            assert 1000 < allowed < 1250, allowed
            fake.usage = {"input": 1000, "output": 900, "cache_write": 0, "cache_read": 0}
            st, _, raw = post(srv, path, small, bearer(tok))
            assert st == 200, raw
            assert fake.requests[-1]["body"][field] == allowed, fake.requests[-1]["body"]
            spent = cost_micros(fake.usage)  # 2000 + 7200
            # What remains (800 micro-dollars) cannot pay for this input: refused, paused.
            calls = len(fake.requests)
            big = body(**{field: 10})
            big["metadata"] = {"pad": "x" * 600}
            st, _, raw = post(srv, path, big, bearer(tok))
            b = json.loads(raw)
            assert st == 429 and b["error"]["code"] == "insufficient_quota" and \
                b["error"]["type"] == "insufficient_quota", (st, b)
            assert b["error"]["message"].startswith("diverge: budget exceeded"), b
            assert len(fake.requests) == calls
            t = wait_phase(srv, "poor", "Paused")
            assert t["status"]["reason"] == "BudgetExceeded", t["status"]
            assert Decimal(t["status"]["costUSD"]) == usd(spent) <= Decimal("0.01")
            st, _, raw = post(srv, path, small, bearer(tok))
            assert st == 401 and json.loads(raw)["error"]["code"] == "invalid_api_key", raw


def test_chat_n_choices_share_the_limit():
    with Gateway() as gw:
        srv, fake = gw.srv, gw.fake
        fake.worst_case = True
        tok = start_task(srv, "many", budgetUSD="0.01")
        body = chat_body(n=4, max_tokens=4096)
        n = len(json.dumps(body).encode())
        allowed = allowed_output(n, 10000, 4 * 4096)
        st, _, raw = post(srv, CHAT, body, bearer(tok))
        assert st == 200, raw
        sent = fake.requests[-1]["body"]
        assert sent["n"] == 4 and sent["max_tokens"] == allowed // 4, (sent, allowed)
        assert Decimal(task(srv, "many")["status"]["costUSD"]) <= Decimal("0.01")


def test_models_auth_and_refusals():
    with Gateway() as gw:
        srv, fake = gw.srv, gw.fake
        tok = start_task(srv, "caps", budgetUSD="5.00", capabilities=["gpt-4.1*", "o3"])
        for path, body in ((RESP, resp_body), (CHAT, chat_body)):
            st, _, raw = post(srv, path, body(model="gpt-4o"), bearer(tok))
            b = json.loads(raw)
            assert st == 403 and b["error"]["code"] == "permission_denied", (st, b)
            st, _, raw = post(srv, path, body(model="no-such-model"), bearer(tok))
            b = json.loads(raw)
            assert st == 403 and b["error"]["message"] == \
                "diverge: no price for model no-such-model", b
            for hdrs in ({}, bearer("not-a-token"), {"Authorization": "Basic eDp5"},
                         {"x-api-key": tok}):
                st, _, raw = post(srv, path, body(), hdrs)
                b = json.loads(raw)
                assert st == 401 and b["error"]["code"] == "invalid_api_key", (hdrs, st, b)
            st, _, raw = post(srv, path, b"not json", bearer(tok))
            assert st == 400 and json.loads(raw)["error"]["type"] == "invalid_request_error"
        # State kept upstream under the server's key (shared by every task) is not reachable
        # through the gateway, and its input would not be bounded by the body.
        for field, value in (("previous_response_id", "resp_other_task"),
                             ("conversation", "conv_1"), ("prompt", {"id": "pmpt_1"})):
            st, _, raw = post(srv, RESP, resp_body(**{field: value}), bearer(tok))
            b = json.loads(raw)
            assert st == 400 and b["error"]["type"] == "invalid_request_error", (field, st, b)
            assert "previous_response_id" in b["error"]["message"], b
        assert fake.requests == [], fake.requests
        # The model list: the table's rows this task may call, named without the glob's
        # trailing '*'.
        st, _, b = srv.request("GET", MODELS, headers=bearer(tok), auth=False)
        assert st == 200 and b["object"] == "list", b
        ids = [m["id"] for m in b["data"]]
        assert ids == ["gpt-4.1-mini", "gpt-4.1-nano", "gpt-4.1", "o3"], ids
        assert b["data"][2] == {"id": "gpt-4.1", "object": "model", "created": 0,
                                "owned_by": "diverge"}, b
        for hdrs in ({}, bearer("not-a-token")):
            st, _, b = srv.request("GET", MODELS, headers=hdrs, auth=False)
            assert st == 401 and b["error"]["code"] == "invalid_api_key", b
        tok2 = start_task(srv, "all", budgetUSD="5.00")
        st, _, b = srv.request("GET", MODELS, headers=bearer(tok2), auth=False)
        ids = [m["id"] for m in b["data"]]
        assert st == 200 and "gpt-5-mini" in ids and "gpt-5" in ids and \
            "claude-sonnet-4" in ids and len(ids) == len(set(ids)) > 20, ids


def test_upstream_errors_pass_through_uncharged():
    with Gateway() as gw:
        srv, fake = gw.srv, gw.fake
        tok = start_task(srv, "errs", budgetUSD="5.00")
        for status, code in ((500, "server_error"), (429, "rate_limit_exceeded"),
                             (401, "invalid_api_key")):
            body = {"error": {"message": "upstream says no " + KEY, "type": code,
                              "code": code, "param": None}}
            for path, mk in ((RESP, resp_body), (CHAT, chat_body)):
                fake.script.append({"status": status, "body": body})
                st, _, raw = post(srv, path, mk(), bearer(tok))
                got = json.loads(raw)
                assert st == status and got["error"]["code"] == code, (st, raw)
                assert KEY.encode() not in raw and got["error"]["message"].startswith(
                    "upstream says no ***"), raw
                fake.script.append({"status": status, "body": body})
                st, data, _ = stream_raw(srv, path, mk(stream=True), bearer(tok))
                assert st == status and json.loads(data)["error"]["code"] == code, (st, data)
                assert KEY.encode() not in data
        t = task(srv, "errs")["status"]
        assert Decimal(t.get("costUSD", "0")) == 0 and t.get("tokensConsumed", 0) == 0, t
        assert t["phase"] == "Active"


def test_stream_cut_charges_the_reservation():
    with Gateway() as gw:
        srv, fake = gw.srv, gw.fake
        tok = start_task(srv, "cut", budgetUSD="5.00")
        total, tokens, calls = 0, 0, 0
        for path, body in ((RESP, resp_body(stream=True, max_output_tokens=200)),
                           (CHAT, chat_body(stream=True, max_completion_tokens=200))):
            fake.script.append({"cut_after": 3})
            st, data, err = stream_raw(srv, path, body, bearer(tok))
            assert st == 200 and err is not None, (st, data, err)
            assert len(sse_events(data)) == 3, data
            n = len(json.dumps(body).encode())  # the client's bytes bound the input
            total += int((Decimal(n) * PRICE["input"] + 200 * PRICE["output"])
                         .to_integral_value(rounding=ROUND_CEILING))
            tokens += n + 200
            calls += 1
            wait_charges(srv, "cut", calls)
            t = task(srv, "cut")["status"]
            assert Decimal(t["costUSD"]) == usd(total) and t["tokensConsumed"] == tokens, \
                (t, total)
        log = read_log(srv, "cut")
        assert log.count("llm openai %s ended before its usage arrived: charged the "
                         "reservation" % MODEL) == 2, log


def test_key_never_leaves_the_server():
    with Gateway() as gw:
        srv, fake = gw.srv, gw.fake
        tok = start_task(srv, "leak", budgetUSD="5.00")
        post(srv, RESP, resp_body(), bearer(tok))
        stream_raw(srv, CHAT, chat_body(stream=True), bearer(tok))
        wait_charges(srv, "leak", 2)  # the log holds both calls' lines
        _, _, metrics = srv.request("GET", "/metrics")
        assert KEY not in metrics and KEY not in read_log(srv, "leak")
        assert KEY not in srv.stderr()
        for r in fake.requests:
            assert tok not in json.dumps(r)
            assert r["headers"]["authorization"] == "Bearer " + KEY


if __name__ == "__main__":
    run_tests([test_responses_exact_spend, test_chat_exact_spend_and_the_usage_chunk,
               test_guidance, test_budget_lowers_the_limit_then_429_insufficient_quota,
               test_chat_n_choices_share_the_limit, test_models_auth_and_refusals,
               test_upstream_errors_pass_through_uncharged,
               test_stream_cut_charges_the_reservation, test_key_never_leaves_the_server])
