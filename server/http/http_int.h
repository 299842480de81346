/* SPDX-License-Identifier: Apache-2.0 */
/* Declarations shared inside server/http/: the route lookup, request metrics and the
 * connection guard. */
#ifndef DIVERGE_SERVER_HTTP_HTTP_INT_H
#define DIVERGE_SERVER_HTTP_HTTP_INT_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

#include "common/err.h"
#include "server/http/http.h"

/* --- route lookup (http_route.c) --- */
/* Finds the route of R's method and path in r->srv's table (filling r->params); sets
 * *path_known when some route has this path with another method. Unix sockets are the
 * meter sockets that sandboxes reach: there only HTTP_ROUTE_UNIX routes exist. -1: none. */
int http_route_find(struct request *r, bool *path_known);
/* The extras of ROUTE of SRV's table, or NULL. */
const struct http_route_extra *http_route_extra_of(const struct server *srv, int route);

/* --- metrics (metrics.c) --- */
void metrics_observe(int route, int status, int64_t duration_ns);

/* --- connection admission and deadlines (http_guard.c) --- */
struct MHD_Connection;
struct http_guard;
struct http_guard_limits {
    int64_t head_ms;    /* the request head must be in this long after the request began */
    int64_t request_ms; /* and the whole request */
    int conn_max;       /* general pool: connections in all */
    int per_addr_max;   /* ... from one client address */
    int per_prefix_max; /* ... from one IPv4 /24 or IPv6 /64 */
    int reserve_max;    /* reserve pool (health and meter routes only) */
    int hard_max;       /* TCP connections in all, refused ones still closing included */
};
#define HTTP_GUARD_LIMITS_DEFAULTS                                                                 \
    {                                                                                              \
        .head_ms = SERVER_HEAD_DEADLINE_MS, .request_ms = SERVER_REQUEST_DEADLINE_MS,              \
        .conn_max = SERVER_CONN_MAX, .per_addr_max = SERVER_PER_IP_CONN_MAX,                       \
        .per_prefix_max = SERVER_PER_PREFIX_CONN_MAX, .reserve_max = SERVER_RESERVE_CONN_MAX,      \
        .hard_max = SERVER_CONN_HARD_MAX,                                                          \
    }
/* Starts the reaper thread that shuts down connections past their deadline (LIM is
 * copied). Free with http_guard_free() after MHD_stop_daemon() of every daemon using it. */
int http_guard_new(struct http_guard **out, const struct http_guard_limits *lim, struct err *err);
void http_guard_free(struct http_guard *g);
/* The MHD_OPTION_NOTIFY_CONNECTION callback (CLS is the guard); CODE is an
 * enum MHD_ConnectionNotificationCode. A new TCP connection is admitted to the general or
 * the reserve pool, or refused (its socket shut down at once). */
void http_guard_notify(void *cls, struct MHD_Connection *conn, void **socket_context, int code);
/* For the accept policy callback (CLS is the guard): false when a connection from ADDR
 * would be refused now, which then counts as refused. A connection accepted here is
 * admitted (or refused) again by http_guard_notify. */
bool http_guard_accept(void *cls, const struct sockaddr *addr, socklen_t addrlen);
/* The head of the request on CONN is in; RESERVED_ROUTE says whether it asks for a route
 * the reserve pool serves. False: the connection holds a reserve slot and the route is
 * another; the caller answers 503. */
bool http_guard_head(struct MHD_Connection *conn, bool reserved_route);
/* 1 when CONN was accepted on a unix socket, 0 when not, -1 when the guard does not know
 * (no guard, or the socket could not be asked when it was accepted). */
int http_guard_unix_socket(struct MHD_Connection *conn);
/* The response on CONN ended: the next request's clock starts now. */
void http_guard_request_done(struct MHD_Connection *conn);
/* Connections shut down so far for missing a deadline. */
long long http_guard_reaped(struct http_guard *g);
/* Connections refused or pushed out of the reserve so far for being over the limits. */
long long http_guard_refused(struct http_guard *g);

#endif
