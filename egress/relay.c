/* SPDX-License-Identifier: Apache-2.0 */
/* The in-sandbox end of `--sandbox-network proxy`: the runner listens on 127.0.0.1:3128
 * (HTTPS_PROXY) and copies each connection to a fresh connection to the task's unix
 * socket, where the server's proxy decides. No policy here: the sandbox is untrusted, the
 * proxy is the only gate. The accepting and the bounded threads are egress_listener's. */
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "egress/egress.h"
#include "egress/egress_int.h"

_Static_assert(sizeof(((struct sockaddr_un *)NULL)->sun_path) == EGRESS_RELAY_SOCKET_MAX,
               "EGRESS_RELAY_SOCKET_MAX is sun_path's size");

struct egress_relay {
    struct egress_listener *l;          /* owned */
    char path[EGRESS_RELAY_SOCKET_MAX]; /* the proxy's unix socket */
};

static int connect_target(const char *path)
{
    struct sockaddr_un target;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);

    if (fd < 0 || strlen(path) >= sizeof(target.sun_path)) {
        if (fd >= 0) {
            close(fd);
        }
        return -1;
    }
    memset(&target, 0, sizeof(target));
    target.sun_family = AF_UNIX;
    memcpy(target.sun_path, path, strlen(path) + 1); /* length checked by the opener */
    /* Non-blocking: a unix connect completes at once or fails (EAGAIN on a full backlog),
     * so a stuck proxy cannot hold this thread past a stop. */
    if (connect(fd, (const struct sockaddr *)(const void *)&target, sizeof(target)) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

void egress_relay_conn(int fd, int stop_fd, void *userdata)
{
    uint64_t up = 0, down = 0;
    int target = connect_target(userdata);

    if (target >= 0) {
        egress_pump(fd, target, stop_fd, NULL, 0, &up, &down);
        close(target);
    }
}

int egress_relay_open(struct egress_relay **out, const char *listen_ip, uint16_t port,
                      const char *unix_path, struct err *err)
{
    struct egress_relay *r;
    int rc;

    *out = NULL;
    if (unix_path == NULL || strlen(unix_path) >= EGRESS_RELAY_SOCKET_MAX) {
        return err_set(err, E_INVALID, "egress relay: proxy socket path missing or too long");
    }
    r = xcalloc(1, sizeof(*r));
    memcpy(r->path, unix_path, strlen(unix_path) + 1);
    rc = egress_listener_open(&r->l, listen_ip, port, EGRESS_RELAY_CONNS_MAX, egress_relay_conn,
                              r->path, err);
    if (rc != E_OK) {
        free(r);
        return rc;
    }
    *out = r;
    return E_OK;
}

uint16_t egress_relay_port(const struct egress_relay *r)
{
    return egress_listener_port(r->l);
}

int egress_relay_run(struct egress_relay *r, struct err *err)
{
    return egress_listener_run(r->l, err);
}

void egress_relay_stop(struct egress_relay *r)
{
    egress_listener_stop(r->l);
}

void egress_relay_free(struct egress_relay *r)
{
    if (r == NULL) {
        return;
    }
    egress_listener_free(r->l);
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
