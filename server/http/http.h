/* SPDX-License-Identifier: Apache-2.0 */
/* The HTTP layer of the server (libmicrohttpd): the request handlers see, the responses
 * they send, the route table they are listed in, and the daemons that serve it. The
 * protocols themselves are in server/api/; this layer knows none of them. */
#ifndef DIVERGE_SERVER_HTTP_HTTP_H
#define DIVERGE_SERVER_HTTP_HTTP_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"
#include "common/err.h"
#include "server/server_int.h"

struct MHD_Connection;
struct github_webhook_mac;

/* One HTTP request; lives from the first access-handler call to the completion callback. */
struct request {
    struct server *srv;                      /* borrowed */
    struct MHD_Connection *conn;             /* borrowed */
    const char *method;                      /* borrowed from MHD */
    const char *url;                         /* borrowed from MHD (path only) */
    struct buf body;                         /* capped request body */
    bool too_big;                            /* body went over its cap */
    size_t discarded;                        /* bytes of an oversized body thrown away */
    int route;                               /* index into the route table, -1 none */
    const char *params[SERVER_ROUTE_PARAMS]; /* path parameters, owned (param_store) */
    char *param_store;                       /* owned copy of the path, split */
    int64_t start_ns;                        /* monotonic start */
    int status;                              /* status sent, for logs and metrics */
    bool kube_errors;                        /* errors as metav1.Status (under /apis/) */
    struct github_webhook_mac *gh_mac;       /* owned; HMAC of the body as it arrives */
    /* A route's begin hook may spool the body to a file instead of BODY (git pushes):
     * http.c writes each piece there as it arrives, up to the route's cap. */
    size_t body_max;            /* the begin hook's body cap; 0: the route's */
    int body_fd;                /* owned; >= 0: the spool file; -1: none */
    size_t body_spooled;        /* bytes written to body_fd */
    bool body_failed;           /* writing the spool failed (answered 503) */
    void (*on_done)(void *arg); /* called once when the request ends (completion), or NULL */
    void *on_done_arg;
};

/* --- responses (http_response.c, http.c) --- each returns the MHD result of queueing. */
int http_send_json(struct request *r, int status, json_t *body); /* steals BODY */
int http_send_text(struct request *r, int status, const char *content_type, const char *text);
/* As http_send_text for LEN bytes of TEXT, which it takes ownership of (a malloc'd buffer,
 * freed once sent): a large body (a list of 10,000 tasks) is not copied again. */
int http_send_text_take(struct request *r, int status, const char *content_type, char *text,
                        size_t len);
/* A buffer for a large body (a list), with memory kept from earlier bodies when there is
 * some (already faulted in, large enough); send it with http_send_body, or buf_cleanup. */
void http_body_init(struct buf *out);
/* Sends BODY's bytes and takes its memory (BODY is left empty); once sent, the memory is
 * kept for the next http_body_init, or freed. */
int http_send_body(struct request *r, int status, const char *content_type, struct buf *body);
/* Sends the error body for CODE (an enum err_code or an HTTP status when >= 100). Under
 * /apis/ the body is a metav1.Status. */
int http_send_error(struct request *r, int status, const char *reason, const struct err *err,
                    const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* Maps an enum err_code to the HTTP status (the one translation table). */
int http_status_of(int code);
/* Sends the error for an err from the store/model layers: status from http_status_of. */
int http_send_err(struct request *r, const struct err *err);
const char *http_query(struct request *r, const char *key);
/* True when the request carries the admin bearer token (compared in constant time). */
bool http_admin_ok(struct request *r);
/* True when TOKEN is the admin token (compared in constant time). */
bool http_admin_token_is(struct request *r, const char *token);
const char *http_header(struct request *r, const char *key);
/* How many request headers are named KEY (case-insensitive). */
int http_header_count(struct request *r, const char *key);
/* How many query arguments are named KEY (case-sensitive, as query keys are). */
int http_query_count(struct request *r, const char *key);
bool http_query_true(struct request *r, const char *key);
/* Parses the request body as JSON; on failure sends 400 and returns NULL. */
json_t *http_body_json(struct request *r, int *mhd_ret_out);
/* Starts a streaming chunked response; READ is called in the connection's thread and may
 * block. Returns the MHD result. */
typedef long (*http_stream_fn)(void *cls, uint64_t pos, char *buf, size_t max);
int http_send_stream(struct request *r, int status, const char *content_type, http_stream_fn read,
                     void *cls, void (*free_cls)(void *));

/* --- routes (http_route.c): the table is the API's (server/api/api_routes.c) --- */
typedef int (*http_route_fn)(struct request *r);

enum http_route_auth {
    HTTP_AUTH_NONE,
    HTTP_AUTH_ADMIN,
};

struct http_route {
    const char *method;
    /* '*' matches one non-empty path segment, or, when the pattern goes on within the
     * segment (a '*' followed by ":generateContent"), its non-empty start up to the first
     * occurrence of the byte that follows the '*' */
    const char *pattern;
    http_route_fn handler;
    const char *name; /* for logs and metrics */
    enum http_route_auth auth;
};

#define HTTP_ROUTE_RESERVED 1u /* connections over the limits may still use it (http_guard.c) */
#define HTTP_ROUTE_UNIX 2u     /* served on unix sockets (the meter sockets), where no other is */
/* An LLM gateway route (SPEC §13): what a sandbox's relay may reach on its task's own
 * socket besides the meter (the socket's route filter decides). */
#define HTTP_ROUTE_LLM 4u
/* Every route whose pattern starts so is served on unix sockets too (SPEC §13: the LLM
 * routes, which the runner's relay reaches over the task's socket). */
#define HTTP_UNIX_PREFIX "/api/v1/llm/"

/* What some handlers add to their route: BEGIN runs once the headers are in, before any
 * body byte is read (answering there, r->status set, refuses the request without reading
 * its body); BODY_MAX replaces SERVER_BODY_MAX; FLAGS are HTTP_ROUTE_*. */
struct http_route_extra {
    http_route_fn handler;
    http_route_fn begin; /* NULL: none */
    size_t body_max;     /* 0: SERVER_BODY_MAX */
    unsigned flags;
};

/* A route table: ROUTES in the order they are matched, and the EXTRAS of some of them
 * (found by handler). srv->routes points at one before a daemon starts. */
struct http_routes {
    const struct http_route *routes;
    size_t count;
    const struct http_route_extra *extras;
    size_t extras_count;
};

/* Name of ROUTE of SRV's table for logs and metrics ("tasks.get"); "none" for -1. */
const char *http_route_name(const struct server *srv, int route);
int http_route_count(const struct server *srv);

/* --- the daemons (http.c) --- */
/* Starts the HTTP daemon on SRV->cfg.listen; *port_out gets the bound port. */
int http_start(struct MHD_Daemon **out, uint16_t *port_out, struct server *srv, struct err *err);
void http_stop(struct MHD_Daemon *d, struct server *srv);
/* Serves the meter route and the routes under HTTP_UNIX_PREFIX, nothing else (every
 * other path is 404), on LISTEN_FD (a listening unix socket, taken over) with at most CONN_MAX
 * connections. With GUARDED the whole-request deadline of a started http_start() applies (stop the
 * daemon before http_stop()); without it only the idle timeout (a daemon that may outlive the
 * guard: the per-task meter sockets). */
int http_start_unix(struct MHD_Daemon **out, struct server *srv, int listen_fd,
                    unsigned int conn_max, bool guarded, struct err *err);
void http_stop_unix(struct MHD_Daemon *d);
/* Serves every route over HTTPS on LISTEN ("host:port") with the PEM certificate and key;
 * *port_out gets the bound port. Needs the guard of a started http_start(); stop it with
 * http_stop_unix() before http_stop(). No HTTP/2 (no ALPN). */
int http_start_tls(struct MHD_Daemon **out, uint16_t *port_out, struct server *srv,
                   const char *listen, const char *cert_pem, const char *key_pem, struct err *err);

/* The request on CONN is complete: no deadline while it is answered (http_guard.c; a
 * handler that answers over time, a stream, says so itself). */
void http_guard_answering(struct MHD_Connection *conn);
/* Renders the Prometheus text exposition into OUT (metrics.c). */
void metrics_render(struct buf *out, struct server *srv);

#endif
