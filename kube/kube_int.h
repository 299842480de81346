/* SPDX-License-Identifier: Apache-2.0 */
/* Declarations shared by the kube/ sources only: the config's fields and the request
 * helper over common/httpc. Nothing outside kube/ includes this. */
#ifndef DIVERGE_KUBE_KUBE_INT_H
#define DIVERGE_KUBE_KUBE_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/stat.h>

#include "common/buf.h"
#include "common/httpc.h"
#include "kube/kube.h"

struct kube_config {
    char *server;         /* owned; "https://host:port", no trailing slash */
    char *ns;             /* owned; default namespace */
    char *ca_file;        /* owned; PEM file to trust, or NULL */
    char *ca_data;        /* owned; PEM bytes to trust (decoded), or NULL */
    size_t ca_len;        /* bytes of ca_data */
    bool insecure;        /* insecure-skip-tls-verify: no peer or host check */
    char *token;          /* owned; static bearer token, or NULL; wiped on free */
    char *token_file;     /* owned; file holding the token (re-read on change), or NULL */
    pthread_mutex_t mu;   /* guards the two fields below */
    struct stat token_st; /* stat of token_file when token_cache was read */
    char *token_cache;    /* owned; token_file's last contents, or NULL; wiped on free */
};

/* An empty config (namespace "default"), for the loaders. */
struct kube_config *kube_config_new_empty(void);

/* Reads the whole file PATH (at most MAX bytes) into *out (NUL-terminated, caller frees)
 * and its length into *len_out. E_NOTFOUND, E_TOOBIG, E_FAIL. */
int kube_read_file(char **out, size_t *len_out, const char *path, size_t max, struct err *err);

struct kube_http_req {
    const char *method;       /* "GET", "PUT", ... */
    const char *url;          /* full URL; borrowed */
    const char *content_type; /* of BODY, or NULL */
    const char *body;         /* or NULL */
    size_t body_len;          /* bytes of body */
    long timeout_ms;          /* whole exchange; 0: none (watches) */
    httpc_chunk_fn on_chunk;  /* each piece of a 2xx body as it arrives; non-zero stops the
                                 transfer and becomes kube_http_do's result. NULL: collect
                                 the body into *body_out */
    void *userdata;           /* for on_chunk */
    const atomic_int *cancel; /* non-zero aborts the transfer (E_AGAIN); or NULL */
};

/* Performs REQ against CFG's server with its token and TLS settings, over common/httpc.
 * *status_out is the HTTP status (0 when none); BODY_OUT (caller's, initialised; its contents
 * are replaced, capped at KUBE_BODY_MAX) receives the body (only a non-2xx one when
 * streaming). Errors: E_AGAIN (unreachable, dropped, timed out, cancelled), E_TOOBIG,
 * E_FAIL. */
int kube_http_do(long *status_out, struct buf *body_out, struct kube_config *cfg,
                 const struct kube_http_req *req, struct err *err);

/* Turns a non-2xx STATUS and its BODY (a metav1.Status, or anything) into our code and
 * err->msg "<reason>: <message>" (escaped, cut). WHAT names the call ("get agenttasks"). */
int kube_status_error(long status, const struct buf *body, const char *what, struct err *err);

/* Whether S is a DNS label (namespaces: [a-z0-9]([-a-z0-9]*[a-z0-9])?, at most 63). */
bool kube_name_ok(const char *s);
/* Whether S is a DNS subdomain (object names: labels joined by '.', at most 253). */
bool kube_object_name_ok(const char *s);
/* Whether RV can be a resourceVersion we send back: 1 to KUBE_RV_MAX - 1 printable bytes
 * without '&', '#', '%'. */
bool kube_rv_ok(const char *rv);

/* The URL of RES in NS (NULL: every namespace), NAME and subresource SUB (each or NULL),
 * without a query. E_INVALID when NS or NAME break the name rules. Caller frees *out. */
int kube_url(char **out, struct kube_client *c, const struct kube_resource *res, const char *ns,
             const char *name, const char *sub, struct err *err);

/* One exchange with the API server: BODY (or NULL) sent as CTYPE, the whole exchange limited
 * to TIMEOUT_MS; a 2xx answer is parsed into *out when OUT is non-NULL, anything else becomes
 * kube_status_error(…, WHAT, …). */
int kube_call(json_t **out, struct kube_client *c, const char *method, const char *url,
              const char *ctype, const json_t *body, long timeout_ms, const char *what,
              struct err *err);

/* Runs the watch-stream parser over DATA[0..len), handed over in pieces of PIECE bytes (>= 1)
 * as a server's chunks would be, ending as a closed stream would: for tests and fuzzing.
 * Returns and sets *end_out as kube_watch does. */
int kube_watch_feed(enum kube_watch_end *end_out, char rv[KUBE_RV_MAX], const char *data,
                    size_t len, size_t piece, kube_watch_fn fn, void *userdata, struct err *err);

/* Parses BODY as one JSON object (duplicate keys refused). E_FAIL when it is not. */
int kube_parse_object(json_t **out, const char *body, size_t len, struct err *err);

#endif
