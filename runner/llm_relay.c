/* SPDX-License-Identifier: Apache-2.0 */
/* The connections of the runner's LLM relay (SPEC §13): one request per connection is
 * read from the agent (head and body capped, every wait timed, a stop ends it), sent to
 * the server's LLM routes with the token read from the token file now, on this very
 * request, in place of whatever key the agent holds, and the answer is passed back as
 * it arrives: an SSE stream chunk by chunk, never gathered first. The agent is
 * untrusted; whatever it sends ends in an error answer or a closed connection. */
#include <errno.h>
#include <jansson.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "common/clock.h"
#include "common/httpc.h"
#include "runner/runner_int.h"

#define READ_CHUNK (16u << 10) /* bytes read from the agent at a time */

/* One agent connection. */
struct conn {
    int fd;                      /* the agent's connection; borrowed */
    int stop_fd;                 /* readable once the runner stops */
    struct runner_llm_relay *r;  /* borrowed */
    struct httpc_response *resp; /* the server's answer, while relaying */
    bool head_request;           /* HEAD: no body in the answer */
    bool replied;                /* the response head went to the agent */
    bool broken;                 /* the agent stopped reading: give up */
};

/* Waits until FD is ready for EVENTS; false on timeout, stop or error. */
static bool wait_fd(const struct conn *c, short events, long timeout_ms)
{
    struct pollfd p[2] = {{.fd = c->fd, .events = events}, {.fd = c->stop_fd, .events = POLLIN}};
    int64_t deadline = clock_mono_ns() + (int64_t)timeout_ms * 1000000;

    for (;;) {
        int64_t left = (deadline - clock_mono_ns()) / 1000000;
        int n;
        if (left <= 0) {
            return false;
        }
        n = poll(p, 2, (int)left);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        return n > 0 && p[1].revents == 0 && p[0].revents != 0;
    }
}

/* Writes all of DATA[0..n) to the agent; false (and c->broken) when it cannot. */
static bool put(struct conn *c, const char *data, size_t n)
{
    while (n > 0 && !c->broken) {
        ssize_t w = send(c->fd, data, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            data += w;
            n -= (size_t)w;
        } else if (w < 0 && errno == EINTR) {
            continue;
        } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) &&
                   wait_fd(c, POLLOUT, RUNNER_LLM_WRITE_TIMEOUT_MS)) {
            continue;
        } else {
            c->broken = true;
        }
    }
    return !c->broken;
}

/* Reads what the agent sent next into B (within its cap); bytes read, 0 at end of
 * file, -1 on timeout, stop or error. */
static ssize_t get(struct conn *c, struct buf *b, long timeout_ms)
{
    char tmp[READ_CHUNK];
    ssize_t n;

    for (;;) {
        n = recv(c->fd, tmp, sizeof(tmp), MSG_DONTWAIT);
        if (n >= 0 || errno == EINTR) {
            if (n < 0) {
                continue;
            }
            break;
        }
        if ((errno != EAGAIN && errno != EWOULDBLOCK) || !wait_fd(c, POLLIN, timeout_ms)) {
            return -1;
        }
    }
    if (n > 0 && buf_append(b, tmp, (size_t)n) != E_OK) {
        return -1;
    }
    return n;
}

/* An answer of the relay's own (the request never reached the server): the providers'
 * error shapes in one ({"type":"error","error":{type, code, status, message}}). */
static void reply_error(struct conn *c, long status, const char *msg)
{
    char *body, *head;
    json_t *j;

    if (c->replied || c->broken) {
        return;
    }
    j = json_pack("{s:s, s:{s:s, s:I, s:s, s:s+}}", "type", "error", "error", "type",
                  status >= 500 ? "api_error" : "invalid_request_error", "code", (json_int_t)status,
                  "status", status >= 500 ? "UNAVAILABLE" : "INVALID_ARGUMENT", "message",
                  "diverge relay: ", msg != NULL ? msg : "");
    body = j != NULL ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (body == NULL) {
        body = xstrdup("{}");
    }
    head = runner_llm_reply_head(status, NULL, 0, true);
    /* The head ends "Connection: close\r\n\r\n": put the body's type and length first. */
    head[strlen(head) - 2] = '\0';
    put(c, head, strlen(head));
    free(head);
    head = xasprintf("Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n", strlen(body));
    put(c, head, strlen(head));
    if (!c->head_request) {
        put(c, body, strlen(body));
    }
    c->replied = true;
    free(head);
    free(body);
}

/* Where the blank line ending a head is in S[0..n): the bytes up to and including it,
 * 0 when not there yet. */
static size_t head_end(const char *s, size_t n)
{
    for (size_t i = 0; i + 1 < n; i++) {
        if (s[i] == '\n' &&
            (s[i + 1] == '\n' || (s[i + 1] == '\r' && i + 2 < n && s[i + 2] == '\n'))) {
            return i + (s[i + 1] == '\n' ? 2 : 3);
        }
    }
    return 0;
}

/* Reads the head into IN; its length, 0 after answering an error. */
static size_t read_head(struct conn *c, struct buf *in)
{
    int64_t deadline = clock_mono_ns() + (int64_t)RUNNER_LLM_READ_TIMEOUT_MS * 1000000;
    size_t end = 0;

    while ((end = head_end(in->data != NULL ? in->data : "", in->len)) == 0) {
        long left = (long)((deadline - clock_mono_ns()) / 1000000);
        ssize_t n;
        if (in->len > RUNNER_LLM_HEAD_MAX) {
            reply_error(c, 431, "request head too large");
            return 0;
        }
        n = left > 0 ? get(c, in, left) : -1;
        if (n == 0 || (n < 0 && in->len == 0)) {
            return 0; /* gone, or an idle connection: nothing to answer */
        }
        if (n < 0) {
            reply_error(c, 408, "the request head did not arrive in time");
            return 0;
        }
    }
    if (end > RUNNER_LLM_HEAD_MAX) {
        reply_error(c, 431, "request head too large");
        return 0;
    }
    return end;
}

/* The body of a Content-Length request: PENDING bytes already read, then the rest. */
static int read_sized(struct conn *c, struct buf *body, const char *pending, size_t n,
                      long long length)
{
    if (length > 0) {
        buf_reserve(body, (size_t)length);
    }
    if (buf_append(body, pending, n < (size_t)length ? n : (size_t)length) != E_OK) {
        return E_TOOBIG;
    }
    while ((long long)body->len < length) {
        ssize_t got = get(c, body, RUNNER_LLM_READ_TIMEOUT_MS);
        if (got <= 0) {
            return got == 0 ? E_FAIL : E_AGAIN; /* the agent went away, or too slow */
        }
    }
    if ((long long)body->len > length) {
        body->len = (size_t)length; /* pipelined bytes: this connection serves one request */
    }
    return E_OK;
}

/* The body of a chunked request into BODY. */
static int read_chunked(struct conn *c, struct buf *body, const char *pending, size_t n)
{
    struct runner_llm_chunked st = {0};
    struct buf raw;
    size_t used = 0, total = n;
    int rc;

    buf_init(&raw, 0);
    buf_append(&raw, pending, n);
    for (;;) {
        rc = runner_llm_dechunk(&st, body, raw.data != NULL ? raw.data : "", raw.len, &used);
        if (used > 0) {
            memmove(raw.data, raw.data + used, raw.len - used);
            raw.len -= used;
        }
        if (rc != E_AGAIN) {
            break;
        }
        ssize_t got = get(c, &raw, RUNNER_LLM_READ_TIMEOUT_MS);
        if (got <= 0 || total > 2 * (size_t)RUNNER_LLM_BODY_MAX) {
            rc = got == 0 ? E_FAIL : got < 0 ? E_AGAIN : E_TOOBIG;
            break;
        }
        total += (size_t)got;
    }
    buf_cleanup(&raw);
    return rc;
}

/* The answer to a request refused with RC (E_FAIL: the agent went away, no answer). */
static void reply_refused(struct conn *c, int rc, const struct err *err)
{
    static const struct {
        int rc;
        long status;
        const char *msg;
    } map[] = {{E_NOTFOUND, 404, NULL},
               {E_TOOBIG, 413, "request too large"},
               {E_INVALID, 400, "malformed request"},
               {E_AGAIN, 408, "the request did not arrive in time"}};

    for (size_t i = 0; i < ARRAY_LEN(map); i++) {
        if (map[i].rc == rc) {
            reply_error(c, map[i].status,
                        err->msg[0] != '\0' || map[i].msg == NULL ? err->msg : map[i].msg);
        }
    }
}

/* Reads the request into H and BODY; false after answering an error (or losing the
 * agent). */
static bool read_request(struct conn *c, struct runner_llm_head *h, struct buf *body)
{
    struct buf in;
    struct err err = {0};
    size_t end;
    int rc;

    buf_init(&in, RUNNER_LLM_HEAD_MAX + READ_CHUNK);
    end = read_head(c, &in);
    rc = end > 0 ? runner_llm_head_parse(h, in.data, end, &err) : E_FAIL;
    c->head_request = rc == E_OK && strcmp(h->method, "HEAD") == 0;
    if (rc == E_OK && h->expect_continue && in.len == end &&
        (h->chunked || h->content_length > 0)) {
        put(c, "HTTP/1.1 100 Continue\r\n\r\n", 25);
    }
    if (rc == E_OK && h->chunked) {
        rc = read_chunked(c, body, in.data + end, in.len - end);
    } else if (rc == E_OK && h->content_length > 0) {
        rc = read_sized(c, body, in.data + end, in.len - end, h->content_length);
    }
    buf_cleanup(&in);
    if (end > 0 && rc != E_OK) {
        reply_refused(c, rc, &err);
    }
    return rc == E_OK;
}

/* The response head, once, from what the server answered so far. */
static bool reply_head(struct conn *c)
{
    char *head;
    bool ok;

    if (c->replied) {
        return !c->broken;
    }
    head = runner_llm_reply_head(c->resp->status, c->resp->headers.data, c->resp->headers.len,
                                 c->head_request);
    ok = put(c, head, strlen(head));
    free(head);
    c->replied = true;
    return ok;
}

/* One piece of the body, as one HTTP chunk. */
static bool reply_chunk(struct conn *c, const char *data, size_t n)
{
    char size[32];

    if (n == 0) {
        return !c->broken;
    }
    snprintf(size, sizeof(size), "%zx\r\n", n);
    return put(c, size, strlen(size)) && put(c, data, n) && put(c, "\r\n", 2);
}

/* httpc_chunk_fn: a piece of a 2xx answer, passed on as it came. */
static int on_chunk(const char *data, size_t len, void *userdata)
{
    struct conn *c = userdata;

    return reply_head(c) && reply_chunk(c, data, len) ? E_OK : E_AGAIN;
}

/* What ends the answer after the server's call returned RC. */
static void finish(struct conn *c, const char *what, int rc, const struct err *err)
{
    bool body = !c->head_request && c->resp->status != 204 && c->resp->status != 304;

    if (rc == E_OK) {
        /* A non-2xx answer was gathered (capped): it goes as one chunk. */
        if (reply_head(c) && body && reply_chunk(c, c->resp->body.data, c->resp->body.len)) {
            put(c, "0\r\n\r\n", 5);
        }
        return;
    }
    if (c->broken || atomic_load(&c->r->stopping) != 0) {
        return;
    }
    char msg[sizeof(err->msg) + 64];

    runner_say("llm relay: %s: %s%s", what, c->replied ? "cut mid-answer: " : "", err->msg);
    /* Mid-answer the agent sees the stream end without its last chunk: a cut, not an end. */
    snprintf(msg, sizeof(msg), "the server could not be reached: %s", err->msg);
    reply_error(c, 502, msg);
}

/* Sends H and BODY on with TOKEN and passes the answer back. */
static void relay(struct conn *c, const struct runner_llm_head *h, const struct buf *body,
                  const char *token)
{
    struct httpc_request req = HTTPC_REQUEST_DEFAULTS;
    struct httpc_response resp;
    char *target = runner_llm_target(h->target, token);
    char *url = xasprintf("%s%s", c->r->base, target);
    char **headers = runner_llm_upstream_headers(h, token);
    char what[96];
    struct err err = {0};
    int rc;

    /* For the log: the method and the path, never the query (it may hold a key). */
    snprintf(what, sizeof(what), "%s %.*s", h->method, (int)strcspn(h->target, "?"), h->target);
    req.method = h->method;
    req.url = url;
    req.headers = (const char *const *)headers;
    req.body = body->len > 0 ? body->data : NULL;
    req.body_len = body->len;
    req.connect_timeout_ms = RUNNER_LLM_CONNECT_TIMEOUT_MS;
    req.timeout_ms = RUNNER_LLM_TIMEOUT_MS;
    req.max_body = RUNNER_LLM_ERROR_BODY_MAX;
    req.ca_file = c->r->cfg->ca_file;
    req.unix_socket = c->r->unix_socket;
    req.tcp_keepalive = true;
    req.cancel = &c->r->stopping;
    c->resp = &resp;
    rc = httpc_stream(&resp, &req, on_chunk, c, &err);
    finish(c, what, rc, &err);
    c->resp = NULL;
    httpc_response_cleanup(&resp);
    runner_llm_lines_free(headers);
    runner_token_free(url);
    runner_token_free(target);
}

void runner_llm_conn(int fd, int stop_fd, void *userdata)
{
    struct conn c = {.fd = fd, .stop_fd = stop_fd, .r = userdata};
    struct runner_llm_head h;
    struct buf body;
    struct err err = {0};
    char *token = NULL;

    memset(&h, 0, sizeof(h));
    buf_init(&body, RUNNER_LLM_BODY_MAX);
    if (read_request(&c, &h, &body)) {
        if (runner_token_read(&token, c.r->cfg, &err) != E_OK) {
            char msg[sizeof(err.msg) + 64];
            snprintf(msg, sizeof(msg), "no token to put on the request: %s", err.msg);
            reply_error(&c, 503, msg);
        } else {
            relay(&c, &h, &body, token);
        }
    }
    runner_token_free(token);
    runner_llm_head_cleanup(&h);
    buf_cleanup(&body);
}
