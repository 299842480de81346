/* SPDX-License-Identifier: Apache-2.0 */
/* The kube client's requests over common/httpc: the API server's headers (JSON, a bearer
 * token re-read per request), its TLS settings (a CA given as PEM bytes or a file,
 * insecure-skip-tls-verify) and its error answers. Bodies are capped at KUBE_BODY_MAX; the
 * token header is wiped after each call. */
#include "kube/kube_int.h"

#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/httpc.h"

/* The request headers; the Authorization line is built in AUTH (wiped by the caller).
 * LINES has room for four entries and ends NULL. */
static void headers(const char *lines[4], const struct kube_http_req *req, struct buf *auth,
                    const char *token, struct buf *ctype)
{
    size_t n = 0;

    lines[n++] = "Accept: application/json";
    if (req->content_type != NULL) {
        (void)buf_printf(ctype, "Content-Type: %s", req->content_type);
        lines[n++] = ctype->data;
    }
    if (token != NULL) {
        (void)buf_printf(auth, "Authorization: Bearer %s", token);
        lines[n++] = auth->data;
    }
    lines[n] = NULL;
}

static void wipe_buf(struct buf *b)
{
    if (b->data != NULL) {
        volatile char *p = b->data;
        for (size_t i = 0; i < b->cap; i++) {
            p[i] = 0;
        }
    }
    buf_cleanup(b);
}

/* REQ for CFG's server as an httpc request whose header lines are LINES. */
static void build(struct httpc_request *hr, const struct kube_config *cfg,
                  const struct kube_http_req *req, const char *const *lines)
{
    hr->method = req->method;
    hr->url = req->url;
    hr->headers = lines;
    hr->body = req->body;
    hr->body_len = req->body_len;
    hr->timeout_ms = req->timeout_ms;
    hr->max_body = KUBE_BODY_MAX;
    hr->user_agent = "diverge-kube";
    /* A watch may idle for minutes: keepalive notices a peer that vanished without a FIN. */
    hr->tcp_keepalive = true;
    hr->cancel = req->cancel;
    hr->insecure = cfg->insecure;
    hr->ca_data = cfg->ca_data;
    hr->ca_len = cfg->ca_len;
    hr->ca_file = cfg->ca_file;
}

int kube_http_do(long *status_out, struct buf *body_out, struct kube_config *cfg,
                 const struct kube_http_req *req, struct err *err)
{
    struct httpc_request hr = HTTPC_REQUEST_DEFAULTS;
    struct httpc_response resp;
    struct err herr = {0};
    const char *lines[4];
    struct buf auth, ctype;
    char *token = NULL;
    int rc;

    *status_out = 0;
    buf_init(&auth, 0);
    buf_init(&ctype, 512);
    httpc_response_init(&resp);
    rc = kube_config_token_dup(&token, cfg, err);
    if (rc != E_OK) {
        return rc;
    }
    headers(lines, req, &auth, token, &ctype);
    build(&hr, cfg, req, lines);
    if (req->on_chunk != NULL) {
        rc = httpc_stream(&resp, &hr, req->on_chunk, req->userdata, &herr);
    } else {
        rc = httpc_request(&resp, &hr, &herr);
    }
    *status_out = resp.status;
    /* The body moves to the caller's buffer, keeping its cap. */
    buf_cleanup(body_out);
    *body_out = resp.body;
    body_out->max = KUBE_BODY_MAX;
    buf_init(&resp.body, 0);
    /* httpc leaves HERR alone when the chunk callback stopped the transfer: that callback
     * has said why in ERR already. A request kube built that httpc calls malformed is ours
     * to fail, not the caller's to fix. */
    if (rc != E_OK && herr.code != E_OK) {
        rc = err_set(err, rc == E_INVALID ? E_FAIL : rc, "kubernetes api: %s", herr.msg);
    }
    httpc_response_cleanup(&resp);
    wipe_buf(&auth);
    buf_cleanup(&ctype);
    if (token != NULL) {
        volatile char *p = token;
        for (size_t i = 0; p[i] != '\0'; i++) {
            p[i] = 0;
        }
        free(token);
    }
    return rc;
}

/* Maps an HTTP status of the API server to our code: what a watch or a write retries
 * (410 Gone, 429, 5xx) is E_AGAIN, a body over the server's limit E_TOOBIG. */
static int status_code(long status)
{
    if (status == 413) {
        return E_TOOBIG;
    }
    if (status == 410 || status == 429 || status >= 500) {
        return E_AGAIN;
    }
    return httpc_status_err(status);
}

int kube_status_error(long status, const struct buf *body, const char *what, struct err *err)
{
    int code = status_code(status);
    json_t *st = NULL;
    const char *reason = NULL, *message = NULL;
    char safe[256];

    if (body->data != NULL && kube_parse_object(&st, body->data, body->len, NULL) == E_OK &&
        json_is_string(json_object_get(st, "kind")) &&
        strcmp(json_string_value(json_object_get(st, "kind")), "Status") == 0) {
        reason = json_string_value(json_object_get(st, "reason"));
        message = json_string_value(json_object_get(st, "message"));
    }
    if (reason == NULL || *reason == '\0') {
        reason = "HTTP error";
    }
    /* The message comes from the server: keep it to valid UTF-8, one line, cut short. */
    safe[0] = '\0';
    if (message != NULL) {
        err_utf8_copy(safe, sizeof(safe), message, strlen(message));
        for (char *p = safe; *p != '\0'; p++) {
            if ((unsigned char)*p < 0x20) {
                *p = ' ';
            }
        }
    }
    char r[64];
    err_utf8_copy(r, sizeof(r), reason, strlen(reason));
    for (char *p = r; *p != '\0'; p++) {
        if ((unsigned char)*p < 0x20) {
            *p = ' ';
        }
    }
    code = err_set(err, code, "%s: %s (%ld): %s", what, r, status, safe);
    json_decref(st);
    return code;
}

int kube_parse_object(json_t **out, const char *body, size_t len, struct err *err)
{
    json_error_t je;

    *out = NULL;
    *out = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (*out == NULL) {
        return err_set(err, E_FAIL, "kubernetes api: malformed json at byte %d", je.position);
    }
    if (!json_is_object(*out)) {
        json_decref(*out);
        *out = NULL;
        return err_set(err, E_FAIL, "kubernetes api: response is not a json object");
    }
    return E_OK;
}
