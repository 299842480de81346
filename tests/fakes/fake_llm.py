# SPDX-License-Identifier: Apache-2.0
"""A scripted fake LLM upstream on loopback for the gateway tests (Python 3 stdlib only).

Answers the provider shapes the gateway forwards (SPEC §13):

    POST /v1/messages, /v1/messages/count_tokens        Anthropic (JSON or SSE)
    POST /v1/responses, /v1/chat/completions            OpenAI (JSON or SSE)
    POST /v1beta/models/{model}:generateContent          Gemini
    POST /v1beta/models/{model}:streamGenerateContent    Gemini (SSE with alt=sse)

with the usage configured in `usage` (input, output, cache_write, cache_read). Script the
next answers with `script` (a list of dicts, taken in order, then the default):
    {"status": 500|529|429, "body": {...}}   an error, JSON as given
        (optional "headers": {name: value} sent with it, e.g. retry-after)
    {"cut_after": N}                        a stream cut after N events (no usage end)
    {"delay_event": threading.Event}        the answer waits until the event is set
    {"pause_after": N, "resume": threading.Event}   a stream sends N events, sets
        "paused" (a threading.Event, when given), then waits until "resume" is set
Every request is recorded in `requests` (method, path, headers lower-cased, JSON body,
raw_len: the body's byte count)
so tests can assert which key reached the upstream and what the system prompt said.

    fake = FakeLLM(); fake.start(); url = fake.url; ...; fake.stop()
"""
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeLLM:
    def __init__(self):
        self.usage = {"input": 100, "output": 50, "cache_write": 0, "cache_read": 0}
        self.script = []
        # True: answer with input = the body's bytes and output = its max_tokens (the
        # most a call may use), to test that budgets hold.
        self.worst_case = False
        self.requests = []
        self.lock = threading.Lock()
        self.httpd = None
        self.url = None

    def start(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_POST(self):
                fake._handle(self)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = "http://127.0.0.1:%d" % self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def stop(self):
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()

    def next_step(self):
        with self.lock:
            return self.script.pop(0) if self.script else {}

    # --- shapes ---------------------------------------------------------------------

    def _anthropic_body(self, model, u):
        return {"id": "msg_fake", "type": "message", "role": "assistant", "model": model,
                "content": [{"type": "text", "text": "hello"}], "stop_reason": "end_turn",
                "stop_sequence": None,
                "usage": {"input_tokens": u["input"], "output_tokens": u["output"],
                          "cache_creation_input_tokens": u["cache_write"],
                          "cache_read_input_tokens": u["cache_read"]}}

    def _anthropic_events(self, model, u):
        start = {"type": "message_start", "message": {
            "id": "msg_fake", "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": u["input"], "output_tokens": 1,
                      "cache_creation_input_tokens": u["cache_write"],
                      "cache_read_input_tokens": u["cache_read"]}}}
        return [
            ("message_start", start),
            ("content_block_start", {"type": "content_block_start", "index": 0,
                                     "content_block": {"type": "text", "text": ""}}),
            ("ping", {"type": "ping"}),
            ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                     "delta": {"type": "text_delta", "text": "hel"}}),
            ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                     "delta": {"type": "text_delta", "text": "lo"}}),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            ("message_delta", {"type": "message_delta",
                               "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                               "usage": {"output_tokens": u["output"]}}),
            ("message_stop", {"type": "message_stop"}),
        ]

    # --- the handler ------------------------------------------------------------------

    def _handle(self, h):
        n = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(n)
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        with self.lock:
            self.requests.append({"method": "POST", "path": h.path,
                                  "headers": {k.lower(): v for k, v in h.headers.items()},
                                  "body": body, "raw_len": len(raw)})
        step = self.next_step()
        h.fake_step = step  # for _sse's pause_after
        with self.lock:
            u = dict(self.usage)
        if self.worst_case and body is not None:
            u = {"input": len(raw), "output": body.get("max_tokens", 0), "cache_write": 0,
                 "cache_read": 0}
        if step.get("delay_event") is not None:
            step["delay_event"].wait(30)
        if "status" in step:
            return self._json(h, step["status"], step.get("body", {}), step.get("headers"))
        path = h.path.split("?")[0]
        model = (body or {}).get("model", "")
        if path == "/v1/messages/count_tokens":
            return self._json(h, 200, {"input_tokens": 42})
        if path == "/v1/messages":
            if (body or {}).get("stream"):
                return self._sse(h, self._anthropic_events(model, u), step.get("cut_after"))
            return self._json(h, 200, self._anthropic_body(model, u))
        return self._json(h, 404, {"error": "no such path"})

    def _json(self, h, status, obj, headers=None):
        data = json.dumps(obj).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.send_header("request-id", "req_fake")
        for name, value in (headers or {}).items():
            h.send_header(name, value)
        h.end_headers()
        h.wfile.write(data)

    def _sse(self, h, events, cut_after=None):
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Cache-Control", "no-cache")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        step = getattr(h, "fake_step", {})
        for i, (name, data) in enumerate(events):
            if step.get("pause_after") == i:
                if step.get("paused") is not None:
                    step["paused"].set()
                step["resume"].wait(30)
            if cut_after is not None and i >= cut_after:
                h.wfile.flush()
                h.close_connection = True
                # Close abruptly: the stream ends without its usage.
                h.connection.shutdown(2)
                return
            chunk = ("event: %s\ndata: %s\n\n" % (name, json.dumps(data))).encode()
            h.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            h.wfile.flush()
        h.wfile.write(b"0\r\n\r\n")
        h.wfile.flush()
