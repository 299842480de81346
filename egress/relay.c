/* SPDX-License-Identifier: Apache-2.0 */
/* The in-sandbox end of `--sandbox-network proxy`: the runner listens on 127.0.0.1:3128
 * (HTTPS_PROXY) and copies each connection to a fresh connection to the task's unix
 * socket, where the server's proxy decides. No policy here: the sandbox is untrusted, the
 * proxy is the only gate. One thread per connection, bounded. */
#define _GNU_SOURCE /* accept4, pipe2 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "egress/egress.h"
#include "egress/egress_int.h"

struct egress_relay {
    int listen_fd;
    uint16_t port;                  /* bound TCP port */
    struct sockaddr_un target;      /* the proxy's unix socket */
    int stop_rd, stop_wr;           /* stop pipe: readable once stopping */
    struct egress_workers *workers; /* owned while running */
};

struct relay_conn {
    struct egress_relay *r; /* borrowed */
    int fd;                 /* accepted TCP connection, owned */
    size_t slot;
};

static int listen_tcp(struct egress_relay *r, const char *ip, uint16_t port, struct err *err)
{
    struct egress_addr a;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    int one = 1;

    memset(&ss, 0, sizeof(ss));
    if (egress_addr_parse(&a, ip) != E_OK) {
        return err_set(err, E_INVALID, "egress relay: listen address is not an ip literal");
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
    r->listen_fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (r->listen_fd < 0) {
        return err_set(err, E_FAIL, "egress relay: socket: %s", strerror(errno));
    }
    setsockopt(r->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(r->listen_fd, (struct sockaddr *)(void *)&ss, sl) != 0 ||
        listen(r->listen_fd, 64) != 0) {
        return err_set(err, E_FAIL, "egress relay: cannot listen: %s", strerror(errno));
    }
    sl = sizeof(ss);
    if (getsockname(r->listen_fd, (struct sockaddr *)(void *)&ss, &sl) != 0) {
        return err_set(err, E_FAIL, "egress relay: getsockname: %s", strerror(errno));
    }
    r->port = ntohs(ss.ss_family == AF_INET ? ((struct sockaddr_in *)(void *)&ss)->sin_port
                                            : ((struct sockaddr_in6 *)(void *)&ss)->sin6_port);
    return E_OK;
}

int egress_relay_open(struct egress_relay **out, const char *listen_ip, uint16_t port,
                      const char *unix_path, struct err *err)
{
    struct egress_relay *r;
    int pipefd[2], rc;

    *out = NULL;
    if (unix_path == NULL || strlen(unix_path) >= sizeof(r->target.sun_path)) {
        return err_set(err, E_INVALID, "egress relay: proxy socket path missing or too long");
    }
    r = xcalloc(1, sizeof(*r));
    r->listen_fd = r->stop_rd = r->stop_wr = -1;
    r->target.sun_family = AF_UNIX;
    memcpy(r->target.sun_path, unix_path, strlen(unix_path) + 1);
    rc = listen_tcp(r, listen_ip, port, err);
    if (rc == E_OK && pipe2(pipefd, O_CLOEXEC | O_NONBLOCK) != 0) {
        rc = err_set(err, E_FAIL, "egress relay: pipe: %s", strerror(errno));
    } else if (rc == E_OK) {
        r->stop_rd = pipefd[0];
        r->stop_wr = pipefd[1];
    }
    if (rc != E_OK) {
        egress_relay_free(r);
        return rc;
    }
    *out = r;
    return E_OK;
}

uint16_t egress_relay_port(const struct egress_relay *r)
{
    return r->port;
}

static int connect_target(const struct egress_relay *r)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);

    if (fd < 0) {
        return -1;
    }
    /* Non-blocking: a unix connect completes at once or fails (EAGAIN on a full backlog),
     * so a stuck proxy cannot hold this thread past a stop. */
    if (connect(fd, (const struct sockaddr *)(const void *)&r->target, sizeof(r->target)) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static void *relay_conn_main(void *arg)
{
    struct relay_conn *c = arg;
    struct egress_relay *r = c->r;
    size_t slot = c->slot;
    uint64_t up = 0, down = 0;
    int target = connect_target(r);

    if (target >= 0) {
        egress_pump(c->fd, target, r->stop_rd, NULL, 0, &up, &down);
        close(target);
    }
    close(c->fd);
    free(c);
    egress_workers_done(r->workers, slot);
    return NULL;
}

int egress_relay_run(struct egress_relay *r, struct err *err)
{
    int rc = E_OK;

    r->workers = egress_workers_new(EGRESS_RELAY_CONNS_MAX);
    for (;;) {
        struct pollfd pfd[2] = {{.fd = r->listen_fd, .events = POLLIN},
                                {.fd = r->stop_rd, .events = POLLIN}};
        struct relay_conn *c;
        int fd;

        if (poll(pfd, 2, -1) < 0) {
            if (errno == EINTR) {
                continue;
            }
            rc = err_set(err, E_FAIL, "egress relay: poll: %s", strerror(errno));
            break;
        }
        if (pfd[1].revents != 0) {
            break;
        }
        if (pfd[0].revents == 0) {
            continue;
        }
        fd = accept4(r->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) {
            egress_accept_backoff(errno, r->stop_rd);
            continue;
        }
        c = xcalloc(1, sizeof(*c));
        c->r = r;
        c->fd = fd;
        if (egress_workers_start(r->workers, relay_conn_main, c, &c->slot) != E_OK) {
            close(fd); /* over the cap: the client sees the connection closed */
            free(c);
        }
    }
    egress_workers_free(r->workers);
    r->workers = NULL;
    return rc;
}

void egress_relay_stop(struct egress_relay *r)
{
    static const char one = 1;
    ssize_t n;

    /* write(2) is async-signal-safe; a full pipe already means "stopping". */
    do {
        n = write(r->stop_wr, &one, 1);
    } while (n < 0 && errno == EINTR);
}

void egress_relay_free(struct egress_relay *r)
{
    if (r == NULL) {
        return;
    }
    if (r->listen_fd >= 0) {
        close(r->listen_fd);
    }
    if (r->stop_rd >= 0) {
        close(r->stop_rd);
        close(r->stop_wr);
    }
    free(r);
}

int egress_relay_serve(const char *listen_ip, uint16_t port, const char *unix_path, struct err *err)
{
    struct egress_relay *r = NULL;
    int rc = egress_relay_open(&r, listen_ip, port, unix_path, err);

    if (rc == E_OK) {
        rc = egress_relay_run(r, err);
    }
    egress_relay_free(r);
    return rc;
}
