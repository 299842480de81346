/* SPDX-License-Identifier: Apache-2.0 */
/* Forwarding one call upstream (SPEC §13): a non-streamed answer is read whole, metered
 * and passed on; a stream is relayed as it arrives (a worker thread reads upstream, the
 * connection's thread writes to the client). The call's reservation record is committed
 * beside the upstream call; the answer (a stream's final chunk) waits for that record to
 * be durable, not for the charge, which follows it (a stream's starts as soon as its
 * final usage arrived). Upstream errors pass through unchanged and are not charged. */
#define _GNU_SOURCE /* memmem */
#include <microhttpd.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common/httpc.h"
#include "common/log.h"
#include "server/api/llm/llm_call.h"

/* A stream's idle bound while it is relayed (the runner's bound on a whole call): an
 * upstream may fall silent for longer than the listener's idle timeout (120 s; a task
 * socket's 30 s) while a model thinks, and libmicrohttpd would then cut the stream as the
 * next event arrives (and the call be charged its reservation). */
#define LLM_STREAM_IDLE_TIMEOUT_S 1800u

/* Response headers of the upstream passed on to the client. */
static const char *const g_pass_headers[] = {"content-type", "request-id", "x-request-id",
                                             "retry-after", "x-should-retry"};

/* Status and error type of each kind, per provider (SPEC §13: OpenAI's budget refusal is
 * 429 insufficient_quota, which Codex treats as final; the others' is 402). */
struct err_shape {
    int status;
    const char *type;
};

static const struct err_shape g_shapes[LLM_PROVIDER_COUNT][LLM_ERR_UPSTREAM + 1] =
    {
        [LLM_ANTHROPIC] =
            {
                [LLM_ERR_INVALID] = {400, "invalid_request_error"},
                [LLM_ERR_AUTH] = {401, "authentication_error"},
                [LLM_ERR_PERMISSION] = {403, "permission_error"},
                [LLM_ERR_BUDGET] = {402, "billing_error"},
                [LLM_ERR_UNAVAILABLE] = {503, "api_error"},
                [LLM_ERR_UPSTREAM] = {502, "api_error"},
            },
        [LLM_OPENAI] =
            {
                [LLM_ERR_INVALID] = {400, "invalid_request_error"},
                [LLM_ERR_AUTH] = {401, "invalid_api_key"},
                [LLM_ERR_PERMISSION] = {403, "permission_denied"},
                [LLM_ERR_BUDGET] = {429, "insufficient_quota"},
                [LLM_ERR_UNAVAILABLE] = {503, "server_error"},
                [LLM_ERR_UPSTREAM] = {502, "server_error"},
            },
        [LLM_GEMINI] =
            {
                [LLM_ERR_INVALID] = {400, "INVALID_ARGUMENT"},
                [LLM_ERR_AUTH] = {401, "UNAUTHENTICATED"},
                [LLM_ERR_PERMISSION] = {403, "PERMISSION_DENIED"},
                [LLM_ERR_BUDGET] = {402, "FAILED_PRECONDITION"},
                [LLM_ERR_UNAVAILABLE] = {503, "UNAVAILABLE"},
                [LLM_ERR_UPSTREAM] = {502, "UNAVAILABLE"},
            },
};

int llm_send_error(struct request *r, enum llm_provider p, enum llm_err kind, const char *message)
{
    const struct err_shape *e = &g_shapes[p < LLM_PROVIDER_COUNT ? p : LLM_ANTHROPIC][kind];
    json_t *body;

    switch (p) {
    case LLM_ANTHROPIC:
        body = json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type", e->type,
                         "message", message);
        break;
    case LLM_OPENAI:
        body = json_pack("{s:{s:s, s:s, s:s, s:n}}", "error", "message", message, "type",
                         kind == LLM_ERR_AUTH ? "invalid_request_error" : e->type, "code", e->type,
                         "param");
        break;
    default:
        body = json_pack("{s:{s:i, s:s, s:s}}", "error", "code", e->status, "message", message,
                         "status", e->type);
        break;
    }
    return http_send_json(r, e->status, body);
}

static void build_request(struct httpc_request *req, const char **hdrs, struct llm_call *c)
{
    size_t n = 0;

    hdrs[n++] = c->key_header;
    hdrs[n++] = "content-type: application/json";
    for (size_t i = 0; i < LLM_EXTRA_HEADERS; i++) {
        if (c->extra_headers[i] != NULL) {
            hdrs[n++] = c->extra_headers[i];
        }
    }
    hdrs[n] = NULL;
    req->method = "POST";
    req->url = c->url;
    req->headers = hdrs;
    req->body = c->body;
    req->body_len = c->send_len;
    req->connect_timeout_ms = 10000;
    req->max_body = LLM_RESPONSE_MAX;
    req->pool = c->gw->pool;
}

static void add_pass_headers(struct MHD_Response *resp, const struct httpc_response *up)
{
    for (size_t i = 0; i < ARRAY_LEN(g_pass_headers); i++) {
        const char *v = httpc_response_header(up, g_pass_headers[i]);
        if (v != NULL && strlen(v) < 1024) {
            MHD_add_response_header(resp, g_pass_headers[i], v);
        }
    }
}

/* An upstream body that names the server's key (some providers echo a bad key) has it
 * masked: the key never reaches a client. */
static void mask_key(struct buf *b, const struct llm_call *c)
{
    const char *key = c->gw->key[c->provider];
    size_t klen = key != NULL ? strlen(key) : 0;
    char *hit;

    while (klen >= 8 && b->data != NULL && (hit = memmem(b->data, b->len, key, klen)) != NULL) {
        memset(hit, '*', klen);
    }
}

static int send_upstream_answer(struct request *r, const struct httpc_response *up)
{
    struct MHD_Response *resp;
    enum MHD_Result ret;

    resp = MHD_create_response_from_buffer(
        up->body.len, up->body.data != NULL ? up->body.data : (void *)(uintptr_t) "",
        MHD_RESPMEM_MUST_COPY);
    if (resp == NULL) {
        return MHD_NO;
    }
    add_pass_headers(resp, up);
    http_guard_answering(r->conn);
    r->status = (int)up->status;
    ret = MHD_queue_response(r->conn, (unsigned int)up->status, resp);
    MHD_destroy_response(resp);
    return ret;
}

static int unreachable(struct request *r, enum llm_provider p)
{
    log_kv(LOG_WARN, "llm_upstream_unreachable", "provider", llm_provider_name(p), NULL);
    return llm_send_error(r, p, LLM_ERR_UPSTREAM, "diverge: the upstream API could not be reached");
}

static int forward_whole(struct request *r, struct llm_call *c)
{
    struct httpc_request req = HTTPC_REQUEST_DEFAULTS;
    struct httpc_response up;
    const char *hdrs[LLM_EXTRA_HEADERS + 3];
    struct llm_usage u = {0};
    struct err err = {0};
    bool charge = false;
    int rc, ret;

    build_request(&req, hdrs, c);
    req.timeout_ms = LLM_UPSTREAM_TIMEOUT_MS;
    rc = httpc_request(&up, &req, &err);
    if (rc != E_OK) {
        llm_call_ended(c);
        ret = unreachable(r, c->provider);
    } else {
        if (up.status >= 200 && up.status < 300) {
            llm_usage_from_body(&u, c->dialect, up.body.data, up.body.len);
            charge = true;
            if (!llm_call_recorded(c)) {
                llm_call_settle(c, &u); /* no durable record: the answer waits for the charge */
            }
        }
        mask_key(&up.body, c);
        llm_call_ended(c);
        ret = send_upstream_answer(r, &up);
    }
    httpc_response_cleanup(&up);
    /* Charged (or, upstream errors, released) once the answer is on its way: its record
     * is durable, so a server dying before the charge charges it at its next start. */
    llm_call_finish_later(c, &u, charge);
    return ret;
}

/* --- streams ----------------------------------------------------------------------- */

struct relay {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct buf pending;       /* bytes read upstream, not yet written to the client */
    size_t sent;              /* of pending */
    bool started;             /* a 2xx body began */
    bool done;                /* upstream ended and the call is settled */
    bool cut;                 /* upstream ended abnormally after it started */
    bool gone;                /* the client went away */
    int refs;                 /* the worker's and the response's */
    atomic_int cancel;        /* stops the upstream transfer */
    struct httpc_response up; /* the worker's until done, then read-only */
    int rc;                   /* httpc_stream's result */
    struct llm_call *call;    /* owned by the worker */
    enum llm_provider provider;
    struct llm_sse sse;          /* the worker's */
    bool strip;                  /* Chat: drop the usage-only chunk the gateway asked for */
    struct buf kept;             /* the worker's: what the filter passes on of a piece */
    struct MHD_Connection *conn; /* the client's, while the response is relayed */
    unsigned int idle_s;         /* its idle timeout before the stream, 0: unknown */
    bool settle_tried;           /* the worker's: the final usage arrived */
    bool settling;               /* the worker's: the settler thread charges the call */
    pthread_t settler;           /* the worker's: joined before the stream ends */
    struct llm_usage charged;    /* the usage the settler charges (fixed when it starts) */
};

static void relay_unref(struct relay *rl)
{
    bool last;

    pthread_mutex_lock(&rl->mu);
    last = --rl->refs == 0;
    pthread_mutex_unlock(&rl->mu);
    if (!last) {
        return;
    }
    buf_cleanup(&rl->pending);
    httpc_response_cleanup(&rl->up);
    llm_sse_cleanup(&rl->sse);
    buf_cleanup(&rl->kept);
    pthread_mutex_destroy(&rl->mu);
    pthread_cond_destroy(&rl->cv);
    free(rl);
}

/* Appends DATA[0..len) to what the client is sent; E_AGAIN once it went away. */
static int relay_push(struct relay *rl, const char *data, size_t len)
{
    int rc = E_OK;

    pthread_mutex_lock(&rl->mu);
    /* A slow client holds the upstream back rather than our memory filling up. */
    while (!rl->gone && rl->pending.len - rl->sent > LLM_RELAY_BUF_MAX) {
        pthread_cond_wait(&rl->cv, &rl->mu);
    }
    if (rl->gone) {
        rc = E_AGAIN;
    } else if (buf_append(&rl->pending, data, len) != E_OK) {
        rc = E_TOOBIG;
    }
    rl->started = true;
    pthread_cond_broadcast(&rl->cv);
    pthread_mutex_unlock(&rl->mu);
    return rc;
}

static bool same_usage(const struct llm_usage *a, const struct llm_usage *b)
{
    return a->input == b->input && a->output == b->output && a->cache_write == b->cache_write &&
           a->cache_read == b->cache_read && a->complete == b->complete;
}

static void *settle_thread(void *arg)
{
    struct relay *rl = arg;

    llm_call_settle(rl->call, &rl->charged);
    return NULL;
}

/* Starts the call's charge once its final usage arrived (Anthropic message_delta,
 * Responses response.completed, the Chat usage chunk, Gemini's final chunk): its commit
 * overlaps the relay of what follows instead of holding the end of the stream. What the
 * stream says of its usage after this is not charged again: the protocols end there. When
 * no thread can be started, the call is settled at its end as before. */
static void settle_early(struct relay *rl)
{
    pthread_attr_t attr;

    if (rl->settle_tried || !rl->sse.u.complete) {
        return;
    }
    rl->settle_tried = true;
    rl->charged = rl->sse.u;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256u << 10);
    rl->settling = pthread_create(&rl->settler, &attr, settle_thread, rl) == 0;
    pthread_attr_destroy(&attr);
}

static int on_chunk(const char *data, size_t len, void *userdata)
{
    struct relay *rl = userdata;
    int rc;

    if (!rl->strip) {
        llm_sse_feed(&rl->sse, data, len);
        rc = relay_push(rl, data, len);
    } else {
        /* Whole events only, so that the usage-only chunk is dropped however it was
         * split. */
        rl->kept.len = 0;
        if (llm_sse_relay(&rl->sse, data, len, &rl->kept) != E_OK) {
            return E_TOOBIG;
        }
        rc = relay_push(rl, rl->kept.data != NULL ? rl->kept.data : "", rl->kept.len);
    }
    settle_early(rl);
    return rc;
}

/* Ends C's charge: the settler's, joined, or C charged with the stream's usage (its
 * reservation when incomplete) when CHARGE, else released. */
static void relay_finish_call(struct relay *rl, struct llm_call *c, bool charge)
{
    if (rl->settling) {
        pthread_join(rl->settler, NULL);
        rl->settling = false;
        if (!same_usage(&rl->charged, &rl->sse.u)) {
            log_kv(LOG_WARN, "llm_usage_after_charge", "provider", llm_provider_name(rl->provider),
                   NULL);
        }
    } else if (charge) {
        llm_call_settle(c, &rl->sse.u); /* incomplete usage: the reservation */
    } else {
        llm_call_release(c);
    }
}

static void *relay_worker(void *arg)
{
    struct relay *rl = arg;
    struct llm_call *c = rl->call;
    struct httpc_request req = HTTPC_REQUEST_DEFAULTS;
    const char *hdrs[LLM_EXTRA_HEADERS + 3];
    struct llm_gateway *gw = c->gw;
    struct err err = {0};
    bool started, charge, before;

    build_request(&req, hdrs, c);
    req.timeout_ms = 0;
    req.tcp_keepalive = true;
    req.cancel = &rl->cancel;
    rl->rc = httpc_stream(&rl->up, &req, on_chunk, rl, &err);
    pthread_mutex_lock(&rl->mu);
    started = rl->started;
    pthread_mutex_unlock(&rl->mu);
    if (started && rl->strip) {
        /* An event the upstream never ended is passed on as it came. */
        rl->kept.len = 0;
        if (llm_sse_relay_end(&rl->sse, &rl->kept) == E_OK && rl->kept.len > 0) {
            relay_push(rl, rl->kept.data, rl->kept.len);
        }
    }
    charge =
        rl->settling || started || (rl->rc == E_OK && rl->up.status >= 200 && rl->up.status < 300);
    /* The stream ends once the call's reservation record is durable (a server dying now
     * charges it at its next start), its charge follows; without a record, once the
     * charge is durable. */
    before = charge && !llm_call_recorded(c);
    if (before) {
        relay_finish_call(rl, c, true);
    }
    mask_key(&rl->up.body, c);
    llm_call_ended(c);
    pthread_mutex_lock(&rl->mu);
    rl->cut = rl->rc != E_OK || !rl->sse.u.complete;
    rl->done = true;
    pthread_cond_broadcast(&rl->cv);
    pthread_mutex_unlock(&rl->mu);
    if (!before) {
        relay_finish_call(rl, c, charge);
    }
    rl->call = NULL;
    llm_call_free(c);
    relay_unref(rl);
    llm_gateway_idle_one(gw);
    return NULL;
}

static ssize_t relay_read(void *cls, uint64_t pos, char *out, size_t max)
{
    struct relay *rl = cls;
    ssize_t n;

    (void)pos;
    pthread_mutex_lock(&rl->mu);
    while (rl->sent == rl->pending.len && !rl->done) {
        pthread_cond_wait(&rl->cv, &rl->mu);
    }
    if (rl->sent < rl->pending.len) {
        size_t k = rl->pending.len - rl->sent;
        k = k < max ? k : max;
        memcpy(out, rl->pending.data + rl->sent, k);
        rl->sent += k;
        if (rl->sent == rl->pending.len) {
            rl->pending.len = rl->sent = 0;
        }
        pthread_cond_broadcast(&rl->cv);
        n = (ssize_t)k;
    } else {
        /* A stream cut upstream is cut for the client too (no final chunk). */
        n = rl->rc == E_OK ? MHD_CONTENT_READER_END_OF_STREAM : MHD_CONTENT_READER_END_WITH_ERROR;
    }
    pthread_mutex_unlock(&rl->mu);
    if (n < 0 && rl->idle_s > 0) {
        /* The stream ended: the listener's idle timeout again (this is the thread of the
         * connection, which is alive while MHD reads its response), counted from now. Set
         * over a timeout of 0, a timeout restarts its timer; else it counts from the last
         * byte sent, and a stream whose end came later than that (a slow upstream end or
         * charge) was closed before its final chunk. */
        MHD_set_connection_option(rl->conn, MHD_CONNECTION_OPTION_TIMEOUT, 0);
        MHD_set_connection_option(rl->conn, MHD_CONNECTION_OPTION_TIMEOUT, rl->idle_s);
    }
    return n;
}

static void relay_gone(void *cls)
{
    struct relay *rl = cls;

    pthread_mutex_lock(&rl->mu);
    rl->gone = true;
    atomic_store(&rl->cancel, 1);
    pthread_cond_broadcast(&rl->cv);
    pthread_mutex_unlock(&rl->mu);
    relay_unref(rl);
}

/* Answers R once the worker knows how upstream answered: a started 2xx stream is relayed,
 * anything else is sent whole. */
static int answer_stream(struct request *r, struct relay *rl)
{
    const union MHD_ConnectionInfo *ci;
    struct MHD_Response *resp;
    enum MHD_Result ret;
    bool started;

    pthread_mutex_lock(&rl->mu);
    while (!rl->started && !rl->done) {
        pthread_cond_wait(&rl->cv, &rl->mu);
    }
    started = rl->started;
    pthread_mutex_unlock(&rl->mu);
    if (!started) {
        /* The worker is done with up: it is read-only now. */
        int rc = rl->rc == E_OK ? send_upstream_answer(r, &rl->up) : unreachable(r, rl->provider);
        relay_unref(rl);
        return rc;
    }
    resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, relay_read, rl, relay_gone);
    if (resp == NULL) {
        relay_gone(rl);
        return MHD_NO;
    }
    pthread_mutex_lock(&rl->mu);
    add_pass_headers(resp, &rl->up);
    pthread_mutex_unlock(&rl->mu);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    ci = MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CONNECTION_TIMEOUT);
    rl->conn = r->conn;
    rl->idle_s = ci != NULL ? ci->connection_timeout : 0;
    MHD_set_connection_option(r->conn, MHD_CONNECTION_OPTION_TIMEOUT, LLM_STREAM_IDLE_TIMEOUT_S);
    http_guard_answering(r->conn);
    r->status = 200;
    ret = MHD_queue_response(r->conn, 200, resp);
    MHD_destroy_response(resp);
    return ret;
}

static int forward_stream(struct request *r, struct llm_call *c)
{
    struct relay *rl = xcalloc(1, sizeof(*rl));

    pthread_mutex_init(&rl->mu, NULL);
    pthread_cond_init(&rl->cv, NULL);
    buf_init(&rl->pending, 0);
    httpc_response_init(&rl->up);
    llm_sse_init(&rl->sse, c->dialect);
    buf_init(&rl->kept, 0);
    rl->strip = c->strip_usage_chunk;
    rl->refs = 2;
    rl->call = c;
    rl->provider = c->provider;
    if (llm_gateway_thread(c->gw, relay_worker, rl) != 0) {
        enum llm_provider rl_provider = c->provider;
        rl->call = NULL;
        rl->refs = 1;
        relay_unref(rl);
        llm_call_free(c);
        return llm_send_error(r, rl_provider, LLM_ERR_UNAVAILABLE,
                              "diverge: cannot start a stream; retry");
    }
    return answer_stream(r, rl);
}

int llm_forward(struct request *r, struct llm_call *c)
{
    llm_call_record(c); /* committed beside the upstream call, never before it */
    return c->stream ? forward_stream(r, c) : forward_whole(r, c);
}
