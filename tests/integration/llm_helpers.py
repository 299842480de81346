# SPDX-License-Identifier: Apache-2.0
"""What the LLM gateway tests share: `diverge serve` with one provider's upstream pointed
at a scripted fake (tests/fakes/fake_llm.py) and that provider's server key, and a task
with its token (sdk_helpers.start_task)."""
import os
import sys

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
