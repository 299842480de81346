# SPDX-License-Identifier: Apache-2.0
"""A scripted fake Anthropic Messages upstream that plays the model of a coding agent
(Claude Code) fixing the demo repository (Python 3 stdlib only, loopback only).

POST /v1/messages (streamed or not; ?beta=true accepted). The answer depends only on how
many tool results the conversation already holds, so a fresh CLI process starts over:

    0 tool results  -> tool_use Bash: print every environment of the sandbox's processes
                       and list the files under the workspace, HOME and /tmp that hold
                       `needle` (the test's secret, written split so the command itself
                       never holds it)
    1               -> tool_use Read greeting.txt (Edit refuses a file not read first)
    2               -> tool_use Edit greeting.txt: `old` -> `new`
    3 or more       -> a final text answer

Each answer's usage is `usage` (input, output, cache_write, cache_read); with
`exhaust_output` the output is the request's max_tokens (a model that used all it was
allowed). Every request (its body and byte size) and the usage answered are recorded in
`calls`.

    fake = FakeAgentLLM(workdir="/workspace", needle="sk-..."); fake.start(); fake.url
"""
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def tool_results(body):
    """The tool_result blocks of BODY's messages, in order."""
    out = []
    for m in body.get("messages") or []:
        if m.get("role") == "user" and isinstance(m.get("content"), list):
            out += [b for b in m["content"] if isinstance(b, dict) and b.get("type") == "tool_result"]
    return out


def result_text(block):
    c = block.get("content")
    if isinstance(c, list):
        return "".join(b.get("text", "") for b in c if isinstance(b, dict))
    return c if isinstance(c, str) else ""


class FakeAgentLLM:
    def __init__(self, workdir, needle, old="Hello, wrold!", new="Hello, world!"):
        self.workdir = workdir
        self.needle = needle
        self.old, self.new = old, new
        self.usage = {"input": 1200, "output": 150, "cache_write": 800, "cache_read": 400}
        self.exhaust_output = False
        self.calls = []  # {"path", "headers", "body", "usage"}
        self.lock = threading.Lock()
        self.httpd = None
        self.url = None

    def start(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_HEAD(self):
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_POST(self):
                fake._handle(self)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = "http://127.0.0.1:%d" % self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()
        return self

    def stop(self):
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()

    # --- the script -------------------------------------------------------------------

    def probe_command(self):
        half = len(self.needle) // 2
        pattern = "'%s''%s'" % (self.needle[:half], self.needle[half:])
        return ("for f in /proc/[0-9]*/environ; do echo \"== $f\"; tr '\\0' '\\n' < $f; done; "
                "echo '== files holding the key:'; grep -rlF -- %s %s \"$HOME\" /tmp "
                "2>/dev/null; echo '== probe done'" % (pattern, self.workdir))

    def plan(self, body):
        """(content blocks, stop_reason) for BODY."""
        n = len(tool_results(body))
        path = self.workdir + "/greeting.txt"
        if n == 0:
            return [{"type": "text", "text": "Let me look around first."},
                    {"type": "tool_use", "id": "toolu_probe", "name": "Bash",
                     "input": {"command": self.probe_command(),
                               "description": "Inspect the environment"}}], "tool_use"
        if n == 1:
            return [{"type": "tool_use", "id": "toolu_read", "name": "Read",
                     "input": {"file_path": path}}], "tool_use"
        if n == 2:
            return [{"type": "tool_use", "id": "toolu_edit", "name": "Edit",
                     "input": {"file_path": path, "old_string": self.old,
                               "new_string": self.new}}], "tool_use"
        return [{"type": "text", "text": "Fixed the typo in greeting.txt."}], "end_turn"

    # --- HTTP -------------------------------------------------------------------------

    def _handle(self, h):
        raw = h.rfile.read(int(h.headers.get("Content-Length") or 0))
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if h.path.split("?")[0] != "/v1/messages" or not isinstance(body, dict):
            return self._json(h, 404, {"type": "error", "error": {
                "type": "not_found_error", "message": "fake: no route %s" % h.path}})
        with self.lock:
            u = dict(self.usage)
            if self.exhaust_output:
                u["output"] = int(body.get("max_tokens") or 0)
            self.calls.append({"path": h.path, "usage": u, "body": body, "size": len(raw),
                               "headers": {k.lower(): v for k, v in h.headers.items()}})
        blocks, stop = self.plan(body)
        model = body.get("model", "")
        usage = {"input_tokens": u["input"], "output_tokens": u["output"],
                 "cache_creation_input_tokens": u["cache_write"],
                 "cache_read_input_tokens": u["cache_read"]}
        if not body.get("stream"):
            return self._json(h, 200, {"id": "msg_fake", "type": "message", "role": "assistant",
                                       "model": model, "content": blocks, "stop_reason": stop,
                                       "stop_sequence": None, "usage": usage})
        self._sse(h, self._events(model, blocks, stop, usage))

    def _events(self, model, blocks, stop, usage):
        start_usage = dict(usage, output_tokens=1)
        ev = [("message_start", {"type": "message_start", "message": {
            "id": "msg_fake", "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": None, "stop_sequence": None, "usage": start_usage}})]
        for i, b in enumerate(blocks):
            if b["type"] == "text":
                ev.append(("content_block_start", {"type": "content_block_start", "index": i,
                                                   "content_block": {"type": "text", "text": ""}}))
                delta = {"type": "text_delta", "text": b["text"]}
            else:
                ev.append(("content_block_start", {"type": "content_block_start", "index": i,
                                                   "content_block": dict(b, input={})}))
                delta = {"type": "input_json_delta", "partial_json": json.dumps(b["input"])}
            ev.append(("content_block_delta", {"type": "content_block_delta", "index": i,
                                               "delta": delta}))
            ev.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
        # As the live API: message_delta repeats the input side; its output is final.
        ev.append(("message_delta", {"type": "message_delta",
                                     "delta": {"stop_reason": stop, "stop_sequence": None},
                                     "usage": usage}))
        ev.append(("message_stop", {"type": "message_stop"}))
        return ev

    def _json(self, h, status, obj):
        data = json.dumps(obj).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def _sse(self, h, events):
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Cache-Control", "no-cache")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        for name, data in events:
            chunk = ("event: %s\ndata: %s\n\n" % (name, json.dumps(data))).encode()
            h.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            h.wfile.flush()
        h.wfile.write(b"0\r\n\r\n")
        h.wfile.flush()
