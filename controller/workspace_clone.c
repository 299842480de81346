/* SPDX-License-Identifier: Apache-2.0 */
/* The git directory of a local sandbox's workspace, made outside the sandbox from the
 * mirror before the sandbox starts: the runner's shallow clone over file:// (upload-pack,
 * pack-objects and index-pack in the sandbox) was about half of a task's start. Here the
 * mirror's object files are hard-linked (they stay the server's and read-only, see
 * controller_give_mirror), and the refs, config and shallow list the runner's clone would
 * have made are written: the base branch from origin, the working branch tracking
 * origin's when the mirror has it, else a new one at the base. Nothing of the repository
 * is checked out here: the runner does that inside the sandbox (git's checkout reads the
 * repository's hostile trees; the server never does). The runner finds the marker
 * CONTROLLER_PREPARED_MARK and treats the workspace as a fresh clone (SPEC §9 step 2).
 *
 * What the sandbox sees does not grow: the mirror was already bound read-only into it
 * (every ref and object of the task's repository); no other repository's objects, no
 * staging repository or workspace of another task is linked. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/gitref.h"
#include "common/hash.h"
#include "common/proc.h"
#include "controller/controller_int.h"

#define DEPTH_MAX 50 /* commits kept, as the runner's clone --depth=50 (rev-list's argv) */

bool controller_plain_branch(const char *name)
{
    size_t n = name != NULL ? strlen(name) : 0;

    if (n == 0 || n > 200 ||
        strspn(name, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                     "0123456789._/+-") != n) {
        return false;
    }
    if (strchr("-./", name[0]) != NULL || strchr("/.", name[n - 1]) != NULL ||
        strstr(name, "..") != NULL || strstr(name, "//") != NULL || strstr(name, "/.") != NULL) {
        return false;
    }
    return !(n >= 5 && strcmp(name + n - 5, ".lock") == 0);
}

/* Where refs/heads/BRANCH of the mirror DIR points (OID): 1, 0 absent, -1 not readable
 * from its files. The fetches that write the mirror are git's; its packed-refs may be
 * long (every tag of a large repository). */
static int read_branch(char oid[GITREF_OID_HEX + 1], const char *dir, const char *branch)
{
    char *ref = xasprintf("refs/heads/%s", branch);
    int rc = gitref_read(oid, dir, ref, GITREF_PACKED_MAX);

    free(ref);
    return rc;
}

/* Writes TEXT into the new file DIR/NAME. */
static int put_file(const char *dir, const char *name, const char *text, struct err *err)
{
    return controller_put_new(dir, name, text)
               ? E_OK
               : err_set(err, E_FAIL, "write .git/%s: %s", name, strerror(errno));
}

/* What git needs to call GITDIR a repository (HEAD, objects/, refs/; HEAD comes later)
 * and the directory of the packs: nothing git makes when it needs it (every directory
 * costs a metadata write, which a busy disk makes slow). */
static int skeleton(const char *gitdir, struct err *err)
{
    static const char *const sub[] = {"", "objects", "objects/pack", "refs"};

    for (size_t i = 0; i < ARRAY_LEN(sub); i++) {
        char *p = xasprintf("%s/%s", gitdir, sub[i]);
        int rc = mkdir(p, 0700);
        free(p);
        if (rc != 0) {
            return err_set(err, E_FAIL, "create .git/%s: %s", sub[i], strerror(errno));
        }
    }
    return E_OK;
}

/* What the runner's clone of BASE (and fetch of WORKING when the remote has it) leaves:
 * the refs (packed), HEAD on WORKING and the config with origin at the mirror's path in
 * the sandbox. TRACK: WORKING is on the remote at WORKING_OID. */
static int write_refs(const struct controller_clone *q, const char *base_oid, bool track,
                      const char *working_oid, struct err *err)
{
    struct buf refs, config;
    char *head = xasprintf("ref: refs/heads/%s\n", q->working);
    int rc;

    buf_init(&refs, 0);
    buf_init(&config, 0);
    buf_printf(&refs, "%s refs/heads/%s\n", base_oid, q->base);
    if (strcmp(q->base, q->working) != 0) {
        buf_printf(&refs, "%s refs/heads/%s\n", working_oid, q->working);
    }
    buf_printf(&refs, "%s refs/remotes/origin/%s\n", base_oid, q->base);
    buf_printf(&config,
               "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = false\n"
               "\tlogallrefupdates = true\n[remote \"origin\"]\n"
               "\turl = file://" SANDBOX_IN_MIRROR "\n"
               "\tfetch = +refs/heads/%s:refs/remotes/origin/%s\n",
               q->base, q->base);
    if (track) {
        buf_printf(&refs, "%s refs/remotes/origin/%s\n", working_oid, q->working);
        buf_printf(&config, "\tfetch = +refs/heads/%s:refs/remotes/origin/%s\n", q->working,
                   q->working);
    }
    buf_printf(&config, "[branch \"%s\"]\n\tremote = origin\n\tmerge = refs/heads/%s\n", q->base,
               q->base);
    if (track) {
        buf_printf(&config, "[branch \"%s\"]\n\tremote = origin\n\tmerge = refs/heads/%s\n",
                   q->working, q->working);
    }
    rc = put_file(q->gitdir, "packed-refs", refs.data, err);
    if (rc == E_OK) {
        rc = put_file(q->gitdir, "config", config.data, err);
    }
    if (rc == E_OK) {
        rc = put_file(q->gitdir, "HEAD", head, err);
    }
    buf_cleanup(&refs);
    buf_cleanup(&config);
    free(head);
    return rc;
}

/* Whether OID (40 hex at S) is among the first N lines' commits of LINES. */
static bool listed(char *const *lines, size_t n, const char *s)
{
    for (size_t i = 0; i < n; i++) {
        if (memcmp(lines[i], s, GITREF_OID_HEX) == 0) {
            return true;
        }
    }
    return false;
}

/* The shallow list of DEPTH_MAX commits from the tips: `rev-list --parents` of them, and
 * every listed commit with a parent outside the list is a boundary (git then reads it as
 * having none). "" when the whole history fits. Into *LIST_OUT (a new string). */
static int shallow_list(char **list_out, const char *gitdir, const char *tip1, const char *tip2,
                        struct err *err)
{
    const char *argv[] = {"git", "--git-dir", gitdir, "rev-list", "--parents", "--max-count=50",
                          tip1,  tip2,        NULL};
    char *lines[DEPTH_MAX + 1], *save = NULL, *line;
    struct buf out, shallow;
    size_t n = 0;
    int status = -1, rc;

    buf_init(&out, 64 * 1024);
    rc = proc_run(&status, &out, NULL, false, argv, err);
    if (rc == E_OK && status != 0) {
        rc = err_set(err, E_FAIL, "git rev-list failed (exit %d)", status);
    }
    buf_init(&shallow, 1024);
    if (rc == E_OK && out.data == NULL) {
        rc = err_set(err, E_FAIL, "git rev-list printed nothing");
    }
    for (line = strtok_r(out.data, "\n", &save); rc == E_OK && line != NULL;
         line = strtok_r(NULL, "\n", &save)) {
        if (n == ARRAY_LEN(lines) || strlen(line) % (GITREF_OID_HEX + 1) != GITREF_OID_HEX) {
            rc = err_set(err, E_FAIL, "git rev-list: unexpected output");
        } else {
            lines[n++] = line;
        }
    }
    for (size_t i = 0; rc == E_OK && i < n; i++) {
        size_t len = strlen(lines[i]);
        for (size_t at = GITREF_OID_HEX + 1; at < len; at += GITREF_OID_HEX + 1) {
            if (!listed(lines, n, lines[i] + at)) {
                buf_printf(&shallow, "%.*s\n", GITREF_OID_HEX, lines[i]);
                break;
            }
        }
    }
    *list_out = rc == E_OK ? xstrdup(shallow.len > 0 ? shallow.data : "") : NULL;
    buf_cleanup(&out);
    buf_cleanup(&shallow);
    return rc;
}

/* GITDIR's shallow file for the tips TIP1 and TIP2 of MIRROR: from C's memo of recent
 * starts (lock held; commits are immutable, so the same tips of one mirror have the same
 * list), else shallow_list. */
static int write_shallow(struct controller *c, const char *gitdir, const char *mirror,
                         const char *tip1, const char *tip2, struct err *err)
{
    char tips[sizeof(c->shallow_memo[0].tips)];
    const char *text = NULL;
    char *made = NULL;
    int rc = E_OK;

    snprintf(tips, sizeof(tips), "%s %s %016llx", tip1, tip2,
             (unsigned long long)hash_fnv1a_str(mirror));
    for (size_t i = 0; i < ARRAY_LEN(c->shallow_memo) && text == NULL; i++) {
        if (strcmp(c->shallow_memo[i].tips, tips) == 0) {
            text = c->shallow_memo[i].text;
        }
    }
    if (text == NULL) {
        rc = shallow_list(&made, gitdir, tip1, tip2, err);
        if (rc == E_OK) {
            struct controller_shallow_memo *m = &c->shallow_memo[c->shallow_next];
            c->shallow_next = (c->shallow_next + 1) % ARRAY_LEN(c->shallow_memo);
            free(m->text);
            memcpy(m->tips, tips, sizeof(tips));
            m->text = made;
            text = made;
        }
    }
    if (rc == E_OK && text[0] != '\0') {
        rc = put_file(gitdir, "shallow", text, err);
    }
    return rc;
}

/* The two tips: base and, when they differ, the working branch's. */
static int make(struct controller *c, const struct controller_clone *q, struct err *err)
{
    char base_oid[GITREF_OID_HEX + 1], working_oid[GITREF_OID_HEX + 1];
    int lock, has_base = -1, has_working = 0, rc;

    rc = skeleton(q->gitdir, err);
    if (rc != E_OK) {
        return rc;
    }
    lock = controller_mirror_lock(c->data_dir, q->url, err);
    if (lock < 0) {
        return E_FAIL;
    }
    /* Under the lock: the refs and the objects are those of one fetch. */
    has_base = read_branch(base_oid, q->mirror, q->base);
    if (strcmp(q->base, q->working) != 0) {
        has_working = read_branch(working_oid, q->mirror, q->working);
    }
    if (has_base != 1 || has_working < 0) {
        rc = err_set(err, E_NOTFOUND, "the mirror has no readable branch %s",
                     has_base != 1 ? q->base : q->working);
    } else {
        rc = controller_give_mirror(c, q->mirror, q->gitdir, err);
    }
    close(lock);
    if (rc == E_OK) {
        if (has_working != 1) {
            memcpy(working_oid, base_oid, sizeof(base_oid));
        }
        rc = write_refs(q, base_oid, has_working == 1, working_oid, err);
    }
    if (rc == E_OK) {
        rc = write_shallow(c, q->gitdir, q->mirror, working_oid, base_oid, err);
    }
    if (rc == E_OK) {
        rc = put_file(q->gitdir, CONTROLLER_PREPARED_MARK, "", err);
    }
    return rc;
}

int controller_workspace_clone(struct controller *c, const struct controller_clone *q,
                               struct err *err)
{
    /* Other names are left to the runner's clone. */
    if (!controller_plain_branch(q->base) || !controller_plain_branch(q->working)) {
        return err_set(err, E_INVALID, "a branch name it leaves to git");
    }
    return make(c, q, err);
}
