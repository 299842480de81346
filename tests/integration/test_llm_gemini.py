# SPDX-License-Identifier: Apache-2.0
"""The gateway's Gemini routes (SPEC §13: models/{model}:generateContent and
:streamGenerateContent?alt=sse) against the real `diverge serve --sandbox-provider none` and
the scripted fake upstream (tests/fakes/fake_llm.py): exact spend from the last
usageMetadata (cached input priced as cache read, thoughts as output), the token in
x-goog-api-key or ?key= and never upstream, guidance in systemInstruction, the 402 that
pauses the task, errors in Gemini's shape, upstream errors passed through uncharged, a
stream cut charged its reservation, and hostile model names refused."""
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.parse
from decimal import Decimal, ROUND_CEILING

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "fakes"))

from harness import run_tests  # noqa: E402
from llm_helpers import LLMGateway, wait_charges  # noqa: E402
from test_llm_gateway import NS, read_log, start_task, task, usd, wait_phase  # noqa: E402

BASE = "/api/v1/llm/gemini/v1beta/models/"
KEY = "AIza-server-key-7c2e9d14b0a6"
MODEL = "gemini-2.5-flash"
GEN = BASE + MODEL + ":generateContent"
STREAM = BASE + MODEL + ":streamGenerateContent?alt=sse"
# The built-in price of gemini-2.5-flash*: USD per million tokens.
PRICE = {"input": Decimal("0.30"), "output": Decimal("2.50"), "cache_write": Decimal("0.30"),
         "cache_read": Decimal("0.03")}
MAX_OUTPUT = 65536  # its maxOutputTokens


class Gateway(LLMGateway):
    def __init__(self):
        super().__init__("gemini", KEY)


def body(max_output=None, **extra):
    b = {"contents": [{"role": "user", "parts": [{"text": "say hello"}]}]}
    if max_output is not None:
        b["generationConfig"] = {"temperature": 0, "maxOutputTokens": max_output}
    b.update(extra)
    return b


def call(srv, path, b, headers):
    """POSTs B (a dict, or bytes as they are) to PATH, sent as given (not re-encoded);
    returns (status, bytes, the error that ended the answer or None)."""
    host, port = srv.url.split("//")[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    h = {"Content-Type": "application/json"}
    h.update(headers)
    conn.request("POST", path, b if isinstance(b, bytes) else json.dumps(b).encode(), h)
    resp = conn.getresponse()
    data, err = b"", None
    try:
        while True:
            chunk = resp.read1(65536)
            if not chunk:
                break
            data += chunk
    except (http.client.IncompleteRead, ConnectionError) as e:
        err = e
    conn.close()
    return resp.status, data, err


def cost_micros(u):
    """The charge of fake usage U: input and cached at their prices, a tool's prompt tokens as
    input, thoughts as output."""
    total = (Decimal(u["input"] + u.get("tool_use", 0)) * PRICE["input"]
             + Decimal(u["cache_read"]) * PRICE["cache_read"]
             + Decimal(u["output"] + u.get("thoughts", 0)) * PRICE["output"])
    return int(total.to_integral_value(rounding=ROUND_CEILING))


def reservation(n, max_output):
    """The most a call of N body bytes and MAX_OUTPUT output tokens can cost: input at the
    dearest input kind."""
    dearest = max(PRICE["input"], PRICE["cache_write"], PRICE["cache_read"])
    return int((Decimal(n) * dearest + max_output * PRICE["output"])
               .to_integral_value(rounding=ROUND_CEILING))


def sse_events(data):
    return [json.loads(line[len("data: "):]) for line in data.decode().splitlines()
            if line.startswith("data: ")]


def assert_gemini_error(st, data, status, code, prefix):
    b = json.loads(data)
    assert st == status and set(b) == {"error"}, (st, b)
    assert b["error"]["code"] == status and b["error"]["status"] == code, b
    assert b["error"]["message"].startswith(prefix), b


def test_gemini_exact_spend_both_methods():
    with Gateway() as gw:
        srv, fake = gw.srv, gw.fake
        tok = start_task(srv, "gexact", budgetUSD="5.00")
        fake.usage = {"input": 100, "output": 50, "cache_write": 0, "cache_read": 20,
                      "thoughts": 7}
        one = cost_micros(fake.usage)
        assert one == 174  # 30 + 0.6 + 142.5 micro-dollars, rounded up
        # generateContent, the token in x-goog-api-key, an output limit of the client's.
        st, data, err = call(srv, GEN, body(max_output=100), {"x-goog-api-key": tok})
        assert st == 200 and err is None, (st, data)
        b = json.loads(data)
        assert b["candidates"][0]["content"]["parts"][0]["text"] == "hello", b
        assert b["usageMetadata"]["thoughtsTokenCount"] == 7, b
        r0 = fake.requests[-1]
        assert r0["path"] == "/v1beta/models/%s:generateContent" % MODEL, r0["path"]
        assert r0["headers"]["x-goog-api-key"] == KEY, r0["headers"]
        assert r0["body"] == body(max_output=100), r0["body"]  # passed on unchanged
        wait_charges(srv, "gexact", 1)
        t = task(srv, "gexact")
        assert Decimal(t["status"]["costUSD"]) == usd(one), t["status"]
        assert t["status"]["tokensConsumed"] == 177, t["status"]
        # streamGenerateContent?alt=sse, the token in ?key=, no output limit: the table's.
        st, data, err = call(srv, STREAM + "&key=" + urllib.parse.quote(tok, safe=""), body(),
                             {})
        assert st == 200 and err is None, (st, data, err)
        events = sse_events(data)
        assert len(events) == 3 and events[-1]["candidates"][0]["finishReason"] == "STOP", data
        assert "".join(e["candidates"][0]["content"]["parts"][0]["text"] for e in events) == \
            "hello"
        r1 = fake.requests[-1]
        # Upstream gets the server's key and alt=sse: never the client's ?key=.
        assert r1["path"] == "/v1beta/models/%s:streamGenerateContent?alt=sse" % MODEL, r1
        assert r1["headers"]["x-goog-api-key"] == KEY
        assert r1["body"]["generationConfig"] == {"maxOutputTokens": MAX_OUTPUT}, r1["body"]
        for r in fake.requests:
            assert tok not in json.dumps(r), r
        wait_charges(srv, "gexact", 2)
        t = task(srv, "gexact")
        assert Decimal(t["status"]["costUSD"]) == usd(2 * one), t["status"]
        assert t["status"]["tokensConsumed"] == 2 * 177
        # The snake_case spelling is read and kept (both spellings would be a duplicate).
        st, data, _ = call(srv, GEN, {"contents": [], "generation_config": {
            "max_output_tokens": 10}}, {"x-goog-api-key": tok})
        assert st == 200, data
        assert fake.requests[-1]["body"] == {"contents": [], "generation_config": {
            "max_output_tokens": 10}}, fake.requests[-1]["body"]
        wait_charges(srv, "gexact", 3)
        log = read_log(srv, "gexact")
        line = "llm gemini %s input=100 output=57 cache_write=0 cache_read=20 usd=0.000174" % MODEL
        assert log.count(line) == 2, log
        # The third call was allowed 10 output tokens: the fake's 57 are charged no more
        # than the call's reservation.
        assert log.count("llm gemini %s input=100 output=57 cache_write=0 cache_read=20 usd="
                         % MODEL) == 3, log
        assert log.count("(capped at the call's reservation") == 1, log
        assert KEY not in log and KEY not in srv.stderr()


def test_gemini_tool_use_prompt_tokens_charged_as_input():
    """toolUsePromptTokenCount (what a server-side tool such as search put into the prompt)
    is billed by Gemini as input but is not part of promptTokenCount: it is charged as
    input, streamed and not, and the task's tokens equal the answer's totalTokenCount. (The
    prompt is long enough that the call's reservation covers them: a charge is capped at
    its reservation.)"""
    with Gateway() as gw:
        srv, fake = gw.srv, gw.fake
        tok = start_task(srv, "gtool", budgetUSD="5.00")
        fake.usage = {"input": 100, "output": 50, "cache_write": 0, "cache_read": 0,
                      "tool_use": 400}
        one = cost_micros(fake.usage)
        long_body = body(max_output=100)
        long_body["contents"][0]["parts"][0]["text"] = "say hello " * 60  # 600 bytes
        assert one == 275  # (100 + 400) x 0.30 + 50 x 2.50 micro-dollars
        st, data, err = call(srv, GEN, long_body, {"x-goog-api-key": tok})
        assert st == 200 and err is None, (st, data)
        meta = json.loads(data)["usageMetadata"]
        assert meta["toolUsePromptTokenCount"] == 400, meta
        wait_charges(srv, "gtool", 1)
        t = task(srv, "gtool")
        assert Decimal(t["status"]["costUSD"]) == usd(one), t["status"]
        assert t["status"]["tokensConsumed"] == meta["totalTokenCount"] == 550, t["status"]
        st, data, err = call(srv, STREAM, long_body, {"x-goog-api-key": tok})
        assert st == 200 and err is None, (st, data, err)
        assert sse_events(data)[-1]["usageMetadata"]["toolUsePromptTokenCount"] == 400, data
        wait_charges(srv, "gtool", 2)
        t = task(srv, "gtool")
        assert Decimal(t["status"]["costUSD"]) == usd(2 * one), t["status"]
        assert t["status"]["tokensConsumed"] == 1100, t["status"]
        line = "llm gemini %s input=500 output=50 cache_write=0 cache_read=0 usd=0.000275" % MODEL
        assert read_log(srv, "gtool").count(line) == 2, read_log(srv, "gtool")


def test_gemini_guidance_in_system_instruction():
    with Gateway() as gw:
        srv, fake = gw.srv, gw.fake
        tok = start_task(srv, "gguide", budgetUSD="5.00")
        post = {"x-goog-api-key": tok}
        call(srv, GEN, body(100), post)
        assert "systemInstruction" not in fake.requests[-1]["body"]
        srv.request("PATCH", NS + "/gguide",
                    {"metadata": {"annotations": {"divergedev.com/guidance": "use the ORM"}}},
                    headers={"Content-Type": "application/merge-patch+json"})
        g = {"text": "Reviewer guidance from the pull request: use the ORM"}
        call(srv, GEN, body(100), post)
        assert fake.requests[-1]["body"]["systemInstruction"] == {"parts": [g]}
        own = {"role": "user", "parts": [{"text": "You are terse."}]}
        call(srv, STREAM, body(100, systemInstruction=own), post)
        assert fake.requests[-1]["body"]["systemInstruction"] == {
            "role": "user", "parts": [{"text": "You are terse."}, g]}
        call(srv, GEN, body(100, system_instruction={"parts": [{"text": "A"}]}), post)
        sent = fake.requests[-1]["body"]
        assert sent["system_instruction"] == {"parts": [{"text": "A"}, g]} and \
            "systemInstruction" not in sent, sent


def test_gemini_budget_402_and_pause():
    with Gateway() as gw:
        srv, fake = gw.srv, gw.fake
        tok = start_task(srv, "gpoor", budgetUSD="0.01")
        b = body(max_output=8192, systemInstruction={"parts": [{"text": "x" * 900}]})
        n = len(json.dumps(b).encode())
        assert 1000 < n < 1100, n
        in_cost = Decimal(n) * PRICE["input"]
        allowed = int((Decimal(10000) - in_cost) / PRICE["output"])
        while (in_cost + allowed * PRICE["output"]).to_integral_value(ROUND_CEILING) > 10000:
            allowed -= 1
        # The call uses all it was allowed: what remains cannot pay for the next one's input.
        fake.usage = {"input": 100, "output": allowed, "cache_write": 0, "cache_read": 0}
        st, data, _ = call(srv, GEN, b, {"x-goog-api-key": tok})
        assert st == 200, data
        sent = fake.requests[-1]["body"]["generationConfig"]
        assert sent == {"temperature": 0, "maxOutputTokens": allowed}, (sent, allowed)
        spent = cost_micros(fake.usage)
        wait_charges(srv, "gpoor", 1)
        assert Decimal(task(srv, "gpoor")["status"]["costUSD"]) == usd(spent)
        calls = len(fake.requests)
        st, data, _ = call(srv, STREAM, b, {"x-goog-api-key": tok})
        assert_gemini_error(st, data, 402, "FAILED_PRECONDITION", "diverge: budget exceeded")
        assert len(fake.requests) == calls
        t = wait_phase(srv, "gpoor", "Paused")
        assert t["status"]["reason"] == "BudgetExceeded", t["status"]
        assert Decimal(t["status"]["costUSD"]) == usd(spent) <= Decimal("0.01")
        st, data, _ = call(srv, GEN, b, {"x-goog-api-key": tok})
        assert_gemini_error(st, data, 401, "UNAUTHENTICATED", "diverge: ")
        assert "refused: budget exceeded, task paused" in read_log(srv, "gpoor")


def test_gemini_auth_and_models():
    with Gateway() as gw:
        srv, fake = gw.srv, gw.fake
        tok = start_task(srv, "gcaps", budgetUSD="5.00", capabilities=["gemini-2.5-pro*"])
        q = urllib.parse.quote(tok, safe="")
        st, data, _ = call(srv, BASE + "gemini-unknown-1:generateContent", body(100),
                           {"x-goog-api-key": tok})
        assert_gemini_error(st, data, 403, "PERMISSION_DENIED",
                            "diverge: no price for model gemini-unknown-1")
        st, data, _ = call(srv, GEN, body(100), {"x-goog-api-key": tok})  # not in capabilities
        assert_gemini_error(st, data, 403, "PERMISSION_DENIED", "diverge: ")
        pro = BASE + "gemini-2.5-pro:generateContent"
        for path, hdrs in ((pro, {}), (pro, {"x-goog-api-key": "not-a-token"}),
                           (pro + "?key=" + q, {"x-goog-api-key": tok}),  # two: refused
                           (pro + "?key=" + q + "&key=" + q, {}),
                           (pro, {"Authorization": "Bearer " + tok})):
            st, data, _ = call(srv, path, body(100), hdrs)
            assert_gemini_error(st, data, 401, "UNAUTHENTICATED", "diverge: ")
        assert fake.requests == [], fake.requests
        st, data, _ = call(srv, pro + "?key=" + q, body(100), {})
        assert st == 200, data
        assert fake.requests[-1]["path"] == "/v1beta/models/gemini-2.5-pro:generateContent"
        st, data, _ = call(srv, pro, b"[1, 2]", {"x-goog-api-key": tok})
        assert_gemini_error(st, data, 400, "INVALID_ARGUMENT", "diverge: ")


def test_gemini_hostile_paths_refused():
    with Gateway() as gw:
        srv, fake = gw.srv, gw.fake
        tok = start_task(srv, "ghostile", budgetUSD="5.00")
        h = {"x-goog-api-key": tok}
        # Reach the route (one segment up to the ':') but are no plain model name.
        for model in ("gemini..flash", "..", "a%3Fb", "a%23b", "a%25b", "a%2525b", "a%20b",
                      "a%0d%0aX-Evil%201", "a%3Bb", "%C3%A9", "a" * 129):
            st, data, _ = call(srv, BASE + model + ":generateContent", body(100), h)
            assert st == 400, (model, st, data)
            assert_gemini_error(st, data, 400, "INVALID_ARGUMENT",
                                "diverge: the model in the path must be a plain model name")
            st, data, _ = call(srv, BASE + model + ":streamGenerateContent?alt=sse", body(100), h)
            assert st == 400, (model, st, data)
        # Never reach it: another segment, or no method of ours.
        for path in (BASE + "a/b:generateContent", BASE + "a%2Fb:generateContent",
                     BASE + MODEL + ":countTokens", BASE + ":generateContent",
                     BASE + MODEL + ":generateContentX", BASE + MODEL,
                     BASE + "a%0d%0aX-Evil:%201:generateContent"):
            st, data, _ = call(srv, path, body(100), h)
            assert st == 404, (path, st, data)
        # streamGenerateContent is SSE only; generateContent is JSON only.
        for path in (BASE + MODEL + ":streamGenerateContent",
                     BASE + MODEL + ":streamGenerateContent?alt=json",
                     STREAM + "&alt=sse", GEN + "?alt=sse"):
            st, data, _ = call(srv, path, body(100), h)
            assert_gemini_error(st, data, 400, "INVALID_ARGUMENT", "diverge: ")
        assert fake.requests == [], fake.requests
        st, data, _ = call(srv, GEN + "?alt=json", body(100), h)
        assert st == 200, data
        assert fake.requests[-1]["path"] == "/v1beta/models/%s:generateContent" % MODEL


def test_gemini_upstream_errors_pass_through_uncharged():
    with Gateway() as gw:
        srv, fake = gw.srv, gw.fake
        tok = start_task(srv, "gerrs", budgetUSD="5.00")
        for status, code in ((500, "INTERNAL"), (429, "RESOURCE_EXHAUSTED"),
                             (503, "UNAVAILABLE")):
            err = {"error": {"code": status, "message": "upstream says no", "status": code}}
            for path in (GEN, STREAM):
                fake.script.append({"status": status, "body": err})
                st, data, _ = call(srv, path, body(100), {"x-goog-api-key": tok})
                assert st == status and json.loads(data) == err, (path, st, data)
        t = task(srv, "gerrs")
        assert Decimal(t["status"].get("costUSD", "0")) == 0, t["status"]
        assert t["status"].get("tokensConsumed", 0) == 0
        assert t["status"]["phase"] == "Active"


def test_gemini_stream_cut_charges_the_reservation():
    with Gateway() as gw:
        srv, fake = gw.srv, gw.fake
        tok = start_task(srv, "gcut", budgetUSD="5.00")
        b = body(max_output=300)
        # Two chunks with partial usage (the prompt's), then the connection drops: the
        # final usageMetadata never came.
        fake.script.append({"cut_after": 2})
        st, data, err = call(srv, STREAM, b, {"x-goog-api-key": tok})
        assert st == 200 and len(sse_events(data)) == 2, (st, data)
        assert err is not None, "the client must see the stream cut, not a normal end"
        n = len(json.dumps(b).encode())
        wait_charges(srv, "gcut", 1)
        t = task(srv, "gcut")
        assert Decimal(t["status"]["costUSD"]) == usd(reservation(n, 300)), t["status"]
        assert t["status"]["tokensConsumed"] == n + 300
        assert "ended before its usage arrived: charged the reservation" in read_log(srv, "gcut")


def test_gemini_output_limit_counts_every_candidate():
    with Gateway() as gw:
        srv, fake = gw.srv, gw.fake
        tok = start_task(srv, "gcands", budgetUSD="5.00")
        h = {"x-goog-api-key": tok}
        # maxOutputTokens is per candidate: a cut stream of 3 candidates of 100 is charged
        # 300 output tokens.
        b = body(max_output=100)
        b["generationConfig"]["candidateCount"] = 3
        fake.script.append({"cut_after": 1})
        st, data, err = call(srv, STREAM, b, h)
        assert st == 200 and err is not None, (st, data)
        assert fake.requests[-1]["body"] == b  # within the budget: unchanged
        n = len(json.dumps(b).encode())
        wait_charges(srv, "gcands", 1)
        t = task(srv, "gcands")
        assert Decimal(t["status"]["costUSD"]) == usd(reservation(n, 300)), t["status"]
        # Two spellings of one field: the gateway does not guess which one counts; it
        # writes one limit of its own (the table's, shared by the candidates).
        for cfg, want in (({"maxOutputTokens": 10, "max_output_tokens": 999999},
                           {"maxOutputTokens": MAX_OUTPUT}),
                          ({"maxOutputTokens": "999999"}, {"maxOutputTokens": MAX_OUTPUT}),
                          ({"candidateCount": 2}, {"candidateCount": 2,
                                                   "maxOutputTokens": MAX_OUTPUT // 2}),
                          ({"candidateCount": 2, "candidate_count": 8},
                           {"candidateCount": 2, "maxOutputTokens": MAX_OUTPUT // 2}),
                          ({"candidateCount": 99}, {"candidateCount": 1,
                                                    "maxOutputTokens": MAX_OUTPUT})):
            st, data, _ = call(srv, GEN, {"contents": [], "generationConfig": cfg}, h)
            assert st == 200, data
            assert fake.requests[-1]["body"]["generationConfig"] == want, (cfg, fake.requests[-1])
        st, data, _ = call(srv, GEN, {"contents": [], "generationConfig": {"topK": 1},
                                      "generation_config": {"maxOutputTokens": 999999}}, h)
        assert st == 200, data
        assert fake.requests[-1]["body"] == {"contents": [], "generationConfig": {
            "topK": 1, "maxOutputTokens": MAX_OUTPUT}}, fake.requests[-1]["body"]


def run_gemini_cli(srv, tok, workdir):
    """Runs the real Gemini CLI (pinned in npm_pin) once in prompt mode through the gateway
    with TOK as its API key; returns (exit code, stdout, stderr). Non-loopback HTTP would go
    to a dead loopback proxy; the settings turn usage statistics, telemetry and update
    checks off, and select API-key auth (else a base URL makes it exit 41)."""
    import npm_pin
    modules = npm_pin.install(*npm_pin.GEMINI_CLI)
    home = os.path.join(workdir, "home")
    os.makedirs(os.path.join(home, ".gemini"), exist_ok=True)
    os.makedirs(os.path.join(workdir, "tmp"), exist_ok=True)
    os.makedirs(os.path.join(workdir, "repo"), exist_ok=True)
    with open(os.path.join(home, ".gemini", "settings.json"), "w") as f:
        json.dump({"security": {"auth": {"selectedType": "gemini-api-key"}},
                   "privacy": {"usageStatisticsEnabled": False},
                   "telemetry": {"enabled": False},
                   "general": {"disableAutoUpdate": True, "disableUpdateNag": True}}, f)
    env = {"PATH": os.environ["PATH"], "HOME": home, "GEMINI_CLI_HOME": home,
           "TMPDIR": os.path.join(workdir, "tmp"), "TERM": "dumb", "LANG": "C.UTF-8",
           "GOOGLE_GEMINI_BASE_URL": srv.url + "/api/v1/llm/gemini", "GEMINI_API_KEY": tok,
           "HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9",
           "NO_PROXY": "127.0.0.1,localhost"}
    r = subprocess.run([os.path.join(modules, ".bin", "gemini"), "-p", "say hello",
                        "--yolo", "--skip-trust", "-m", MODEL, "--output-format", "json"],
                       cwd=os.path.join(workdir, "repo"), env=env, stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout, r.stderr


def test_gemini_cli_through_the_gateway():
    import npm_pin
    npm_pin.ensure_node()
    if npm_pin.node_major() < 20:
        # The pinned CLI is a bundle that needs Node 20 (Debian 12's own nodejs is 18: it
        # fails there at its first regular expression with the v flag). The gateway's
        # Gemini path is still checked above with the hand-made requests.
        print("SKIP test_gemini_cli_through_the_gateway: needs Node 20 or newer, found %d"
              % npm_pin.node_major())
        return
    with Gateway() as gw:
        srv, fake = gw.srv, gw.fake
        work = tempfile.mkdtemp(prefix="diverge-gemini-cli-")
        try:
            tok = start_task(srv, "gcli", budgetUSD="5.00")
            fake.usage = {"input": 100, "output": 50, "cache_write": 0, "cache_read": 20,
                          "thoughts": 7}
            rc, out, err = run_gemini_cli(srv, tok, os.path.join(work, "ok"))
            assert rc == 0, (rc, out, err)
            res = json.loads(out)
            assert res["response"].strip() == "hello", res
            calls = [r for r in fake.requests if r["path"].startswith("/v1beta/models/")]
            assert len(calls) >= 1, fake.requests
            for r in calls:
                assert r["path"] == "/v1beta/models/%s:streamGenerateContent?alt=sse" % MODEL
                assert r["headers"]["x-goog-api-key"] == KEY and tok not in json.dumps(r)
            # The CLI's own totals equal what the gateway charged, call for call.
            tokens = res["stats"]["models"][MODEL]["tokens"]
            n = len(calls)
            wait_charges(srv, "gcli", n)
            assert tokens["prompt"] == 120 * n and tokens["cached"] == 20 * n, tokens
            assert tokens["candidates"] == 50 * n and tokens["thoughts"] == 7 * n, tokens
            t = task(srv, "gcli")
            assert Decimal(t["status"]["costUSD"]) == usd(n * cost_micros(fake.usage)), t
            assert t["status"]["tokensConsumed"] == tokens["total"] == 177 * n, (t, tokens)
            # A budget that cannot pay for the CLI's first call (its body alone is tens of
            # kilobytes): 402, and the CLI stops at once (its exit code is the status).
            before = len(fake.requests)
            tok = start_task(srv, "gcli-poor", budgetUSD="0.01")
            rc, out, err = run_gemini_cli(srv, tok, os.path.join(work, "poor"))
            assert rc == 402 & 0xff, (rc, out, err)
            assert "budget exceeded" in out + err, (out, err)
            assert len(fake.requests) == before, fake.requests[before:]
            t = wait_phase(srv, "gcli-poor", "Paused")
            assert t["status"]["reason"] == "BudgetExceeded", t["status"]
            assert Decimal(t["status"].get("costUSD", "0")) == 0, t["status"]
        finally:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    run_tests([test_gemini_exact_spend_both_methods,
               test_gemini_tool_use_prompt_tokens_charged_as_input,
               test_gemini_guidance_in_system_instruction,
               test_gemini_budget_402_and_pause, test_gemini_auth_and_models,
               test_gemini_hostile_paths_refused,
               test_gemini_upstream_errors_pass_through_uncharged,
               test_gemini_stream_cut_charges_the_reservation,
               test_gemini_output_limit_counts_every_candidate,
               test_gemini_cli_through_the_gateway])
