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

/* Whether SB is a file of the mirror hard-linked into a workspace (controller_give_mirror):
 * the server's, read-only, with more than one link. Never given away: the sandbox user
 * could make it writable and change the mirror every later task reads. The sandbox user
 * cannot make such a file (it is not the server's user). */
static bool shared_object(const struct stat *sb)
{
    return S_ISREG(sb->st_mode) && sb->st_nlink > 1 && sb->st_uid == geteuid();
}

static int chown_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)flag;
    (void)ftw;
    if (shared_object(sb) || (sb->st_uid == g_chown_uid && sb->st_gid == g_chown_gid)) {
        return 0;
    }
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

void controller_reach(struct controller *c, const char *path)
{
    if (c->chown_files) {
        reach(c, path);
    }
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

static size_t g_mirror_len; /* the mirror walk's state: guarded by the controller lock */
static const char *g_link_to;

/* Whether REL (a path in a repository) is an object file a clone reads: a loose object
 * objects/<2 hex>/<38 hex>, or objects/pack/pack-<hex>.<ext>. */
static bool object_file(const char *rel)
{
    size_t n = strlen(rel);

    if (strncmp(rel, "objects/pack/pack-", 18) == 0) {
        return strchr(rel + 18, '/') == NULL && strspn(rel + 18, "0123456789abcdef") >= 40;
    }
    return n == 8 + 2 + 1 + 38 && strncmp(rel, "objects/", 8) == 0 &&
           strspn(rel + 8, "0123456789abcdef") == 2 && rel[10] == '/' &&
           strspn(rel + 11, "0123456789abcdef") == 38;
}

/* Hard-links the object file PATH (REL in the mirror) to the same REL under g_link_to. */
static int link_object(const char *path, const char *rel)
{
    char *dst = xasprintf("%s/%s", g_link_to, rel);
    char *slash = strrchr(dst, '/');
    int rc;

    *slash = '\0';
    rc = mkdir(dst, 0700) == 0 || errno == EEXIST ? 0 : -1;
    *slash = '/';
    if (rc == 0) {
        rc = link(path, dst);
    }
    free(dst);
    return rc;
}

static int mirror_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    const char *rel = path[g_mirror_len] == '/' ? path + g_mirror_len + 1 : "";

    (void)ftw;
    if (flag == FTW_F && S_ISREG(sb->st_mode) && strncmp(rel, "objects/", 8) == 0) {
        /* The server's and read-only for everyone else: the sandbox user reads it (through
         * the mirror's bind, or a hard link in its workspace) and can never change it. */
        if ((sb->st_uid != geteuid() || sb->st_gid != getegid()) &&
            lchown(path, geteuid(), getegid()) != 0) {
            return -1;
        }
        if ((sb->st_mode & 07777) != 0444 && chmod(path, 0444) != 0) {
            return -1;
        }
        return g_link_to != NULL && object_file(rel) ? link_object(path, rel) : 0;
    }
    if (sb->st_uid == g_chown_uid && sb->st_gid == g_chown_gid) {
        return 0; /* given at an earlier start: no syscall */
    }
    return lchown(path, g_chown_uid, g_chown_gid) == 0 ? 0 : -1;
}

int controller_give_mirror(struct controller *c, const char *mirror, const char *link_to,
                           struct err *err)
{
    if (!c->chown_files) {
        return link_to == NULL ? E_OK : err_set(err, E_INVALID, "the server does not run as root");
    }
    reach(c, mirror);
    g_chown_uid = c->sandbox_uid;
    g_chown_gid = c->sandbox_gid;
    g_mirror_len = strlen(mirror);
    g_link_to = link_to;
    if (nftw(mirror, mirror_one, 16, FTW_PHYS) != 0) {
        int e = errno;
        g_link_to = NULL;
        return err_set(err, E_FAIL, "%s %s: %s", link_to != NULL ? "link the objects of" : "chown",
                       mirror, strerror(e));
    }
    g_link_to = NULL;
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
