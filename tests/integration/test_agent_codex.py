# SPDX-License-Identifier: Apache-2.0
"""The real Codex CLI (npm, pinned in npm_pin.py) as a task's agent inside the local
(bubblewrap) sandbox, run by examples/agents/codex.agent.yaml, through the runner's LLM
relay and the server's OpenAI Responses route (SPEC §13) to a scripted fake upstream on
loopback (tests/fakes/fake_llm.py's agent script: exec_command tool calls, then text).
Codex reaches the sandbox as a user would put it there: an `npm install -g --prefix DIR`
layout given to `diverge serve --sandbox-tools DIR` (bound read-only, its bin/ on PATH;
bin/codex is the package's node launcher, which execs the native binary). Tasks come from
`/diverge` comments on local pull requests (SPEC §10).

- fix: Codex runs the fake's commands (a probe of the sandbox, then the fix); verify
  passes, the fix is on the PR's head branch; the spend equals the fake's usage x the
  --llm-prices table exactly, and the token sums equal what Codex itself reports (the
  `turn.completed` usage of its --json output, in the task log);
- keys: the server's key is nowhere in the sandbox (every process's environment and the
  files under the workspace, HOME and /tmp, as Codex's own exec_command saw them; the
  workspace and HOME on the host after the run), the task log, the answers or the API;
  the upstream got the server's key and never a task token;
- budget: a budget that runs out after the first call: the gateway refuses the second
  with 429 insufficient_quota, Codex stops at once (no retry), the task is Paused
  (BudgetExceeded) with spend <= budget; after `/diverge guide …` and `/diverge resume
  +$1` every request's instructions carry the guidance and the task completes.
Codex never gives up on an unreachable upstream: the example bounds it with `timeout`.
Skipped (with the reason) only when bubblewrap cannot run here."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from decimal import ROUND_CEILING, Decimal

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fakes"))

import npm_pin  # noqa: E402
from fake_llm import FakeLLM  # noqa: E402
from harness import SOURCE_DIR, run_tests  # noqa: E402
from sandbox_helpers import git  # noqa: E402
from test_agent_claude_code import (BASE_ENV, agent_server, comment, files_holding,  # noqa: E402
                                    log_of, make_repo, task, token_of, usd, wait, wait_phase,
                                    why_skip)

EXAMPLE = os.path.join(SOURCE_DIR, "examples", "agents", "codex.agent.yaml")
KEY = "sk-proj-SERVERKEY-4e81c07d2b9a5f36"
MODEL = "gpt-5.5"  # the example's model
PRICES = """version: "1"
models:
  - match: "gpt-5*"
    inputPerMTok: "1.00"
    outputPerMTok: "10.00"
    cacheWritePerMTok: "2.00"
    cacheReadPerMTok: "0.10"
    maxOutputTokens: 32000
"""
PRICE = {"input": Decimal("1.00"), "output": Decimal("10.00"), "cache_read": Decimal("0.10")}
USAGE = {"input": 1000, "output": 120, "cache_write": 0, "cache_read": 400}  # 2240 µ$
ENV = dict(BASE_ENV, DIVERGE_OPENAI_API_KEY=KEY)
FIX = ("exec_command", {"cmd": "sed -i s/wrold/world/ greeting.txt"})
REFUSED = "refused: budget exceeded, task paused"


def probe():
    """A command for Codex's exec_command: which environments of the sandbox's processes
    and which files under the workspace, HOME and /tmp hold the key (written split, so
    the command itself never holds it), and this shell's LLM variables."""
    half = len(KEY) // 2
    pattern = "'%s''%s'" % (KEY[:half], KEY[half:])
    return ("echo \"== environs $(ls -d /proc/[0-9]*/environ | wc -l)\"; "
            "echo '== environs holding the key:'; grep -alF -- %s /proc/[0-9]*/environ; "
            "grep -alF DIVERGE_OPENAI_API_KEY /proc/[0-9]*/environ; "
            "echo \"== environs holding the placeholder $(grep -alF diverge-sandbox "
            "/proc/[0-9]*/environ | wc -l)\"; "
            "echo '== files holding the typo:'; grep -rlF wrold /workspace; "
            "echo '== files holding the key:'; grep -rlF -- %s /workspace \"$HOME\" /tmp; "
            "echo '== vars'; env | grep -E '^(OPENAI|DIVERGE_LLM)' | sort; "
            "echo '== probe done'" % (pattern, pattern))


def tools_top():
    """A new folder for codex_tools, searchable by all: in the temporary folder when that is
    on the npm cache's filesystem (hard links), else in /var/tmp or /tmp when one is (a
    TMPDIR on tmpfs: scripts/test.sh)."""
    dev = os.stat(npm_pin.install(*npm_pin.CODEX)).st_dev
    where = None
    for d in (tempfile.gettempdir(), "/var/tmp", "/tmp"):
        try:
            if os.stat(d).st_dev == dev:
                where = d
                break
        except OSError:
            pass
    top = tempfile.mkdtemp(prefix="diverge-codex-sb-", dir=where)
    os.chmod(top, 0o755)
    return top


def codex_tools(top):
    """TOP/tools as `npm install -g --prefix TOP/tools @openai/codex` lays it out
    (lib/node_modules/@openai/{codex,codex-linux-x64}, bin/codex -> the launcher), made
    of hard links into the npm cache: outside the cache, so the sandbox user can reach
    every folder on its path (~ of root is not searchable)."""
    nm = npm_pin.install(*npm_pin.CODEX)
    tools = os.path.join(top, "tools")
    lib = os.path.join(tools, "lib", "node_modules")
    os.makedirs(lib, mode=0o755)
    if subprocess.run(["cp", "-al", os.path.join(nm, "@openai"), lib]).returncode != 0:
        # Another filesystem than the cache's (tools_top found none): a copy (~400 MB).
        shutil.rmtree(os.path.join(lib, "@openai"), ignore_errors=True)
        subprocess.run(["cp", "-a", os.path.join(nm, "@openai"), lib], check=True)
    for d, dirs, _ in os.walk(tools):
        os.chmod(d, 0o755)
    os.makedirs(os.path.join(tools, "bin"), mode=0o755)
    os.symlink("../lib/node_modules/@openai/codex/bin/codex.js",
               os.path.join(tools, "bin", "codex"))
    return tools


def example_yaml(budget=None):
    """The shipped example, with the demo repository's test as its verify command and,
    when given, another budget."""
    with open(EXAMPLE) as f:
        text = f.read()
    text, n = re.subn(r"verifyCommand: make test.*\n", "verifyCommand: sh test.sh\n", text)
    assert n == 1, text
    if budget is not None:
        text, n = re.subn(r'budgetUSD: "[0-9.]+"', 'budgetUSD: "%s"' % budget, text)
        assert n == 1, text
    return text


def cost_micros(u):
    return int(sum(Decimal(u[k]) * PRICE[k] for k in PRICE).to_integral_value(ROUND_CEILING))


def codex_events(log):
    """The JSON events Codex printed (exec --json), in order."""
    out = []
    for line in log.splitlines():
        i = line.find("[sandbox] {")
        if i >= 0:
            try:
                obj = json.loads(line[i + len("[sandbox] "):])
            except ValueError:
                continue
            if isinstance(obj, dict) and "type" in obj:
                out.append(obj)
    return out


def outputs(body):
    """The function_call_output items of a Responses request body, in order."""
    items = body.get("input") if isinstance(body.get("input"), list) else []
    return [i for i in items if isinstance(i, dict) and i.get("type") == "function_call_output"]


def output_text(item):
    o = item.get("output")
    if isinstance(o, list):
        return "".join(p.get("text", "") for p in o if isinstance(p, dict))
    return o if isinstance(o, str) else ""


def check_probe(calls):
    """What Codex's exec_command saw in the sandbox: the relay's placeholder, no key in
    any process's environment or file."""
    seen = [output_text(o) for c in calls for o in outputs(c["body"])
            if o.get("call_id") == "call_fake_0"]
    assert seen, [c["body"]["input"] for c in calls]
    out = seen[0]
    assert "== probe done" in out, out
    n = int(re.search(r"== environs (\d+)", out).group(1))
    assert n >= 3, out  # at least the runner, Codex and this shell
    environs = out.split("== environs holding the key:")[1].split("== environs")[0].strip()
    assert environs == "", out
    # The same greps find what is there: the placeholder in the environments of Codex,
    # its shell and this one; the typo in the workspace.
    assert int(re.search(r"== environs holding the placeholder (\d+)", out).group(1)) >= 3, out
    typo = out.split("== files holding the typo:")[1].split("== files")[0].split()
    assert typo == ["/workspace/greeting.txt"], out
    files = out.split("== files holding the key:")[1].split("== vars")[0].strip()
    assert files == "", out
    assert "OPENAI_API_KEY=diverge-sandbox" in out, out
    assert "OPENAI_BASE_URL=http://127.0.0.1:3129/api/v1/llm/openai/v1" in out, out
    assert KEY not in out, out


def check_upstream_saw_the_key(calls, tokens):
    assert calls
    for c in calls:
        assert c["headers"].get("authorization") == "Bearer " + KEY, c["headers"]
        text = json.dumps(c)
        for t in tokens:
            assert t not in text
        assert "diverge-sandbox" not in json.dumps(c["headers"])


def turn_usage(events):
    """Codex's own report: the usage of its turn.completed events, summed."""
    done = [e["usage"] for e in events if e.get("type") == "turn.completed"]
    return done, {k: sum(u.get(k, 0) for u in done) for k in
                  ("input_tokens", "cached_input_tokens", "output_tokens")}


def scenario_fix(srv, fake, top):
    bare = make_repo(top, "greet", example_yaml())
    r = srv.cli("local", "pr", "open", "acme/greet#1", "--repo", "file://" + bare,
                "--head", "fix")
    assert r.returncode == 0, r
    before = len(fake.requests)
    comment(srv, "acme/greet#1", "/diverge fix the typo in greeting.txt")
    ns, name = "acme-greet", "fix-pr-1"
    wait(lambda: (task(srv, ns, name) or {}).get("status", {}).get("phase") == "Active",
         what="task Active")
    tok = token_of(srv, ns, name)
    t = wait_phase(srv, ns, name, ("Completed", "Failed"))
    log = log_of(srv, ns, name)
    assert t["status"]["phase"] == "Completed", (t["status"], log)
    assert t["spec"]["runner"]["verifyCommand"] == "sh test.sh", t["spec"]
    assert "codex exec --json" in t["spec"]["runner"]["command"], t["spec"]
    assert "iteration 1/3: agent exit 0, verify exit 0" in log, log
    calls = fake.requests[before:]
    # Three calls: the probe, the fix, the final text.
    assert len(calls) == 3, [c["body"].get("input") for c in calls]
    for c in calls:
        assert c["path"] == "/v1/responses", c["path"]
        assert c["body"]["model"] == MODEL and c["body"]["stream"] is True, c["body"]
        assert "Reviewer guidance" not in json.dumps(c["body"].get("instructions"))
    fixed = [output_text(o) for o in outputs(calls[2]["body"])]
    assert len(fixed) == 2, calls[2]["body"]["input"]
    # The fix is on the PR's head branch.
    assert git("--git-dir", bare, "show", "fix:greeting.txt") == "Hello, world!\n"
    # Spend: the fake's usage x the price table, per call rounded up, exactly.
    one = cost_micros(USAGE)
    assert one == 2240
    assert Decimal(t["status"]["costUSD"]) == usd(3 * one), t["status"]
    per_call = USAGE["input"] + USAGE["output"] + USAGE["cache_read"]
    assert t["status"]["tokensConsumed"] == 3 * per_call, t["status"]
    line = ("llm openai %s input=%d output=%d cache_write=0 cache_read=%d usd=%s"
            % (MODEL, USAGE["input"], USAGE["output"], USAGE["cache_read"], usd(one)))
    assert log.count(line) == 3, log
    # ... and Codex's own report of its turn says the same token sums.
    done, cu = turn_usage(codex_events(log))
    assert len(done) == 1, log
    assert cu == {"input_tokens": 3 * (USAGE["input"] + USAGE["cache_read"]),
                  "cached_input_tokens": 3 * USAGE["cache_read"],
                  "output_tokens": 3 * USAGE["output"]}, cu
    # No key in the sandbox, its files, the log, the task, or anything Codex got.
    check_probe(calls)
    check_upstream_saw_the_key(calls, [tok])
    assert KEY not in log and tok not in log
    assert KEY not in json.dumps(t)
    for where in ("workspaces", "state"):
        d = os.path.join(srv.data_dir, where)
        if os.path.isdir(d):
            assert files_holding(d, KEY) == [], where
    # HOME (the state dir) holds what Codex wrote (CODEX_HOME), and no key or token.
    homes = [d for d, _, f in os.walk(srv.data_dir) if "installation_id" in f]
    assert homes and all(h.endswith("/.codex") for h in homes), homes
    for h in homes:
        assert files_holding(h, KEY) == [] and files_holding(h, tok) == [], h
    return calls


def responses_by_code(srv):
    """The gateway's Responses route's answers so far, by status code (/metrics)."""
    st, _, text = srv.request("GET", "/metrics")
    assert st == 200, st
    seen = {}
    for ln in text.splitlines():
        if ln.startswith('diverge_http_requests_total{route="llm.openai.responses"'):
            seen[ln.split('code="')[1].split('"')[0]] = int(ln.rsplit(" ", 1)[1])
    return seen


def scenario_budget_resume(srv, fake, top, first_size):
    """A budget that pays for the first call only: with the fake using all a call may
    (its body's bytes in, its lowered output limit out), what remains is less than the
    second call's input bound (its body, longer by the probe's output)."""
    # The first call's input bound (its bytes at the dearest input price) plus 3000 output
    # tokens, in whole cents.
    bound = first_size * Decimal("2.00") + 3000 * PRICE["output"]
    budget = (bound / Decimal(10000)).to_integral_value(ROUND_CEILING) / Decimal(100)
    bare = make_repo(top, "poor", example_yaml(budget="%.2f" % budget))
    r = srv.cli("local", "pr", "open", "acme/poor#2", "--repo", "file://" + bare,
                "--head", "fix")
    assert r.returncode == 0, r
    ns, name = "acme-poor", "fix-pr-2"
    before, codes = len(fake.requests), responses_by_code(srv)
    fake.worst_case = True
    comment(srv, "acme/poor#2", "/diverge fix the typo in greeting.txt")
    wait(lambda: (task(srv, ns, name) or {}).get("status", {}).get("phase") == "Active",
         what="task Active")
    tok1 = token_of(srv, ns, name)
    t = wait_phase(srv, ns, name, ("Paused", "Completed", "Failed"))
    log = wait(lambda: (lambda l: l if "agent exit" in l else None)(log_of(srv, ns, name)),
               what="the agent's exit in the log")
    assert t["status"]["phase"] == "Paused", (t["status"], log)
    assert t["status"]["reason"] == "BudgetExceeded", t["status"]
    assert t["spec"]["budgetUSD"] == "%.2f" % budget, t["spec"]
    # One call reached the upstream; the next was refused by the gateway with 429
    # insufficient_quota, once: Codex did not retry it, it reported the quota and exited.
    first = fake.requests[before:]
    assert len(first) == 1, [c["body"]["input"] for c in first]
    assert log.count(REFUSED) == 1, log
    after = responses_by_code(srv)
    delta = {k: v - codes.get(k, 0) for k, v in after.items() if v != codes.get(k, 0)}
    assert delta == {"200": 1, "429": 1}, (codes, after)
    events = codex_events(log)
    failed = [e for e in events if e.get("type") == "turn.failed"]
    assert len(failed) == 1 and "Quota exceeded" in json.dumps(failed[0]), events
    assert re.search(r"iteration 1/1: agent exit [1-9]|iteration 1/3: agent exit [1-9]",
                     log), log
    # The first call's output limit was lowered to what the budget could pay for, and it
    # used all of it: the spend is that call's, within the budget.
    limit = first[0]["body"].get("max_output_tokens")
    assert isinstance(limit, int) and 0 < limit < 32000, first[0]["body"].get("max_output_tokens")
    first_cost = cost_micros({"input": first[0]["raw_len"], "output": limit, "cache_read": 0})
    spent = Decimal(t["status"]["costUSD"])
    assert spent == usd(first_cost) <= budget, (t["status"], first_cost, budget)
    assert git("--git-dir", bare, "show", "fix:greeting.txt") == "Hello, wrold!\n"
    # Guidance while paused, then more budget: a new Codex continues the task from the
    # next iteration, to the end, and every request carries the guidance.
    fake.worst_case = False
    comment(srv, "acme/poor#2", "/diverge guide keep the exclamation mark")
    wait(lambda: (task(srv, ns, name) or {}).get("metadata", {}).get("annotations", {})
         .get("divergedev.com/guidance") == "keep the exclamation mark", what="guidance")
    comment(srv, "acme/poor#2", "/diverge resume +$1")
    t = wait_phase(srv, ns, name, ("Completed", "Failed"))
    log = log_of(srv, ns, name)
    assert t["status"]["phase"] == "Completed", (t["status"], log)
    assert Decimal(t["spec"]["budgetUSD"]) == budget + 1, t["spec"]
    assert git("--git-dir", bare, "show", "fix:greeting.txt") == "Hello, world!\n"
    rest = fake.requests[before + 1:]
    assert len(rest) == 3, [c["body"]["input"] for c in rest]
    guidance = "Reviewer guidance from the pull request: keep the exclamation mark"
    assert guidance not in json.dumps(first[0]["body"])
    for c in rest:
        assert guidance in c["body"]["instructions"], c["body"].get("instructions")
    spent = Decimal(t["status"]["costUSD"])
    assert spent == usd(first_cost + 3 * cost_micros(USAGE)) <= budget + 1, t["status"]
    done, cu = turn_usage(codex_events(log))
    assert len(done) == 1 and cu == {
        "input_tokens": 3 * (USAGE["input"] + USAGE["cache_read"]),
        "cached_input_tokens": 3 * USAGE["cache_read"],
        "output_tokens": 3 * USAGE["output"]}, (done, log)
    check_upstream_saw_the_key(first + rest, [tok1])
    assert KEY not in log and tok1 not in log


def test_codex_in_the_local_sandbox():
    why, runner = why_skip()
    if why:
        print("SKIP: " + why)
        return
    top = tools_top()
    tools = codex_tools(top)
    fake = FakeLLM().start()
    fake.usage = dict(USAGE)
    fake.agent_calls = [("exec_command", {"cmd": probe()}), FIX]
    srv = agent_server(top, tools, PRICES, "openai", fake.url, runner, ENV)
    try:
        with srv:
            calls = scenario_fix(srv, fake, top)
            scenario_budget_resume(srv, fake, top, calls[0]["raw_len"])
            assert KEY not in srv.stderr() and KEY not in "\n".join(srv.lines)
    finally:
        fake.stop()
        shutil.rmtree(top, ignore_errors=True)


if __name__ == "__main__":
    run_tests([test_codex_in_the_local_sandbox])
