/* SPDX-License-Identifier: Apache-2.0 */
/* The size of what the server's push of a task's working branch would send to the real
 * remote (--max-push-bytes): the on-disk size of the objects of the branch in the staging
 * repository that the repository's mirror (the remote's refs when it was last fetched)
 * cannot reach. git measures it (rev-list --disk-usage, git >= 2.31), with the mirror as an
 * alternate object store given through the environment, never through the staging repo's
 * files, which the sandbox wrote. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "controller/controller_int.h"

extern char **environ;

#define PUSH_SIZE_OUT_MAX 64 /* bytes of rev-list output read: one number */

/* git's environment: the server's PATH, HOME and git config variables, C locale, no
 * prompt, and the mirror's objects as an alternate when MIRROR is a directory. */
static char **size_env(const char *mirror)
{
    static const char *const keep[] = {
        "PATH=", "HOME=", "GIT_CONFIG_GLOBAL=", "GIT_CONFIG_NOSYSTEM="};
    char **env = xcalloc(ARRAY_LEN(keep) + 4, sizeof(*env));
    struct stat st;
    size_t n = 0;

    for (char **e = environ; *e != NULL; e++) {
        for (size_t i = 0; i < ARRAY_LEN(keep) && n < ARRAY_LEN(keep); i++) {
            if (strncmp(*e, keep[i], strlen(keep[i])) == 0) {
                env[n++] = xstrdup(*e);
                break;
            }
        }
    }
    env[n++] = xstrdup("LC_ALL=C");
    env[n++] = xstrdup("GIT_TERMINAL_PROMPT=0");
    if (mirror != NULL && lstat(mirror, &st) == 0 && S_ISDIR(st.st_mode)) {
        env[n++] = xasprintf("GIT_ALTERNATE_OBJECT_DIRECTORIES=%s/objects", mirror);
    }
    env[n] = NULL;
    return env;
}

/* Runs ARGV with ENV, its stdout (the first OUT_MAX - 1 bytes) into OUT. */
static int run_read(char *out, size_t out_max, const char *const argv[], char **env,
                    struct err *err)
{
    posix_spawn_file_actions_t fa;
    int pipefd[2], rc, status = 0;
    size_t len = 0;
    pid_t pid;

    if (pipe2(pipefd, O_CLOEXEC) != 0) {
        return err_set(err, E_FAIL, "pipe: %s", strerror(errno));
    }
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, pipefd[1], 1);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    rc = posix_spawnp(&pid, "git", &fa, NULL, (char *const *)(uintptr_t)argv, env);
    posix_spawn_file_actions_destroy(&fa);
    close(pipefd[1]);
    if (rc != 0) {
        close(pipefd[0]);
        return err_set(err, E_FAIL, "start git: %s", strerror(rc));
    }
    for (;;) {
        char buf[256];
        ssize_t got = read(pipefd[0], buf, sizeof(buf));
        if (got < 0 && errno == EINTR) {
            continue;
        }
        if (got <= 0) {
            break;
        }
        size_t take = (size_t)got < out_max - 1 - len ? (size_t)got : out_max - 1 - len;
        memcpy(out + len, buf, take);
        len += take;
    }
    out[len] = '\0';
    close(pipefd[0]);
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        return err_set(err, E_FAIL, "cannot measure the push: git rev-list failed (exit %d)",
                       WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
    }
    return E_OK;
}

int controller_push_size(int64_t *bytes_out, const char *staging, const char *mirror,
                         const char *working, struct err *err)
{
    char *ref = xasprintf("refs/heads/%s", working);
    const char *argv[] = {"git",
                          "--git-dir",
                          staging,
                          "rev-list",
                          "--objects",
                          "--disk-usage",
                          "--ignore-missing",
                          ref,
                          "--not",
                          "--alternate-refs",
                          NULL};
    char **env = size_env(mirror);
    char out[PUSH_SIZE_OUT_MAX], *end = NULL;
    long long n;
    int rc = run_read(out, sizeof(out), argv, env, err);

    *bytes_out = 0;
    if (rc == E_OK) {
        errno = 0;
        n = strtoll(out, &end, 10);
        if (errno != 0 || end == out || (*end != '\n' && *end != '\0') || n < 0) {
            rc = err_set(err, E_FAIL, "cannot measure the push: git rev-list said no size");
        } else {
            *bytes_out = n;
        }
    }
    for (char **e = env; *e != NULL; e++) {
        free(*e);
    }
    free(env);
    free(ref);
    return rc;
}
