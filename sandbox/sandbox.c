/* SPDX-License-Identifier: Apache-2.0 */
/* What a started sandbox takes over from its caller (sandbox_spec): the task's egress
 * proxy and its meter socket. The provider frees them when the runner exits, when the
 * sandbox is stopped, and when start() fails; the caller frees them when it never got to
 * start(). */
#include <stdlib.h>
#include <unistd.h>

#include "egress/egress.h"
#include "sandbox/sandbox.h"

void sandbox_egress_free(struct sandbox_egress *e)
{
    if (e == NULL) {
        return;
    }
    egress_proxy_stop(e->proxy); /* joins every thread, removes the socket */
    if (e->dir != NULL) {
        char *sock = xasprintf("%s/%s", e->dir, SANDBOX_EGRESS_SOCKET);
        (void)unlink(sock);
        (void)rmdir(e->dir);
        free(sock);
    }
    free(e->dir);
    free(e->log_path);
    free(e);
}

/* Removes the meter socket of DIR and DIR itself. */
static void remove_meter_dir(const char *dir)
{
    char *sock = xasprintf("%s/%s", dir, SANDBOX_METER_SOCKET);

    (void)unlink(sock);
    (void)rmdir(dir);
    free(sock);
}

void sandbox_meter_free(struct sandbox_meter *m)
{
    if (m == NULL) {
        return;
    }
    if (m->close != NULL) {
        m->close(m->server); /* no connection is left when it returns */
    }
    if (m->dir != NULL) {
        remove_meter_dir(m->dir);
    }
    free(m->dir);
    free(m);
}
