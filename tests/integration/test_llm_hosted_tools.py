# SPDX-License-Identifier: Apache-2.0
"""Tools the provider runs itself (web search, URL fetch, code execution, remote MCP
servers, file search, image generation) are taken out of a metered gateway request before
it is forwarded: their cost is billed as input the request does not hold (the call's
reservation could not cover it) and they reach the network outside the sandbox's egress
policy. The agent's own tools (functions, custom tools, client-run shell/editor tools,
Gemini functionDeclarations) and every other field reach the upstream unchanged, the call
is charged as usual, and the task log names what was removed. Against the real `diverge
serve` and the scripted fake upstream (tests/fakes/fake_llm.py), all three providers."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import run_tests  # noqa: E402
from llm_helpers import LLMGateway, wait_charges  # noqa: E402
from test_llm_gateway import post, read_log, start_task, task  # noqa: E402

KEYS = {"DIVERGE_OPENAI_API_KEY": "sk-proj-server-key-hosted-1",
        "DIVERGE_GEMINI_API_KEY": "AIza-server-key-hosted-2"}
MSG = "/api/v1/llm/anthropic/v1/messages"
RESP = "/api/v1/llm/openai/v1/responses"
CHAT = "/api/v1/llm/openai/v1/chat/completions"
GEN = "/api/v1/llm/gemini/v1beta/models/gemini-2.5-flash:generateContent"
FUNC_OPENAI = {"type": "function", "name": "exec_command",
               "parameters": {"type": "object", "properties": {}}}


class Gateway(LLMGateway):
    """One server, the three providers' upstreams all pointed at one fake."""

    def __init__(self):
        super().__init__("anthropic", "sk-ant-server-key-hosted-0", env=KEYS)
        url = self.fake.url
        self.srv.args = ["--sandbox-provider", "none"] + [
            a for p in ("anthropic", "openai", "gemini") for a in ("--llm-upstream", p + "=" + url)]


def removed_lines(srv, name):
    return [ln for ln in read_log(srv, name).splitlines() if "provider-run tools removed" in ln]


def test_anthropic_server_tools_and_mcp_servers_removed():
    with Gateway() as gw:
        srv, fake = gw.srv, gw.fake
        tok = start_task(srv, "hosted-a", budgetUSD="5.00")
        own = [{"name": "Bash", "input_schema": {"type": "object"}},
               {"type": "custom", "name": "Edit", "input_schema": {"type": "object"}},
               {"type": "bash_20250124", "name": "bash"},
               {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"}]
        hosted = [{"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
                  {"type": "web_fetch_20250910", "name": "web_fetch"},
                  {"type": "code_execution_20250825", "name": "code_execution"}]
        body = {"model": "claude-sonnet-4-5-20250929", "max_tokens": 100,
                "messages": [{"role": "user", "content": "look it up"}],
                "tools": own[:2] + hosted + own[2:],
                "mcp_servers": [{"type": "url", "url": "https://mcp.example.invalid/sse",
                                 "name": "x"}]}
        st, _, data = post(srv, MSG, body, {"x-api-key": tok})
        assert st == 200, data
        sent = fake.requests[-1]["body"]
        assert sent["tools"] == own, sent["tools"]  # order and content of the rest kept
        assert "mcp_servers" not in sent, sent
        assert sent["messages"] == body["messages"]
        wait_charges(srv, "hosted-a", 1)
        assert float(task(srv, "hosted-a")["status"]["costUSD"]) > 0
        (line,) = removed_lines(srv, "hosted-a")
        assert "(web_search_20250305,web_fetch_20250910,code_execution_20250825,mcp_servers)" \
            in line, line
        # A request with only the agent's own tools goes out byte for byte as sent.
        raw = json.dumps({"model": "claude-sonnet-4-5-20250929", "max_tokens": 100,
                          "messages": [{"role": "user", "content": "hi"}], "tools": own},
                         indent=1).encode()
        st, _, data = post(srv, MSG, raw, {"x-api-key": tok})
        assert st == 200, data
        assert fake.requests[-1]["raw_len"] == len(raw)  # not re-encoded
        assert len(removed_lines(srv, "hosted-a")) == 1


def test_openai_hosted_tools_removed_from_responses_and_chat():
    with Gateway() as gw:
        srv, fake = gw.srv, gw.fake
        tok = start_task(srv, "hosted-o", budgetUSD="5.00")
        auth = {"Authorization": "Bearer " + tok}
        own = [FUNC_OPENAI, {"type": "custom", "name": "apply_patch"},
               {"type": "local_shell"}, {"type": "tool_search"}]
        hosted = [{"type": "web_search"}, {"type": "web_search_preview_2025_03_11"},
                  {"type": "file_search", "vector_store_ids": ["vs_1"]},
                  {"type": "code_interpreter", "container": {"type": "auto"}},
                  {"type": "image_generation"},
                  {"type": "mcp", "server_label": "x", "server_url": "https://x.invalid"}]
        st, _, data = post(srv, RESP, {"model": "gpt-4.1-2025-04-14", "input": "hi",
                                       "tools": hosted[:3] + own + hosted[3:]}, auth)
        assert st == 200, data
        assert fake.requests[-1]["body"]["tools"] == own, fake.requests[-1]["body"]
        st, _, data = post(srv, CHAT, {"model": "gpt-4.1-2025-04-14",
                                       "messages": [{"role": "user", "content": "hi"}],
                                       "tools": [{"type": "function",
                                                  "function": {"name": "f"}}],
                                       "web_search_options": {}}, auth)
        assert st == 200, data
        sent = fake.requests[-1]["body"]
        assert "web_search_options" not in sent and sent["tools"][0]["function"]["name"] == "f"
        lines = removed_lines(srv, "hosted-o")
        assert len(lines) == 2, lines
        assert "(web_search,web_search_preview_2025_03_11,file_search,code_interpreter," \
            "image_generation,mcp)" in lines[0], lines[0]
        assert "(web_search_options)" in lines[1], lines[1]


def test_gemini_hosted_tools_removed():
    with Gateway() as gw:
        srv, fake = gw.srv, gw.fake
        tok = start_task(srv, "hosted-g", budgetUSD="5.00")
        decl = {"functionDeclarations": [{"name": "run_shell_command"}]}
        tools = [decl, {"googleSearch": {}}, {"urlContext": {}, "codeExecution": {}},
                 {"google_search_retrieval": {}, "function_declarations": [{"name": "g"}]}]
        body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}], "tools": tools}
        st, _, data = post(srv, GEN, body, {"x-goog-api-key": tok})
        assert st == 200, data
        sent = fake.requests[-1]["body"]
        assert sent["tools"] == [decl, {"function_declarations": [{"name": "g"}]}], sent
        (line,) = removed_lines(srv, "hosted-g")
        assert "(googleSearch,urlContext,codeExecution,google_search_retrieval)" in line, line
        # The agent's function declarations alone: no line, nothing changed.
        st, _, data = post(srv, GEN, {"contents": body["contents"], "tools": [decl]},
                           {"x-goog-api-key": tok})
        assert st == 200 and fake.requests[-1]["body"]["tools"] == [decl]
        assert len(removed_lines(srv, "hosted-g")) == 1


if __name__ == "__main__":
    run_tests([test_anthropic_server_tools_and_mcp_servers_removed,
               test_openai_hosted_tools_removed_from_responses_and_chat,
               test_gemini_hosted_tools_removed])
