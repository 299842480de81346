/* SPDX-License-Identifier: Apache-2.0 */
/* What a started sandbox takes over from its caller (sandbox_spec): the task's egress
 * proxy and its meter socket. The provider frees them when the runner exits, when the
 * sandbox is stopped, and when start() fails; the caller frees them when it never got to
 * start(). */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
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
        sandbox_socket_dir_remove(e->dir, SANDBOX_EGRESS_SOCKET);
    }
    free(e->dir);
    free(e->log_path);
    free(e);
}

void sandbox_socket_dir_remove(const char *dir, const char *sockname)
{
    char *sock = xasprintf("%s/%s", dir, sockname);

    (void)unlink(sock);
    (void)rmdir(dir);
    free(sock);
}

void sandbox_socket_sweep(const char *root, const char *sockname)
{
    DIR *d = opendir(root);
    struct dirent *de;

    while (d != NULL && (de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0) {
            continue;
        }
        char *dir = xasprintf("%s/%s", root, de->d_name);
        sandbox_socket_dir_remove(dir, sockname);
        free(dir);
    }
    if (d != NULL) {
        closedir(d);
    }
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
        sandbox_socket_dir_remove(m->dir, SANDBOX_METER_SOCKET);
    }
    free(m->dir);
    free(m);
}
