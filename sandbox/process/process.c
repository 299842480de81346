/* SPDX-License-Identifier: Apache-2.0 */
/* The `process` sandbox provider: the runner as a grandchild of the server in its own
 * process group, under a small guard process (a fork of the server that never execs) which
 * watches the server and kills the whole group when the server dies, even by SIGKILL (SPEC §9:
 * sandboxes die with the server). Only descriptors 0-2 reach the runner. NO ISOLATION: the agent
 * runs as the server's user with the server's view of the machine. For development only; it says so
 * loudly. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/log.h"
#include "sandbox/sandbox_int.h"

struct process_provider {
    struct sandbox_provider base; /* must be first */
    struct sbx_set set;
};

static struct process_provider *to_process(struct sandbox_provider *p)
{
    return container_of(p, struct process_provider, base);
}

/* What the forked guard and runner do before exec: only async-signal-safe calls. */
struct spawn_plan {
    const char *path; /* the runner */
    char *const *argv, *const *envp;
    const char *cwd; /* the workspace */
    int out_fd;      /* becomes stdout and stderr */
    pid_t server;    /* getpid() of the server, before the fork */
};

/* The guard's parent-death signal (catchable: the guard must act on it). */
#define GUARD_SIGNAL SIGTERM

/* In the guard, on GUARD_SIGNAL (the server's launching thread is gone) or when the server
 * is found gone: every process of the sandbox's group dies, the guard too. */
static void guard_kill_group(int sig)
{
    (void)sig;
    kill(0, SIGKILL);
}

/* Default dispositions (the server ignores SIGPIPE, handles others) and an empty mask (the
 * server blocks SIGTERM in every thread); HANDLER, when set, for GUARD_SIGNAL. */
static void reset_signals(void (*handler)(int))
{
    struct sigaction sa;
    sigset_t none;

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = SIG_DFL;
    for (int sig = 1; sig < NSIG; sig++) {
        (void)sigaction(sig, &sa, NULL); /* SIGKILL, SIGSTOP and glibc's own refuse: fine */
    }
    if (handler != NULL) {
        sa.sa_handler = handler;
        (void)sigaction(GUARD_SIGNAL, &sa, NULL);
    }
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
}

/* The runner, a vfork child of the guard: it dies with the guard, then execs. */
static void runner_exec(const struct spawn_plan *pl, pid_t guard)
{
    reset_signals(NULL);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != guard) {
        _exit(126); /* the guard died before the line above: no signal would come */
    }
    execve(pl->path, pl->argv, pl->envp);
    _exit(127);
}

/* A descriptor that becomes readable when process PID has ended (pidfd_open, Linux 5.3),
 * or -1. */
static int pid_watch(pid_t pid)
{
    return (int)syscall(SYS_pidfd_open, pid, 0);
}

/* Waits for RUNNER to end, or for the server (watched by SERVER_FD, -1: only the parent-death
 * signal tells) to end first, in which case the whole group is killed. Returns the runner's
 * wait status. Polling the two process descriptors needs no signal handler: under
 * ThreadSanitizer a forked copy of the server ran GUARD_SIGNAL's handler too late or never. */
static int guard_wait(pid_t runner, int server_fd)
{
    int runner_fd = server_fd >= 0 ? pid_watch(runner) : -1, status = 0;

    while (server_fd >= 0 && runner_fd >= 0) {
        struct pollfd p[2] = {{.fd = server_fd, .events = POLLIN},
                              {.fd = runner_fd, .events = POLLIN}};
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR) {
                continue;
            }
            break;
        }
        if (p[0].revents != 0) {
            guard_kill_group(0); /* the server is gone */
        }
        if (p[1].revents != 0) {
            break;
        }
    }
    while (waitpid(runner, &status, 0) < 0) {
        if (errno != EINTR) {
            _exit(126);
        }
    }
    return status;
}

/* The guard: leader of the sandbox's process group, parent of the runner. When the server
 * dies (even by SIGKILL) it kills the whole group, which a SIGKILLed runner could not do for
 * the agent's processes: it watches the server through a process descriptor, and the
 * kernel also sends it GUARD_SIGNAL (kernels without pidfd_open). It exits with the
 * runner's status (128 + signal when killed). */
static void guard(const struct spawn_plan *pl)
{
    int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC), status, server_fd;
    pid_t self = getpid(), runner;

    reset_signals(guard_kill_group);
    if (setpgid(0, 0) != 0 || devnull < 0 || dup2(devnull, 0) < 0 || dup2(pl->out_fd, 1) < 0 ||
        dup2(pl->out_fd, 2) < 0 || chdir(pl->cwd) != 0 || sbx_cloexec_from_3() != 0) {
        _exit(126);
    }
    prctl(PR_SET_PDEATHSIG, GUARD_SIGNAL);
    server_fd = pid_watch(pl->server);
    if (getppid() != pl->server) {
        guard_kill_group(0); /* the server died before the lines above */
    }
    /* vfork: no fork handlers run in this copy of a multi-threaded server. */
    runner = vfork();
    if (runner == 0) {
        runner_exec(pl, self);
    }
    if (runner < 0) {
        _exit(126);
    }
    status = guard_wait(runner, server_fd);
    _exit(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
}

static int spawn_runner(pid_t *pid_out, const struct sandbox_spec *s, int out_fd, void *ctx,
                        struct err *err)
{
    char *const argv[] = {(char *)(uintptr_t)s->runner_path, NULL};
    struct spawn_plan pl = {.path = s->runner_path,
                            .argv = argv,
                            .envp = (char *const *)(uintptr_t)s->env,
                            .cwd = s->workspace,
                            .out_fd = out_fd,
                            .server = getpid()};
    pid_t pid;

    (void)ctx;
    if (access(s->runner_path, X_OK) != 0) {
        return err_set(err, E_FAIL, "start %s: %s", s->runner_path, strerror(errno));
    }
    pid = fork();
    if (pid < 0) {
        return err_set(err, E_FAIL, "fork: %s", strerror(errno));
    }
    if (pid == 0) {
        guard(&pl);
    }
    setpgid(pid, pid); /* also from here: no race with a signal to the group */
    *pid_out = pid;
    return E_OK;
}

static int process_start(struct sandbox_provider *p, const struct sandbox_spec *s, struct err *err)
{
    sandbox_log_event(s->log_path,
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

int sandbox_process_new(struct sandbox_provider **out, const struct sandbox_process_opts *o,
                        struct err *err)
{
    struct process_provider *pp = xcalloc(1, sizeof(*pp));

    (void)err;
    pp->base.ops = &process_ops;
    pp->base.on_exit = o->on_exit;
    pp->base.on_exit_userdata = o->on_exit_userdata;
    sbx_set_init(&pp->set, &pp->base, o->state_dir, NULL, pp);
    log_kv(LOG_WARN, "sandbox_unisolated", "provider", "process", "message",
           "sandbox provider process runs agents WITHOUT ISOLATION as the server's user: "
           "development only",
           NULL);
    fprintf(stderr, "diverge: WARNING: --sandbox-provider process runs agents WITHOUT "
                    "ISOLATION as the server's user (development only)\n");
    *out = &pp->base;
    return E_OK;
}
