/* SPDX-License-Identifier: Apache-2.0 */
/* The per-task meter socket of sandboxes on this host (local, process): a unix socket in
 * <data-dir>/meter/<random>/meter.sock that the server (controller_meter_sockets) serves
 * with the meter route only and a small connection cap. The local provider binds its
 * directory read-only at /diverge/sock, so DIVERGE_METER_SOCKET inside stays
 * /diverge/sock/meter.sock; no other sandbox sees it. The provider owns a started one
 * (sandbox.h): it goes with the sandbox, and the next start makes a new one. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/log.h"
#include "controller/controller_int.h"

#define METER_BACKLOG 16

static char *meter_root(const struct controller *c)
{
    return xasprintf("%s/meter", c->data_dir);
}

void controller_meter_sweep(const struct controller *c)
{
    char *root = meter_root(c);

    sandbox_socket_sweep(root, SANDBOX_METER_SOCKET);
    free(root);
}

/* A listening unix socket at PATH into *fd_out. */
static int listen_at(int *fd_out, const char *path, struct err *err)
{
    struct sockaddr_un sa;
    int fd;

    *fd_out = -1;
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    memcpy(sa.sun_path, path, strlen(path) + 1); /* length checked by the caller */
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
        listen(fd, METER_BACKLOG) != 0) {
        int e = errno;
        if (fd >= 0) {
            close(fd);
        }
        return err_set(err, E_FAIL, "listen on the task's meter socket: %s", strerror(e));
    }
    *fd_out = fd;
    return E_OK;
}

/* Opens M's socket in M->dir and has the server serve it. */
static int serve_socket(struct sandbox_meter *m, struct controller *c, struct err *err)
{
    char *sock = xasprintf("%s/%s", m->dir, SANDBOX_METER_SOCKET);
    int fd = -1;
    int rc = listen_at(&fd, sock, err);

    if (rc == E_OK) {
        controller_expose_socket(c, sock); /* the sandbox user connects to it */
        rc = c->meter_sockets.open(&m->server, fd, c->meter_sockets.userdata, err);
        if (rc != E_OK) {
            close(fd);
        } else {
            m->close = c->meter_sockets.close;
        }
    }
    free(sock);
    return rc;
}

int controller_meter_open(struct sandbox_meter **out, struct controller *c, const char *log_path,
                          char **env, size_t *n, struct err *err)
{
    bool inside = strcmp(c->provider, "local") == 0;
    struct sandbox_meter *m;
    char *root = meter_root(c);
    /* <root>/<16 hex>/meter.sock must fit a socket address. */
    bool fits = strlen(root) + 18 + strlen(SANDBOX_METER_SOCKET) <
                sizeof(((struct sockaddr_un *)NULL)->sun_path);
    int rc;

    *out = NULL;
    free(root);
    if (c->meter_sockets.open == NULL) {
        return E_OK;
    }
    if (!fits) {
        sandbox_log_event(log_path, "[diverge] no meter socket: the data dir path is too long "
                                    "for a unix socket; the runner meters over "
                                    "DIVERGE_METER_URL");
        return E_OK;
    }
    m = xcalloc(1, sizeof(*m));
    rc = controller_socket_dir(&m->dir, c, "meter", err);
    if (rc == E_OK) {
        rc = serve_socket(m, c, err);
    }
    if (rc != E_OK) {
        sandbox_meter_free(m);
        return rc;
    }
    env[(*n)++] =
        inside ? xstrdup("DIVERGE_METER_SOCKET=" SANDBOX_IN_SOCK_DIR "/" SANDBOX_METER_SOCKET)
               : xasprintf("DIVERGE_METER_SOCKET=%s/%s", m->dir, SANDBOX_METER_SOCKET);
    env[*n] = NULL;
    *out = m;
    return E_OK;
}
