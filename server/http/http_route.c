/* SPDX-License-Identifier: Apache-2.0 */
/* Route lookup in the server's route table (srv->routes, the API's): method and path
 * matching with '*' segments, the extras of a route, and route names for logs and
 * metrics. */
#include <microhttpd.h>
#include <stdbool.h>
#include <string.h>
#include <sys/socket.h>

#include "server/http/http_int.h"

const struct http_route_extra *http_route_extra_of(const struct server *srv, int route)
{
    const struct http_routes *t = srv->routes;

    for (size_t i = 0; route >= 0 && i < t->extras_count; i++) {
        if (t->extras[i].handler == t->routes[route].handler) {
            return &t->extras[i];
        }
    }
    return NULL;
}

int http_route_count(const struct server *srv)
{
    return srv->routes != NULL ? (int)srv->routes->count : 0;
}

const char *http_route_name(const struct server *srv, int route)
{
    return route >= 0 && route < http_route_count(srv) ? srv->routes->routes[route].name : "none";
}

/* The bytes a '*' of a pattern takes at U: up to the end of the segment, or, when the
 * pattern goes on within the segment (P_NEXT is neither '/' nor the end, as in a '*'
 * followed by ":generateContent"), up to the first P_NEXT in it (0: none there). */
static size_t star_len(const char *u, char p_next)
{
    size_t seg = strcspn(u, "/");
    const char *stop;

    if (p_next == '\0' || p_next == '/') {
        return seg;
    }
    stop = memchr(u, p_next, seg);
    return stop != NULL ? (size_t)(stop - u) : 0;
}

/* Matches PATH against PATTERN; on success copies up to SERVER_ROUTE_PARAMS wildcard
 * segments (or the part of one up to what follows the '*') into r->params (pointing into
 * r->param_store). */
static bool match(struct request *r, const char *pattern, const char *path)
{
    const char *p = pattern, *u = path;
    int np = 0;
    size_t off = 0;

    while (*p != '\0' && *u != '\0') {
        if (*p == '*') {
            size_t n = star_len(u, p[1]);
            if (n == 0 || np >= SERVER_ROUTE_PARAMS) {
                return false;
            }
            memcpy(r->param_store + off, u, n);
            r->param_store[off + n] = '\0';
            r->params[np++] = r->param_store + off;
            off += n + 1;
            u += n;
            p++;
            continue;
        }
        if (*p != *u) {
            return false;
        }
        p++;
        u++;
    }
    return *p == '\0' && *u == '\0';
}

/* True when CONN came in on a unix socket, or when that cannot be told (fail closed). */
static bool unix_peer(struct MHD_Connection *conn)
{
    int known = http_guard_unix_socket(conn); /* asked once when the guard took it */
    const union MHD_ConnectionInfo *ci;
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);

    if (known >= 0) {
        return known == 1;
    }
    ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci == NULL || getsockname(ci->connect_fd, (struct sockaddr *)&ss, &len) != 0 ||
           ss.ss_family == AF_UNIX;
}

static bool route_has(const struct server *srv, int route, unsigned flag)
{
    const struct http_route_extra *x = http_route_extra_of(srv, route);

    return x != NULL && (x->flags & flag) != 0;
}

/* Unix sockets are the meter sockets that sandboxes reach: there only the routes marked
 * HTTP_ROUTE_UNIX (the meter) and every route under HTTP_UNIX_PREFIX (the LLM gateway,
 * which the runner's relay reaches through them) exist; every other path is unknown
 * (404). */
static bool unix_route(const struct server *srv, int route)
{
    return route_has(srv, route, HTTP_ROUTE_UNIX) ||
           strncmp(srv->routes->routes[route].pattern, HTTP_UNIX_PREFIX,
                   strlen(HTTP_UNIX_PREFIX)) == 0;
}

int http_route_find(struct request *r, bool *path_known)
{
    const struct http_route *routes = r->srv->routes->routes;
    bool meter_only = unix_peer(r->conn);

    *path_known = false;
    for (size_t i = 0; i < r->srv->routes->count; i++) {
        if ((meter_only && !unix_route(r->srv, (int)i)) || !match(r, routes[i].pattern, r->url)) {
            continue;
        }
        if (strcmp(routes[i].method, r->method) == 0) {
            return (int)i;
        }
        *path_known = true;
    }
    return -1;
}
