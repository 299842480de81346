# SPDX-License-Identifier: Apache-2.0
"""The real Claude Code CLI (npm, pinned in npm_pin.py) as a task's agent inside the local
(bubblewrap) sandbox, run by examples/agents/claude-code.agent.yaml, through the runner's
LLM relay and the server's gateway (SPEC §13) to a scripted fake Anthropic upstream on
loopback (tests/fakes/fake_anthropic_agent.py: Bash, Read, Edit tool calls, then text).
The CLI reaches the sandbox as a user would make it: one host folder of agent tools
given to `diverge serve --sandbox-tools` (bound read-only, its bin/ on PATH). Tasks come
from `/diverge` comments on local pull requests (SPEC §10), so agent.yaml is read from
the base branch as for GitHub.

- fix: the CLI edits greeting.txt with the fake's tool calls; verify passes, the fix is on
  the PR's head branch; the spend equals the fake's usage x the --llm-prices table
  exactly, and the token sums equal what the CLI itself reports (its JSON `usage`);
- keys: the server's key is nowhere in the sandbox (every process's environment and the
  files under the workspace, HOME and /tmp, as the agent's own Bash tool saw them; the
  workspace and HOME on the host after the run), the task log, the CLI's answers or the
  API; the upstream got the server's key in x-api-key and never a task token;
- budget: a budget that runs out after the first call: the gateway refuses the second
  (402), the CLI exits, the task is Paused (BudgetExceeded) with spend <= budget; after
  `/diverge guide …` and `/diverge resume +$1` the next request's system prompt carries
  the guidance and the task completes.
Skipped (with the reason) only when bubblewrap cannot run here."""
import json
import os
import re
import shutil
import sys
import tempfile
import time
from decimal import ROUND_CEILING, Decimal

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fakes"))

import npm_pin  # noqa: E402
from fake_anthropic_agent import FakeAgentLLM, result_text, tool_results  # noqa: E402
from harness import API, BUILD_DIR, SOURCE_DIR, Server, run_tests  # noqa: E402
from sandbox_helpers import git  # noqa: E402
from test_sandbox_local import usable  # noqa: E402

EXAMPLE = os.path.join(SOURCE_DIR, "examples", "agents", "claude-code.agent.yaml")
DEMO_REPO = os.path.join(SOURCE_DIR, "examples", "demo-repo")
KEY = "sk-ant-api03-SERVERKEY-9f3c2b7a61d04e8e"
PRICES = """version: "1"
models:
  - match: "claude-sonnet-4*"
    inputPerMTok: "1.00"
    outputPerMTok: "5.00"
    cacheWritePerMTok: "2.00"
    cacheReadPerMTok: "0.10"
    maxOutputTokens: 64000
"""
PRICE = {"input": Decimal("1.00"), "output": Decimal("5.00"), "cache_write": Decimal("2.00"),
         "cache_read": Decimal("0.10")}
BASE_ENV = {"GITHUB_TOKEN": None, "DIVERGE_NOTIFIER_TOKEN": None, "DIVERGE_AGENT_CMD": None,
            "DIVERGE_VERIFY_CMD": None, "DIVERGE_DATA_DIR": None}
ENV = dict(BASE_ENV, DIVERGE_ANTHROPIC_API_KEY=KEY)


def claude_tools(top):
    """TOP/tools, a folder of agent tools whose bin/claude is the pinned CLI's native binary
    (what its postinstall links over the bin/claude.exe stub): a hard link into the npm
    cache, a copy across filesystems. Outside the cache: the sandbox user must be able to
    reach every folder on its path (~ of root is not searchable)."""
    pkg, version = npm_pin.CLAUDE_CODE
    nm = npm_pin.install(pkg, version)
    native = os.path.join(nm, "@anthropic-ai", "claude-code-linux-x64", "claude")
    assert os.access(native, os.X_OK), "the pinned CLI has no linux-x64 binary: " + native
    tools = os.path.join(top, "tools")
    dest = os.path.join(tools, "bin", "claude")
    os.makedirs(os.path.dirname(dest), mode=0o755)
    try:
        os.link(native, dest)
    except OSError:
        shutil.copy2(native, dest)
    return tools


def sanitized(path):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return False
    return b"__asan_init" in data or b"__tsan_init" in data


def runner_path():
    """The runner the server starts: its own build's, unless that is an ASan/TSan build
    (their runtimes need ptrace/personality, which the sandbox's seccomp filter denies):
    then the normal build's next to the sources (a sanitized server still runs), else
    None."""
    own = os.path.join(BUILD_DIR, "diverge-agent-runner")
    if not sanitized(own):
        return own
    plain = os.path.join(SOURCE_DIR, "build", "diverge-agent-runner")
    return plain if os.access(plain, os.X_OK) and not sanitized(plain) else None


def example_yaml(budget=None):
    """The shipped example, with the demo repository's test as its verify command (the
    one line every repository adapts) and, when given, another budget."""
    with open(EXAMPLE) as f:
        text = f.read()
    text, n = re.subn(r"verifyCommand: make test .*\n", "verifyCommand: sh test.sh\n", text)
    assert n == 1, text
    if budget is not None:
        text, n = re.subn(r'budgetUSD: "[0-9.]+"', 'budgetUSD: "%s"' % budget, text)
        assert n == 1, text
    return text


def make_repo(top, name, agent_yaml):
    """TOP/NAME.git: main holds examples/demo-repo with AGENT_YAML; branch `fix` = main."""
    src = os.path.join(top, name + "-src")
    shutil.copytree(DEMO_REPO, src)
    with open(os.path.join(src, ".diverge", "agent.yaml"), "w") as f:
        f.write(agent_yaml)
    git("init", "-q", "-b", "main", cwd=src)
    git("add", "-A", cwd=src)
    git("commit", "-q", "-m", "demo", cwd=src)
    bare = os.path.join(top, name + ".git")
    git("init", "-q", "--bare", "-b", "main", bare)
    git("push", "-q", bare, "main", "main:fix", cwd=src)
    return bare


def usd(micros):
    return Decimal(micros) / Decimal(1000000)


def cost_micros(u):
    return int(sum(Decimal(u[k]) * PRICE[k] for k in PRICE).to_integral_value(ROUND_CEILING))


def task(srv, ns, name):
    st, _, body = srv.request("GET", API + "/namespaces/%s/agenttasks/%s" % (ns, name))
    return body if st == 200 else None


def wait(fn, timeout=90, what="condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError("timed out waiting for " + what)


def wait_phase(srv, ns, name, phases, timeout=90):
    def done():
        t = task(srv, ns, name)
        return t if t and t["status"].get("phase") in phases else None
    try:
        return wait(done, timeout, "%s/%s in %s" % (ns, name, phases))
    except AssertionError:
        raise AssertionError("%s never reached %s: %s\n%s" % (
            name, phases, task(srv, ns, name), log_of(srv, ns, name)))


def log_of(srv, ns, name):
    try:
        with open(os.path.join(srv.data_dir, "logs", ns, name + ".log"), errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def comment(srv, ref, text):
    r = srv.cli("local", "comment", ref, text, "--as", "alice")
    assert r.returncode == 0, r


def cli_results(log):
    """The JSON results the CLI printed (--output-format json), in order."""
    out = []
    for line in log.splitlines():
        i = line.find("[sandbox] {")
        if i >= 0:
            try:
                obj = json.loads(line[i + len("[sandbox] "):])
            except ValueError:
                continue
            if isinstance(obj, dict) and obj.get("type") == "result":
                out.append(obj)
    return out


def sums(usages):
    return {k: sum(u[k] for u in usages) for k in ("input", "output", "cache_write", "cache_read")}


def token_of(srv, ns, name):
    st, _, tok = srv.request("GET", API + "/namespaces/%s/agenttasks/%s/token" % (ns, name))
    return tok.strip() if st == 200 else None


def files_holding(top, needle):
    hits = []
    for d, _, files in os.walk(top):
        for f in files:
            p = os.path.join(d, f)
            try:
                with open(p, "rb") as fh:
                    if needle.encode() in fh.read():
                        hits.append(p)
            except OSError:
                pass
    return hits


def check_probe(fake, calls):
    """The agent's own Bash tool: every sandbox process's environment has the relay's
    placeholder and no key; no file the agent can see holds the key."""
    probes = [result_text(b) for c in calls for b in tool_results(c["body"])
              if b.get("tool_use_id") == "toolu_probe"]
    assert probes, [c["body"]["messages"] for c in calls]
    out = probes[0]
    assert "== probe done" in out and "== /proc/" in out, out
    assert "ANTHROPIC_API_KEY=diverge-sandbox" in out, out
    assert "ANTHROPIC_BASE_URL=http://127.0.0.1:3129/api/v1/llm/anthropic" in out, out
    assert KEY not in out and "DIVERGE_ANTHROPIC_API_KEY" not in out, out
    files = out.split("== files holding the key:")[1].split("== probe done")[0].strip()
    assert files == "", files


def check_upstream_saw_the_key(fake, tokens):
    assert fake.calls
    for c in fake.calls:
        assert c["headers"].get("x-api-key") == KEY, c["headers"]
        assert "authorization" not in c["headers"], c["headers"]
        text = json.dumps(c)
        for t in tokens:
            assert t not in text
        assert "diverge-sandbox" not in json.dumps(c["headers"])


def scenario_fix(srv, fake, top):
    bare = make_repo(top, "greet", example_yaml())
    r = srv.cli("local", "pr", "open", "acme/greet#1", "--repo", "file://" + bare,
                "--head", "fix")
    assert r.returncode == 0, r
    comment(srv, "acme/greet#1", "/diverge fix the typo in greeting.txt")
    ns, name = "acme-greet", "fix-pr-1"
    wait(lambda: (task(srv, ns, name) or {}).get("status", {}).get("phase") == "Active",
         what="task Active")
    tok = token_of(srv, ns, name)
    t = wait_phase(srv, ns, name, ("Completed", "Failed"))
    log = log_of(srv, ns, name)
    assert t["status"]["phase"] == "Completed", (t["status"], log)
    # The example's command ran: the CLI, through the relay, to the fake.
    assert t["spec"]["runner"]["verifyCommand"] == "sh test.sh", t["spec"]
    assert "claude -p" in t["spec"]["runner"]["command"], t["spec"]
    assert "iteration 1/3: agent exit 0, verify exit 0" in log, log
    calls = list(fake.calls)
    assert len(calls) == 4, [c["body"].get("messages") for c in calls]
    for c in calls:
        assert c["path"] == "/v1/messages?beta=true", c["path"]
        assert c["body"]["model"] == "claude-sonnet-4-5" and c["body"]["stream"] is True
        assert "Reviewer guidance from the pull request" not in json.dumps(c["body"]["system"])
    # The fix is on the PR's head branch.
    assert git("--git-dir", bare, "show", "fix:greeting.txt") == "Hello, world!\n"
    subject = git("--git-dir", bare, "log", "-1", "--format=%s", "fix").strip()
    assert subject == "fix(fix-pr-1): the typo in greeting.txt", subject
    # Spend: the fake's usage x the price table, per call rounded up, exactly.
    want = sum(cost_micros(c["usage"]) for c in calls)
    got = sums([c["usage"] for c in calls])
    assert Decimal(t["status"]["costUSD"]) == usd(want), (t["status"], want)
    assert t["status"]["tokensConsumed"] == sum(got.values()), t["status"]
    for c in calls:
        u = c["usage"]
        line = ("llm anthropic claude-sonnet-4-5 input=%d output=%d cache_write=%d "
                "cache_read=%d usd=" % (u["input"], u["output"], u["cache_write"], u["cache_read"]))
        assert line in log, log
    # ... and the CLI's own report says the same token sums.
    res = cli_results(log)
    assert len(res) == 1, log
    cu = res[0]["usage"]
    assert (cu["input_tokens"], cu["output_tokens"], cu["cache_creation_input_tokens"],
            cu["cache_read_input_tokens"]) == (got["input"], got["output"], got["cache_write"],
                                               got["cache_read"]), (cu, got)
    assert res[0]["is_error"] is False and res[0]["num_turns"] == 4, res[0]
    # No key in the sandbox, its files, the log, the task, or anything the CLI got.
    check_probe(fake, calls)
    check_upstream_saw_the_key(fake, [tok])
    assert KEY not in log and tok not in log
    assert KEY not in json.dumps(t)
    for where in ("workspaces", "state"):
        d = os.path.join(srv.data_dir, where)
        if os.path.isdir(d):
            assert files_holding(d, KEY) == [], where
    # HOME (the state dir) holds what the CLI wrote, and no key.
    homes = [d for d, _, f in os.walk(srv.data_dir) if ".claude.json" in f]
    assert homes, "the CLI wrote no ~/.claude.json under the data dir"
    for h in homes:
        assert files_holding(h, KEY) == [] and files_holding(h, tok) == [], h
    return calls


def scenario_budget_guide_resume(srv, fake, top, first_size):
    """A budget that pays for the first call only: with the fake's output at the lowered
    max_tokens, what remains is less than the second call's input bound."""
    # The first call's input bound (its bytes at the dearest input price) plus 3000 output
    # tokens, in whole cents: the second call, longer by the probe's output, cannot fit.
    bound = first_size * PRICE["cache_write"] + 3000 * PRICE["output"]
    budget = (bound / Decimal(10000)).to_integral_value(ROUND_CEILING) / Decimal(100)
    bare = make_repo(top, "poor", example_yaml(budget="%.2f" % budget))
    r = srv.cli("local", "pr", "open", "acme/poor#2", "--repo", "file://" + bare,
                "--head", "fix")
    assert r.returncode == 0, r
    ns, name = "acme-poor", "fix-pr-2"
    before = len(fake.calls)
    fake.exhaust_output = True
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
    # One call reached the upstream; the second was refused by the gateway with 402, and
    # the CLI stopped at once (no retry) and said so.
    first = fake.calls[before:]
    assert len(first) == 1, [c["body"]["messages"] for c in first]
    assert first[0]["body"]["max_tokens"] < 32000, first[0]["body"]["max_tokens"]
    assert "refused: budget exceeded, task paused" in log, log
    res = cli_results(log)
    assert len(res) == 1 and res[0]["is_error"] is True, (res, log)
    assert res[0]["api_error_status"] == 402, res[0]
    assert re.search(r"agent exit [1-9]", log), log
    spent = Decimal(t["status"]["costUSD"])
    assert spent == usd(cost_micros(first[0]["usage"])), (t["status"], first[0]["usage"])
    assert spent <= budget, (spent, budget)
    # Guidance while paused, then more budget: the next request carries the guidance in
    # its system prompt, and the task completes.
    fake.exhaust_output = False
    comment(srv, "acme/poor#2", "/diverge guide keep the exclamation mark")
    wait(lambda: (task(srv, ns, name) or {}).get("metadata", {}).get("annotations", {})
         .get("divergedev.com/guidance") == "keep the exclamation mark", what="guidance")
    comment(srv, "acme/poor#2", "/diverge resume +$1")
    t = wait_phase(srv, ns, name, ("Completed", "Failed"))
    log = log_of(srv, ns, name)
    assert t["status"]["phase"] == "Completed", (t["status"], log)
    assert git("--git-dir", bare, "show", "fix:greeting.txt") == "Hello, world!\n"
    after = fake.calls[before + 1:]
    assert len(after) == 4, [c["body"]["messages"] for c in after]
    guidance = "Reviewer guidance from the pull request: keep the exclamation mark"
    assert guidance not in json.dumps(first[0]["body"])
    for c in after:
        system = c["body"]["system"]
        texts = [system] if isinstance(system, str) else [b.get("text") for b in system]
        assert guidance in texts, system
    calls = first + after
    assert Decimal(t["status"]["costUSD"]) == usd(sum(cost_micros(c["usage"]) for c in calls))
    assert Decimal(t["status"]["costUSD"]) <= budget + 1
    tok2 = token_of(srv, ns, name) or tok1
    check_upstream_saw_the_key(fake, [tok1, tok2])
    assert KEY not in log and tok1 not in log


def why_skip():
    """(why the agent tests cannot run here or None, the runner to use)."""
    why, runner = usable(), runner_path()
    if why is None and runner is None:
        why = "the runner is a sanitized build, which cannot run under the sandbox's seccomp " \
              "filter, and there is no plain build/diverge-agent-runner to use instead"
    return why, runner


def agent_server(top, tools, prices, provider, upstream, runner, env):
    """`diverge serve` with the local sandbox, TOOLS, PROVIDER's upstream at UPSTREAM, the
    price table PRICES (written to TOP) and ENV (the server key among it)."""
    path = os.path.join(top, "prices.yaml")
    with open(path, "w") as f:
        f.write(prices)
    return Server(["--sandbox-provider", "local", "--sandbox-tools", tools, "--llm-upstream",
                   provider + "=" + upstream, "--llm-prices", path, "--agent-cmd", "exit 9",
                   "--verify-cmd", "exit 9", "--notifier-min-interval", "1"],
                  env=dict(env, DIVERGE_RUNNER_PATH=runner))


def test_claude_code_in_the_local_sandbox():
    why, runner = why_skip()
    if why:
        print("SKIP: " + why)
        return
    top = tempfile.mkdtemp(prefix="diverge-claude-")
    os.chmod(top, 0o755)
    tools = claude_tools(top)
    fake = FakeAgentLLM(workdir="/workspace", needle=KEY).start()
    srv = agent_server(top, tools, PRICES, "anthropic", fake.url, runner, ENV)
    try:
        with srv:
            calls = scenario_fix(srv, fake, top)
            scenario_budget_guide_resume(srv, fake, top, calls[0]["size"])
            assert KEY not in srv.stderr() and KEY not in "\n".join(srv.lines)
    finally:
        fake.stop()
        shutil.rmtree(top, ignore_errors=True)


if __name__ == "__main__":
    run_tests([test_claude_code_in_the_local_sandbox])
