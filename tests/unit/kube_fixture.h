/* SPDX-License-Identifier: Apache-2.0 */
/* Test fixture for the kube/ client: starts tests/fakes/fake_kube.py on a free loopback
 * port (it prints its URL on the first line) and builds clients pointing at it. */
#ifndef DIVERGE_TESTS_UNIT_KUBE_FIXTURE_H
#define DIVERGE_TESTS_UNIT_KUBE_FIXTURE_H

#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kube/kube_int.h"

extern char **environ;

#define FAKE_TOKEN "fake-kube-token"

struct fake_kube {
    pid_t pid;     /* the python process */
    char url[128]; /* its base URL */
};

/* posix_spawn's argv is char *const[] for historical reasons; it never writes to it. */
static inline char *fixture_unconst(const char *s)
{
    return (char *)(uintptr_t)s;
}

/* Runs ARGS (NULL-terminated, at most 31) to completion; returns its exit status or -1. */
static inline int fixture_run(const char *const *args)
{
    char *argv[32];
    pid_t pid;
    int st = 0;
    size_t n = 0;

    for (; args[n] != NULL && n < 31; n++) {
        argv[n] = fixture_unconst(args[n]);
    }
    argv[n] = NULL;
    if (posix_spawnp(&pid, argv[0], NULL, NULL, argv, environ) != 0) {
        return -1;
    }
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st)) {
        return -1;
    }
    return WEXITSTATUS(st);
}

/* Starts the fake with EXTRA arguments (up to 8, NULL-terminated); aborts on failure. */
static inline void fake_kube_start(struct fake_kube *f, const char *const *extra)
{
    const char *src = getenv("DIVERGE_SOURCE_DIR");
    char *script = xasprintf("%s/tests/fakes/fake_kube.py", src != NULL ? src : ".");
    /* The interpreter CMake resolved (tests/CMakeLists.txt): not a version manager's shim. */
    const char *py = getenv("DIVERGE_TEST_PYTHON");
    char *argv[20] = {fixture_unconst(py != NULL && py[0] != '\0' ? py : "python3"), script,
                      fixture_unconst("--token"), fixture_unconst(FAKE_TOKEN)};
    size_t n = 4;
    posix_spawn_file_actions_t fa;
    int fds[2];
    FILE *in;

    for (size_t i = 0; extra != NULL && extra[i] != NULL && n < 18; i++) {
        argv[n++] = fixture_unconst(extra[i]);
    }
    argv[n] = NULL;
    ASSERT(pipe(fds) == 0);
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    posix_spawn_file_actions_addclose(&fa, fds[0]);
    ASSERT(posix_spawnp(&f->pid, argv[0], &fa, NULL, argv, environ) == 0);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    in = fdopen(fds[0], "r");
    ASSERT(in != NULL);
    ASSERT(fgets(f->url, sizeof(f->url), in) != NULL);
    fclose(in);
    f->url[strcspn(f->url, "\n")] = '\0';
    free(script);
}

static inline void fake_kube_stop(struct fake_kube *f)
{
    int st;

    kill(f->pid, SIGTERM);
    /* Up to 10 s for a graceful exit, then SIGKILL: a test must never hang on its fake. */
    for (int i = 0; i < 200; i++) {
        if (waitpid(f->pid, &st, WNOHANG) == f->pid) {
            return;
        }
        struct timespec ts = {.tv_sec = 0, .tv_nsec = 50000000L};
        nanosleep(&ts, NULL);
    }
    kill(f->pid, SIGKILL);
    waitpid(f->pid, &st, 0);
}

/* A client for the fake with TOKEN (NULL: the right one). */
static inline struct kube_client *fake_kube_client(const struct fake_kube *f, const char *token)
{
    struct kube_config *cfg = kube_config_new_empty();
    struct kube_client *c = NULL;

    cfg->server = xstrdup(f->url);
    cfg->token = xstrdup(token != NULL ? token : FAKE_TOKEN);
    ASSERT(kube_client_new(&c, cfg, NULL) == E_OK);
    return c;
}

/* Sleeps MS milliseconds (for polling loops, never as a timing assertion). */
static inline void fixture_sleep_ms(long ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};

    nanosleep(&ts, NULL);
}

#endif
