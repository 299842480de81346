/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests of the disk limits (controller/disk_watch.c, push_limit.c): a task the
 * watchdog stopped fails whatever its phase, the measure of a task's tree (symlinks not
 * followed, the depth and entry limits one past them, the early stop), and the size of a
 * push with the mirror's history left out. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "controller/controller.h"
#include "controller/controller_int.h"
#include "sandbox/sandbox.h"
#include "tests/t_check.h"

TEST(decide_disk_over)
{
    static const struct {
        enum task_phase phase;
        bool suspended;
        int sandbox;
        enum controller_action want;
    } cases[] = {
        {TASK_ACTIVE, false, SANDBOX_ABSENT, CONTROLLER_DISK_LIMIT},
        {TASK_ACTIVE, false, SANDBOX_EXITED, CONTROLLER_DISK_LIMIT},
        {TASK_ACTIVE, true, SANDBOX_ABSENT, CONTROLLER_DISK_LIMIT},
        {TASK_PAUSED, false, SANDBOX_ABSENT, CONTROLLER_DISK_LIMIT},
        {TASK_PAUSING, true, SANDBOX_ABSENT, CONTROLLER_DISK_LIMIT},
        {TASK_PROVISIONING, false, SANDBOX_ABSENT, CONTROLLER_DISK_LIMIT},
        {TASK_FAILED, false, SANDBOX_ABSENT, CONTROLLER_NOTHING},
        {TASK_COMPLETED, false, SANDBOX_ABSENT, CONTROLLER_NOTHING},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        struct task_view v;
        struct controller_observed o = {.runs_sandboxes = true,
                                        .can_run = true,
                                        .workspace_exists = true,
                                        .sandbox = cases[i].sandbox,
                                        .disk_over = true};
        memset(&v, 0, sizeof(v));
        v.phase = cases[i].phase;
        v.suspended = cases[i].suspended;
        enum controller_action a = controller_decide(&v, &o);
        if (a != cases[i].want) {
            t_fail(__FILE__, __LINE__, "case %zu: got %s want %s", i, controller_action_name(a),
                   controller_action_name(cases[i].want));
        }
    }
    /* Without the mark, a running task goes on. */
    struct task_view v;
    struct controller_observed o = {
        .runs_sandboxes = true, .can_run = true, .workspace_exists = true, .sandbox = 1};
    memset(&v, 0, sizeof(v));
    v.phase = TASK_ACTIVE;
    CHECK_EQ_INT(controller_decide(&v, &o), CONTROLLER_NOTHING);
}

static void write_file(const char *path, size_t len)
{
    char buf[4096];
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);

    memset(buf, 'x', sizeof(buf));
    for (size_t done = 0; fd >= 0 && done < len; done += sizeof(buf)) {
        CHECK(write(fd, buf, sizeof(buf)) == (ssize_t)sizeof(buf));
    }
    CHECK(fd >= 0 && fsync(fd) == 0);
    close(fd);
}

static int remove_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static int64_t usage(const char *path, int64_t stop_at, int64_t max_entries, int *rc_out)
{
    int64_t bytes = -1, entries = max_entries;

    *rc_out = controller_disk_usage(&bytes, path, stop_at, &entries, false, NULL);
    return bytes;
}

TEST(disk_usage_measures_the_tree)
{
    char dir[] = "/tmp/diverge-disk-XXXXXX";
    char *root = mkdtemp(dir), *sub, *file, *outside, *link, *deep;
    int64_t bytes, base;
    int rc;

    CHECK(root != NULL);
    sub = xasprintf("%s/ws", root);
    CHECK_OK(mkdir(sub, 0700));
    base = usage(sub, 0, 100, &rc);
    CHECK_OK(rc);
    file = xasprintf("%s/ws/one", root);
    write_file(file, 1 << 20);
    bytes = usage(sub, 0, 100, &rc);
    CHECK_OK(rc);
    CHECK(bytes >= base + (1 << 20));
    /* A symlink to a big file elsewhere counts as the link, not as the file. */
    outside = xasprintf("%s/outside", root);
    write_file(outside, 4 << 20);
    link = xasprintf("%s/ws/link", root);
    CHECK_OK(symlink(outside, link));
    CHECK(usage(sub, 0, 100, &rc) < bytes + (1 << 20));
    CHECK_OK(rc);
    /* Stopped early once past STOP_AT: still E_OK, more than it. */
    CHECK(usage(sub, 4096, 100, &rc) > 4096);
    CHECK_OK(rc);
    /* Entries: "one" and "link" are 2; one fewer allowed is over. */
    usage(sub, 0, 2, &rc);
    CHECK_OK(rc);
    usage(sub, 0, 1, &rc);
    CHECK_EQ_INT(rc, E_TOOBIG);
    /* Depth: a chain of CONTROLLER_DISK_DEPTH_MAX directories is measured, one more is not. */
    deep = xasprintf("%s/ws", root);
    for (int i = 1; i <= CONTROLLER_DISK_DEPTH_MAX; i++) {
        char *next = xasprintf("%s/d", deep);
        CHECK_OK(mkdir(next, 0700));
        free(deep);
        deep = next;
        if (i == CONTROLLER_DISK_DEPTH_MAX - 1) {
            usage(sub, 0, 1000, &rc);
            CHECK_OK(rc);
        }
    }
    usage(sub, 0, 1000, &rc);
    CHECK_EQ_INT(rc, E_TOOBIG);
    /* An absent tree takes nothing. */
    free(deep);
    deep = xasprintf("%s/absent", root);
    CHECK_EQ_INT(usage(deep, 0, 10, &rc), 0);
    CHECK_OK(rc);
    CHECK(controller_disk_free(root) > 0);
    free(deep);
    free(link);
    free(outside);
    free(file);
    free(sub);
    CHECK_OK(nftw(root, remove_one, 16, FTW_DEPTH | FTW_PHYS));
}

/* A file of the server's user hard-linked into the tree (the mirror's objects in a
 * workspace) is not the task's with SKIP_LINKS; a file with one link is. */
TEST(disk_usage_skips_the_servers_links)
{
    char dir[] = "/tmp/diverge-disk-XXXXXX";
    char *root = mkdtemp(dir), *sub, *shared, *linked, *own;
    int64_t base, bytes = -1, entries = 100;
    int rc;

    CHECK(root != NULL);
    sub = xasprintf("%s/ws", root);
    CHECK_OK(mkdir(sub, 0700));
    base = usage(sub, 0, 100, &rc);
    shared = xasprintf("%s/mirror-pack", root);
    linked = xasprintf("%s/ws/pack", root);
    own = xasprintf("%s/ws/own", root);
    write_file(shared, 4 << 20);
    CHECK_OK(link(shared, linked));
    CHECK(usage(sub, 0, 100, &rc) >= base + (4 << 20)); /* counted without SKIP_LINKS */
    CHECK_OK(controller_disk_usage(&bytes, sub, 0, &entries, true, NULL));
    CHECK(bytes < base + (1 << 20));
    write_file(own, 1 << 20);
    entries = 100;
    CHECK_OK(controller_disk_usage(&bytes, sub, 0, &entries, true, NULL));
    CHECK(bytes >= base + (1 << 20) && bytes < base + (2 << 20));
    free(shared);
    free(linked);
    free(own);
    free(sub);
    CHECK_OK(nftw(root, remove_one, 16, FTW_DEPTH | FTW_PHYS));
}

T_MAIN
