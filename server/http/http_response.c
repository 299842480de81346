/* SPDX-License-Identifier: Apache-2.0 */
/* Response helpers and request accessors of the HTTP server: JSON and text responses,
 * errors through the one code-to-status table, query, headers and the JSON body. A body
 * that cannot be built is answered with a fixed 500, never an abort. */
#include <microhttpd.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/log.h"
#include "server/http/http_int.h"

/* --- responses ------------------------------------------------------------------- */

/* Sent when an error or JSON body cannot be built (never an abort: the input that got us
 * here may well be hostile). A metav1.Status that also carries "error", so both kinds of
 * client read it. */
static const char g_internal_body[] =
    "{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"metadata\":{},\"status\":\"Failure\","
    "\"message\":\"internal error: the response could not be built\",\"reason\":"
    "\"InternalError\",\"code\":500,\"error\":\"internal error: the response could not be "
    "built\"}\n";

static int queue(struct request *r, int status, struct MHD_Response *resp)
{
    enum MHD_Result ret;

    if (resp == NULL) {
        return MHD_NO; /* MHD is out of memory: drop the connection */
    }
    http_guard_answering(r->conn);
    r->status = status;
    ret = MHD_queue_response(r->conn, (unsigned int)status, resp);
    MHD_destroy_response(resp);
    return ret;
}

int http_send_text(struct request *r, int status, const char *content_type, const char *text)
{
    struct MHD_Response *resp = MHD_create_response_from_buffer(
        strlen(text), (void *)(uintptr_t)text, MHD_RESPMEM_MUST_COPY);

    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    return queue(r, status, resp);
}

int http_send_text_take(struct request *r, int status, const char *content_type, char *text,
                        size_t len)
{
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);

    if (resp == NULL) {
        free(text);
    } else {
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    }
    return queue(r, status, resp);
}

/* Large bodies (a list of 10,000 tasks is ~7 MB) are written into memory kept from the
 * last ones: fresh memory faults every page in as it is first written, and with creates
 * running beside a list those faults (and the copies of a growing buffer) were half of its
 * time (bench/RESULTS.md). A few are kept for the process, each up to HTTP_BODY_KEEP_MAX;
 * others are freed once sent, as before. */
#define HTTP_BODIES_KEPT 2
#define HTTP_BODY_KEEP_MAX ((size_t)64 << 20)

static pthread_mutex_t g_bodies_mu = PTHREAD_MUTEX_INITIALIZER;
static struct buf g_bodies[HTTP_BODIES_KEPT];
static size_t g_n_bodies;

void http_body_init(struct buf *out)
{
    buf_init(out, 0);
    pthread_mutex_lock(&g_bodies_mu);
    if (g_n_bodies > 0) {
        *out = g_bodies[--g_n_bodies];
    }
    pthread_mutex_unlock(&g_bodies_mu);
    out->len = 0;
    if (out->data != NULL) {
        out->data[0] = '\0';
    }
}

/* MHD's free callback of a body sent by http_send_body: its memory is kept, or freed. */
static void body_done(void *cls)
{
    struct buf *b = cls;

    pthread_mutex_lock(&g_bodies_mu);
    if (g_n_bodies < HTTP_BODIES_KEPT && b->data != NULL && b->cap <= HTTP_BODY_KEEP_MAX) {
        g_bodies[g_n_bodies++] = *b;
        buf_init(b, 0);
    }
    pthread_mutex_unlock(&g_bodies_mu);
    buf_cleanup(b);
    free(b);
}

int http_send_body(struct request *r, int status, const char *content_type, struct buf *body)
{
    struct buf *sent = xmalloc(sizeof(*sent));
    struct MHD_Response *resp;

    *sent = *body;
    buf_init(body, 0);
    if (sent->data == NULL) {
        (void)buf_puts(sent, ""); /* MHD wants a buffer, even for no bytes */
    }
    resp = MHD_create_response_from_buffer_with_free_callback_cls(sent->len, sent->data, body_done,
                                                                  sent);
    if (resp == NULL) {
        body_done(sent);
    } else {
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    }
    return queue(r, status, resp);
}

int http_send_json(struct request *r, int status, json_t *body)
{
    char *text = body != NULL ? json_dumps(body, JSON_COMPACT) : NULL;
    struct MHD_Response *resp;
    size_t n;

    json_decref(body);
    if (text == NULL) {
        /* json_pack refused a value (not UTF-8, say) or memory ran out. */
        log_kv(LOG_ERROR, "response_build_failed", "route", http_route_name(r->srv, r->route),
               NULL);
        resp = MHD_create_response_from_buffer(
            strlen(g_internal_body), (void *)(uintptr_t)g_internal_body, MHD_RESPMEM_PERSISTENT);
        if (resp != NULL) {
            MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
        }
        return queue(r, 500, resp);
    }
    n = strlen(text);
    text[n] = '\0';
    /* Newline-terminated like kubectl output, so curl output reads well. */
    text = xrealloc(text, n + 2);
    text[n] = '\n';
    text[n + 1] = '\0';
    resp = MHD_create_response_from_buffer(n + 1, text, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    return queue(r, status, resp);
}

int http_status_of(int code)
{
    static const struct {
        int code;
        int status;
    } table[] = {
        {E_INVALID, 422}, {E_NOTFOUND, 404}, {E_CONFLICT, 409}, {E_DENIED, 401},
        {E_TOOBIG, 413},  {E_AGAIN, 503},    {E_FAIL, 500},
    };
    for (size_t i = 0; i < ARRAY_LEN(table); i++) {
        if (table[i].code == code) {
            return table[i].status;
        }
    }
    return 500;
}

static const char *reason_of(int status)
{
    static const struct {
        int status;
        const char *reason;
    } table[] = {
        {400, "BadRequest"}, {401, "Unauthorized"},          {403, "Forbidden"},
        {404, "NotFound"},   {405, "MethodNotAllowed"},      {409, "Conflict"},
        {410, "Expired"},    {413, "RequestEntityTooLarge"}, {415, "UnsupportedMediaType"},
        {422, "Invalid"},    {429, "TooManyRequests"},       {503, "ServiceUnavailable"},
    };
    for (size_t i = 0; i < ARRAY_LEN(table); i++) {
        if (table[i].status == status) {
            return table[i].reason;
        }
    }
    return "InternalError";
}

/* The name of the object a request is about: the {name} of its path, else the body's
 * metadata.name (create), else "" (also when it is not a DNS label: request bytes are
 * never echoed). Caller frees. */
static char *request_object_name(const struct request *r)
{
    const char *n = r->params[1];
    json_t *body;
    char *out;

    if (n != NULL || r->body.len == 0) {
        return xstrdup(n != NULL && task_name_valid(n) ? n : "");
    }
    body = json_loadb(r->body.data, r->body.len, 0, NULL);
    n = json_string_value(json_object_get(json_object_get(body, "metadata"), "name"));
    out = xstrdup(n != NULL && task_name_valid(n) ? n : "");
    json_decref(body);
    return out;
}

int http_send_error(struct request *r, int status, const char *reason, const struct err *err,
                    const char *fmt, ...)
{
    char msg[ERR_MSG_MAX];
    va_list ap;
    json_t *body;

    va_start(ap, fmt);
    /* Valid UTF-8 cut on a character boundary, whatever went into the format. */
    err_vformat(msg, fmt, ap);
    va_end(ap);
    if (reason == NULL) {
        reason = reason_of(status);
    }
    if (!r->kube_errors) {
        return http_send_json(r, status, json_pack("{s:s, s:s}", "error", msg, "reason", reason));
    }
    body = json_pack("{s:s, s:s, s:{}, s:s, s:s, s:s, s:i, s:s}", "kind", "Status", "apiVersion",
                     "v1", "metadata", "status", "Failure", "message", msg, "reason", reason,
                     "code", status, "error", msg);
    if (body != NULL && err != NULL && err->field[0] != '\0') {
        /* kubectl prints `The <kind> "<name>" is invalid: <field>: <message>` from these. */
        size_t fl = strlen(err->field);
        const char *m =
            strncmp(err->msg, err->field, fl) == 0 && strncmp(err->msg + fl, ": ", 2) == 0
                ? err->msg + fl + 2
                : err->msg;
        char *name = request_object_name(r);
        json_object_set_new(
            body, "details",
            json_pack("{s:s, s:s, s:s, s:[{s:s, s:s, s:s}]}", "name", name, "group",
                      "divergedev.com", "kind",
                      strstr(r->url, "/spendquotas") != NULL ? "SpendQuota" : "AgentTask", "causes",
                      "reason", "FieldValueInvalid", "message", m, "field", err->field));
        free(name);
    }
    return http_send_json(r, status, body);
}

int http_send_err(struct request *r, const struct err *err)
{
    int status = http_status_of(err->code);
    const char *reason = NULL;

    if (err->code == E_CONFLICT && strstr(err->msg, "already exists") != NULL) {
        reason = "AlreadyExists";
    }
    if (status >= 500) {
        log_kv(LOG_ERROR, "internal_error", "path", r->url, "error", err->msg, NULL);
    }
    return http_send_error(r, status, reason, err, "%s", err->msg);
}

const char *http_query(struct request *r, const char *key)
{
    return MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, key);
}

struct header_count {
    const char *key;
    int n;
};

static enum MHD_Result count_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                    const char *value)
{
    struct header_count *hc = cls;

    (void)kind;
    (void)value;
    if (strcasecmp(key, hc->key) == 0) {
        hc->n++;
    }
    return MHD_YES;
}

int http_header_count(struct request *r, const char *key)
{
    struct header_count hc = {.key = key, .n = 0};

    MHD_get_connection_values(r->conn, MHD_HEADER_KIND, count_header, &hc);
    return hc.n;
}

static enum MHD_Result count_query(void *cls, enum MHD_ValueKind kind, const char *key,
                                   const char *value)
{
    struct header_count *hc = cls;

    (void)kind;
    (void)value;
    if (strcmp(key, hc->key) == 0) {
        hc->n++;
    }
    return MHD_YES;
}

int http_query_count(struct request *r, const char *key)
{
    struct header_count hc = {.key = key, .n = 0};

    MHD_get_connection_values(r->conn, MHD_GET_ARGUMENT_KIND, count_query, &hc);
    return hc.n;
}

const char *http_header(struct request *r, const char *key)
{
    return MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, key);
}

bool http_query_true(struct request *r, const char *key)
{
    const char *v = http_query(r, key);
    return v != NULL && (strcmp(v, "true") == 0 || strcmp(v, "1") == 0);
}

json_t *http_body_json(struct request *r, int *mhd_ret_out)
{
    json_error_t jerr;
    json_t *j;

    if (r->body.len == 0) {
        *mhd_ret_out = http_send_error(r, 400, NULL, NULL, "request body is empty");
        return NULL;
    }
    j = json_loadb(r->body.data, r->body.len, JSON_REJECT_DUPLICATES, &jerr);
    if (j == NULL) {
        *mhd_ret_out = http_send_error(r, 400, NULL, NULL, "invalid JSON at line %d column %d: %s",
                                       jerr.line, jerr.column, jerr.text);
    }
    return j;
}

int http_send_stream(struct request *r, int status, const char *content_type, http_stream_fn read,
                     void *cls, void (*free_cls)(void *))
{
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, (MHD_ContentReaderCallback)read,
                                          cls, (MHD_ContentReaderFreeCallback)free_cls);

    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    return queue(r, status, resp);
}
