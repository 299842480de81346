# SPDX-License-Identifier: Apache-2.0
"""The official `@anthropic-ai/sdk` npm client (pinned in npm_pin.py) through the LLM
gateway (SPEC §13) of the real `diverge serve --sandbox-provider none`, against the
scripted fake upstream (tests/fakes/fake_llm.py): baseURL = server +
/api/v1/llm/anthropic, apiKey = the task's token, maxRetries 0 (one upstream request per
call, so counts stay exact). Streamed and not, a stream cut by the upstream, upstream
500/529/429 passed through unchanged and not charged, models outside the capabilities or
the price table refused with 403 as the SDK surfaces it, and the spend of the good calls
equal to their usage x the built-in prices."""
import json
import os
import subprocess
import sys
from decimal import Decimal, ROUND_CEILING

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "fakes"))

import npm_pin  # noqa: E402
from harness import API, run_tests  # noqa: E402
from llm_helpers import LLMGateway, wait_charges  # noqa: E402
from sdk_helpers import start_task  # noqa: E402

NS = API + "/namespaces/default/agenttasks"
KEY = "sk-ant-server-key-sdk-77c1d0e2"
MODEL = "claude-sonnet-4-5-20250929"
# The built-in price of claude-sonnet-4*: USD per million tokens.
PRICE = {"input": Decimal("3.00"), "output": Decimal("15.00"),
         "cache_write": Decimal("3.75"), "cache_read": Decimal("0.30")}

# Runs the calls named in argv[2] (a JSON list) one after the other with the official SDK
# and prints one JSON line: for each call what the SDK returned or threw.
NODE_DRIVER = r"""
import Anthropic from "@anthropic-ai/sdk";

const [baseURL, calls] = [process.argv[2], JSON.parse(process.argv[3])];
const apiKey = process.env.DIVERGE_TEST_TASK_TOKEN;
const client = new Anthropic({ baseURL, apiKey, maxRetries: 0, timeout: 30000 });

function failure(e) {
  const out = { error: true, name: e?.constructor?.name ?? typeof e,
                message: String(e?.message ?? e) };
  if (e instanceof Anthropic.APIError) {
    out.status = e.status ?? null;
    out.type = e.type ?? null;
    out.body = e.error ?? null;
    out.requestID = e.requestID ?? null;
    out.retryAfter = e.headers?.get?.("retry-after") ?? null;
  }
  out.apiError = e instanceof Anthropic.APIError;
  out.connectionError = e instanceof Anthropic.APIConnectionError;
  out.cause = e?.cause ? String(e.cause?.message ?? e.cause) : null;
  return out;
}

async function one(call) {
  const params = {
    model: call.model, max_tokens: call.max_tokens ?? 100,
    messages: [{ role: "user", content: "say hello" }],
  };
  if (call.kind === "create") {
    const { data, response } = await client.messages.create(params).withResponse();
    return { message: data, requestID: response.headers.get("request-id") };
  }
  if (call.kind === "stream") {
    // The helper: text as it arrives, then the accumulated final message.
    const texts = [];
    const events = [];
    const stream = client.messages.stream(params);
    stream.on("text", (t) => texts.push(t));
    stream.on("streamEvent", (ev) => events.push(ev.type));
    try {
      const message = await stream.finalMessage();
      return { texts, events, message };
    } catch (e) {
      return { texts, events, ...failure(e) };
    }
  }
  if (call.kind === "raw") {
    // stream: true, iterating the raw server-sent events.
    const events = [];
    const texts = [];
    try {
      const s = await client.messages.create({ ...params, stream: true });
      for await (const ev of s) {
        events.push(ev.type);
        if (ev.type === "content_block_delta" && ev.delta.type === "text_delta") {
          texts.push(ev.delta.text);
        }
      }
      return { events, texts };
    } catch (e) {
      return { events, texts, ...failure(e) };
    }
  }
  throw new Error("unknown call kind " + call.kind);
}

const results = [];
for (const call of calls) {
  try {
    results.push(await one(call));
  } catch (e) {
    results.push(failure(e));
  }
}
console.log(JSON.stringify(results));
"""


def driver():
    modules = npm_pin.install(*npm_pin.ANTHROPIC_SDK)
    # ESM resolves packages from the script's folder upwards: put it next to node_modules.
    return npm_pin.write_file(os.path.join(os.path.dirname(modules), "diverge_llm_sdk.mjs"),
                              NODE_DRIVER)


class Gateway(LLMGateway):
    def __init__(self):
        super().__init__("anthropic", KEY)
        self.script = driver()

    def sdk(self, token, calls):
        """Runs CALLS with the SDK as the task of TOKEN; returns one result per call."""
        env = dict(os.environ, DIVERGE_TEST_TASK_TOKEN=token)
        r = subprocess.run(["node", self.script, self.srv.url + "/api/v1/llm/anthropic",
                            json.dumps(calls)], capture_output=True, text=True, timeout=120,
                           env=env)
        assert r.returncode == 0, (r.stdout, r.stderr)
        out = json.loads(r.stdout.strip().splitlines()[-1])
        assert len(out) == len(calls), out
        return out


def status(srv, name):
    st, _, b = srv.request("GET", NS + "/" + name)
    assert st == 200, b
    return b["status"]


def spent(srv, name):
    s = status(srv, name)
    return Decimal(s.get("costUSD") or "0"), s.get("tokensConsumed", 0)


def cost_micros(u):
    total = sum(Decimal(u[k]) * PRICE[k] for k in PRICE)  # micro-dollars: tokens x $/MTok
    return int(total.to_integral_value(rounding=ROUND_CEILING))


def usd(micros):
    return Decimal(micros) / Decimal(1000000)


def read_log(srv, name):
    """The task's log ("" before its first line)."""
    try:
        with open(os.path.join(srv.data_dir, "logs", "default", name + ".log")) as f:
            return f.read()
    except FileNotFoundError:
        return ""


def sdk_usage(u):
    """The usage object the SDK returns for the fake's usage U."""
    return {"input_tokens": u["input"], "output_tokens": u["output"],
            "cache_creation_input_tokens": u["cache_write"],
            "cache_read_input_tokens": u["cache_read"]}


def test_sdk_calls_streamed_and_not_are_charged_exactly():
    with Gateway() as gw:
        srv, fake = gw.srv, gw.fake
        tok = start_task(srv, "sdk-good", budgetUSD="5.00")
        # Within what each call may use (its body's bytes in, its max_tokens of 100 out): a
        # call's charge is capped at its reservation.
        fake.usage = {"input": 20, "output": 45, "cache_write": 4, "cache_read": 12}
        created, helper, raw = gw.sdk(tok, [{"kind": "create", "model": MODEL},
                                            {"kind": "stream", "model": MODEL},
                                            {"kind": "raw", "model": MODEL}])
        # Non-streamed: the upstream's message whole, its request id passed on.
        assert not created.get("error"), created
        m = created["message"]
        assert m["content"] == [{"type": "text", "text": "hello"}], m
        assert m["model"] == MODEL and m["stop_reason"] == "end_turn", m
        assert {k: m["usage"][k] for k in sdk_usage(fake.usage)} == sdk_usage(fake.usage), m
        assert created["requestID"] == "req_fake", created
        # messages.stream(): the text arrives in its deltas, and the final message the SDK
        # accumulates from message_start + message_delta has the upstream's usage.
        assert not helper.get("error"), helper
        assert helper["texts"] == ["hel", "lo"], helper
        assert helper["events"] == ["message_start", "content_block_start",
                                    "content_block_delta", "content_block_delta",
                                    "content_block_stop", "message_delta", "message_stop"], helper
        fm = helper["message"]
        assert fm["content"][0]["text"] == "hello" and fm["stop_reason"] == "end_turn", fm
        assert {k: fm["usage"][k] for k in sdk_usage(fake.usage)} == sdk_usage(fake.usage), fm
        # stream: true iterated by hand: every event, the text whole.
        assert not raw.get("error"), raw
        assert "".join(raw["texts"]) == "hello" and raw["events"][-1] == "message_stop", raw
        # Three upstream requests (no retries), each with the server's key, never the token.
        assert len(fake.requests) == 3, [r["path"] for r in fake.requests]
        for r in fake.requests:
            assert r["path"] == "/v1/messages" and r["headers"]["x-api-key"] == KEY, r
            assert tok not in json.dumps(r), r
        assert [bool(r["body"].get("stream")) for r in fake.requests] == [False, True, True]
        # Spend = usage x prices, exactly, once per call.
        one = cost_micros(fake.usage)
        assert one == 754  # 60 + 675 + 15 + 3.6 micro-dollars, rounded up
        wait_charges(srv, "sdk-good", 3)
        cost, tokens = spent(srv, "sdk-good")
        assert cost == usd(3 * one), (cost, one)
        assert tokens == 3 * sum(fake.usage.values()), tokens
        line = ("llm anthropic %s input=20 output=45 cache_write=4 cache_read=12 "
                "usd=0.000754" % MODEL)
        assert read_log(srv, "sdk-good").count(line) == 3, read_log(srv, "sdk-good")


def test_sdk_sees_a_cut_stream_and_the_reservation_is_charged():
    with Gateway() as gw:
        srv, fake = gw.srv, gw.fake
        tok = start_task(srv, "sdk-cut", budgetUSD="5.00")
        # message_start, content_block_start, ping, the first text delta; then the
        # upstream drops the connection: no message_delta, no usage end.
        fake.script += [{"cut_after": 4}, {"cut_after": 4}]
        helper, raw = gw.sdk(tok, [{"kind": "stream", "model": MODEL, "max_tokens": 300},
                                   {"kind": "raw", "model": MODEL, "max_tokens": 300}])
        for res in (helper, raw):
            # An error, not a normal end: Node's fetch reports the body cut ("terminated").
            assert res.get("error") and not res["apiError"], res
            assert "terminated" in res["message"], res
            assert res["texts"] == ["hel"], res
            assert "message_delta" not in res["events"], res
            assert "message_stop" not in res["events"], res
        assert len(fake.requests) == 2
        # Each cut call is charged its reservation: input at most the bytes the upstream
        # got, priced at the dearest input kind, output its max_tokens.
        reserve = 0
        for r in fake.requests:
            assert r["body"]["max_tokens"] == 300, r  # forwarded as the SDK sent it
            reserve_one = (Decimal(r["raw_len"]) * PRICE["cache_write"] + 300 * PRICE["output"])
            reserve += int(reserve_one.to_integral_value(rounding=ROUND_CEILING))
        wait_charges(srv, "sdk-cut", 2)
        cost, tokens = spent(srv, "sdk-cut")
        assert cost == usd(reserve), (cost, reserve)
        assert tokens == sum(r["raw_len"] + 300 for r in fake.requests), tokens
        log = read_log(srv, "sdk-cut")
        assert log.count("llm anthropic %s ended before its usage arrived: charged the "
                         "reservation" % MODEL) == 2, log
        assert status(srv, "sdk-cut")["phase"] == "Active"


def test_sdk_gets_upstream_errors_unchanged_and_uncharged():
    with Gateway() as gw:
        srv, fake = gw.srv, gw.fake
        tok = start_task(srv, "sdk-errs", budgetUSD="5.00")
        errors = [(500, "api_error", {}), (529, "overloaded_error", {"x-should-retry": "true"}),
                  (429, "rate_limit_error", {"retry-after": "17"})]
        calls = []
        for st, etype, headers in errors:
            body = {"type": "error", "error": {"type": etype, "message": "upstream %d" % st}}
            for kind in ("create", "stream", "raw"):
                fake.script.append({"status": st, "body": body, "headers": headers})
                calls.append({"kind": kind, "model": MODEL})
        out = gw.sdk(tok, calls)
        for i, (st, etype, headers) in enumerate(errors):
            body = {"type": "error", "error": {"type": etype, "message": "upstream %d" % st}}
            for res in out[3 * i:3 * i + 3]:
                assert res.get("error") and res["apiError"], res
                assert res["status"] == st and res["type"] == etype, res
                assert res["body"] == body, res
                assert res["requestID"] == "req_fake", res
                assert res["retryAfter"] == headers.get("retry-after"), res
            assert out[3 * i]["name"] == {500: "InternalServerError", 529: "OverloadedError",
                                          429: "RateLimitError"}[st], out[3 * i]
        # maxRetries 0: exactly one upstream request per call.
        assert len(fake.requests) == len(calls), len(fake.requests)
        cost, tokens = spent(srv, "sdk-errs")
        assert cost == 0 and tokens == 0, (cost, tokens)
        assert "llm anthropic" not in read_log(srv, "sdk-errs")
        assert status(srv, "sdk-errs")["phase"] == "Active"
        # The task still works after them, and is charged for that call only.
        (ok,) = gw.sdk(tok, [{"kind": "create", "model": MODEL}])
        assert not ok.get("error"), ok
        wait_charges(srv, "sdk-errs", 1)
        assert spent(srv, "sdk-errs")[0] == usd(cost_micros(fake.usage))


def test_sdk_gets_403_for_models_outside_the_capabilities_or_prices():
    with Gateway() as gw:
        srv, fake = gw.srv, gw.fake
        tok = start_task(srv, "sdk-caps", budgetUSD="5.00", capabilities=["claude-haiku-*"])
        out = gw.sdk(tok, [{"kind": "create", "model": MODEL},
                           {"kind": "stream", "model": MODEL},
                           {"kind": "create", "model": "no-such-model-1"},
                           {"kind": "raw", "model": "no-such-model-1"},
                           {"kind": "create", "model": "claude-haiku-4-5"}])
        for res in out[:4]:
            assert res.get("error") and res["name"] == "PermissionDeniedError", res
            assert res["status"] == 403 and res["type"] == "permission_error", res
            assert res["body"]["type"] == "error", res
            assert res["body"]["error"]["message"].startswith("diverge: "), res
        assert out[2]["body"]["error"]["message"] == \
            "diverge: no price for model no-such-model-1", out[2]
        assert not out[4].get("error"), out[4]
        # Only the allowed call reached the upstream.
        assert [r["body"]["model"] for r in fake.requests] == ["claude-haiku-4-5"]
        # A wrong key is 401 as the SDK surfaces it.
        (bad,) = gw.sdk("not-a-task-token", [{"kind": "create", "model": "claude-haiku-4-5"}])
        assert bad["name"] == "AuthenticationError" and bad["status"] == 401, bad
        assert bad["type"] == "authentication_error", bad
        assert len(fake.requests) == 1


if __name__ == "__main__":
    run_tests([test_sdk_calls_streamed_and_not_are_charged_exactly,
               test_sdk_sees_a_cut_stream_and_the_reservation_is_charged,
               test_sdk_gets_upstream_errors_unchanged_and_uncharged,
               test_sdk_gets_403_for_models_outside_the_capabilities_or_prices])
