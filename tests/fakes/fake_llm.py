# SPDX-License-Identifier: Apache-2.0
"""A scripted fake LLM upstream on loopback for the gateway tests (Python 3 stdlib only).

Answers the provider shapes the gateway forwards (SPEC §13):

    POST /v1/messages, /v1/messages/count_tokens        Anthropic (JSON or SSE)
    POST /v1/responses, /v1/chat/completions            OpenAI (JSON or SSE)
    POST /v1beta/models/{model}:generateContent          Gemini
    POST /v1beta/models/{model}:streamGenerateContent    Gemini (SSE with alt=sse)

with the usage configured in `usage` (input, output, cache_write, cache_read; for Gemini
also `thoughts`, reported apart from the candidates). Script the
next answers with `script` (a list of dicts, taken in order, then the default):
    {"status": 500|529|429, "body": {...}}   an error, JSON as given
        (optional "headers": {name: value} sent with it, e.g. retry-after)
    {"cut_after": N}                        a stream cut after N events (no usage end)
    {"delay_event": threading.Event}        the answer waits until the event is set
    {"split": N}                            OpenAI streams: written N bytes at a time
    {"text": "..."}                         OpenAI: the answer's text (default "hello")
    {"pause_after": N, "resume": threading.Event}   a stream sends N events, sets
        "paused" (a threading.Event, when given), then waits until "resume" is set (N the
        number of the stream's events: before its final chunk)
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
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()
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
                                  "body": body, "raw_len": len(raw),
                                  "peer": h.client_address})
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
        if path.startswith("/v1beta/models/"):
            return self._gemini(h, path, body, raw, u, step)
        if path == "/v1/messages/count_tokens":
            return self._json(h, 200, {"input_tokens": 42})
        if path == "/v1/messages":
            if (body or {}).get("stream"):
                return self._sse(h, self._anthropic_events(model, u), step.get("cut_after"))
            return self._json(h, 200, self._anthropic_body(model, u))
        if path in ("/v1/responses", "/v1/chat/completions"):
            return self._openai(h, path, body or {}, raw, u, step)
        return self._json(h, 404, {"error": "no such path"})

    # --- Gemini -----------------------------------------------------------------------

    @staticmethod
    def _gemini_max_output(body):
        cfg = body.get("generationConfig") or body.get("generation_config") or {}
        return cfg.get("maxOutputTokens") or cfg.get("max_output_tokens") or 0

    def _gemini_usage(self, u):
        """usageMetadata for U: the prompt counts the cached tokens; thoughts (the optional
        `thoughts` of `usage`) are apart from the candidates, and a server-side tool's
        prompt tokens (the optional `tool_use`) apart from the prompt."""
        meta = {"promptTokenCount": u["input"] + u["cache_read"],
                "candidatesTokenCount": u["output"],
                "totalTokenCount": u["input"] + u["cache_read"] + u["output"] +
                u.get("thoughts", 0) + u.get("tool_use", 0)}
        if u["cache_read"]:
            meta["cachedContentTokenCount"] = u["cache_read"]
        if u.get("thoughts"):
            meta["thoughtsTokenCount"] = u["thoughts"]
        if u.get("tool_use"):  # a server-side tool's tokens: apart from the prompt's
            meta["toolUsePromptTokenCount"] = u["tool_use"]
        return meta

    def _gemini_chunks(self, model, u):
        """A streamGenerateContent answer as the live API sends it: every chunk carries the
        usage so far (the first only the prompt's), the last one the totals and the
        finishReason."""
        prompt = u["input"] + u["cache_read"]
        partial = {"promptTokenCount": prompt, "totalTokenCount": prompt}

        def chunk(text, meta, finish=None):
            cand = {"content": {"role": "model", "parts": [{"text": text}]}, "index": 0}
            if finish:
                cand["finishReason"] = finish
            return {"candidates": [cand], "usageMetadata": meta, "modelVersion": model,
                    "responseId": "resp_fake"}

        return [chunk("hel", partial), chunk("l", dict(partial)),
                chunk("o", self._gemini_usage(u), "STOP")]

    def _gemini(self, h, path, body, raw, u, step):
        """POST /v1beta/models/{model}:generateContent | :streamGenerateContent?alt=sse."""
        model, _, method = path[len("/v1beta/models/"):].partition(":")
        if self.worst_case and body is not None:
            u = {"input": len(raw), "output": self._gemini_max_output(body), "cache_write": 0,
                 "cache_read": 0}
        if method == "generateContent":
            chunks = self._gemini_chunks(model, u)
            whole = dict(chunks[-1])
            whole["candidates"] = [dict(whole["candidates"][0],
                                        content={"role": "model", "parts": [{"text": "hello"}]})]
            return self._json(h, 200, whole)
        if method == "streamGenerateContent" and "alt=sse" in h.path:
            return self._gemini_sse(h, self._gemini_chunks(model, u), step.get("cut_after"))
        return self._json(h, 404, {"error": {"code": 404, "message": "no such method",
                                             "status": "NOT_FOUND"}})

    def _gemini_sse(self, h, chunks, cut_after=None):
        """Gemini's SSE: data lines only, and the stream just ends (no [DONE])."""
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        for i, data in enumerate(chunks):
            if cut_after is not None and i >= cut_after:
                h.wfile.flush()
                h.close_connection = True
                h.connection.shutdown(2)  # abruptly: the final usage never comes
                return
            chunk = ("data: %s\r\n\r\n" % json.dumps(data)).encode()
            h.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            h.wfile.flush()
        h.wfile.write(b"0\r\n\r\n")
        h.wfile.flush()

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
        if step.get("pause_after") == len(events):
            if step.get("paused") is not None:
                step["paused"].set()
            step["resume"].wait(30)
        h.wfile.write(b"0\r\n\r\n")
        h.wfile.flush()


# --- OpenAI shapes (Responses and Chat Completions) ---------------------------------------
# u["input"] is the uncached input: OpenAI reports input including the cached tokens.

def openai_responses_usage(u):
    return {"input_tokens": u["input"] + u["cache_read"],
            "input_tokens_details": {"cached_tokens": u["cache_read"]},
            "output_tokens": u["output"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": u["input"] + u["cache_read"] + u["output"]}


def openai_chat_usage(u):
    return {"prompt_tokens": u["input"] + u["cache_read"],
            "prompt_tokens_details": {"cached_tokens": u["cache_read"]},
            "completion_tokens": u["output"],
            "completion_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": u["input"] + u["cache_read"] + u["output"]}


def openai_responses_body(model, u, text="hello"):
    return {"id": "resp_fake", "object": "response", "created_at": 0, "status": "completed",
            "model": model, "error": None, "incomplete_details": None,
            "output": [{"type": "message", "id": "msg_fake", "status": "completed",
                        "role": "assistant",
                        "content": [{"type": "output_text", "text": text,
                                     "annotations": []}]}],
            "usage": openai_responses_usage(u)}


def openai_responses_events(model, u, text="hello"):
    """(event name, data) pairs of a streamed Responses answer."""
    done = openai_responses_body(model, u, text)
    base = dict(done, status="in_progress", output=[], usage=None)
    item = {"type": "message", "id": "msg_fake", "status": "in_progress", "role": "assistant",
            "content": []}
    evs = [("response.created", {"response": base}),
           ("response.in_progress", {"response": base}),
           ("response.output_item.added", {"output_index": 0, "item": item}),
           ("response.content_part.added", {"item_id": "msg_fake", "output_index": 0,
                                            "content_index": 0,
                                            "part": {"type": "output_text", "text": "",
                                                     "annotations": []}}),
           ("response.output_text.delta", {"item_id": "msg_fake", "output_index": 0,
                                           "content_index": 0, "delta": text}),
           ("response.output_text.done", {"item_id": "msg_fake", "output_index": 0,
                                          "content_index": 0, "text": text}),
           ("response.output_item.done", {"output_index": 0, "item": done["output"][0]}),
           ("response.completed", {"response": done})]
    out = []
    for i, (name, data) in enumerate(evs):
        d = {"type": name, "sequence_number": i}
        d.update(data)
        out.append((name, d))
    return out


def openai_chat_body(model, u, text="hello"):
    return {"id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": model,
            "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                         "message": {"role": "assistant", "content": text,
                                     "refusal": None}}],
            "usage": openai_chat_usage(u)}


def openai_chat_events(model, u, include_usage, text="hello"):
    """(None, data) pairs of a streamed Chat answer, the usage-only chunk last when asked;
    the stream then ends with data: [DONE]."""
    def chunk(choices, usage=None):
        c = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0,
             "model": model, "choices": choices}
        if include_usage:
            c["usage"] = usage
        return c
    half = len(text) // 2
    evs = [chunk([{"index": 0, "delta": {"role": "assistant", "content": ""},
                   "finish_reason": None}]),
           chunk([{"index": 0, "delta": {"content": text[:half]}, "finish_reason": None}]),
           chunk([{"index": 0, "delta": {"content": text[half:]}, "finish_reason": None}]),
           chunk([{"index": 0, "delta": {}, "finish_reason": "stop"}])]
    if include_usage:
        evs.append(chunk([], openai_chat_usage(u)))
    return [(None, e) for e in evs]


def openai_worst_usage(body, raw):
    """The most an OpenAI call may use: its body's bytes in, its output limit out."""
    limit = body.get("max_output_tokens") or body.get("max_completion_tokens") or \
        body.get("max_tokens") or 0
    return {"input": len(raw), "output": limit * int(body.get("n") or 1), "cache_write": 0,
            "cache_read": 0}


def _openai(self, h, path, body, raw, u, step):
    model = body.get("model", "")
    text = step.get("text", "hello")
    if self.worst_case:
        u = openai_worst_usage(body, raw)
    if path == "/v1/responses":
        if body.get("stream"):
            return self._sse_openai(h, openai_responses_events(model, u, text), False, step)
        return self._json(h, 200, openai_responses_body(model, u, text))
    if body.get("stream"):
        inc = bool((body.get("stream_options") or {}).get("include_usage"))
        return self._sse_openai(h, openai_chat_events(model, u, inc, text), True, step)
    return self._json(h, 200, openai_chat_body(model, u, text))


def _sse_openai(self, h, events, done, step):
    """Writes EVENTS (name or None, data) as SSE; `data: [DONE]` last when DONE. With
    step["split"] = N the whole stream goes out N bytes per write (events split across
    reads); step["cut_after"] = K closes the connection after K events."""
    h.send_response(200)
    h.send_header("Content-Type", "text/event-stream")
    h.send_header("Cache-Control", "no-cache")
    h.send_header("Transfer-Encoding", "chunked")
    h.send_header("x-request-id", "req_fake")
    h.end_headers()
    cut = step.get("cut_after")
    texts = []
    for i, (name, data) in enumerate(events):
        if cut is not None and i >= cut:
            break
        texts.append(("event: %s\n" % name if name else "") + "data: %s\n\n" % json.dumps(data))
    if done and cut is None:
        texts.append("data: [DONE]\n\n")
    stream = "".join(texts).encode()
    n = step.get("split") or 0
    pieces = [stream[i:i + n] for i in range(0, len(stream), n)] if n else \
        [t.encode() for t in texts]
    for p in pieces:
        h.wfile.write(b"%x\r\n%s\r\n" % (len(p), p))
        h.wfile.flush()
    if cut is not None:
        h.close_connection = True
        h.connection.shutdown(2)  # abruptly: the stream ends without its usage
        return
    h.wfile.write(b"0\r\n\r\n")
    h.wfile.flush()


FakeLLM._openai = _openai
FakeLLM._sse_openai = _sse_openai


# --- a scripted agent over Responses (the real Codex CLI) ---------------------------------
# fake.agent_calls = [(tool name, arguments dict), ...]: a Responses request that carries
# K function_call_output items is answered with the call agent_calls[K] (a function_call
# item), and once they are all done with the text "done". The usage stays fake.usage (or,
# with worst_case, the most the call may use).

def openai_agent_output(body, calls):
    items = body.get("input") if isinstance(body.get("input"), list) else []
    k = len([i for i in items if isinstance(i, dict) and i.get("type") == "function_call_output"])
    if k < len(calls):
        name, args = calls[k]
        return {"type": "function_call", "id": "fc_fake_%d" % k, "status": "completed",
                "call_id": "call_fake_%d" % k, "name": name, "arguments": json.dumps(args)}
    return None


def openai_agent_events(model, u, item):
    done = openai_responses_body(model, u, "done")
    done["output"] = [item]
    base = dict(done, status="in_progress", output=[], usage=None)
    evs = [("response.created", {"response": base}),
           ("response.in_progress", {"response": base}),
           ("response.output_item.added", {"output_index": 0,
                                           "item": dict(item, status="in_progress",
                                                        arguments="")}),
           ("response.function_call_arguments.delta", {"item_id": item["id"], "output_index": 0,
                                                       "delta": item["arguments"]}),
           ("response.function_call_arguments.done", {"item_id": item["id"], "output_index": 0,
                                                      "arguments": item["arguments"]}),
           ("response.output_item.done", {"output_index": 0, "item": item}),
           ("response.completed", {"response": done})]
    return [(name, dict({"type": name, "sequence_number": i}, **data))
            for i, (name, data) in enumerate(evs)]


_openai_plain = _openai


def _openai_agent(self, h, path, body, raw, u, step):
    item = openai_agent_output(body, getattr(self, "agent_calls", []))
    if path != "/v1/responses" or item is None:
        return _openai_plain(self, h, path, body, raw, u, step)
    model = body.get("model", "")
    if self.worst_case:
        u = openai_worst_usage(body, raw)
    if body.get("stream"):
        return self._sse_openai(h, openai_agent_events(model, u, item), False, step)
    resp = openai_responses_body(model, u)
    resp["output"] = [item]
    return self._json(h, 200, resp)


FakeLLM._openai = _openai_agent
