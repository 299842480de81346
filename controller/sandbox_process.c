/* SPDX-License-Identifier: Apache-2.0 */
/* The `process` sandbox provider: the runner as a plain child of the server in its own
 * process group, started with posix_spawn. NO ISOLATION: the agent runs as the server's
 * user with the server's view of the machine. For development only; it says so loudly. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "controller/controller_int.h"
#include "controller/sandbox_int.h"

struct process_provider {
    struct sandbox_provider base; /* must be first */
    struct sbx_set set;
};

static struct process_provider *to_process(struct sandbox_provider *p)
{
    return container_of(p, struct process_provider, base);
}

static int spawn_runner(pid_t *pid_out, const struct sandbox_spec *s, int out_fd, void *ctx,
                        struct err *err)
{
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t attr;
    sigset_t none, all;
    char *const argv[] = {(char *)(uintptr_t)s->runner_path, NULL};
    int rc;

    (void)ctx;
    sigemptyset(&none);
    sigfillset(&all);
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, out_fd, 1);
    posix_spawn_file_actions_adddup2(&fa, out_fd, 2);
    posix_spawn_file_actions_addchdir_np(&fa, s->workspace);
    posix_spawnattr_init(&attr);
    /* Its own process group (pause and kill address the group), default signal
     * dispositions and an empty mask (the server blocks SIGTERM in every thread). */
    posix_spawnattr_setpgroup(&attr, 0);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setsigdefault(&attr, &all);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK |
                                        POSIX_SPAWN_SETSIGDEF);
    rc = posix_spawn(pid_out, s->runner_path, &fa, &attr, argv, (char *const *)(uintptr_t)s->env);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    if (rc != 0) {
        return err_set(err, E_FAIL, "start %s: %s", s->runner_path, strerror(rc));
    }
    return E_OK;
}

static int process_start(struct sandbox_provider *p, const struct sandbox_spec *s, struct err *err)
{
    controller_log_event(s->log_path,
                         "[diverge] WARNING: sandbox provider \"process\": NO ISOLATION, the "
                         "agent runs as the server's user (development only)");
    return sbx_launch(&to_process(p)->set, s, spawn_runner, NULL, err);
}

static int process_suspend(struct sandbox_provider *p, const char *ns, const char *name,
                           struct err *err)
{
    return sbx_suspend(&to_process(p)->set, ns, name, err);
}

static int process_resume(struct sandbox_provider *p, const char *ns, const char *name,
                          struct err *err)
{
    return sbx_resume(&to_process(p)->set, ns, name, err);
}

static void process_status(struct sandbox_status *out, struct sandbox_provider *p, const char *ns,
                           const char *name)
{
    sbx_status(out, &to_process(p)->set, ns, name);
}

static void process_stop(struct sandbox_provider *p, const char *ns, const char *name)
{
    sbx_stop(&to_process(p)->set, ns, name);
}

static void process_free(struct sandbox_provider *p)
{
    struct process_provider *pp = to_process(p);

    sbx_set_cleanup(&pp->set);
    free(pp);
}

static const struct sandbox_provider_ops process_ops = {
    .name = "process",
    .start = process_start,
    .suspend = process_suspend,
    .resume = process_resume,
    .status = process_status,
    .stop = process_stop,
    .free = process_free,
};

int sandbox_process_new(struct sandbox_provider **out, const char *state_dir, struct err *err)
{
    struct process_provider *pp = xcalloc(1, sizeof(*pp));

    (void)err;
    pp->base.ops = &process_ops;
    sbx_set_init(&pp->set, &pp->base, state_dir, NULL, pp);
    log_kv(LOG_WARN, "sandbox_unisolated", "provider", "process", "message",
           "sandbox provider process runs agents WITHOUT ISOLATION as the server's user: "
           "development only",
           NULL);
    fprintf(stderr, "diverge: WARNING: --sandbox-provider process runs agents WITHOUT "
                    "ISOLATION as the server's user (development only)\n");
    *out = &pp->base;
    return E_OK;
}
