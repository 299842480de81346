/* SPDX-License-Identifier: Apache-2.0 */
/* libcurl behind common/httpc.h. One easy handle per call (a pooled one, reset, when the
 * request names a pool), global init once; bodies and headers land in capped buffers, so
 * a hostile or broken server cannot exhaust memory. */
#include "common/httpc.h"

#include <ctype.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <curl/curl.h>

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static CURLcode g_init_rc = CURLE_OK;

static void global_init(void)
{
    g_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

struct httpc_pool {
    pthread_mutex_t mu; /* guards idle, n */
    CURL **idle;        /* owned: handles no request uses, the last one warmest */
    size_t n, max;
};

struct httpc_pool *httpc_pool_new(size_t max_idle)
{
    struct httpc_pool *p = xcalloc(1, sizeof(*p));

    pthread_mutex_init(&p->mu, NULL);
    p->max = max_idle;
    p->idle = xcalloc(max_idle > 0 ? max_idle : 1, sizeof(*p->idle));
    return p;
}

void httpc_pool_free(struct httpc_pool *p)
{
    if (p == NULL) {
        return;
    }
    for (size_t i = 0; i < p->n; i++) {
        curl_easy_cleanup(p->idle[i]);
    }
    free(p->idle);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

/* A handle for one request: P's warmest idle one, else a new one. */
static CURL *handle_get(struct httpc_pool *p)
{
    CURL *c = NULL;

    if (p != NULL) {
        pthread_mutex_lock(&p->mu);
        if (p->n > 0) {
            c = p->idle[--p->n];
        }
        pthread_mutex_unlock(&p->mu);
        if (c != NULL) {
            return c;
        }
    }
    return curl_easy_init();
}

/* Gives C back to P with every option reset (no pointer into the finished request stays;
 * its connections, DNS and TLS session caches do), or closes it (P NULL or full). */
static void handle_put(struct httpc_pool *p, CURL *c)
{
    if (p != NULL) {
        curl_easy_reset(c);
        pthread_mutex_lock(&p->mu);
        if (p->n < p->max) {
            p->idle[p->n++] = c;
            c = NULL;
        }
        pthread_mutex_unlock(&p->mu);
    }
    if (c != NULL) {
        curl_easy_cleanup(c);
    }
}

/* Per-transfer state shared by the callbacks. */
struct xfer {
    CURL *curl;                  /* borrowed */
    struct httpc_response *resp; /* borrowed */
    size_t max_body;             /* 0: no cap */
    httpc_chunk_fn on_chunk;     /* NULL: collect everything */
    void *userdata;              /* for on_chunk */
    const atomic_int *cancel;    /* non-zero stops the transfer; or NULL */
    int abort_rc;                /* E_* that made a callback stop the transfer, else E_OK */
};

void httpc_response_init(struct httpc_response *r)
{
    r->status = 0;
    buf_init(&r->headers, 0);
    buf_init(&r->body, 0);
}

void httpc_response_cleanup(struct httpc_response *r)
{
    buf_cleanup(&r->headers);
    buf_cleanup(&r->body);
    r->status = 0;
}

const char *httpc_response_header(const struct httpc_response *r, const char *name)
{
    const char *p = r->headers.data, *end = p + r->headers.len;

    while (p != NULL && p < end) {
        const char *value = p + strlen(p) + 1;
        if (strcasecmp(p, name) == 0) {
            return value;
        }
        p = value + strlen(value) + 1;
    }
    return NULL;
}

static size_t on_header(char *data, size_t size, size_t nmemb, void *userdata)
{
    struct xfer *x = userdata;
    size_t n = size * nmemb, name_len, vstart, vend;
    const char *colon;

    /* A status line starts a new response (after 100 Continue or a proxy CONNECT): keep
     * only the final response's headers. */
    if (n >= 5 && memcmp(data, "HTTP/", 5) == 0) {
        x->resp->headers.len = 0;
        return n;
    }
    colon = memchr(data, ':', n);
    if (colon == NULL) {
        return n; /* the blank line ending the headers, or junk */
    }
    name_len = (size_t)(colon - data);
    vstart = name_len + 1;
    vend = n;
    while (vstart < vend && (data[vstart] == ' ' || data[vstart] == '\t')) {
        vstart++;
    }
    while (vend > vstart && isspace((unsigned char)data[vend - 1])) {
        vend--;
    }
    if (buf_append(&x->resp->headers, data, name_len) != E_OK ||
        buf_append(&x->resp->headers, "", 1) != E_OK ||
        buf_append(&x->resp->headers, data + vstart, vend - vstart) != E_OK ||
        buf_append(&x->resp->headers, "", 1) != E_OK) {
        x->abort_rc = E_TOOBIG;
        return 0;
    }
    return n;
}

static size_t on_body(char *data, size_t size, size_t nmemb, void *userdata)
{
    struct xfer *x = userdata;
    size_t n = size * nmemb;
    long status = 0;

    if (x->on_chunk != NULL) {
        curl_easy_getinfo(x->curl, CURLINFO_RESPONSE_CODE, &status);
        if (status >= 200 && status < 300) {
            int rc;
            x->resp->status = status; /* the chunk callback may look (a relay passes it on) */
            rc = x->on_chunk(data, n, x->userdata);
            if (rc != E_OK) {
                x->abort_rc = rc;
                return 0;
            }
            return n;
        }
    }
    if (x->max_body != 0 && (n > x->max_body || x->resp->body.len > x->max_body - n)) {
        x->abort_rc = E_TOOBIG;
        return 0;
    }
    if (buf_append(&x->resp->body, data, n) != E_OK) {
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
    if (x->cancel != NULL && atomic_load(x->cancel) != 0) {
        x->abort_rc = E_AGAIN;
        return 1;
    }
    return 0;
}

static bool method_ok(const char *m)
{
    if (m == NULL || *m == '\0' || strlen(m) > 16) {
        return false;
    }
    for (; *m != '\0'; m++) {
        if (*m < 'A' || *m > 'Z') {
            return false;
        }
    }
    return true;
}

static bool method_has_body(const char *m)
{
    return strcmp(m, "POST") == 0 || strcmp(m, "PUT") == 0 || strcmp(m, "PATCH") == 0;
}

/* Translates a failed transfer into our codes; the network-level failures that mean
 * "the server is not reachable right now" are E_AGAIN. */
static int map_curl_error(CURLcode cc, const char *detail, struct err *err)
{
    const char *msg = (detail != NULL && *detail != '\0') ? detail : curl_easy_strerror(cc);

    switch (cc) {
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
        return err_set(err, E_AGAIN, "%s", msg);
    case CURLE_URL_MALFORMAT:
    case CURLE_UNSUPPORTED_PROTOCOL:
        return err_set(err, E_INVALID, "%s", msg);
    default:
        return err_set(err, E_FAIL, "%s", msg);
    }
}

/* Whom to trust: nobody checked (insecure), PEM bytes, a PEM file, or the system's. */
static int setup_tls(CURL *c, const struct httpc_request *req)
{
    int bad = 0;

    if (req->insecure) {
        bad |= curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, 0L) != CURLE_OK;
        bad |= curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, 0L) != CURLE_OK;
    } else if (req->ca_data != NULL) {
        struct curl_blob blob = {
            .data = (void *)(uintptr_t)req->ca_data, .len = req->ca_len, .flags = CURL_BLOB_COPY};
        bad |= curl_easy_setopt(c, CURLOPT_CAINFO_BLOB, &blob) != CURLE_OK;
    } else if (req->ca_file != NULL) {
        bad |= curl_easy_setopt(c, CURLOPT_CAINFO, req->ca_file) != CURLE_OK;
    }
    return bad ? E_FAIL : E_OK;
}

/* The optional parts of the transfer: keepalive, cancelling, a unix socket. */
static int setup_extras(CURL *c, const struct httpc_request *req, struct xfer *x)
{
    int bad = 0;

    if (req->tcp_keepalive) {
        bad |= curl_easy_setopt(c, CURLOPT_TCP_KEEPALIVE, 1L) != CURLE_OK;
    }
    if (req->cancel != NULL) {
        bad |= curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress) != CURLE_OK;
        bad |= curl_easy_setopt(c, CURLOPT_XFERINFODATA, x) != CURLE_OK;
        bad |= curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L) != CURLE_OK;
    }
    if (req->unix_socket != NULL) {
        bad |= curl_easy_setopt(c, CURLOPT_UNIX_SOCKET_PATH, req->unix_socket) != CURLE_OK;
    }
    return bad ? E_FAIL : E_OK;
}

static int setup(CURL *c, struct curl_slist **hdrs_out, const struct httpc_request *req,
                 struct xfer *x, char *errbuf)
{
    int bad = 0;

    *hdrs_out = NULL;
    /* Never let a caller's headers pick up curl's "Expect: 100-continue" delay. */
    *hdrs_out = curl_slist_append(*hdrs_out, "Expect:");
    for (size_t i = 0; req->headers != NULL && req->headers[i] != NULL; i++) {
        *hdrs_out = curl_slist_append(*hdrs_out, req->headers[i]);
    }
    if (*hdrs_out == NULL) {
        abort(); /* out of memory */
    }
    bad |= curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf) != CURLE_OK;
    bad |= curl_easy_setopt(c, CURLOPT_URL, req->url) != CURLE_OK;
    bad |= curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https") != CURLE_OK;
    bad |= curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L) != CURLE_OK;
    bad |=
        curl_easy_setopt(c, CURLOPT_USERAGENT,
                         req->user_agent != NULL ? req->user_agent : HTTPC_USER_AGENT) != CURLE_OK;
    bad |= curl_easy_setopt(c, CURLOPT_HTTPHEADER, *hdrs_out) != CURLE_OK;
    bad |= curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, req->method) != CURLE_OK;
    bad |= curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, req->connect_timeout_ms) != CURLE_OK;
    bad |= curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, req->timeout_ms) != CURLE_OK;
    bad |= curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header) != CURLE_OK;
    bad |= curl_easy_setopt(c, CURLOPT_HEADERDATA, x) != CURLE_OK;
    bad |= curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body) != CURLE_OK;
    bad |= curl_easy_setopt(c, CURLOPT_WRITEDATA, x) != CURLE_OK;
    if (strcmp(req->method, "HEAD") == 0) {
        bad |= curl_easy_setopt(c, CURLOPT_NOBODY, 1L) != CURLE_OK;
    }
    /* With POSTFIELDS set (even to "") curl never reads a body from stdin. */
    if (req->body != NULL || method_has_body(req->method)) {
        const char *body = req->body != NULL ? req->body : "";
        bad |=
            curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)req->body_len) != CURLE_OK;
        bad |= curl_easy_setopt(c, CURLOPT_POSTFIELDS, body) != CURLE_OK;
    }
    bad |= setup_tls(c, req) != E_OK;
    bad |= setup_extras(c, req, x) != E_OK;
    return bad ? E_FAIL : E_OK;
}

static int perform(struct httpc_response *out, const struct httpc_request *req,
                   httpc_chunk_fn on_chunk, void *userdata, struct err *err)
{
    struct xfer x = {.resp = out,
                     .max_body = req->max_body,
                     .on_chunk = on_chunk,
                     .userdata = userdata,
                     .cancel = req->cancel,
                     .abort_rc = E_OK};
    struct curl_slist *hdrs = NULL;
    char errbuf[CURL_ERROR_SIZE] = "";
    CURLcode cc;
    int rc = E_OK;

    httpc_response_init(out);
    out->headers.max = req->max_headers;
    if (req->url == NULL || !method_ok(req->method)) {
        return err_set(err, E_INVALID, "malformed request method or url");
    }
    pthread_once(&g_once, global_init);
    if (g_init_rc != CURLE_OK) {
        return err_set(err, E_FAIL, "libcurl init: %s", curl_easy_strerror(g_init_rc));
    }
    x.curl = handle_get(req->pool);
    if (x.curl == NULL) {
        return err_set(err, E_FAIL, "libcurl: cannot create a handle");
    }
    if (setup(x.curl, &hdrs, req, &x, errbuf) != E_OK) {
        rc = err_set(err, E_INVALID, "libcurl rejected the request options");
        goto out;
    }
    cc = curl_easy_perform(x.curl);
    curl_easy_getinfo(x.curl, CURLINFO_RESPONSE_CODE, &out->status);
    if (x.abort_rc == E_TOOBIG) {
        rc = err_set(err, E_TOOBIG, "response over the size cap");
    } else if (x.abort_rc == E_AGAIN && x.cancel != NULL && atomic_load(x.cancel) != 0) {
        rc = err_set(err, E_AGAIN, "request cancelled");
    } else if (x.abort_rc != E_OK) {
        rc = x.abort_rc;
    } else if (cc != CURLE_OK) {
        rc = map_curl_error(cc, errbuf, err);
    }
out:
    curl_slist_free_all(hdrs);
    handle_put(req->pool, x.curl);
    return rc;
}

int httpc_request(struct httpc_response *out, const struct httpc_request *req, struct err *err)
{
    return perform(out, req, NULL, NULL, err);
}

int httpc_stream(struct httpc_response *out, const struct httpc_request *req,
                 httpc_chunk_fn on_chunk, void *userdata, struct err *err)
{
    ASSERT(on_chunk != NULL);
    return perform(out, req, on_chunk, userdata, err);
}

char *httpc_escape(const char *s)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t n = strlen(s), j = 0;
    char *o = xmalloc(n * 3 + 1);

    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
            ch == '-' || ch == '.' || ch == '_' || ch == '~') {
            o[j++] = (char)ch;
        } else {
            o[j++] = '%';
            o[j++] = hex[ch >> 4];
            o[j++] = hex[ch & 15];
        }
    }
    o[j] = '\0';
    return o;
}

int httpc_status_err(long status)
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
    default:
        return E_FAIL;
    }
}
