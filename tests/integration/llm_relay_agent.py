#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The agent of the LLM relay tests (run by diverge-agent-runner as DIVERGE_AGENT_CMD):
calls the runner's relay the way agent CLIs do, with the placeholder keys from its
environment, and reports what came back. `pod`: every provider's key header, Gemini's
?key=, a chunked request body, a streamed answer read event by event, an upstream error,
a path outside /api/v1/llm/ and hostile bytes; the report goes to $LLM_TEST_OUT as JSON.
`socket`: one call through the task's own socket, reported as one `llmprobe` line on
stdout (the task log). `frozen`: one Responses call, then it waits for the file `go` in
the workspace (the test pauses and resumes the task meanwhile: this process is frozen
with the old token and thawed with a new one it never reads), then the same call again;
each reported as one `llmfrozen N STATUS BODY` line; exit 0 when both got 200. Python 3
stdlib only."""
import http.client
import json
import os
import socket
import sys
import time
import urllib.parse

KEYS = ("DIVERGE_LLM_URL", "ANTHROPIC_BASE_URL", "OPENAI_BASE_URL", "GOOGLE_GEMINI_BASE_URL",
        "ANTHROPIC_API_KEY", "OPENAI_API_KEY", "GEMINI_API_KEY")


def conn(url):
    u = urllib.parse.urlsplit(url)
    path = u.path + ("?" + u.query if u.query else "")
    return http.client.HTTPConnection(u.hostname, u.port, timeout=60), path


def call(method, url, headers=None, body=None):
    c, path = conn(url)
    c.request(method, path, body=body, headers=headers or {})
    r = c.getresponse()
    data = r.read()
    c.close()
    return [r.status, data.decode(errors="replace")]


def raw(url, data):
    """Sends DATA as is to URL's host and port; the first line of the answer."""
    u = urllib.parse.urlsplit(url)
    s = socket.create_connection((u.hostname, u.port), timeout=60)
    s.sendall(data)
    got = b""
    while b"\r\n" not in got:
        chunk = s.recv(4096)
        if not chunk:
            break
        got += chunk
    s.close()
    return got.split(b"\r\n", 1)[0].decode(errors="replace")


def stream(url, key):
    """A streamed call with a chunked request body: the first SSE event is read, the fake
    is told (through the relay) that it arrived, and only then does the rest exist."""
    c, path = conn(url)
    body = iter([b'{"model":"gpt-test",', b'"stream":true,', b'"input":"hi"}'])
    c.request("POST", path, body=body, encode_chunked=True,
              headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"})
    r = c.getresponse()
    first = b""
    while not first.endswith(b"\n\n"):
        line = r.readline()
        if not line:
            break
        first += line
    ack = call("GET", os.environ["DIVERGE_LLM_URL"] + "/ack")
    rest = r.read()
    c.close()
    return {"status": r.status, "type": r.getheader("Content-Type"), "first": first.decode(),
            "ack": ack, "rest": rest.decode()}


def pod():
    env = {k: os.environ.get(k) for k in KEYS}
    a, o, g = env["ANTHROPIC_BASE_URL"], env["OPENAI_BASE_URL"], env["GOOGLE_GEMINI_BASE_URL"]
    out = {"env": env}
    out["anthropic"] = call("POST", a + "/v1/messages?beta=true",
                            {"x-api-key": env["ANTHROPIC_API_KEY"],
                             "anthropic-version": "2023-06-01",
                             "Content-Type": "application/json"},
                            b'{"model":"claude-test","max_tokens":5}')
    # The fake rewrote the token file while answering that call: the next ones carry the
    # new token although this process still holds the placeholder.
    out["openai"] = call("POST", o + "/responses",
                         {"Authorization": "Bearer " + env["OPENAI_API_KEY"],
                          "Content-Type": "application/json"}, b'{"model":"gpt-test"}')
    out["gemini"] = call("POST", g + "/v1beta/models/gemini-test:generateContent?key=" +
                         env["GEMINI_API_KEY"], {"x-goog-api-key": env["GEMINI_API_KEY"],
                                                 "Content-Type": "application/json"}, b"{}")
    out["stream"] = stream(o + "/responses", env["OPENAI_API_KEY"])
    out["overloaded"] = call("POST", a + "/v1/messages",
                             {"x-api-key": env["ANTHROPIC_API_KEY"],
                              "Content-Type": "application/json"},
                             b'{"model":"overloaded","max_tokens":5}')
    base = env["DIVERGE_LLM_URL"][:-len("/api/v1/llm")]
    out["meter"] = call("POST", base + "/api/v1/agenttask/meter",
                        {"Authorization": "Bearer " + env["OPENAI_API_KEY"],
                         "Content-Type": "application/json"}, b'{"requestId":"agent-smuggle"}')
    out["garbage"] = raw(base, b"GARBAGE\r\n\r\n")
    out["huge"] = raw(base, b"GET /api/v1/llm/x HTTP/1.1\r\n" + b"X: " + b"a" * 70000 + b"\r\n\r\n")
    out["dotdot"] = raw(base, b"GET /api/v1/llm/../agenttask/meter HTTP/1.1\r\n\r\n")
    out["after"] = call("POST", g + "/v1beta/models/gemini-test:generateContent",
                        {"x-goog-api-key": env["GEMINI_API_KEY"]}, b"{}")
    with open(os.environ["LLM_TEST_OUT"], "w") as f:
        json.dump(out, f)


def sock():
    env = {k: os.environ.get(k) for k in KEYS}
    base = env["DIVERGE_LLM_URL"][:-len("/api/v1/llm")]
    out = {"env": env,
           "anthropic": call("POST", env["ANTHROPIC_BASE_URL"] + "/v1/messages?beta=true",
                             {"x-api-key": env["ANTHROPIC_API_KEY"],
                              "Content-Type": "application/json"},
                             b'{"model":"claude-test","max_tokens":5}'),
           "meter": call("POST", base + "/api/v1/agenttask/meter",
                         {"Authorization": "Bearer x"}, b"{}")}
    print("llmprobe " + json.dumps(out), flush=True)


def frozen():
    url = os.environ["OPENAI_BASE_URL"] + "/responses"
    headers = {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
               "Content-Type": "application/json"}
    # At least as many bytes as the fake reports input tokens (100): a call's charge is
    # capped at its reservation, whose input bound is the body's byte count.
    body = (b'{"model":"gpt-relay-1","input":"say hello to the reviewer of this pull request'
            b' in one short line","max_output_tokens":50}')
    assert len(body) >= 100
    got = [call("POST", url, headers, body)]
    print("llmfrozen 1 %d %s" % (got[0][0], got[0][1]), flush=True)
    go = os.path.join(os.environ["DIVERGE_WORKSPACE_DIR"], "go")
    while not os.path.exists(go):
        time.sleep(0.05)
    os.remove(go)
    got.append(call("POST", url, headers, body))
    print("llmfrozen 2 %d %s" % (got[1][0], got[1][1]), flush=True)
    sys.exit(0 if all(g[0] == 200 for g in got) else 1)


if __name__ == "__main__":
    {"pod": pod, "socket": sock, "frozen": frozen}[sys.argv[1]]()
