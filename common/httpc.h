/* SPDX-License-Identifier: Apache-2.0 */
/* A small blocking HTTP client over libcurl (the only file that includes curl.h): the one
 * HTTP client of the project (SCM REST clients, the kube client, the CLI, the runner). Every
 * response body is capped; "cannot connect" (E_AGAIN) is told apart from an HTTP error
 * status, which is a successful exchange whose status the caller inspects. */
#ifndef DIVERGE_COMMON_HTTPC_H
#define DIVERGE_COMMON_HTTPC_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include "common/buf.h"
#include "common/err.h"
#include "common/version.h"

#define HTTPC_USER_AGENT "diverge/" DIVERGE_VERSION

/* Kept-alive connections for requests that name the pool: idle libcurl handles, each
 * with the connections (and DNS answers, TLS sessions) of its earlier requests, so a
 * request to the same host skips a new TCP (and TLS) handshake. A handle is used by one
 * request at a time (libcurl does not support one connection cache shared by threads at
 * once). Thread-safe. */
struct httpc_pool;

/* A pool keeping at most MAX_IDLE idle handles (a handle beyond that is closed). */
struct httpc_pool *httpc_pool_new(size_t max_idle);
/* Closes every idle handle; call it once no request uses P. NULL is a no-op. */
void httpc_pool_free(struct httpc_pool *p);

/* One request. Build it from HTTPC_REQUEST_DEFAULTS and set what differs. */
struct httpc_request {
    const char *method;         /* "GET", "POST", "PATCH", ...; borrowed */
    const char *url;            /* http:// or https:// only; borrowed */
    const char *const *headers; /* NULL-terminated "Name: value" lines, or NULL; borrowed */
    const char *body;           /* request body or NULL; borrowed */
    size_t body_len;            /* bytes of body */
    long connect_timeout_ms;    /* limit on connecting; 0: libcurl's default */
    long timeout_ms;            /* limit on the whole exchange; 0: none (streams) */
    size_t max_body;            /* cap on the collected response body, bytes; 0: none */
    size_t max_headers;         /* cap on the kept response headers, bytes; 0: none */
    const char *ca_file;        /* PEM bundle to trust instead of the system's, or NULL */
    const char *ca_data;        /* PEM bytes to trust instead of the system's (takes
                                   precedence over ca_file), or NULL; borrowed */
    size_t ca_len;              /* bytes of ca_data */
    bool insecure;              /* no peer or host verification at all (kubeconfig's
                                   insecure-skip-tls-verify, tests); overrides the CA */
    const char *unix_socket;    /* connect to this unix socket path instead of the URL's
                                   host and port (HTTP only), or NULL; borrowed */
    const char *user_agent;     /* User-Agent; NULL: HTTPC_USER_AGENT; borrowed */
    bool tcp_keepalive;         /* TCP keepalive probes (long idle streams notice a peer
                                   that vanished without a FIN) */
    const atomic_int *cancel;   /* checked as the transfer progresses (about once a second
                                   when idle); non-zero stops it with E_AGAIN; or NULL */
    struct httpc_pool *pool;    /* reuse a kept-alive connection from it, or NULL: a
                                   connection of this request's own; borrowed */
};

#define HTTPC_REQUEST_DEFAULTS                                                                     \
    {                                                                                              \
        .method = "GET", .url = NULL, .headers = NULL, .body = NULL, .body_len = 0,                \
        .connect_timeout_ms = 5000, .timeout_ms = 30000, .max_body = 8u << 20,                     \
        .max_headers = 64u << 10, .ca_file = NULL, .ca_data = NULL, .ca_len = 0,                   \
        .insecure = false, .unix_socket = NULL, .user_agent = NULL, .tcp_keepalive = false,        \
        .cancel = NULL, .pool = NULL                                                               \
    }

/* What came back. Caller storage: httpc_response_init() before use (the request
 * functions do it), httpc_response_cleanup() after. */
struct httpc_response {
    long status;        /* HTTP status of the final response, 0 when none arrived */
    struct buf headers; /* owned; the final response's headers as "name\0value\0" pairs */
    struct buf body;    /* owned; the body (for httpc_stream only a non-2xx body) */
};

/* Prepares R: status 0, empty buffers without caps. */
void httpc_response_init(struct httpc_response *r);
/* Releases R's memory; safe on an initialised or zeroed response. */
void httpc_response_cleanup(struct httpc_response *r);

/* Value of the response header NAME (case-insensitive), borrowed from R, or NULL. With
 * repeated headers the first one wins. */
const char *httpc_response_header(const struct httpc_response *r, const char *name);

/* Performs REQ and fills *OUT (initialised here; the caller cleans it up even on error).
 * Any HTTP status, 4xx and 5xx included, returns E_OK. Errors:
 *   E_AGAIN   the server could not be reached: name resolution, refused or timed-out
 *             connect, TLS handshake, connection dropped, the timeout expired, or
 *             REQ->cancel was set (err->msg "request cancelled");
 *   E_TOOBIG  the body or headers went over their caps;
 *   E_INVALID the URL or method is malformed or not http(s);
 *   E_FAIL    anything else.
 * Thread-safe: libcurl's global init runs once (pthread_once); each call has its own
 * handle. Never sends or follows redirects, never uses signals. */
int httpc_request(struct httpc_response *out, const struct httpc_request *req, struct err *err);

/* Called with each piece of a streamed 2xx body as it arrives. A non-zero return (an
 * E_* code) stops the transfer and becomes httpc_stream's result. */
typedef int (*httpc_chunk_fn)(const char *data, size_t len, void *userdata);

/* As httpc_request, but a 2xx body is handed to ON_CHUNK piece by piece instead of
 * being collected (so REQ->max_body does not limit it); a non-2xx body is collected in
 * OUT->body as usual so the caller can report it. When ON_CHUNK runs, OUT->status and
 * OUT->headers already hold the response's status and headers. Use REQ->timeout_ms = 0
 * for watches. */
int httpc_stream(struct httpc_response *out, const struct httpc_request *req,
                 httpc_chunk_fn on_chunk, void *userdata, struct err *err);

/* Percent-encodes S for use as one URL path segment or query value (RFC 3986: every
 * byte outside ALPHA / DIGIT / "-._~" becomes %XX). Caller frees with free(). */
char *httpc_escape(const char *s);

/* Our code for an HTTP error STATUS a server answered: 400 and 422 E_INVALID, 401 and 403
 * E_DENIED, 404 E_NOTFOUND, 409 E_CONFLICT, anything else E_FAIL (a caller that retries
 * maps its retryable statuses first). */
int httpc_status_err(long status);

#endif
