/* SPDX-License-Identifier: Apache-2.0 */
/* libcurl for the kube client. Not common/httpc: the API server needs what httpc does not
 * offer (a CA given as PEM bytes, insecure-skip-tls-verify, a bearer token re-read per
 * request, cancelling a long watch). Bodies are capped at KUBE_BODY_MAX; the token header
 * is wiped after each call. */
#include "kube/kube_int.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>
#include <jansson.h>

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static CURLcode g_init_rc = CURLE_OK;

static void global_init(void)
{
    g_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

struct xfer {
    CURL *curl;                      /* borrowed */
    struct buf *body;                /* borrowed; capped */
    const struct kube_http_req *req; /* borrowed */
    int abort_rc;                    /* E_* that made a callback stop the transfer */
};

static size_t on_body(char *data, size_t size, size_t nmemb, void *userdata)
{
    struct xfer *x = userdata;
    size_t n = size * nmemb;
    long status = 0;

    if (x->req->on_chunk != NULL) {
        curl_easy_getinfo(x->curl, CURLINFO_RESPONSE_CODE, &status);
        if (status >= 200 && status < 300) {
            int rc = x->req->on_chunk(data, n, x->req->userdata);
            if (rc != E_OK) {
                x->abort_rc = rc;
                return 0;
            }
            return n;
        }
    }
    if (buf_append(x->body, data, n) != E_OK) {
        x->abort_rc = E_TOOBIG;
        return 0;
    }
    return n;
}

static int on_progress(void *userdata, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                       curl_off_t ulnow)
{
    struct xfer *x = userdata;

    (void)dltotal;
    (void)dlnow;
    (void)ultotal;
    (void)ulnow;
    if (x->req->cancel != NULL && atomic_load(x->req->cancel) != 0) {
        x->abort_rc = E_AGAIN;
        return 1;
    }
    return 0;
}

static int map_curl_error(CURLcode cc, const char *detail, struct err *err)
{
    const char *msg = (detail != NULL && *detail != '\0') ? detail : curl_easy_strerror(cc);

    switch (cc) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
        return err_set(err, E_AGAIN, "kubernetes api: %s", msg);
    default:
        return err_set(err, E_FAIL, "kubernetes api: %s", msg);
    }
}

static int setup_tls(CURL *c, const struct kube_config *cfg)
{
    int bad = 0;

    if (cfg->insecure) {
        bad |= curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, 0L) != CURLE_OK;
        bad |= curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, 0L) != CURLE_OK;
    } else if (cfg->ca_data != NULL) {
        struct curl_blob blob = {.data = cfg->ca_data, .len = cfg->ca_len, .flags = CURL_BLOB_COPY};
        bad |= curl_easy_setopt(c, CURLOPT_CAINFO_BLOB, &blob) != CURLE_OK;
    } else if (cfg->ca_file != NULL) {
        bad |= curl_easy_setopt(c, CURLOPT_CAINFO, cfg->ca_file) != CURLE_OK;
    }
    return bad ? E_FAIL : E_OK;
}

static int setup(CURL *c, struct curl_slist *hdrs, struct kube_config *cfg,
                 const struct kube_http_req *req, struct xfer *x, char *errbuf)
{
    int bad = 0;

    bad |= curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf) != CURLE_OK;
    bad |= curl_easy_setopt(c, CURLOPT_URL, req->url) != CURLE_OK;
    bad |= curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https") != CURLE_OK;
    bad |= curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L) != CURLE_OK;
    bad |= curl_easy_setopt(c, CURLOPT_USERAGENT, "diverge-kube") != CURLE_OK;
    bad |= curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdrs) != CURLE_OK;
    bad |= curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, req->method) != CURLE_OK;
    bad |= curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, 5000L) != CURLE_OK;
    /* A watch may idle for minutes: keepalive notices a peer that vanished without a FIN. */
    bad |= curl_easy_setopt(c, CURLOPT_TCP_KEEPALIVE, 1L) != CURLE_OK;
    bad |= curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, req->timeout_ms) != CURLE_OK;
    bad |= curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body) != CURLE_OK;
    bad |= curl_easy_setopt(c, CURLOPT_WRITEDATA, x) != CURLE_OK;
    bad |= curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress) != CURLE_OK;
    bad |= curl_easy_setopt(c, CURLOPT_XFERINFODATA, x) != CURLE_OK;
    bad |= curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L) != CURLE_OK;
    if (req->body != NULL) {
        bad |=
            curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)req->body_len) != CURLE_OK;
        bad |= curl_easy_setopt(c, CURLOPT_POSTFIELDS, req->body) != CURLE_OK;
    }
    bad |= setup_tls(c, cfg) != E_OK;
    return bad ? E_FAIL : E_OK;
}

/* The request headers; the Authorization line is built in AUTH (wiped by the caller). */
static struct curl_slist *headers(const struct kube_http_req *req, struct buf *auth,
                                  const char *token, struct buf *ctype)
{
    struct curl_slist *h = curl_slist_append(NULL, "Expect:");

    h = curl_slist_append(h, "Accept: application/json");
    if (req->content_type != NULL) {
        (void)buf_printf(ctype, "Content-Type: %s", req->content_type);
        h = curl_slist_append(h, ctype->data);
    }
    if (token != NULL) {
        (void)buf_printf(auth, "Authorization: Bearer %s", token);
        h = curl_slist_append(h, auth->data);
    }
    if (h == NULL) {
        abort(); /* out of memory */
    }
    return h;
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

int kube_http_do(long *status_out, struct buf *body_out, struct kube_config *cfg,
                 const struct kube_http_req *req, struct err *err)
{
    struct xfer x = {.body = body_out, .req = req, .abort_rc = E_OK};
    struct curl_slist *hdrs = NULL;
    struct buf auth, ctype;
    char errbuf[CURL_ERROR_SIZE] = "";
    char *token = NULL;
    CURLcode cc;
    int rc;

    *status_out = 0;
    buf_init(&auth, 0);
    buf_init(&ctype, 512);
    body_out->max = KUBE_BODY_MAX;
    rc = kube_config_token_dup(&token, cfg, err);
    if (rc != E_OK) {
        return rc;
    }
    pthread_once(&g_once, global_init);
    if (g_init_rc != CURLE_OK) {
        rc = err_set(err, E_FAIL, "libcurl init: %s", curl_easy_strerror(g_init_rc));
        goto out;
    }
    x.curl = curl_easy_init();
    if (x.curl == NULL) {
        rc = err_set(err, E_FAIL, "libcurl: cannot create a handle");
        goto out;
    }
    hdrs = headers(req, &auth, token, &ctype);
    if (setup(x.curl, hdrs, cfg, req, &x, errbuf) != E_OK) {
        rc = err_set(err, E_FAIL, "libcurl rejected the request options");
        goto out;
    }
    cc = curl_easy_perform(x.curl);
    curl_easy_getinfo(x.curl, CURLINFO_RESPONSE_CODE, status_out);
    if (x.abort_rc == E_TOOBIG) {
        rc = err_set(err, E_TOOBIG, "kubernetes api: response over the size cap");
    } else if (x.abort_rc == E_AGAIN && req->cancel != NULL && atomic_load(req->cancel) != 0) {
        rc = err_set(err, E_AGAIN, "kubernetes api: request cancelled");
    } else if (x.abort_rc != E_OK) {
        rc = x.abort_rc;
    } else if (cc != CURLE_OK) {
        rc = map_curl_error(cc, errbuf, err);
    }
out:
    curl_slist_free_all(hdrs);
    if (x.curl != NULL) {
        curl_easy_cleanup(x.curl);
    }
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

/* Maps an HTTP status of the API server to our code. */
static int status_code(long status)
{
    switch (status) {
    case 400:
    case 422:
        return E_INVALID;
    case 401:
    case 403:
        return E_DENIED;
    case 404:
        return E_NOTFOUND;
    case 409:
        return E_CONFLICT;
    case 413:
        return E_TOOBIG;
    case 410:
    case 429:
        return E_AGAIN;
    default:
        return status >= 500 ? E_AGAIN : E_FAIL;
    }
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
