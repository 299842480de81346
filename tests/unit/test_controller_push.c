/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests of a push's bounds (controller/workspace.c): a push whose git runs past its
 * wall-clock limit, or that another thread cancels, ends as failed with its git and git's
 * helpers (here the ssh command git runs) killed. The remote is an ssh:// URL whose "ssh"
 * (GIT_SSH_COMMAND) never answers: nothing leaves the machine. The measure of a push
 * (controller/push_limit.c) is bounded the same way: a "git" first on PATH that hangs in
 * rev-list stands for a staging repository that takes git forever. */
#define _GNU_SOURCE
#include <dirent.h>
#include <ftw.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/proc.h"
#include "controller/controller.h"
#include "controller/controller_int.h"
#include "tests/t_check.h"

#define HANG "987654" /* the silent ssh's sleep, found in /proc by it */

/* Runs git with ARGV (from "git" on); its stdout, without the newline, into OUT (may be
 * NULL). */
static void git(char out[128], const char *const argv[])
{
    struct buf b;
    int status = -1;

    buf_init(&b, 128);
    CHECK_OK(proc_run(&status, &b, NULL, false, argv, NULL));
    CHECK_EQ_INT(status, 0);
    if (out != NULL) {
        snprintf(out, 128, "%.*s", (int)(b.len > 0 ? b.len - 1 : 0), b.data);
    }
    buf_cleanup(&b);
}

/* A bare repository under ROOT whose branch main holds one commit; new string. */
static char *staging_repo(const char *root)
{
    char *dir = xasprintf("%s/staging.git", root);
    char tree[128], commit[128];
    const char *init[] = {"git", "init", "-q", "--bare", dir, NULL};
    const char *mktree[] = {"git", "--git-dir", dir, "mktree", NULL};

    git(NULL, init);
    git(tree, mktree);
    const char *commit_tree[] = {
        "git",       "-c", "user.name=t", "-c", "user.email=t@example.invalid",
        "--git-dir", dir,  "commit-tree", tree, "-m",
        "one",       NULL};
    git(commit, commit_tree);
    const char *update[] = {"git", "--git-dir", dir, "update-ref", "refs/heads/main", commit, NULL};
    git(NULL, update);
    return dir;
}

/* How many live processes run the silent ssh's sleep. */
static int hanging(void)
{
    static const char want[] = "sleep\0" HANG;
    DIR *d = opendir("/proc");
    struct dirent *e;
    int n = 0;

    while (d != NULL && (e = readdir(d)) != NULL) {
        char path[300], cmd[64] = {0}, stat[512] = {0};
        FILE *f;
        snprintf(path, sizeof(path), "/proc/%s/cmdline", e->d_name);
        f = fopen(path, "rb");
        size_t len = f != NULL ? fread(cmd, 1, sizeof(cmd), f) : 0;
        if (f != NULL) {
            fclose(f);
        }
        if (len < sizeof(want) || memcmp(cmd, want, sizeof(want)) != 0) {
            continue;
        }
        snprintf(path, sizeof(path), "/proc/%s/stat", e->d_name);
        f = fopen(path, "r");
        if (f != NULL) {
            size_t got = fread(stat, 1, sizeof(stat) - 1, f);
            fclose(f);
            const char *paren = got > 0 ? strrchr(stat, ')') : NULL;
            n += paren != NULL && paren[1] == ' ' && paren[2] != 'Z';
        }
    }
    if (d != NULL) {
        closedir(d);
    }
    return n;
}

/* Waits (at most 30 s) until no live process runs the silent ssh's sleep: SIGKILL is
 * sent to the whole group, each member dies when the kernel gets to it. */
static void check_none_hanging(void)
{
    for (int i = 0; i < 3000 && hanging() > 0; i++) {
        usleep(10000);
    }
    CHECK_EQ_INT(hanging(), 0);
}

static int remove_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

struct fixture {
    char dir[32];
    struct controller *c;
    char *staging;
};

static void fixture_init(struct fixture *f)
{
    snprintf(f->dir, sizeof(f->dir), "/tmp/diverge-push-XXXXXX");
    CHECK(mkdtemp(f->dir) != NULL);
    f->c = xcalloc(1, sizeof(*f->c));
    f->c->data_dir = f->dir;
    f->staging = staging_repo(f->dir);
    /* git runs this for ssh://: it never answers (the ':' takes git's arguments). */
    setenv("GIT_SSH_COMMAND", "sleep " HANG "; :", 1);
    unsetenv("GITHUB_TOKEN");
    unsetenv("DIVERGE_NOTIFIER_TOKEN");
}

static void fixture_cleanup(struct fixture *f)
{
    unsetenv("GIT_SSH_COMMAND");
    free(f->staging);
    free(f->c);
    CHECK_OK(nftw(f->dir, remove_one, 16, FTW_DEPTH | FTW_PHYS));
}

TEST(push_past_its_time_limit_is_stopped)
{
    struct controller_git_bound b;
    struct fixture f;
    struct err err = {0};

    fixture_init(&f);
    controller_git_bound_init(&b, 300);
    CHECK_EQ_INT(
        controller_push(f.c, f.staging, "ssh://127.0.0.1/repo.git", "main", NULL, &b, &err),
        E_FAIL);
    CHECK(strstr(err.msg, "git push stopped after") != NULL);
    CHECK(controller_git_cancelled(&b) == NULL);
    check_none_hanging();
    controller_git_bound_cleanup(&b);
    fixture_cleanup(&f);
}

/* Cancels B once its git runs. */
static void *cancel_when_running(void *arg)
{
    struct controller_git_bound *b = arg;

    for (int i = 0; i < 3000; i++) { /* at most 30 s: then the cancel comes anyway */
        pthread_mutex_lock(&b->lock);
        bool running = b->pgid > 0;
        pthread_mutex_unlock(&b->lock);
        if (running && hanging() > 0) {
            break;
        }
        usleep(10000);
    }
    controller_git_cancel(b, "the test cancelled it");
    return NULL;
}

TEST(cancelled_push_kills_git_and_its_helpers)
{
    struct controller_git_bound b;
    struct fixture f;
    struct err err = {0};
    pthread_t th;

    fixture_init(&f);
    controller_git_bound_init(&b, CONTROLLER_PUSH_LIMIT_MS);
    CHECK_OK(pthread_create(&th, NULL, cancel_when_running, &b));
    CHECK_EQ_INT(
        controller_push(f.c, f.staging, "ssh://127.0.0.1/repo.git", "main", NULL, &b, &err),
        E_FAIL);
    pthread_join(th, NULL);
    CHECK_EQ_STR(err.msg, "git push stopped: the test cancelled it");
    check_none_hanging();
    /* A cancel before the next git starts kills that one at once. */
    memset(&err, 0, sizeof(err));
    CHECK_EQ_INT(
        controller_push(f.c, f.staging, "ssh://127.0.0.1/repo.git", "main", NULL, &b, &err),
        E_FAIL);
    CHECK_EQ_STR(err.msg, "git push stopped: the test cancelled it");
    check_none_hanging();
    controller_git_bound_cleanup(&b);
    fixture_cleanup(&f);
}

/* Puts a "git" that hangs in rev-list (and runs the real git otherwise) first on PATH;
 * returns the PATH before, to give to path_restore(). */
static char *path_with_hanging_rev_list(const struct fixture *f)
{
    const char *path = getenv("PATH");
    char *before = xstrdup(path != NULL ? path : "/usr/bin:/bin");
    char *bin = xasprintf("%s/bin", f->dir), *git_path = xasprintf("%s/git", bin);
    char *script =
        xasprintf("#!/bin/sh\n"
                  "for a in \"$@\"; do [ \"$a\" = rev-list ] && exec sleep " HANG "; done\n"
                  "PATH='%s' exec git \"$@\"\n",
                  before);
    FILE *fp;

    CHECK_OK(mkdir(bin, 0700));
    fp = fopen(git_path, "w");
    CHECK(fp != NULL);
    CHECK(fputs(script, fp) >= 0);
    CHECK_OK(fclose(fp));
    CHECK_OK(chmod(git_path, 0700));
    char *now = xasprintf("%s:%s", bin, before);
    setenv("PATH", now, 1);
    free(now);
    free(script);
    free(git_path);
    free(bin);
    return before;
}

static void path_restore(char *before)
{
    setenv("PATH", before, 1);
    free(before);
}

TEST(push_size_counts_only_what_the_mirror_lacks)
{
    struct fixture f;
    struct err err = {0};
    int64_t size = -1;

    fixture_init(&f);
    char *mirror = xasprintf("%s/mirror.git", f.dir);
    const char *clone[] = {"git", "clone", "-q", "--bare", f.staging, mirror, NULL};
    CHECK_OK(controller_push_size(&size, f.staging, NULL, "main", NULL, &err));
    CHECK(size > 0); /* no mirror: the commit and its tree are new */
    git(NULL, clone);
    CHECK_OK(controller_push_size(&size, f.staging, mirror, "main", NULL, &err));
    CHECK_EQ_INT(size, 0); /* the mirror has them */
    free(mirror);
    fixture_cleanup(&f);
}

TEST(push_size_past_its_time_limit_is_stopped)
{
    struct controller_git_bound b;
    struct fixture f;
    struct err err = {0};
    int64_t size = -1;

    fixture_init(&f);
    char *path = path_with_hanging_rev_list(&f);
    controller_git_bound_init(&b, 300);
    CHECK_EQ_INT(controller_push_size(&size, f.staging, NULL, "main", &b, &err), E_FAIL);
    CHECK_EQ_STR(err.msg,
                 "cannot measure the push: git rev-list stopped after 300 ms without finishing");
    CHECK_EQ_INT(size, 0);
    check_none_hanging();
    controller_git_bound_cleanup(&b);
    path_restore(path);
    fixture_cleanup(&f);
}

TEST(cancelled_push_size_kills_its_git)
{
    struct controller_git_bound b;
    struct fixture f;
    struct err err = {0};
    int64_t size = -1;
    pthread_t th;

    fixture_init(&f);
    char *path = path_with_hanging_rev_list(&f);
    controller_git_bound_init(&b, CONTROLLER_PUSH_LIMIT_MS);
    CHECK_OK(pthread_create(&th, NULL, cancel_when_running, &b));
    CHECK_EQ_INT(controller_push_size(&size, f.staging, NULL, "main", &b, &err), E_FAIL);
    pthread_join(th, NULL);
    CHECK_EQ_STR(err.msg, "cannot measure the push: git rev-list stopped: the test cancelled it");
    check_none_hanging();
    controller_git_bound_cleanup(&b);
    path_restore(path);
    fixture_cleanup(&f);
}

T_MAIN
