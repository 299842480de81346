/* SPDX-License-Identifier: Apache-2.0 */
/* A loopback TCP listener that hands every accepted connection to a handler on a thread
 * of its own, at most a fixed number at once (more are closed at once). Shared by the
 * in-sandbox relays: the egress relay (bytes to the proxy's unix socket) and the
 * runner's LLM relay (HTTP requests to the server's LLM routes). */
#define _GNU_SOURCE /* accept4, pipe2 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "egress/egress.h"
#include "egress/egress_int.h"

struct egress_listener {
    int listen_fd;
    uint16_t port;                  /* bound TCP port */
    size_t conns_max;               /* concurrent connections handled */
    egress_conn_fn handler;         /* called once per connection */
    void *userdata;                 /* for handler; borrowed */
    int stop_rd, stop_wr;           /* stop pipe: readable once stopping */
    struct egress_workers *workers; /* owned while running */
};

struct listener_conn {
    struct egress_listener *l; /* borrowed */
    int fd;                    /* accepted TCP connection, owned */
    size_t slot;
};

static int listen_tcp(struct egress_listener *l, const char *ip, uint16_t port, struct err *err)
{
    struct egress_addr a;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    int one = 1;

    memset(&ss, 0, sizeof(ss));
    if (egress_addr_parse(&a, ip) != E_OK) {
        return err_set(err, E_INVALID, "listen address is not an ip literal");
    }
    if (a.family == 4) {
        struct sockaddr_in *sin = (struct sockaddr_in *)(void *)&ss;
        sin->sin_family = AF_INET;
        sin->sin_port = htons(port);
        memcpy(&sin->sin_addr, a.bytes, 4);
        sl = sizeof(*sin);
    } else {
        struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)(void *)&ss;
        sin6->sin6_family = AF_INET6;
        sin6->sin6_port = htons(port);
        memcpy(&sin6->sin6_addr, a.bytes, 16);
        sl = sizeof(*sin6);
    }
    l->listen_fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (l->listen_fd < 0) {
        return err_set(err, E_FAIL, "socket: %s", strerror(errno));
    }
    setsockopt(l->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(l->listen_fd, (struct sockaddr *)(void *)&ss, sl) != 0 ||
        listen(l->listen_fd, 64) != 0) {
        return err_set(err, errno == EADDRINUSE ? E_CONFLICT : E_FAIL, "cannot listen on %s:%u: %s",
                       ip, (unsigned)port, strerror(errno));
    }
    sl = sizeof(ss);
    if (getsockname(l->listen_fd, (struct sockaddr *)(void *)&ss, &sl) != 0) {
        return err_set(err, E_FAIL, "getsockname: %s", strerror(errno));
    }
    l->port = ntohs(ss.ss_family == AF_INET ? ((struct sockaddr_in *)(void *)&ss)->sin_port
                                            : ((struct sockaddr_in6 *)(void *)&ss)->sin6_port);
    return E_OK;
}

int egress_listener_open(struct egress_listener **out, const char *listen_ip, uint16_t port,
                         size_t conns_max, egress_conn_fn handler, void *userdata, struct err *err)
{
    struct egress_listener *l;
    int pipefd[2], rc;

    *out = NULL;
    ASSERT(handler != NULL && conns_max > 0);
    l = xcalloc(1, sizeof(*l));
    l->listen_fd = l->stop_rd = l->stop_wr = -1;
    l->conns_max = conns_max;
    l->handler = handler;
    l->userdata = userdata;
    rc = listen_tcp(l, listen_ip, port, err);
    if (rc == E_OK && pipe2(pipefd, O_CLOEXEC | O_NONBLOCK) != 0) {
        rc = err_set(err, E_FAIL, "pipe: %s", strerror(errno));
    } else if (rc == E_OK) {
        l->stop_rd = pipefd[0];
        l->stop_wr = pipefd[1];
    }
    if (rc != E_OK) {
        egress_listener_free(l);
        return rc;
    }
    *out = l;
    return E_OK;
}

uint16_t egress_listener_port(const struct egress_listener *l)
{
    return l->port;
}

static void *conn_main(void *arg)
{
    struct listener_conn *c = arg;
    struct egress_listener *l = c->l;
    size_t slot = c->slot;

    l->handler(c->fd, l->stop_rd, l->userdata);
    close(c->fd);
    free(c);
    egress_workers_done(l->workers, slot);
    return NULL;
}

int egress_listener_run(struct egress_listener *l, struct err *err)
{
    int rc = E_OK;

    l->workers = egress_workers_new(l->conns_max);
    for (;;) {
        struct pollfd pfd[2] = {{.fd = l->listen_fd, .events = POLLIN},
                                {.fd = l->stop_rd, .events = POLLIN}};
        struct listener_conn *c;
        int fd;

        if (poll(pfd, 2, -1) < 0) {
            if (errno == EINTR) {
                continue;
            }
            rc = err_set(err, E_FAIL, "poll: %s", strerror(errno));
            break;
        }
        if (pfd[1].revents != 0) {
            break;
        }
        if (pfd[0].revents == 0) {
            continue;
        }
        fd = accept4(l->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) {
            egress_accept_backoff(errno, l->stop_rd);
            continue;
        }
        c = xcalloc(1, sizeof(*c));
        c->l = l;
        c->fd = fd;
        if (egress_workers_start(l->workers, conn_main, c, &c->slot) != E_OK) {
            close(fd); /* over the cap: the client sees the connection closed */
            free(c);
        }
    }
    egress_workers_free(l->workers);
    l->workers = NULL;
    return rc;
}

void egress_listener_stop(struct egress_listener *l)
{
    static const char one = 1;
    ssize_t n;

    /* write(2) is async-signal-safe; a full pipe already means "stopping". */
    do {
        n = write(l->stop_wr, &one, 1);
    } while (n < 0 && errno == EINTR);
}

void egress_listener_free(struct egress_listener *l)
{
    if (l == NULL) {
        return;
    }
    if (l->listen_fd >= 0) {
        close(l->listen_fd);
    }
    if (l->stop_rd >= 0) {
        close(l->stop_rd);
        close(l->stop_wr);
    }
    free(l);
}
