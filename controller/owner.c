/* SPDX-License-Identifier: Apache-2.0 */
/* What the sandbox user gets of the data dir when the server runs as root: its group may
 * search the directories down to what a sandbox binds, its files (workspace, staging,
 * state, token dir, mirror) become its own, and its sockets (meter, egress proxy) take
 * connections from it. Nothing changes when the server runs as the sandbox user. Also
 * where those sockets go: a directory of their own per task. */
#define _GNU_SOURCE
#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/secret.h"
#include "controller/controller_int.h"

static uid_t g_chown_uid; /* nftw has no userdata: guarded by the controller lock */
static gid_t g_chown_gid;

static int chown_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return lchown(path, g_chown_uid, g_chown_gid) == 0 ? 0 : -1;
}

/* Lets the sandbox user's group search (not list, not read) the directories from the
 * data dir down to PATH's parent: bubblewrap, running as that user, resolves the bind
 * sources by name. Files keep their owner-only modes. */
static void reach(struct controller *c, const char *path)
{
    size_t base = strlen(c->data_dir);
    char *p = xstrdup(path);

    for (size_t i = base; p[i] != '\0'; i++) {
        if (p[i] == '/' || i == base) {
            char save = p[i];
            p[i] = '\0';
            if (chown(p, (uid_t)-1, c->sandbox_gid) == 0) {
                (void)chmod(p, 0710);
            }
            p[i] = save;
        }
    }
    free(p);
}

void controller_expose_socket(struct controller *c, const char *path)
{
    if (!c->chown_files) {
        return;
    }
    reach(c, path);
    if (chown(path, (uid_t)-1, c->sandbox_gid) == 0) {
        (void)chmod(path, 0660);
    }
}

int controller_give(struct controller *c, const char *path, struct err *err)
{
    if (!c->chown_files) {
        return E_OK;
    }
    reach(c, path);
    g_chown_uid = c->sandbox_uid;
    g_chown_gid = c->sandbox_gid;
    if (nftw(path, chown_one, 16, FTW_PHYS) != 0) {
        return err_set(err, E_FAIL, "chown %s: %s", path, strerror(errno));
    }
    return E_OK;
}

int controller_socket_dir(char **out, const struct controller *c, const char *kind, struct err *err)
{
    char *root = xasprintf("%s/%s", c->data_dir, kind);
    unsigned char nonce[8];
    char hex[sizeof(nonce) * 2 + 1];
    int rc = E_OK;

    secret_random(nonce, sizeof(nonce));
    for (size_t i = 0; i < sizeof(nonce); i++) {
        snprintf(hex + 2 * i, 3, "%02x", nonce[i]);
    }
    *out = xasprintf("%s/%s", root, hex);
    if (sandbox_mkdirs(*out, true) != 0) {
        rc = err_set(err, E_FAIL, "create %s: %s", *out, strerror(errno));
        free(*out);
        *out = NULL;
    }
    free(root);
    return rc;
}
