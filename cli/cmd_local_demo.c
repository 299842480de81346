/* SPDX-License-Identifier: Apache-2.0 */
/* `diverge local demo` (SPEC §10): a small example repository under the data dir (the
 * files of examples/demo-repo/, built into the binary, and the demo agent), a bare
 * repository with `main` (its test fails) and the PR branch, the local PR
 * demo/greeting#1 bound to it, and the commands to try next. The CLI makes the
 * repository itself: it finds the data dir the way it finds the admin token
 * ($DIVERGE_DATA_DIR, else ./var), and the server only ever reads it through the
 * file:// URL. git runs from argv arrays, offline, never asking for input. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli_int.h"
#include "cli/demo_files.h"
#include "common/proc.h"

#define DEMO_PROJECT "demo/greeting"
#define DEMO_NUMBER 1
#define DEMO_HEAD "fix-greeting"
#define DEMO_BASE "main"
#define DEMO_OBJECTIVE "the typo in greeting.txt"
#define DEMO_NAMESPACE "demo-greeting"
#define DEMO_TASK "fix-pr-1"

/* Runs git with ARGV (after "git" and the fixed options); the first lines of its output
 * are the error message when it fails. */
static int git(const char *const *argv, struct err *err)
{
    const char *full[24] = {"git",
                            "-c",
                            "user.name=diverge demo",
                            "-c",
                            "user.email=demo@diverge.invalid",
                            "-c",
                            "commit.gpgsign=false",
                            "-c",
                            "core.hooksPath=/dev/null",
                            "-c",
                            "init.defaultBranch=main"};
    size_t n = 11;
    struct buf out;
    int status = 0, rc;

    for (; *argv != NULL && n < ARRAY_LEN(full) - 1; argv++) {
        full[n++] = *argv;
    }
    full[n] = NULL;
    buf_init(&out, 4096);
    rc = proc_run(&status, &out, NULL, true, full, err);
    if (rc == E_OK && status != 0) {
        rc = err_set(err, E_FAIL, "git %s failed (exit %d): %.200s", full[11], status,
                     out.data != NULL ? out.data : "");
    }
    buf_cleanup(&out);
    return rc;
}

/* mkdir DIR with MODE unless it exists. */
static int make_dir(const char *dir, mode_t mode, struct err *err)
{
    if (mkdir(dir, mode) != 0 && errno != EEXIST) {
        return err_set(err, E_FAIL, "%s: %s", dir, strerror(errno));
    }
    return E_OK;
}

static int write_file(const char *path, const unsigned char *data, size_t len, mode_t mode,
                      struct err *err)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    size_t off = 0;
    int rc = E_OK;

    if (fd < 0) {
        return err_set(err, E_FAIL, "%s: %s", path, strerror(errno));
    }
    while (off < len && rc == E_OK) {
        ssize_t w = write(fd, data + off, len - off);
        if (w < 0 && errno == EINTR) {
            continue;
        }
        if (w <= 0) {
            rc = err_set(err, E_FAIL, "%s: %s", path, strerror(errno));
        } else {
            off += (size_t)w;
        }
    }
    if (close(fd) != 0 && rc == E_OK) {
        rc = err_set(err, E_FAIL, "%s: %s", path, strerror(errno));
    }
    return rc;
}

/* Writes every embedded file under DIR (subdirectories made as needed). */
static int write_files(const char *dir, struct err *err)
{
    int rc = E_OK;

    for (const struct demo_file *f = demo_files; f->path != NULL && rc == E_OK; f++) {
        char *path = xasprintf("%s/%s", dir, f->path);
        for (char *slash = strchr(path + strlen(dir) + 1, '/'); slash != NULL && rc == E_OK;
             slash = strchr(slash + 1, '/')) {
            *slash = '\0';
            rc = make_dir(path, 0755, err);
            *slash = '/';
        }
        if (rc == E_OK) {
            rc = write_file(path, f->data, f->len, (mode_t)f->mode, err);
        }
        free(path);
    }
    return rc;
}

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void remove_tree(const char *dir)
{
    (void)nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* The working copy SRC: main with the demo files (the test fails), and the PR branch. */
static int build_source(const char *src, struct err *err)
{
    int rc = write_files(src, err);

    if (rc == E_OK) {
        rc = git((const char *const[]){"-C", src, "init", "-q", "-b", DEMO_BASE, NULL}, err);
    }
    if (rc == E_OK) {
        rc = git((const char *const[]){"-C", src, "add", "-A", NULL}, err);
    }
    if (rc == E_OK) {
        rc = git((const char *const[]){"-C", src, "commit", "-q", "-m",
                                       "demo: greeting.txt has a typo, test.sh fails", NULL},
                 err);
    }
    if (rc == E_OK) {
        rc = git((const char *const[]){"-C", src, "branch", DEMO_HEAD, NULL}, err);
    }
    return rc;
}

/* Makes the bare repository BARE (absent) from the embedded files, through temporary
 * directories next to it, renamed into place last: a failed run leaves nothing half made. */
static int create_repo(const char *demo_dir, const char *bare, struct err *err)
{
    char *src = xasprintf("%s/.src-XXXXXX", demo_dir);
    char *tmp_bare = xasprintf("%s/.bare-XXXXXX", demo_dir);
    int rc = E_OK;

    if (mkdtemp(src) == NULL || mkdtemp(tmp_bare) == NULL) {
        rc = err_set(err, E_FAIL, "%s: %s", demo_dir, strerror(errno));
    }
    if (rc == E_OK) {
        rc = build_source(src, err);
    }
    if (rc == E_OK) {
        rc = git((const char *const[]){"init", "-q", "--bare", "-b", DEMO_BASE, tmp_bare, NULL},
                 err);
    }
    if (rc == E_OK) {
        rc = git(
            (const char *const[]){"-C", src, "push", "-q", tmp_bare, DEMO_BASE, DEMO_HEAD, NULL},
            err);
    }
    if (rc == E_OK && (chmod(tmp_bare, 0755) != 0 || rename(tmp_bare, bare) != 0)) {
        rc = err_set(err, E_FAIL, "%s: %s", bare, strerror(errno));
    }
    remove_tree(src);
    if (rc != E_OK) {
        remove_tree(tmp_bare);
    }
    free(src);
    free(tmp_bare);
    return rc;
}

/* The absolute data dir (made 0700 when absent, as the server would) into OUT. */
static int data_dir(char out[PATH_MAX], struct err *err)
{
    const char *dir = getenv("DIVERGE_DATA_DIR");

    if (dir == NULL || dir[0] == '\0') {
        dir = "./var";
    }
    if (make_dir(dir, 0700, err) != E_OK) {
        return E_FAIL;
    }
    if (realpath(dir, out) == NULL) {
        return err_set(err, E_FAIL, "%s: %s", dir, strerror(errno));
    }
    return E_OK;
}

static void print_next_steps(void)
{
    printf("\nNext, with the server running (make run):\n"
           "  %s local comment %s#%d \"/diverge fix %s\"\n"
           "  %s local thread %s#%d      # queued, then running, then Completed\n"
           "  %s task logs %s -n %s -f   # clone, iteration 1 fails its test, 2 passes, push\n",
           cli_program, DEMO_PROJECT, DEMO_NUMBER, DEMO_OBJECTIVE, cli_program, DEMO_PROJECT,
           DEMO_NUMBER, cli_program, DEMO_TASK, DEMO_NAMESPACE);
}

int cli_local_demo(struct cli_ctx *ctx, const struct cli_args *args)
{
    char dir[PATH_MAX], *demo_dir = NULL, *bare = NULL, *url = NULL, *raw = NULL;
    json_t *ans = NULL;
    struct stat sb;
    struct err err = {0};
    bool exists;
    int rc;

    (void)args;
    if (data_dir(dir, &err) != E_OK) {
        cli_errorf("local demo: %s", err.msg);
        return CLI_EXIT_FAILED;
    }
    demo_dir = xasprintf("%s/demo", dir);
    bare = xasprintf("%s/greeting.git", demo_dir);
    url = xasprintf("file://%s", bare);
    exists = stat(bare, &sb) == 0;
    rc = exists ? E_OK : make_dir(demo_dir, 0755, &err);
    if (rc == E_OK && !exists) {
        rc = create_repo(demo_dir, bare, &err);
    }
    if (rc != E_OK) {
        cli_errorf("local demo: %s", err.msg);
        rc = CLI_EXIT_FAILED;
        goto out;
    }
    rc = cli_local_pr_open(&ans, &raw, ctx, DEMO_PROJECT, DEMO_NUMBER, url, DEMO_HEAD, DEMO_BASE);
    if (rc != CLI_EXIT_OK) {
        goto out;
    }
    printf("demo repository %s: %s\n", exists ? "exists" : "created", bare);
    printf("  %s: test.sh fails (greeting.txt has a typo); .diverge/agent.yaml runs the demo "
           "agent\n",
           DEMO_BASE);
    printf("  %s: the pull request's branch\n", DEMO_HEAD);
    printf("local PR %s#%d %s: %s -> %s\n", DEMO_PROJECT, DEMO_NUMBER,
           json_is_true(json_object_get(ans, "created")) ? "opened" : "is open", DEMO_HEAD,
           DEMO_BASE);
    print_next_steps();
out:
    json_decref(ans);
    free(raw);
    free(demo_dir);
    free(bare);
    free(url);
    return rc;
}
