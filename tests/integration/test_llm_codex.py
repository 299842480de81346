# SPDX-License-Identifier: Apache-2.0
"""The real Codex CLI (`@openai/codex`, pinned in npm_pin.py) through the gateway's
Responses route (SPEC §13) against the scripted fake upstream, outside the sandbox: one
tool call (exec_command) fixes a file, the task's spend is the fake's usage times the
price table exactly and equals Codex's own reported usage, and a spent budget's 429
insufficient_quota stops Codex at once (no retry). Codex's provider is configured with -c
(it ignores OPENAI_BASE_URL); every other connection it might try goes to a dead loopback
proxy."""
import json
import os
import subprocess
import sys
from decimal import Decimal, ROUND_CEILING

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "fakes"))

import npm_pin  # noqa: E402
from harness import run_tests, scratch_dir  # noqa: E402
from llm_helpers import wait_charges  # noqa: E402
from test_llm_gateway import read_log, start_task, task, usd, wait_phase  # noqa: E402
from test_llm_openai import Gateway  # noqa: E402

MODEL = "gpt-fake-1"  # unknown to Codex: it offers exec_command
PRICES = ('version: "1"\nmodels:\n  - match: "gpt-fake-*"\n    inputPerMTok: "2.00"\n'
          '    outputPerMTok: "8.00"\n    cacheWritePerMTok: "2.00"\n'
          '    cacheReadPerMTok: "0.50"\n    maxOutputTokens: 1000\n')
PRICE = {"input": Decimal("2.00"), "output": Decimal("8.00"), "cache_read": Decimal("0.50")}
FIX = ("exec_command", {"cmd": "sed -i s/Helo/Hello/ greeting.txt"})


def cost(u):
    return int(sum(Decimal(u[k]) * PRICE[k] for k in PRICE).to_integral_value(ROUND_CEILING))


class Run:
    """A scratch repository with greeting.txt, and a fresh HOME and TMPDIR for Codex."""

    def __init__(self):
        self.codex = os.path.join(npm_pin.install(*npm_pin.CODEX), ".bin", "codex")
        self.dir = scratch_dir("diverge-codex-")
        self.repo = os.path.join(self.dir, "repo")
        self.home = os.path.join(self.dir, "home")
        self.tmp = os.path.join(self.dir, "tmp")
        for d in (self.repo, self.home, self.tmp):
            os.makedirs(d)
        with open(os.path.join(self.repo, "greeting.txt"), "w") as f:
            f.write("Helo, world!\n")
        git = ["git", "-C", self.repo, "-c", "user.name=t", "-c", "user.email=t@example.com"]
        subprocess.run(git + ["init", "-q"], check=True)
        subprocess.run(git + ["add", "."], check=True)
        subprocess.run(git + ["commit", "-qm", "init"], check=True)

    def codex_exec(self, gw_url, tok):
        base = gw_url + "/api/v1/llm/openai/v1"
        provider = ('{name="Diverge",base_url="%s",env_key="DIVERGE_TASK_TOKEN",'
                    'wire_api="responses"}' % base)
        dead = "http://127.0.0.1:9"  # nothing listens: stray traffic fails on loopback
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": self.home,
               "TMPDIR": self.tmp, "TERM": "dumb", "LANG": "C.UTF-8",
               "DIVERGE_TASK_TOKEN": tok, "HTTPS_PROXY": dead, "HTTP_PROXY": dead,
               "https_proxy": dead, "http_proxy": dead, "NO_PROXY": "127.0.0.1,localhost",
               "no_proxy": "127.0.0.1,localhost"}
        cmd = ["timeout", "120", self.codex, "exec", "--json", "-m", MODEL,
               "--dangerously-bypass-approvals-and-sandbox", "-c", "model_provider=diverge",
               "-c", "model_providers.diverge=" + provider, "--disable", "plugins",
               "-c", "analytics.enabled=false", "fix the typo in greeting.txt"]
        r = subprocess.run(cmd, cwd=self.repo, env=env, stdin=subprocess.DEVNULL,
                           capture_output=True, text=True, timeout=150)
        events = []
        for line in r.stdout.splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                pass
        return r, events

    def greeting(self):
        with open(os.path.join(self.repo, "greeting.txt")) as f:
            return f.read()


def gateway():
    d = scratch_dir("diverge-prices-")
    path = os.path.join(d, "prices.yaml")
    with open(path, "w") as f:
        f.write(PRICES)
    return Gateway(extra_args=["--llm-prices", path])


def test_codex_fixes_the_file_with_exact_spend():
    run = Run()
    with gateway() as gw:
        srv, fake = gw.srv, gw.fake
        fake.agent_calls = [FIX]
        fake.usage = {"input": 1200, "output": 80, "cache_write": 0, "cache_read": 300}
        tok = start_task(srv, "codex", budgetUSD="5.00")
        r, events = run.codex_exec(srv.url, tok)
        assert r.returncode == 0, (r.returncode, r.stdout[-3000:], r.stderr[-3000:])
        assert run.greeting() == "Hello, world!\n", run.greeting()
        assert len(fake.requests) == 2, [q["path"] for q in fake.requests]
        for q in fake.requests:
            assert q["path"] == "/v1/responses" and q["body"]["stream"] is True
            assert q["headers"]["authorization"].startswith("Bearer sk-proj-server-key")
            assert tok not in json.dumps(q)
        outs = [i for i in fake.requests[1]["body"]["input"]
                if isinstance(i, dict) and i.get("type") == "function_call_output"]
        assert len(outs) == 1, fake.requests[1]["body"]["input"]
        wait_charges(srv, "codex", 2)  # the last call's charge follows its answer
        t = task(srv, "codex")["status"]
        assert Decimal(t["costUSD"]) == usd(2 * cost(fake.usage)), t
        assert t["tokensConsumed"] == 2 * 1580, t
        # Codex's own report of the turn equals what the gateway charged.
        done = [e for e in events if e.get("type") == "turn.completed"]
        assert len(done) == 1, events
        u = done[0]["usage"]
        assert u["input_tokens"] == 2 * 1500 and u["cached_input_tokens"] == 2 * 300 and \
            u["output_tokens"] == 2 * 80, u
        log = read_log(srv, "codex")
        assert log.count("llm openai %s input=1200 output=80 cache_write=0 cache_read=300"
                         % MODEL) == 2, log


def test_codex_stops_at_once_on_insufficient_quota():
    run = Run()
    with gateway() as gw:
        srv, fake = gw.srv, gw.fake
        fake.agent_calls = [FIX]
        # The first call (the tool call, a body of about 41 kB: its reservation of about
        # $0.09 fits in $0.10) spends $0.0604: what remains cannot pay for the next call's
        # input (its body is larger), so it is refused with 429 insufficient_quota. (A
        # call's charge is capped at its reservation: the usage must fit its body.)
        fake.usage = {"input": 30000, "output": 50, "cache_write": 0, "cache_read": 0}
        spent = cost(fake.usage)
        assert spent == 60400
        tok = start_task(srv, "broke", budgetUSD="0.10")
        r, events = run.codex_exec(srv.url, tok)
        assert r.returncode == 1, (r.returncode, r.stdout[-3000:], r.stderr[-3000:])
        assert run.greeting() == "Hello, world!\n"  # the tool call ran before the refusal
        assert len(fake.requests) == 1, fake.requests
        assert any(e.get("type") == "turn.failed" for e in events), events
        assert "Quota exceeded" in r.stdout + r.stderr, (r.stdout[-2000:], r.stderr[-2000:])
        t = wait_phase(srv, "broke", "Paused")
        assert t["status"]["reason"] == "BudgetExceeded", t["status"]
        assert Decimal(t["status"]["costUSD"]) == usd(spent) <= Decimal("0.10")
        log = read_log(srv, "broke")
        # Refused once, and never asked again (a retry would meet the revoked token).
        assert log.count("refused: budget exceeded, task paused") == 1, log
        # The route saw two calls: the tool call (200) and the refused one (429); no retry.
        st, _, metrics = srv.request("GET", "/metrics")
        seen = {}
        for ln in metrics.splitlines():
            if ln.startswith('diverge_http_requests_total{route="llm.openai.responses"'):
                code = ln.split('code="')[1].split('"')[0]
                seen[code] = int(ln.rsplit(" ", 1)[1])
        assert {k: v for k, v in seen.items() if v} == {"200": 1, "429": 1}, seen

if __name__ == "__main__":
    run_tests([test_codex_fixes_the_file_with_exact_spend,
               test_codex_stops_at_once_on_insufficient_quota])
