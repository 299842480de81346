# SPDX-License-Identifier: Apache-2.0
"""The official `openai` npm client (pinned in npm_pin.py) through the gateway's OpenAI
routes (SPEC §13), against the scripted fake upstream: Responses and Chat Completions,
streamed and not, with the exact spend; upstream 500 and 429 passed through to the client
and not charged; a model outside the price table is the client's PermissionDeniedError;
a spent budget is the client's 429 with code insufficient_quota."""
import json
import os
import subprocess
import sys
from decimal import Decimal

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "fakes"))

import npm_pin  # noqa: E402
from harness import run_tests, scratch_dir  # noqa: E402
from llm_helpers import wait_charges  # noqa: E402
from test_llm_gateway import start_task, task, usd, wait_phase  # noqa: E402
from test_llm_openai import MODEL, Gateway, cost_micros  # noqa: E402

# Runs the steps of argv[2] (JSON) with the client against the base URL and key of argv[1],
# printing one JSON result per step: what the client returned, or its error.
DRIVER = r"""
const OpenAI = require("openai").default;
const [base, key] = JSON.parse(process.argv[2]);
const steps = JSON.parse(process.argv[3]);
const client = new OpenAI({ baseURL: base, apiKey: key, maxRetries: 0, timeout: 30000 });

async function one(s) {
  const api = s.api === "responses" ? client.responses : client.chat.completions;
  if (!s.body.stream) {
    const r = await api.create(s.body);
    return { ok: true, text: s.api === "responses" ? r.output_text : r.choices[0].message.content,
             usage: r.usage };
  }
  const stream = await api.create(s.body);
  let text = "", usage = null, types = [], usageOnly = 0;
  for await (const ev of stream) {
    if (s.api === "responses") {
      types.push(ev.type);
      if (ev.type === "response.output_text.delta") text += ev.delta;
      if (ev.type === "response.completed") usage = ev.response.usage;
    } else {
      if (ev.choices.length === 0) usageOnly++;
      else text += ev.choices[0].delta.content || "";
      if (ev.usage) usage = ev.usage;
    }
  }
  return { ok: true, text, usage, types, usageOnly };
}

(async () => {
  const out = [];
  for (const s of steps) {
    try {
      out.push(await one(s));
    } catch (e) {
      out.push({ ok: false, cls: e.constructor.name, status: e.status, code: e.code,
                 type: e.type, message: e.message });
    }
  }
  process.stdout.write(JSON.stringify(out));
})();
"""


class Client:
    def __init__(self):
        self.modules = npm_pin.install(*npm_pin.OPENAI_SDK)
        self.dir = scratch_dir("diverge-openai-sdk-")
        self.driver = os.path.join(self.dir, "driver.js")
        with open(self.driver, "w") as f:
            f.write(DRIVER)

    def run(self, srv, tok, steps):
        env = dict(os.environ, NODE_PATH=self.modules)
        for k in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "OPENAI_ORG_ID", "OPENAI_PROJECT_ID"):
            env.pop(k, None)
        base = srv.url + "/api/v1/llm/openai/v1"
        r = subprocess.run(["node", self.driver, json.dumps([base, tok]), json.dumps(steps)],
                           capture_output=True, text=True, timeout=60, env=env)
        assert r.returncode == 0, (r.stdout, r.stderr)
        return json.loads(r.stdout)


def step(api, stream=False, **body):
    b = {"model": MODEL, "stream": stream}
    if api == "responses":
        b["input"] = "say hello"
    else:
        b["messages"] = [{"role": "user", "content": "say hello"}]
    b.update(body)
    return {"api": api, "body": b}


GOOD = [step("responses"), step("responses", True), step("chat"), step("chat", True)]
USAGE = {"input": 100, "output": 50, "cache_write": 0, "cache_read": 20}


def test_good_calls_exact_spend():
    client = Client()
    with Gateway() as gw:
        srv, fake = gw.srv, gw.fake
        tok = start_task(srv, "sdk", budgetUSD="5.00")
        fake.usage = dict(USAGE)
        out = client.run(srv, tok, GOOD + [step("chat", True,
                                                stream_options={"include_usage": True})])
        for r in out:
            assert r["ok"] and r["text"] == "hello", out
        assert out[0]["usage"]["input_tokens_details"]["cached_tokens"] == 20
        assert out[1]["types"][-1] == "response.completed" and \
            out[1]["usage"]["output_tokens"] == 50, out[1]
        assert out[2]["usage"]["prompt_tokens"] == 120
        # Chat streamed without include_usage: the client sees no usage-only chunk (the
        # gateway asked for it); with it, the client gets it.
        assert out[3]["usageOnly"] == 0 and out[3]["usage"] is None, out[3]
        assert out[4]["usageOnly"] == 1 and out[4]["usage"]["completion_tokens"] == 50, out[4]
        wait_charges(srv, "sdk", 5)
        t = task(srv, "sdk")["status"]
        assert Decimal(t["costUSD"]) == usd(5 * cost_micros(USAGE)), t
        assert t["tokensConsumed"] == 5 * 170, t
        for r in fake.requests:
            assert r["headers"]["authorization"].startswith("Bearer sk-proj-server-key")
            assert tok not in json.dumps(r)


def test_upstream_errors_and_refusals():
    client = Client()
    with Gateway() as gw:
        srv, fake = gw.srv, gw.fake
        tok = start_task(srv, "sdkerr", budgetUSD="5.00")
        steps = []
        for status, code in ((500, "server_error"), (429, "rate_limit_exceeded")):
            for s in GOOD:
                fake.script.append({"status": status, "body": {"error": {
                    "message": "upstream says no", "type": code, "code": code,
                    "param": None}}})
                steps.append(s)
        out = client.run(srv, tok, steps)
        want = ["InternalServerError"] * 4 + ["RateLimitError"] * 4
        assert [r.get("cls") for r in out] == want, out
        assert [r["status"] for r in out] == [500] * 4 + [429] * 4, out
        assert all(r["code"] in ("server_error", "rate_limit_exceeded") for r in out), out
        t = task(srv, "sdkerr")["status"]
        assert Decimal(t.get("costUSD", "0")) == 0 and t.get("tokensConsumed", 0) == 0, t
        # A model outside the price table: the client's PermissionDeniedError, no call.
        calls = len(fake.requests)
        out = client.run(srv, tok, [dict(s, body=dict(s["body"], model="no-such-model"))
                                    for s in GOOD])
        assert all(r["cls"] == "PermissionDeniedError" and r["status"] == 403 for r in out), out
        assert len(fake.requests) == calls


def test_budget_exhausted_is_insufficient_quota():
    client = Client()
    with Gateway() as gw:
        srv, fake = gw.srv, gw.fake
        for api, stream in (("responses", False), ("responses", True), ("chat", False),
                            ("chat", True)):
            name = "broke-%s-%d" % (api, stream)
            tok = start_task(srv, name, budgetUSD="0.001")  # 1000 micro-dollars
            fake.usage = {"input": 100, "output": 90, "cache_write": 0, "cache_read": 0}
            out = client.run(srv, tok, [step(api, stream), step(api, stream)])
            assert out[0]["ok"], out  # 200 + 720 micro-dollars: too little left for more
            r = out[1]
            assert not r["ok"] and r["status"] == 429 and r["code"] == "insufficient_quota" \
                and r["cls"] == "RateLimitError", r
            assert "diverge: budget exceeded" in r["message"], r
            t = wait_phase(srv, name, "Paused")
            assert t["status"]["reason"] == "BudgetExceeded", t["status"]
            assert Decimal(t["status"]["costUSD"]) == usd(920) <= Decimal("0.001")


if __name__ == "__main__":
    run_tests([test_good_calls_exact_spend, test_upstream_errors_and_refusals,
               test_budget_exhausted_is_insufficient_quota])
