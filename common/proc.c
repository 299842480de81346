/* SPDX-License-Identifier: Apache-2.0 */
/* proc_run: posix_spawnp with an argv array and a pipe, read to the end, then waitpid. */
#define _GNU_SOURCE
#include "common/proc.h"

#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static char **small_env(void)
{
    static const char *const keep[] = {"PATH=", "HOME="};
    size_t n = 0;
    char **env = xcalloc(ARRAY_LEN(keep) + 4, sizeof(*env));

    for (size_t i = 0; i < ARRAY_LEN(keep); i++) {
        for (char **e = environ; *e != NULL; e++) {
            if (strncmp(*e, keep[i], strlen(keep[i])) == 0) {
                env[n++] = xstrdup(*e);
                break;
            }
        }
    }
    env[n++] = xstrdup("GIT_TERMINAL_PROMPT=0");
    env[n++] = xstrdup("GIT_CONFIG_NOSYSTEM=1");
    env[n++] = xstrdup("LC_ALL=C");
    env[n] = NULL;
    return env;
}

static void env_free(char **env)
{
    for (char **e = env; *e != NULL; e++) {
        free(*e);
    }
    free(env);
}

/* Reads FD to its end into OUT (NULL: dropped); true when something did not fit. */
static bool drain(int fd, struct buf *out)
{
    char chunk[4096];
    bool truncated = false;

    for (;;) {
        ssize_t got = read(fd, chunk, sizeof(chunk));
        if (got < 0 && errno == EINTR) {
            continue;
        }
        if (got <= 0) {
            return truncated;
        }
        if (out != NULL && !truncated && buf_append(out, chunk, (size_t)got) != E_OK) {
            truncated = true;
        }
    }
}

int proc_run(int *status_out, struct buf *out, bool *truncated_out, bool with_stderr,
             const char *const argv[], struct err *err)
{
    posix_spawn_file_actions_t fa;
    char **env;
    int pipefd[2], rc, st = 0;
    pid_t pid = -1, w;
    bool truncated;

    *status_out = -1;
    if (pipe2(pipefd, O_CLOEXEC) != 0) {
        return err_set(err, E_FAIL, "pipe: %s", strerror(errno));
    }
    env = small_env();
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, pipefd[1], 1);
    if (with_stderr) {
        posix_spawn_file_actions_adddup2(&fa, pipefd[1], 2);
    } else {
        posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    }
    rc = posix_spawnp(&pid, argv[0], &fa, NULL, (char *const *)(uintptr_t)argv, env);
    posix_spawn_file_actions_destroy(&fa);
    close(pipefd[1]);
    env_free(env);
    if (rc != 0) {
        close(pipefd[0]);
        return err_set(err, E_FAIL, "start %s: %s", argv[0], strerror(rc));
    }
    truncated = drain(pipefd[0], out);
    close(pipefd[0]);
    do {
        w = waitpid(pid, &st, 0);
    } while (w < 0 && errno == EINTR);
    if (w < 0) {
        return err_set(err, E_FAIL, "wait for %s: %s", argv[0], strerror(errno));
    }
    *status_out = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (truncated_out != NULL) {
        *truncated_out = truncated;
    }
    return E_OK;
}
