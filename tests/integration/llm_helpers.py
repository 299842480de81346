# SPDX-License-Identifier: Apache-2.0
"""What the LLM gateway tests share: `diverge serve` with one provider's upstream pointed
at a scripted fake (tests/fakes/fake_llm.py) and that provider's server key, and a task
with its token (sdk_helpers.start_task)."""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fakes"))

from fake_llm import FakeLLM  # noqa: E402
from harness import Server  # noqa: E402
from sdk_helpers import NS, start_task, wait_phase  # noqa: E402,F401

KEY_ENV = {"anthropic": "DIVERGE_ANTHROPIC_API_KEY", "openai": "DIVERGE_OPENAI_API_KEY",
           "gemini": "DIVERGE_GEMINI_API_KEY"}


class LLMGateway:
    """A server whose PROVIDER upstream is a fresh FakeLLM, with KEY as its server key."""

    def __init__(self, provider, key, extra_args=(), env=None):
        self.fake = FakeLLM().start()
        e = {KEY_ENV[provider]: key}
        e.update(env or {})
        self.srv = Server(["--sandbox-provider", "none", "--llm-upstream",
                           provider + "=" + self.fake.url] + list(extra_args), env=e)

    def __enter__(self):
        self.srv.__enter__()
        return self

    def __exit__(self, *exc):
        self.srv.__exit__(*exc)
        self.fake.stop()


def charge_lines(srv, name, ns="default"):
    """The gateway's charge lines in the task log of NAME (each has ' usd=')."""
    try:
        with open(os.path.join(srv.data_dir, "logs", ns, name + ".log")) as f:
            return [ln for ln in f.read().splitlines() if " llm " in ln and " usd=" in ln]
    except FileNotFoundError:
        return []


def wait_charges(srv, name, n, ns="default", timeout=30):
    """Waits until the task log of NAME holds N gateway charge lines. A call's charge commits
    just after its answer ended (the answer waits only for the call's reservation record,
    SPEC §13), and its log line is written once the charge is durable: a test reads the
    task's spend after this. Returns the lines."""
    deadline = time.time() + timeout
    lines = charge_lines(srv, name, ns)
    while len(lines) < n and time.time() < deadline:
        time.sleep(0.02)
        lines = charge_lines(srv, name, ns)
    assert len(lines) >= n, (n, lines)
    return lines


def wait_for(cond, what, timeout=30):
    """Waits until COND() is true (polling), else fails naming WHAT."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError("timed out waiting for " + what)
