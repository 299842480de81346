# SPDX-License-Identifier: Apache-2.0
"""Metering LLM usage against `POST /api/v1/agenttask/meter`, and ending the task with
`POST /api/v1/agenttask/complete` (complete_task).

Standard library only. The token, URL and socket are read from the environment on every
call, so a token rotated by a pause/resume is picked up without a restart:

- token: ``DIVERGE_MACAROON_TOKEN`` when non-empty, else the first line of the file
  ``DIVERGE_TOKEN_FILE`` (default ``/etc/diverge/token/token``);
- transport: ``DIVERGE_METER_SOCKET`` (HTTP over a unix socket) when set, else
  ``DIVERGE_METER_URL`` (the meter URL; a bare ``http://host:port`` gets the meter path).

Network failures (refused, reset, timeouts) and 5xx answers are retried with exponential
backoff and the same ``requestId``, so the server charges a call once however often it is
sent. 4xx answers are never retried.
"""
import http.client
import json
import os
import random
import socket
import time
import urllib.parse
import uuid
from decimal import Decimal, InvalidOperation

__all__ = ["meter_llm_usage", "MeterResult", "LLMMeterError", "METER_PATH",
           "complete_task", "CompleteResult", "TaskCompleteError", "COMPLETE_PATH",
           "DEFAULT_TOKEN_FILE", "DEFAULT_MAX_ATTEMPTS"]

METER_PATH = "/api/v1/agenttask/meter"
COMPLETE_PATH = "/api/v1/agenttask/complete"
DEFAULT_TOKEN_FILE = "/etc/diverge/token/token"
DEFAULT_MAX_ATTEMPTS = 5
DEFAULT_TIMEOUT = 30.0
DEFAULT_BACKOFF = 0.25
MAX_BACKOFF = 10.0
MAX_RESPONSE = 1 << 20


class MeterResult:
    """The meter's answer: cumulative totals of the task after this call."""

    __slots__ = ("allowed", "suspended", "total_tokens_used", "total_cost_usd", "iteration",
                 "max_iterations", "guidance", "preview_url", "duplicate", "request_id", "raw")

    def __init__(self, body, request_id):
        self.allowed = body.get("allowed") is True
        self.suspended = body.get("suspended") is True
        self.total_tokens_used = int(body.get("totalTokensUsed") or 0)
        self.total_cost_usd = _decimal(body.get("totalCostUSD"))
        self.iteration = int(body.get("iteration") or 0)
        self.max_iterations = int(body.get("maxIterations") or 0)
        self.guidance = body.get("guidance") or None
        self.preview_url = body.get("previewUrl") or None
        self.duplicate = body.get("duplicate") is True
        self.request_id = request_id
        self.raw = body

    def __repr__(self):
        return ("MeterResult(allowed=%r, suspended=%r, total_tokens_used=%r, "
                "total_cost_usd=%r, iteration=%r, max_iterations=%r, guidance=%r, "
                "preview_url=%r)" % (self.allowed, self.suspended, self.total_tokens_used,
                                     self.total_cost_usd, self.iteration, self.max_iterations,
                                     self.guidance, self.preview_url))


class LLMMeterError(Exception):
    """The meter refused the call (``status`` 400/401/403/429), or it could not be reached
    after every retry (``status`` 0 and ``reason`` "unreachable", or the last 5xx)."""

    def __init__(self, status, reason, message, body=None, request_id=None):
        super().__init__("meter: %s (HTTP %s)" % (message, status) if status else
                         "meter: %s" % message)
        self.status = status
        self.reason = reason
        self.message = message
        self.body = body
        self.request_id = request_id
        # The totals a 429 carries (the task is paused now).
        self.result = MeterResult(body, request_id) if status == 429 and body else None

    @property
    def is_budget_exceeded(self):
        return self.status == 429 and self.reason == "budget exceeded"

    @property
    def is_max_iterations_exceeded(self):
        return self.status == 429 and self.reason == "max iterations exceeded"

    @property
    def is_model_disallowed(self):
        return self.status == 403

    @property
    def is_unauthenticated(self):
        return self.status == 401


def _decimal(v):
    if v is None:
        return Decimal(0)
    if isinstance(v, Decimal):
        return v
    return Decimal(str(v))


def _cost_text(cost_usd):
    """COST_USD as the text of an exact JSON number (no exponent, no float rounding)."""
    if isinstance(cost_usd, bool):
        raise TypeError("cost_usd must be a number or a decimal string")
    try:
        d = Decimal(cost_usd) if isinstance(cost_usd, (Decimal, int, str)) \
            else Decimal(repr(float(cost_usd)))
    except (InvalidOperation, ValueError, TypeError):
        raise ValueError("cost_usd must be a number or a decimal string") from None
    if not d.is_finite():
        raise ValueError("cost_usd must be finite")
    return format(d, "f")


def _token():
    tok = os.environ.get("DIVERGE_MACAROON_TOKEN", "").strip()
    if tok:
        return tok
    path = os.environ.get("DIVERGE_TOKEN_FILE") or DEFAULT_TOKEN_FILE
    try:
        with open(path, encoding="utf-8") as f:
            return f.readline().strip() or None
    except OSError:
        return None


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            s.connect(self._path)
        except OSError:
            s.close()
            raise
        self.sock = s


def _connection(timeout, route=METER_PATH, error=None):
    """(connection, request path) for the configured transport. ROUTE is METER_PATH or
    COMPLETE_PATH: the completion goes to the meter URL with its last segment "meter"
    replaced by "complete"."""
    error = error or LLMMeterError
    sock = os.environ.get("DIVERGE_METER_SOCKET", "")
    if sock:
        return _UnixConnection(sock, timeout), route
    url = os.environ.get("DIVERGE_METER_URL", "")
    if not url:
        raise error(0, "not configured",
                    "neither DIVERGE_METER_SOCKET nor DIVERGE_METER_URL is set")
    u = urllib.parse.urlsplit(url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise error(0, "not configured", "DIVERGE_METER_URL must be an http(s) URL")
    path = u.path if u.path not in ("", "/") else METER_PATH
    if route != METER_PATH:
        path = path[:-len("meter")] + "complete" if path.endswith("/meter") else route
    if u.query:
        path += "?" + u.query
    cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
    return cls(u.hostname, u.port, timeout=timeout), path


def _send_once(body, timeout, route=METER_PATH, error=None):
    """One exchange: (status, parsed body or None, Retry-After seconds or None)."""
    conn, path = _connection(timeout, route, error)
    headers = {"Content-Type": "application/json", "Accept": "application/json",
               "User-Agent": "diverge-sdk-python/0.1.0"}
    tok = _token()
    if tok:
        headers["Authorization"] = "Bearer " + tok
    try:
        conn.request("POST", path, body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read(MAX_RESPONSE + 1)
        retry_after = resp.getheader("Retry-After")
    finally:
        conn.close()
    try:
        parsed = json.loads(data.decode("utf-8"), parse_float=Decimal) if data else None
    except ValueError:
        parsed = None
    try:
        retry_after = float(retry_after) if retry_after else None
    except ValueError:
        retry_after = None
    return resp.status, parsed if isinstance(parsed, dict) else None, retry_after


def meter_llm_usage(model, tokens_used, cost_usd, request_id=None, iteration=None, *,
                    max_attempts=None, timeout=DEFAULT_TIMEOUT, backoff=DEFAULT_BACKOFF):
    """Reports one LLM call (TOKENS_USED and COST_USD are this call's deltas) and returns a
    MeterResult with the task's totals, guidance and preview URL.

    COST_USD may be a Decimal, an int, a decimal string or a float (sent by its shortest
    repr). REQUEST_ID defaults to a fresh uuid4; the same id is reused on every retry.
    MAX_ATTEMPTS (default ``DIVERGE_METER_MAX_ATTEMPTS`` or 5) bounds the tries; the wait
    starts at BACKOFF seconds and doubles (with jitter, at most 10 s, or the server's
    Retry-After). Raises LLMMeterError.
    """
    if isinstance(tokens_used, bool) or not isinstance(tokens_used, int):
        raise TypeError("tokens_used must be an int")
    if iteration is not None and (isinstance(iteration, bool) or not isinstance(iteration, int)):
        raise TypeError("iteration must be an int")
    request_id = request_id or str(uuid.uuid4())
    max_attempts = _attempts(max_attempts)
    fields = {"requestId": request_id, "tokensUsed": tokens_used}
    if model is not None:
        fields["model"] = model
    if iteration is not None:
        fields["iteration"] = iteration
    body = (json.dumps(fields)[:-1] + ', "costUSD": ' + _cost_text(cost_usd) + "}").encode()
    parsed = _post(body, METER_PATH, LLMMeterError, request_id, max_attempts, timeout, backoff)
    return MeterResult(parsed, request_id)


def _attempts(max_attempts):
    if max_attempts is None:
        try:
            max_attempts = int(os.environ.get("DIVERGE_METER_MAX_ATTEMPTS") or
                               DEFAULT_MAX_ATTEMPTS)
        except ValueError:
            max_attempts = DEFAULT_MAX_ATTEMPTS
    return max(1, max_attempts)


def _post(body, route, error, request_id, max_attempts, timeout, backoff):
    """POSTs BODY to ROUTE, retrying network failures and 5xx; the parsed 2xx body, or
    raises ERROR (a 4xx at once, else the last failure)."""
    last = None
    for attempt in range(max_attempts):
        retry_after = None
        try:
            status, parsed, retry_after = _send_once(body, timeout, route, error)
        except (OSError, http.client.HTTPException) as e:  # refused, reset, timeout, EOF
            what = "the meter" if route == METER_PATH else "the server"
            last = error(0, "unreachable", "cannot reach %s: %s" % (what, e),
                         request_id=request_id)
            last.__cause__ = e
        else:
            parsed = parsed or {}
            if 200 <= status < 300:
                return parsed
            reason = parsed.get("reason") or http.client.responses.get(status, "error")
            message = parsed.get("error") or reason
            last = error(status, reason, message, parsed, request_id)
            if status < 500:
                raise last
        if attempt + 1 < max_attempts:
            delay = min(MAX_BACKOFF, backoff * (2 ** attempt)) * random.uniform(0.5, 1.0)
            if retry_after is not None:
                delay = min(MAX_BACKOFF, max(delay, retry_after))
            time.sleep(delay)
    raise last


class CompleteResult:
    """The server's answer to complete_task: the phase the task is in now."""

    __slots__ = ("phase", "reason", "message", "duplicate", "raw")

    def __init__(self, body):
        self.phase = body.get("phase") or ""
        self.reason = body.get("reason") or ""
        self.message = body.get("message") or ""
        self.duplicate = body.get("duplicate") is True
        self.raw = body

    def __repr__(self):
        return "CompleteResult(phase=%r, reason=%r, message=%r, duplicate=%r)" % (
            self.phase, self.reason, self.message, self.duplicate)


class TaskCompleteError(LLMMeterError):
    """complete_task was refused (``status`` 400, or 401: token revoked, task not Active)
    or the server could not be reached after every retry (``status`` 0)."""

    def __init__(self, status, reason, message, body=None, request_id=None):
        super().__init__(status, reason, message, body, request_id)
        self.args = ("complete: %s (HTTP %s)" % (message, status) if status else
                     "complete: %s" % message,)
        self.result = None


def complete_task(result, message=None, *, max_attempts=None, timeout=DEFAULT_TIMEOUT,
                  backoff=DEFAULT_BACKOFF):
    """Ends the agent's own task (``POST /api/v1/agenttask/complete`` with the task token):
    RESULT "succeeded" makes it Completed, "failed" Failed, reason AgentReported, with
    MESSAGE (at most 4096 bytes) as its status message; the token is revoked. Network
    failures and 5xx are retried like meter calls (a retry of a completion that went
    through answers ``duplicate``). Returns a CompleteResult; raises TaskCompleteError."""
    if result not in ("succeeded", "failed"):
        raise ValueError('result must be "succeeded" or "failed"')
    if message is not None and not isinstance(message, str):
        raise TypeError("message must be a str")
    fields = {"result": result}
    if message is not None:
        fields["message"] = message
    body = json.dumps(fields).encode()
    parsed = _post(body, COMPLETE_PATH, TaskCompleteError, None, _attempts(max_attempts),
                   timeout, backoff)
    return CompleteResult(parsed)
