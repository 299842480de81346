/* SPDX-License-Identifier: Apache-2.0 */
/* The per-task CONNECT proxy: one accept thread on the task's unix socket and one thread
 * per connection (bounded). A connection reads a bounded head before a deadline, asks the
 * policy, resolves allowed names itself, re-checks every answer and connects to exactly
 * the addresses it checked, then pumps bytes. Every thread also polls the stop pipe. */
#define _GNU_SOURCE /* accept4, pipe2 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "egress/egress.h"
#include "egress/egress_int.h"

struct egress_proxy {
    struct egress_policy *policy;  /* owned copy */
    struct egress_proxy_opts opts; /* socket_path and policy point at owned copies */
    char *socket_path;             /* owned */
    int listen_fd;
    int stop_rd, stop_wr; /* stop pipe: readable once stopping */
    pthread_t accept_thread;
    struct egress_workers *workers; /* owned */
};

struct conn {
    struct egress_proxy *p; /* borrowed */
    int fd;                 /* the sandbox side, owned */
    size_t slot;            /* worker slot */
};

static int64_t remaining_ms(int64_t deadline_ns)
{
    int64_t left = (deadline_ns - clock_mono_ns()) / 1000000;

    return left < 0 ? 0 : left;
}

/* Waits for EVENTS on FD until DEADLINE_NS; false on stop, timeout or error. */
static bool wait_fd(const struct egress_proxy *p, int fd, short events, int64_t deadline_ns)
{
    for (;;) {
        struct pollfd pfd[2] = {{.fd = fd, .events = events}, {.fd = p->stop_rd, .events = POLLIN}};
        int64_t left = remaining_ms(deadline_ns);
        int n = poll(pfd, 2, left > 60000 ? 60000 : (int)left);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0 || pfd[1].revents != 0) {
            return false;
        }
        if (pfd[0].revents != 0) {
            return true;
        }
    }
}

static void send_all(const struct egress_proxy *p, int fd, const char *s, size_t len)
{
    int64_t deadline = clock_mono_ns() + (int64_t)p->opts.header_timeout_ms * 1000000;

    while (len > 0) {
        ssize_t n = send(fd, s, len, MSG_NOSIGNAL);
        if (n > 0) {
            s += n;
            len -= (size_t)n;
        } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
            if (!wait_fd(p, fd, POLLOUT, deadline)) {
                return;
            }
        } else {
            return;
        }
    }
}

static void reply(const struct egress_proxy *p, int fd, int status, const char *text,
                  const char *reason)
{
    char buf[256];
    int n = snprintf(buf, sizeof(buf),
                     "HTTP/1.1 %d %s\r\nX-Proxy-Error: %s\r\nContent-Length: 0\r\n"
                     "Connection: close\r\n\r\n",
                     status, text, reason);

    if (n > 0 && (size_t)n < sizeof(buf)) {
        send_all(p, fd, buf, (size_t)n);
    }
}

static void emit(const struct egress_proxy *p, struct egress_event *ev)
{
    char line[EGRESS_LINE_MAX];
    const struct clock *c = p->opts.clock != NULL ? p->opts.clock : clock_system();
    size_t body;

    if (p->opts.log == NULL) {
        return;
    }
    ev->time_ms = clock_now_ms(c);
    body = egress_event_format(line, ev);
    ev->line = line;
    ev->body = line + body;
    p->opts.log(ev, p->opts.log_userdata);
}

static void emit_denied(const struct egress_proxy *p, const char *hostport, const char *rule,
                        const char *reason)
{
    struct egress_event ev = {.kind = EGRESS_EVENT_DECISION,
                              .hostport = hostport,
                              .allowed = false,
                              .rule = rule != NULL ? rule : "",
                              .reason = reason};
    emit(p, &ev);
}

/* Reads the request head; returns the parse code, with the bytes in BUF and *LEN. */
static int read_head(const struct egress_proxy *p, int fd, struct egress_connect_req *req,
                     char *buf, size_t *len)
{
    int64_t deadline = clock_mono_ns() + (int64_t)p->opts.header_timeout_ms * 1000000;
    int rc = E_AGAIN;

    *len = 0;
    while (rc == E_AGAIN) {
        ssize_t n;
        if (!wait_fd(p, fd, POLLIN, deadline)) {
            return E_AGAIN; /* timeout or stop */
        }
        n = recv(fd, buf + *len, p->opts.header_max - *len, 0);
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
            continue;
        }
        if (n <= 0) {
            return E_FAIL;
        }
        *len += (size_t)n;
        rc = egress_connect_parse(req, buf, *len, p->opts.header_max);
    }
    return rc;
}

static int resolve_default(struct egress_addr *out, size_t max, size_t *n_out, const char *host,
                           void *userdata)
{
    struct addrinfo hints, *res = NULL;

    (void)userdata;
    *n_out = 0;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_ADDRCONFIG;
    if (getaddrinfo(host, NULL, &hints, &res) != 0) {
        return E_NOTFOUND;
    }
    for (struct addrinfo *ai = res; ai != NULL && *n_out < max; ai = ai->ai_next) {
        struct egress_addr a;
        memset(&a, 0, sizeof(a));
        if (ai->ai_family == AF_INET) {
            a.family = 4;
            memcpy(a.bytes, &((const struct sockaddr_in *)(const void *)ai->ai_addr)->sin_addr, 4);
        } else if (ai->ai_family == AF_INET6) {
            a.family = 6;
            memcpy(a.bytes, &((const struct sockaddr_in6 *)(const void *)ai->ai_addr)->sin6_addr,
                   16);
        } else {
            continue;
        }
        out[(*n_out)++] = a;
    }
    freeaddrinfo(res);
    return E_OK;
}

/* Connects to A:PORT before the connect deadline; returns the fd or -1. */
static int connect_addr(const struct egress_proxy *p, const struct egress_addr *a, uint16_t port)
{
    struct sockaddr_storage ss;
    socklen_t sl;
    int fd, soerr = 0;
    socklen_t el = sizeof(soerr);
    int64_t deadline = clock_mono_ns() + (int64_t)p->opts.connect_timeout_ms * 1000000;

    memset(&ss, 0, sizeof(ss));
    if (a->family == 4) {
        struct sockaddr_in *sin = (struct sockaddr_in *)(void *)&ss;
        sin->sin_family = AF_INET;
        sin->sin_port = htons(port);
        memcpy(&sin->sin_addr, a->bytes, 4);
        sl = sizeof(*sin);
    } else {
        struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)(void *)&ss;
        sin6->sin6_family = AF_INET6;
        sin6->sin6_port = htons(port);
        memcpy(&sin6->sin6_addr, a->bytes, 16);
        sl = sizeof(*sin6);
    }
    fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        return -1;
    }
    if (connect(fd, (struct sockaddr *)(void *)&ss, sl) == 0) {
        return fd;
    }
    if (errno == EINPROGRESS && wait_fd(p, fd, POLLOUT, deadline) &&
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &el) == 0 && soerr == 0) {
        return fd;
    }
    close(fd);
    return -1;
}

static bool stopping(const struct egress_proxy *p)
{
    struct pollfd pfd = {.fd = p->stop_rd, .events = POLLIN};

    return poll(&pfd, 1, 0) > 0;
}

static void head_error(const struct egress_proxy *p, int fd, int rc)
{
    if (stopping(p)) {
        return; /* shutting down: no answer, no log line */
    }
    switch (rc) {
    case E_DENIED:
        reply(p, fd, 405, "Method Not Allowed", "method-not-allowed");
        emit_denied(p, "-", NULL, "method-not-allowed");
        break;
    case E_TOOBIG:
        reply(p, fd, 431, "Request Header Fields Too Large", "header-too-large");
        emit_denied(p, "-", NULL, "header-too-large");
        break;
    case E_INVALID:
        reply(p, fd, 400, "Bad Request", "bad-request");
        emit_denied(p, "-", NULL, "bad-request");
        break;
    case E_AGAIN:
        reply(p, fd, 408, "Request Timeout", "header-timeout");
        emit_denied(p, "-", NULL, "header-timeout");
        break;
    default:
        break; /* the client went away before a whole head */
    }
}

/* Decides and connects; returns the upstream fd, or -1 after replying and logging. */
static int open_tunnel(const struct egress_proxy *p, int fd, const struct egress_connect_req *req,
                       const char *hostport, const char **rule_out)
{
    struct egress_addr addrs[EGRESS_ADDRS_MAX];
    struct egress_decision d;
    const struct egress_rule *r;
    size_t n = 0;
    egress_resolve_fn resolve = p->opts.resolve != NULL ? p->opts.resolve : resolve_default;

    r = egress_policy_match(p->policy, req->host, req->is_ip, &req->addr, req->port);
    *rule_out = r != NULL ? r->text : "";
    if (r == NULL) { /* never resolve a name outside the allowlist (no DNS leaks) */
        reply(p, fd, 403, "Forbidden", "blocked-by-allowlist");
        emit_denied(p, hostport, NULL, "blocked-by-allowlist");
        return -1;
    }
    if (req->is_ip) {
        addrs[0] = req->addr;
        n = 1;
    } else if (resolve(addrs, EGRESS_ADDRS_MAX, &n, req->host, p->opts.resolve_userdata) != E_OK) {
        n = 0;
    }
    if (n == 0) {
        reply(p, fd, 502, "Bad Gateway", "resolve-failed");
        emit_denied(p, hostport, r->text, "resolve-failed");
        return -1;
    }
    egress_decide(&d, p->policy, req->host, req->is_ip, &req->addr, req->port, addrs, n);
    if (!d.allowed) {
        reply(p, fd, 403, "Forbidden", d.reason);
        emit_denied(p, hostport, r->text, d.reason);
        return -1;
    }
    /* Only the addresses just checked: no second resolution between check and use. */
    for (size_t i = 0; i < n; i++) {
        int up = connect_addr(p, &addrs[i], req->port);
        if (up >= 0) {
            return up;
        }
    }
    reply(p, fd, 502, "Bad Gateway", "connect-failed");
    emit_denied(p, hostport, r->text, "connect-failed");
    return -1;
}

static void serve_conn(const struct egress_proxy *p, int fd)
{
    static const char ok[] = "HTTP/1.1 200 Connection established\r\n\r\n";
    struct egress_connect_req req;
    char *buf = xmalloc(p->opts.header_max);
    char hostport[EGRESS_HOSTPORT_MAX];
    const char *rule = "";
    size_t len = 0;
    int up = -1, rc;
    struct egress_event ev = {.kind = EGRESS_EVENT_DECISION, .allowed = true, .reason = ""};

    rc = read_head(p, fd, &req, buf, &len);
    if (rc != E_OK) {
        head_error(p, fd, rc);
        goto out;
    }
    egress_hostport_format(hostport, sizeof(hostport), "", req.host,
                           req.is_ip && req.addr.family == 6, req.port);
    up = open_tunnel(p, fd, &req, hostport, &rule);
    if (up < 0) {
        goto out;
    }
    ev.hostport = hostport;
    ev.rule = rule;
    emit(p, &ev);
    send_all(p, fd, ok, sizeof(ok) - 1);
    /* Bytes the client sent after its head (say, a TLS ClientHello) go first. */
    egress_pump(fd, up, p->stop_rd, buf + req.head_len, len - req.head_len, &ev.bytes_out,
                &ev.bytes_in);
    ev.kind = EGRESS_EVENT_CLOSE;
    emit(p, &ev);
out:
    if (up >= 0) {
        close(up);
    }
    free(buf);
}

static void *conn_main(void *arg)
{
    struct conn *c = arg;
    struct egress_proxy *p = c->p;
    size_t slot = c->slot;

    serve_conn(p, c->fd);
    close(c->fd);
    free(c);
    egress_workers_done(p->workers, slot);
    return NULL;
}

static void *accept_main(void *arg)
{
    struct egress_proxy *p = arg;

    for (;;) {
        struct pollfd pfd[2] = {{.fd = p->listen_fd, .events = POLLIN},
                                {.fd = p->stop_rd, .events = POLLIN}};
        struct conn *c;
        int fd;

        if (poll(pfd, 2, -1) < 0 && errno != EINTR) {
            break;
        }
        if (pfd[1].revents != 0) {
            break;
        }
        if (pfd[0].revents == 0) {
            continue;
        }
        fd = accept4(p->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
            egress_accept_backoff(errno, p->stop_rd);
            continue;
        }
        c = xcalloc(1, sizeof(*c));
        c->p = p;
        c->fd = fd;
        if (egress_workers_start(p->workers, conn_main, c, &c->slot) != E_OK) {
            reply(p, fd, 503, "Service Unavailable", "too-many-tunnels");
            emit_denied(p, "-", NULL, "too-many-tunnels");
            close(fd);
            free(c);
        }
    }
    return NULL;
}

static int listen_unix(int *fd_out, const char *path, unsigned mode, struct err *err)
{
    struct sockaddr_un sun;
    struct stat st;
    int fd;

    *fd_out = -1;
    memset(&sun, 0, sizeof(sun));
    sun.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof(sun.sun_path)) {
        return err_set(err, E_INVALID, "egress: socket path too long");
    }
    memcpy(sun.sun_path, path, strlen(path) + 1);
    if (lstat(path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode)) {
            return err_set(err, E_CONFLICT, "egress: socket path exists and is not a socket");
        }
        unlink(path); /* a stale socket from a previous run of this task */
    }
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        return err_set(err, E_FAIL, "egress: socket: %s", strerror(errno));
    }
    if (bind(fd, (struct sockaddr *)(void *)&sun, sizeof(sun)) != 0 ||
        chmod(path, (mode_t)mode) != 0 || listen(fd, 64) != 0) {
        int e = errno;
        close(fd);
        return err_set(err, E_FAIL, "egress: cannot listen on the task socket: %s", strerror(e));
    }
    *fd_out = fd;
    return E_OK;
}

int egress_proxy_open(struct egress_proxy **out, const struct egress_proxy_opts *opts,
                      struct err *err)
{
    struct egress_proxy *p;
    int pipefd[2], rc;

    *out = NULL;
    if (opts->socket_path == NULL || opts->policy == NULL || opts->max_tunnels == 0 ||
        opts->header_max < 64 || opts->header_max > EGRESS_HEADER_MAX ||
        opts->header_timeout_ms <= 0 || opts->connect_timeout_ms <= 0) {
        return err_set(err, E_INVALID, "egress: invalid proxy options");
    }
    p = xcalloc(1, sizeof(*p));
    p->opts = *opts;
    p->socket_path = xstrdup(opts->socket_path);
    p->policy = egress_policy_dup(opts->policy);
    p->opts.socket_path = p->socket_path;
    p->opts.policy = p->policy;
    p->listen_fd = p->stop_rd = p->stop_wr = -1;
    rc = listen_unix(&p->listen_fd, p->socket_path, opts->socket_mode, err);
    if (rc != E_OK) {
        goto fail;
    }
    if (pipe2(pipefd, O_CLOEXEC) != 0) {
        rc = err_set(err, E_FAIL, "egress: pipe: %s", strerror(errno));
        goto fail;
    }
    p->stop_rd = pipefd[0];
    p->stop_wr = pipefd[1];
    p->workers = egress_workers_new(opts->max_tunnels);
    if (pthread_create(&p->accept_thread, NULL, accept_main, p) != 0) {
        rc = err_set(err, E_FAIL, "egress: cannot start the proxy thread");
        goto fail;
    }
    *out = p;
    return E_OK;
fail:
    if (p->listen_fd >= 0) {
        close(p->listen_fd);
        unlink(p->socket_path);
    }
    if (p->stop_rd >= 0) {
        close(p->stop_rd);
        close(p->stop_wr);
    }
    egress_workers_free(p->workers);
    egress_policy_free(p->policy);
    free(p->socket_path);
    free(p);
    return rc;
}

void egress_proxy_stop(struct egress_proxy *p)
{
    static const char one = 1;

    if (p == NULL) {
        return;
    }
    while (write(p->stop_wr, &one, 1) < 0 && errno == EINTR) {
    }
    pthread_join(p->accept_thread, NULL);
    /* Every worker polls the stop pipe too (a resolver call finishes first). */
    egress_workers_free(p->workers);
    close(p->listen_fd);
    unlink(p->socket_path);
    close(p->stop_rd);
    close(p->stop_wr);
    egress_policy_free(p->policy);
    free(p->socket_path);
    free(p);
}
