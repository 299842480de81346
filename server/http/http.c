/* SPDX-License-Identifier: Apache-2.0 */
/* libmicrohttpd wiring: routing through the server's route table (http_route.c), body
 * caps, admin auth, one log line and one metrics observation per request (response
 * helpers: http_response.c). Every request ends with exactly one response. */
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "scm/github/github.h"
#include "server/http/http_int.h"

/* Oversized bodies up to this many times the cap are read and discarded before the 413. */
#define DISCARD_FACTOR 4

/* libmicrohttpd's connection limit on the TCP listeners: above the guard's hard cap, which
 * refuses connections itself (http_guard.c). */
#define HTTP_MHD_CONN_LIMIT (SERVER_CONN_HARD_MAX + 64)
#define HTTP_LIBRARY_LOG_PER_S 20 /* libmicrohttpd messages logged a second, at most */

/* --- MHD callbacks ---------------------------------------------------------------- */

static bool token_equal(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    unsigned char diff = (unsigned char)(la != lb);

    /* Constant time in the length of the expected token B. */
    for (size_t i = 0; i < lb; i++) {
        diff |= (unsigned char)(b[i] ^ (i < la ? a[i] : 0));
    }
    return diff == 0;
}

static bool admin_ok(struct request *r)
{
    const char *h = http_header(r, MHD_HTTP_HEADER_AUTHORIZATION);

    if (h == NULL || strncmp(h, "Bearer ", 7) != 0) {
        return false;
    }
    return token_equal(h + 7, r->srv->api_token);
}

bool http_admin_ok(struct request *r)
{
    return admin_ok(r);
}

bool http_admin_token_is(struct request *r, const char *token)
{
    return token_equal(token, r->srv->api_token);
}

/* Routes that connections over the per-address, per-prefix and total limits may still
 * use (http_guard.c): health checks and the sandboxes' meter calls. */
static bool reserved_route(const struct request *r)
{
    const struct http_route_extra *x = http_route_extra_of(r->srv, r->route);

    return x != NULL && (x->flags & HTTP_ROUTE_RESERVED) != 0;
}

/* The body cap of the request's route; only known routes ever get a body read. */
static size_t body_cap(const struct request *r)
{
    const struct http_route_extra *x = http_route_extra_of(r->srv, r->route);

    if (r->body_max != 0) {
        return r->body_max;
    }
    return x != NULL && x->body_max != 0 ? x->body_max : SERVER_BODY_MAX;
}

/* The answer to a request whose method and path match no route: 405 when the path is
 * known, else 404. Neither the method nor the path is echoed: both are request bytes. */
static enum MHD_Result no_route(struct request *r, bool path_known)
{
    if (path_known) {
        return (enum MHD_Result)http_send_error(r, 405, NULL, NULL,
                                                "method not allowed on this path");
    }
    return (enum MHD_Result)http_send_error(r, 404, NULL, NULL, "no such path");
}

/* First call, the headers are in: route, authenticate, and refuse whatever can be refused
 * before a single body byte is read (unknown path, wrong method, missing admin token,
 * missing webhook signature, a declared length far over the cap). Nothing is reserved
 * for a body before the request is authenticated. Returns the MHD result; r->status is
 * set when the request was answered. */
static enum MHD_Result begin_request(struct request *r)
{
    const char *cl = http_header(r, MHD_HTTP_HEADER_CONTENT_LENGTH);
    unsigned long long declared = cl != NULL ? strtoull(cl, NULL, 10) : 0;
    const struct http_route *rt;
    const struct http_route_extra *x;
    bool path_known;
    int ret;

    r->route = http_route_find(r, &path_known);
    if (r->route < 0) {
        return no_route(r, path_known);
    }
    rt = &r->srv->routes->routes[r->route];
    buf_init(&r->body, body_cap(r));
    if (!http_guard_head(r->conn, reserved_route(r))) {
        return (enum MHD_Result)http_send_error(r, 503, NULL, NULL,
                                                "server busy: too many connections");
    }
    if (rt->auth == HTTP_AUTH_ADMIN && !admin_ok(r)) {
        return (enum MHD_Result)http_send_error(r, 401, NULL, NULL,
                                                "missing or wrong admin bearer token");
    }
    x = http_route_extra_of(r->srv, r->route);
    if (x != NULL && x->begin != NULL) {
        ret = x->begin(r);
        if (r->status != 0 || ret != MHD_YES) {
            return (enum MHD_Result)ret;
        }
    }
    if (declared > DISCARD_FACTOR * body_cap(r) || (r->body_fd >= 0 && declared > body_cap(r))) {
        /* Far too big (a spooled body: too big at all): refuse before reading the body. */
        r->too_big = true;
        return (enum MHD_Result)http_send_error(
            r, 413, NULL, NULL, "request body is larger than %zu bytes", body_cap(r));
    }
    if (rt->auth == HTTP_AUTH_ADMIN && declared <= body_cap(r)) {
        buf_reserve(&r->body, (size_t)declared); /* one allocation, the sender is known */
    }
    return MHD_YES;
}

/* The whole body is in (or was too big): answer. */
static enum MHD_Result dispatch(struct request *r)
{
    http_guard_answering(r->conn);
    if (r->body_failed) {
        return (enum MHD_Result)http_send_error(r, 503, NULL, NULL,
                                                "the request body could not be stored; retry");
    }
    if (r->too_big) {
        return (enum MHD_Result)http_send_error(
            r, 413, NULL, NULL, "request body is larger than %zu bytes", body_cap(r));
    }
    return (enum MHD_Result)r->srv->routes->routes[r->route].handler(r);
}

static int write_all(int fd, const char *data, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, data, n);
        if (w < 0 && errno == EINTR) {
            continue;
        }
        if (w <= 0) {
            return E_FAIL;
        }
        data += w;
        n -= (size_t)w;
    }
    return E_OK;
}

/* Takes one piece of the body: into the spool file, or into the buffer (and the webhook
 * HMAC). True when the request is to be answered now, without the rest: a spooled body
 * over its cap or a spool that cannot be written, another body far over its cap. */
static bool take_piece(struct request *r, const char *data, size_t n)
{
    if (r->body_fd >= 0) {
        if (r->too_big || r->body_failed) {
            return true;
        }
        if (n > body_cap(r) - r->body_spooled) {
            r->too_big = true;
        } else if (write_all(r->body_fd, data, n) != E_OK) {
            r->body_failed = true;
        } else {
            r->body_spooled += n;
        }
        return r->too_big || r->body_failed;
    }
    if (!r->too_big && buf_append(&r->body, data, n) != E_OK) {
        r->too_big = true;
        buf_cleanup(&r->body);
    }
    if (!r->too_big && r->gh_mac != NULL) {
        github_webhook_mac_update(r->gh_mac, data, n);
    }
    if (r->too_big) {
        /* Read and discard a moderately oversized body so that simple clients, which send
         * it all before reading, see the 413 instead of a broken pipe. */
        r->discarded += n;
        return r->discarded > DISCARD_FACTOR * body_cap(r);
    }
    return false;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    struct request *r = *con_cls;

    (void)version;
    if (r == NULL) {
        r = xcalloc(1, sizeof(*r));
        r->srv = cls;
        r->conn = conn;
        r->method = method;
        r->url = url;
        r->route = -1;
        r->body_fd = -1;
        r->start_ns = clock_mono_ns();
        r->param_store = xmalloc(strlen(url) + 1);
        r->kube_errors = strncmp(url, "/apis", 5) == 0 || strcmp(url, "/api") == 0;
        *con_cls = r;
        return begin_request(r);
    }
    if (r->status != 0) {
        *upload_data_size = 0; /* already answered: drop whatever still comes */
        return MHD_YES;
    }
    if (*upload_data_size > 0) {
        bool now = take_piece(r, upload_data, *upload_data_size);
        *upload_data_size = 0;
        return now ? dispatch(r) : MHD_YES;
    }
    return dispatch(r);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    struct request *r = *con_cls;
    int64_t dur;
    long long us;
    char status[8], ms[32];

    (void)cls;
    (void)toe;
    if (r == NULL) {
        return;
    }
    dur = clock_mono_ns() - r->start_ns;
    metrics_observe(r->route, r->status, dur);
    snprintf(status, sizeof(status), "%d", r->status);
    /* Milliseconds with three decimals, rounded to the microsecond: integers only (a
     * floating-point printf on every request's line was a visible cost). */
    us = dur > 0 ? (long long)((dur + 500) / 1000) : 0;
    snprintf(ms, sizeof(ms), "%lld.%03lld", us / 1000, us % 1000);
    log_kv(LOG_INFO, "request", "method", r->method, "path", r->url, "route",
           http_route_name(r->srv, r->route), "status", status, "ms", ms, NULL);
    if (r->on_done != NULL) {
        r->on_done(r->on_done_arg);
    }
    if (r->body_fd >= 0) {
        close(r->body_fd);
    }
    buf_cleanup(&r->body);
    github_webhook_mac_free(r->gh_mac);
    free(r->param_store);
    free(r);
    *con_cls = NULL;
    http_guard_request_done(conn);
}

static int parse_listen(struct sockaddr_in *sa, const char *listen, const char *flag,
                        struct err *err)
{
    const char *colon = strrchr(listen, ':');
    char host[64];
    char *end;
    unsigned long port;

    memset(sa, 0, sizeof(*sa));
    if (colon == NULL || (size_t)(colon - listen) >= sizeof(host)) {
        return err_set(err, E_INVALID, "%s %s: expected address:port", flag, listen);
    }
    memcpy(host, listen, (size_t)(colon - listen));
    host[colon - listen] = '\0';
    port = strtoul(colon + 1, &end, 10);
    if (*end != '\0' || colon[1] == '\0' || port > 65535) {
        return err_set(err, E_INVALID, "%s %s: bad port", flag, listen);
    }
    if (host[0] == '\0' || strcmp(host, "localhost") == 0) {
        snprintf(host, sizeof(host), "127.0.0.1");
    }
    sa->sin_family = AF_INET;
    sa->sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, host, &sa->sin_addr) != 1) {
        return err_set(err, E_INVALID, "%s %s: expected an IPv4 address", flag, listen);
    }
    return E_OK;
}

static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    http_guard_notify(cls, conn, socket_context, (int)code);
}

/* The accept policy (CLS is the guard): a connection the guard would refuse is closed
 * before libmicrohttpd makes its thread. */
static enum MHD_Result on_accept(void *cls, const struct sockaddr *addr, socklen_t addrlen)
{
    return http_guard_accept(cls, addr, addrlen) ? MHD_YES : MHD_NO;
}

/* Whether a libmicrohttpd message may be logged now: at most HTTP_LIBRARY_LOG_PER_S a
 * second. Under a flood it writes one for nearly every connection cut or reset (thousands
 * a second); the first message of a second after dropped ones is preceded by a count of
 * them (event http_library_suppressed). */
static bool mhd_log_allowed(void)
{
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static int64_t window;         /* the second of the messages counted, under mu */
    static int in_window, dropped; /* messages logged in it, and dropped since the last */
    int64_t now = clock_mono_ns() / 1000000000;
    int dropped_before = 0;
    bool ok;

    pthread_mutex_lock(&mu);
    if (now != window) {
        window = now;
        in_window = 0;
    }
    ok = in_window < HTTP_LIBRARY_LOG_PER_S;
    if (ok) {
        in_window++;
        dropped_before = dropped;
        dropped = 0;
    } else {
        dropped++;
    }
    pthread_mutex_unlock(&mu);
    if (dropped_before > 0) {
        char n[16];
        snprintf(n, sizeof(n), "%d", dropped_before);
        log_kv(LOG_WARN, "http_library_suppressed", "messages", n, NULL);
    }
    return ok;
}

/* libmicrohttpd's own messages go through log_kv, so stderr stays one line per entry. */
__attribute__((format(printf, 2, 0))) static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
    char msg[512];
    size_t n;

    (void)cls;
    if (!mhd_log_allowed()) {
        return;
    }
    vsnprintf(msg, sizeof(msg), fmt, ap);
    n = strlen(msg);
    while (n > 0 && (msg[n - 1] == '\n' || msg[n - 1] == '\r')) {
        msg[--n] = '\0';
    }
    log_kv(LOG_WARN, "http_library", "message", msg, NULL);
}

/* The deadline in the environment variable NAME (tests), else DEF. */
static int64_t deadline_env_ms(const char *name, int64_t def)
{
    const char *v = getenv(name);
    char *end = NULL;
    long long ms;

    if (v == NULL || v[0] == '\0') {
        return def;
    }
    ms = strtoll(v, &end, 10);
    return *end == '\0' && ms > 0 ? ms : def;
}

int http_start(struct MHD_Daemon **out, uint16_t *port_out, struct server *srv, struct err *err)
{
    struct sockaddr_in sa;
    struct MHD_Daemon *d;
    const union MHD_DaemonInfo *info;
    struct http_guard_limits lim = HTTP_GUARD_LIMITS_DEFAULTS;
    int rc = parse_listen(&sa, srv->cfg.listen, "--listen", err);

    *out = NULL;
    lim.request_ms = deadline_env_ms("DIVERGE_REQUEST_DEADLINE_MS", SERVER_REQUEST_DEADLINE_MS);
    lim.head_ms = deadline_env_ms("DIVERGE_HEAD_DEADLINE_MS", SERVER_HEAD_DEADLINE_MS);
    if (rc == E_OK) {
        rc = http_guard_new(&srv->guard, &lim, err);
    }
    if (rc != E_OK) {
        return rc;
    }
    /* One thread per connection: watch streams and (later) group-committed meter calls
     * block in their own thread without starving others. poll(), not select(): sockets
     * past FD_SETSIZE work. Slow clients are bounded by http_guard.c: head and request
     * deadlines, connections per address, per prefix and in all, and a reserve for the
     * health and meter routes. libmicrohttpd's own limit is above the guard's, so the
     * listener keeps accepting (and the guard deciding) under a flood. */
    d = MHD_start_daemon(
        MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL_INTERNAL_THREAD | MHD_USE_ERROR_LOG |
            MHD_USE_ITC,
        0, on_accept, srv->guard, on_request, srv,
        /* first, so that it sees the messages about the other options */
        MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, NULL, MHD_OPTION_SOCK_ADDR, &sa,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv, MHD_OPTION_NOTIFY_CONNECTION, on_connection,
        srv->guard, MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned int)deadline_env_ms("DIVERGE_IDLE_TIMEOUT_S", SERVER_IDLE_TIMEOUT_S),
        MHD_OPTION_CONNECTION_LIMIT, (unsigned int)HTTP_MHD_CONN_LIMIT,
        MHD_OPTION_LISTEN_BACKLOG_SIZE, (unsigned int)1024, MHD_OPTION_END);
    if (d == NULL) {
        http_guard_free(srv->guard);
        srv->guard = NULL;
        return err_set(err, E_FAIL, "cannot listen on %s (address in use?)", srv->cfg.listen);
    }
    info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    *port_out = info != NULL ? info->port : ntohs(sa.sin_port);
    *out = d;
    return E_OK;
}

int http_start_unix(struct MHD_Daemon **out, struct server *srv, int listen_fd,
                    unsigned int conn_max, bool guarded, struct err *err)
{
    /* The meter route only (http_route_find) on a unix socket the sandboxes reach (SPEC §9);
     * per-address limits do not apply to it (every peer has the same address). A guarded
     * daemon is stopped with http_stop_unix() before http_stop() frees the guard; without
     * the guard the idle timeout still cuts silent connections. */
    *out = MHD_start_daemon(
        MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL_INTERNAL_THREAD | MHD_USE_ERROR_LOG |
            MHD_USE_ITC,
        0, NULL, NULL, on_request, srv, MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, NULL,
        MHD_OPTION_LISTEN_SOCKET, listen_fd, MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv,
        MHD_OPTION_NOTIFY_CONNECTION, guarded ? on_connection : NULL, guarded ? srv->guard : NULL,
        MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned int)(guarded ? SERVER_IDLE_TIMEOUT_S : SERVER_UNIX_IDLE_TIMEOUT_S),
        MHD_OPTION_CONNECTION_LIMIT, conn_max, MHD_OPTION_END);
    if (*out == NULL) {
        return err_set(err, E_FAIL, "cannot serve the meter socket");
    }
    return E_OK;
}

int http_start_tls(struct MHD_Daemon **out, uint16_t *port_out, struct server *srv,
                   const char *listen, const char *cert_pem, const char *key_pem, struct err *err)
{
    struct sockaddr_in sa;
    const union MHD_DaemonInfo *info;
    int rc = parse_listen(&sa, listen, "--tls-listen", err);

    *out = NULL;
    if (rc != E_OK) {
        return rc;
    }
    if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES) {
        return err_set(err, E_FAIL, "this libmicrohttpd has no TLS support (--tls-listen)");
    }
    /* The same handlers, guard and limits as the plain listener (http_start). */
    *out =
        MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL_INTERNAL_THREAD |
                             MHD_USE_ERROR_LOG | MHD_USE_ITC | MHD_USE_TLS,
                         0, on_accept, srv->guard, on_request, srv, MHD_OPTION_EXTERNAL_LOGGER,
                         on_mhd_log, NULL, MHD_OPTION_SOCK_ADDR, &sa, MHD_OPTION_HTTPS_MEM_CERT,
                         cert_pem, MHD_OPTION_HTTPS_MEM_KEY, key_pem, MHD_OPTION_NOTIFY_COMPLETED,
                         on_completed, srv, MHD_OPTION_NOTIFY_CONNECTION, on_connection, srv->guard,
                         MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)SERVER_IDLE_TIMEOUT_S,
                         MHD_OPTION_CONNECTION_LIMIT, (unsigned int)HTTP_MHD_CONN_LIMIT,
                         MHD_OPTION_LISTEN_BACKLOG_SIZE, (unsigned int)1024, MHD_OPTION_END);
    if (*out == NULL) {
        return err_set(err, E_FAIL,
                       "cannot listen with TLS on %s (address in use, or a bad certificate or key)",
                       listen);
    }
    info = MHD_get_daemon_info(*out, MHD_DAEMON_INFO_BIND_PORT);
    *port_out = info != NULL ? info->port : ntohs(sa.sin_port);
    return E_OK;
}

void http_stop_unix(struct MHD_Daemon *d)
{
    if (d != NULL) {
        /* A quiesced daemon leaves its listening socket to the caller. */
        MHD_socket fd = MHD_quiesce_daemon(d);
        MHD_stop_daemon(d);
        if (fd != MHD_INVALID_SOCKET) {
            close(fd);
        }
    }
}

void http_stop(struct MHD_Daemon *d, struct server *srv)
{
    if (d != NULL) {
        (void)MHD_quiesce_daemon(d);
        MHD_stop_daemon(d);
    }
    /* After the daemon: stopping it notifies every connection closed. */
    http_guard_free(srv->guard);
    srv->guard = NULL;
}
