/* SPDX-License-Identifier: Apache-2.0 */
/* The `local` sandbox provider (SPEC §9): bubblewrap run as the sandbox user (never root),
 * with new user/mount/pid/ipc/uts/net namespaces, no nested user namespaces, every
 * capability dropped, a root of read-only binds (never / itself), a private /tmp, the
 * workspace, state dir and staging repo writable, the token directory, mirror and runner
 * read-only, a libseccomp filter, and cgroup limits where the host has them. Host paths
 * under the 0700 data dir are handed over as descriptors (--bind-fd), so the sandbox user
 * never needs to reach them by name. Pause freezes the cgroup (SIGSTOP without one). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <pthread.h>
#include <pwd.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/log.h"
#include "sandbox/sandbox_int.h"
#include "sandbox/local/local_int.h"

#define BWRAP_ARGS_MAX 128
#define LOCAL_FDS 11

static struct local_provider *to_local(struct sandbox_provider *p)
{
    return container_of(p, struct local_provider, base);
}

/* What the child does before exec. It runs in the server's memory (fork_exec: vfork) while
 * the calling thread waits, and never returns: it makes system calls only,
 * without libc's wrappers: no errno or cached state of libc's, no sanitizer interceptor
 * that would record the child's descriptors or signal handlers as the server's, no
 * set*id() broadcast to the server's threads. */
struct child_plan {
    const char *path; /* bwrap */
    char *const *argv, *const *envp;
    int out_fd;
    int keep[LOCAL_FDS];     /* descriptors bwrap must inherit, -1 unused */
    int procs[LOCAL_CG_MAX]; /* cgroup.procs files to join, -1 unused */
    bool drop;               /* switch to uid/gid first */
    uid_t uid;
    gid_t gid;
};

static SBX_CHILD_CODE _Noreturn void child_exit(int code)
{
    for (;;) {
        (void)syscall(SYS_exit_group, code);
    }
}

static SBX_CHILD_CODE void write_pid(int fd)
{
    char buf[24];
    size_t n = sizeof(buf);
    long pid = syscall(SYS_getpid);

    buf[--n] = '\n';
    do {
        buf[--n] = (char)('0' + pid % 10);
        pid /= 10;
    } while (pid > 0 && n > 0);
    if (syscall(SYS_write, fd, buf + n, sizeof(buf) - n) < 0) {
        child_exit(125);
    }
}

/* Sets SIG to its default action (the kernel's struct sigaction, zero but the handler). */
static SBX_CHILD_CODE void child_default(int sig)
{
    unsigned long act[4] = {(unsigned long)(uintptr_t)SIG_DFL, 0, 0, 0};

    (void)syscall(SYS_rt_sigaction, sig, act, NULL, 8 /* the kernel's sigset */);
}

/* Starts a process group and wires stdin to /dev/null, stdout and stderr to OUT_FD (SIGPIPE,
 * which the server ignores, back to its default for bwrap); exits 126 on failure. */
static SBX_CHILD_CODE void child_stdio(const struct child_plan *pl)
{
    long devnull = syscall(SYS_openat, AT_FDCWD, "/dev/null", O_RDONLY | O_CLOEXEC);

    child_default(SIGPIPE);
    if (syscall(SYS_setpgid, 0, 0) != 0 || devnull < 0 || syscall(SYS_dup3, devnull, 0, 0) < 0 ||
        (pl->out_fd != 1 && syscall(SYS_dup3, pl->out_fd, 1, 0) < 0) ||
        (pl->out_fd != 2 && syscall(SYS_dup3, pl->out_fd, 2, 0) < 0)) {
        child_exit(126);
    }
}

/* setgroups, setgid, setuid (each of the process alone: the raw calls), then verifies that
 * root cannot come back; exits 127 if not. */
static SBX_CHILD_CODE void child_drop(const struct child_plan *pl)
{
    gid_t groups[1] = {pl->gid};

    if (syscall(SYS_setgroups, 1, groups) != 0 ||
        syscall(SYS_setresgid, pl->gid, pl->gid, pl->gid) != 0 ||
        syscall(SYS_setresuid, pl->uid, pl->uid, pl->uid) != 0 ||
        syscall(SYS_getuid) != (long)pl->uid || syscall(SYS_geteuid) != (long)pl->uid ||
        syscall(SYS_getgid) != (long)pl->gid || syscall(SYS_setuid, 0) == 0) {
        child_exit(127);
    }
}

static SBX_CHILD_CODE _Noreturn void child(const struct child_plan *pl)
{
    unsigned long none = 0;

    child_stdio(pl);
    /* Join the cgroups before anything of the sandbox exists. */
    for (int i = 0; i < LOCAL_CG_MAX; i++) {
        if (pl->procs[i] >= 0) {
            write_pid(pl->procs[i]);
        }
    }
    if (pl->drop) {
        child_drop(pl);
    }
    /* After the credential change, which clears it: die with the server's thread. */
    (void)syscall(SYS_prctl, PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    /* Nothing the server inherited from its own parent reaches the sandbox: every other
     * descriptor closes at exec, then only the kept ones are opened up again. */
    if (sbx_cloexec_from_3() != 0) {
        child_exit(126);
    }
    for (int i = 0; i < LOCAL_FDS; i++) {
        if (pl->keep[i] >= 0) {
            (void)syscall(SYS_fcntl, pl->keep[i], F_SETFD, 0);
        }
    }
    /* fork_exec blocked every signal for the clone; bwrap starts with none blocked. */
    (void)syscall(SYS_rt_sigprocmask, SIG_SETMASK, &none, NULL, 8);
    (void)syscall(SYS_execve, pl->path, pl->argv, pl->envp);
    child_exit(127);
}

/* Starts bwrap as PL says: a vfork (the child shares the server's memory until its exec,
 * as posix_spawn's), not a fork. A fork copied the page tables of the whole server (~10 ms
 * at 300 MB resident, with every thread that faulted meanwhile waiting) and made each of
 * its pages fault once more on its next write. */
static int fork_exec(pid_t *pid_out, const struct child_plan *pl, struct err *err)
{
    sigset_t all, old;
    pid_t pid;
    int saved;

    /* No handler of the server's may run in the child before its exec. */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pid = vfork();
    if (pid == 0) {
        child(pl);
    }
    saved = errno;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (pid < 0) {
        return err_set(err, E_FAIL, "vfork: %s", strerror(saved));
    }
    setpgid(pid, pid); /* also from here: no race with a signal to the group */
    *pid_out = pid;
    return E_OK;
}

static void plan_init(struct child_plan *pl, struct local_provider *lp)
{
    memset(pl, 0, sizeof(*pl));
    for (int i = 0; i < LOCAL_FDS; i++) {
        pl->keep[i] = -1;
    }
    for (int i = 0; i < LOCAL_CG_MAX; i++) {
        pl->procs[i] = -1;
    }
    pl->path = lp->bwrap;
    pl->drop = lp->drop;
    pl->uid = lp->uid;
    pl->gid = lp->gid;
}

struct argv_b {
    char *v[BWRAP_ARGS_MAX + 1];
    size_t n;
};

static void arg(struct argv_b *a, const char *s)
{
    ASSERT(a->n < BWRAP_ARGS_MAX);
    a->v[a->n++] = xstrdup(s);
    a->v[a->n] = NULL;
}

static void argf(struct argv_b *a, int fd)
{
    char *s = xasprintf("%d", fd);
    arg(a, s);
    free(s);
}

static void args_free(struct argv_b *a)
{
    for (size_t i = 0; i < a->n; i++) {
        free(a->v[i]);
    }
}

/* The fixed part of the command line: namespaces, capabilities, the read-only root. */
static void base_args(struct argv_b *a, const struct local_provider *lp, bool chdir_ws)
{
    static const char *const etc[] = {
        "/etc/ld.so.cache",     "/etc/alternatives", "/etc/ssl",
        "/etc/ca-certificates", "/etc/localtime",    "/etc/nsswitch.conf",
        "/etc/passwd",          "/etc/group",        "/etc/gitconfig"};
    static const char *const links[] = {"bin", "sbin", "lib", "lib64", "lib32", "libx32"};
    struct stat st;

    arg(a, lp->bwrap);
    arg(a, "--unshare-all");
    arg(a, "--unshare-user");
    arg(a, "--disable-userns");
    arg(a, "--die-with-parent");
    arg(a, "--new-session");
    arg(a, "--cap-drop");
    arg(a, "ALL");
    arg(a, "--ro-bind");
    arg(a, "/usr");
    arg(a, "/usr");
    for (size_t i = 0; i < ARRAY_LEN(links); i++) {
        char *host = xasprintf("/%s", links[i]), *target = xasprintf("usr/%s", links[i]);
        if (lstat(host, &st) == 0) {
            arg(a, S_ISLNK(st.st_mode) ? "--symlink" : "--ro-bind");
            arg(a, S_ISLNK(st.st_mode) ? target : host);
            arg(a, host);
        }
        free(host);
        free(target);
    }
    for (size_t i = 0; i < ARRAY_LEN(etc); i++) {
        arg(a, "--ro-bind-try");
        arg(a, etc[i]);
        arg(a, etc[i]);
    }
    arg(a, "--proc");
    arg(a, "/proc");
    arg(a, "--dev");
    arg(a, "/dev");
    arg(a, "--tmpfs");
    arg(a, "/tmp");
    arg(a, "--dir");
    arg(a, "/diverge");
    if (chdir_ws) {
        arg(a, "--chdir");
        arg(a, SANDBOX_IN_WORKSPACE);
    }
}

/* Opens PATH as an O_PATH descriptor for --bind-fd, adding it to PL's kept ones. */
static int bind_fd(struct argv_b *a, struct child_plan *pl, int *fds, size_t *nfds, const char *opt,
                   const char *path, const char *dest, struct err *err)
{
    int fd = open(path, O_PATH | O_CLOEXEC);

    if (fd < 0) {
        return err_set(err, E_FAIL, "open %s: %s", path, strerror(errno));
    }
    ASSERT(*nfds < LOCAL_FDS);
    fds[(*nfds)++] = fd;
    pl->keep[*nfds - 1] = fd;
    arg(a, opt);
    argf(a, fd);
    arg(a, dest);
    return E_OK;
}

/* Binds every host path of S into the sandbox by descriptor (optional ones when set). */
static int bind_spec(struct argv_b *a, struct child_plan *pl, int *fds, size_t *nfds,
                     const struct sandbox_spec *s, const char *tools, struct err *err)
{
    const struct {
        const char *opt;  /* bwrap option */
        const char *path; /* borrowed: host path, NULL when unset */
        const char *dest; /* path inside the sandbox */
        bool optional;    /* NULL path: skip rather than fail */
    } binds[] = {
        {"--bind-fd", s->workspace, SANDBOX_IN_WORKSPACE, false},
        {"--bind-fd", s->usage_dir, SANDBOX_IN_STATE, false},
        {"--bind-fd", s->staging, SANDBOX_IN_STAGING, true},
        {"--ro-bind-fd", s->mirror, SANDBOX_IN_MIRROR, true},
        {"--ro-bind-fd", s->token_dir, SANDBOX_IN_TOKEN_DIR, false},
        {"--ro-bind-fd", s->sock_dir, SANDBOX_IN_SOCK_DIR, true},
        {"--ro-bind-fd", s->egress != NULL ? s->egress->dir : NULL, SANDBOX_IN_EGRESS_DIR, true},
        {"--ro-bind-fd", s->runner_path, SANDBOX_IN_RUNNER, false},
        {"--ro-bind-fd", tools, tools, true},
    };

    for (size_t i = 0; i < ARRAY_LEN(binds); i++) {
        if (binds[i].optional && binds[i].path == NULL) {
            continue;
        }
        int rc = bind_fd(a, pl, fds, nfds, binds[i].opt, binds[i].path, binds[i].dest, err);
        if (rc != E_OK) {
            return rc;
        }
    }
    return E_OK;
}

static void close_all(const int *fds, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (fds[i] >= 0) {
            close(fds[i]);
        }
    }
}

static int local_spawn(pid_t *pid_out, const struct sandbox_spec *s, int out_fd, void *ctx,
                       struct err *err)
{
    struct sbx *x = ctx;
    struct local_provider *lp = x->set->ctx;
    struct child_plan pl;
    struct argv_b a = {.n = 0};
    int fds[LOCAL_FDS], seccomp_fd = -1;
    size_t nfds = 0;
    int rc;

    plan_init(&pl, lp);
    pl.out_fd = out_fd;
    base_args(&a, lp, true);
    rc = bind_spec(&a, &pl, fds, &nfds, s, lp->tools, err);
    if (rc == E_OK) {
        rc = local_seccomp_fd(lp, &seccomp_fd, err);
    }
    if (rc == E_OK) {
        pl.keep[nfds] = seccomp_fd;
        if (s->gate_fd > 2) {
            ASSERT(nfds + 1 < LOCAL_FDS);
            pl.keep[nfds + 1] = s->gate_fd;
        }
        arg(&a, "--seccomp");
        argf(&a, seccomp_fd);
        arg(&a, "--");
        arg(&a, SANDBOX_IN_RUNNER);
        local_cgroup_join(&pl.procs[0], lp, s->ns, s->name);
        pl.argv = a.v;
        pl.envp = (char *const *)(uintptr_t)s->env;
        rc = fork_exec(pid_out, &pl, err);
        close_all(pl.procs, LOCAL_CG_MAX);
    }
    close_all(fds, nfds);
    if (seccomp_fd >= 0) {
        close(seccomp_fd);
    }
    args_free(&a);
    return rc;
}

static int local_start(struct sandbox_provider *p, const struct sandbox_spec *s, struct err *err)
{
    struct local_provider *lp = to_local(p);
    struct local_ext *ext;
    char limits[512];

    if (lp->problem != NULL) {
        sandbox_egress_free(s->egress);
        sandbox_meter_free(s->meter);
        return err_set(err, E_FAIL, "%s", lp->problem);
    }
    local_cgroup_create(lp, s->ns, s->name, limits, sizeof(limits));
    /* The cgroups keep the start's name when a claim gives the sandbox to a task. */
    ext = xcalloc(1, sizeof(*ext));
    snprintf(ext->cg, sizeof(ext->cg), "%s.%s", s->ns, s->name);
    snprintf(ext->line, sizeof(ext->line), "[diverge] sandbox local (bubblewrap) as uid %u; %s",
             (unsigned)lp->uid, limits);
    sandbox_log_event(s->log_path, "%s", ext->line);
    return sbx_launch(&lp->set, s, local_spawn, ext, err);
}

static int local_suspend(struct sandbox_provider *p, const char *ns, const char *name,
                         struct err *err)
{
    return sbx_suspend(&to_local(p)->set, ns, name, err);
}

static int local_resume(struct sandbox_provider *p, const char *ns, const char *name,
                        struct err *err)
{
    return sbx_resume(&to_local(p)->set, ns, name, err);
}

static void local_status(struct sandbox_status *out, struct sandbox_provider *p, const char *ns,
                         const char *name)
{
    sbx_status(out, &to_local(p)->set, ns, name);
}

static void local_stop(struct sandbox_provider *p, const char *ns, const char *name)
{
    local_warm_forget(to_local(p), ns, name); /* then its cgroups made ahead go too */
    sbx_stop(&to_local(p)->set, ns, name);
    /* A sandbox taken from a warm slot had cgroups of its own: those made ahead go. */
    local_cgroup_remove(to_local(p), ns, name);
}

/* sbx_claim's SEEN: the sandbox's line of its start into ARG. */
static void copy_line(const void *ext, void *arg)
{
    const struct local_ext *e = ext;

    if (e != NULL) {
        memcpy(arg, e->line, sizeof(e->line));
    }
}

static int local_claim(struct sandbox_provider *p, const char *from_ns, const char *from_name,
                       const char *ns, const char *name, const char *log_path, size_t log_cap,
                       struct err *err)
{
    char line[sizeof(((struct local_ext *)NULL)->line)] = "";
    int rc = sbx_claim(&to_local(p)->set, from_ns, from_name, ns, name, log_path, log_cap,
                       copy_line, line, err);

    if (rc == E_OK) {
        sandbox_log_event(log_path, "%s", line); /* its user and cgroups, in the task's log */
    }
    return rc;
}

static char *local_probe(struct sandbox_provider *p)
{
    struct local_provider *lp = to_local(p);
    return lp->problem != NULL ? xstrdup(lp->problem) : NULL;
}

static bool local_owner(struct sandbox_provider *p, unsigned int *uid_out, unsigned int *gid_out)
{
    struct local_provider *lp = to_local(p);

    *uid_out = lp->uid;
    *gid_out = lp->gid;
    return lp->drop;
}

static void local_free(struct sandbox_provider *p)
{
    struct local_provider *lp = to_local(p);

    sbx_set_cleanup(&lp->set);
    free(lp->problem);
    free(lp->bwrap);
    free(lp->tools);
    local_warm_cleanup(lp);
    local_cgroup_cleanup(lp);
    free(lp->seccomp_prog);
    free(lp);
}

static const struct sandbox_provider_ops local_ops = {
    .name = "local",
    .start = local_start,
    .suspend = local_suspend,
    .resume = local_resume,
    .status = local_status,
    .stop = local_stop,
    .probe = local_probe,
    .owner = local_owner,
    .warm = local_warm,
    .free = local_free,
    .claim = local_claim,
};

/* Whether the sandbox user (LP's uid/gid) may search the folder PATH; *mode_out its mode. */
static bool searchable(mode_t *mode_out, const struct local_provider *lp, const char *path)
{
    struct stat st;
    mode_t need;

    *mode_out = 0;
    if (stat(path, &st) != 0) {
        return false;
    }
    *mode_out = st.st_mode;
    need = lp->uid == st.st_uid ? S_IXUSR : lp->gid == st.st_gid ? S_IXGRP : S_IXOTH;
    return (st.st_mode & need) != 0;
}

/* Whether every folder from / down to the data dir's parent lets the sandbox user (LP's uid/gid)
 * through; the first that does not is named in ERR. Only asked when the server runs as root and the
 * sandbox as another user: bubblewrap then opens the workspace as that user, and a data dir below a
 * 0700 folder (./var in a clone under /root) fails every task. */
static int dir_reachable(const struct local_provider *lp, const char *state_dir, struct err *err)
{
    char *real = realpath(state_dir, NULL), *cut;
    char dir[PATH_MAX];
    size_t n;
    int rc = E_OK;

    if (real == NULL || !lp->drop || lp->uid == 0 || (cut = strrchr(real, '/')) == NULL) {
        free(real);
        return E_OK;
    }
    /* STATE_DIR is <data-dir>/run; the data dir and below are made reachable by the
     * controller (its group, 0710): what is asked is the folders above it. */
    *cut = '\0';
    snprintf(dir, sizeof(dir), "%s", real);
    cut = strrchr(real, '/');
    if (cut == NULL) {
        free(real);
        return E_OK;
    }
    *cut = '\0';
    n = strlen(real);
    /* "/", then each prefix of REAL that ends before a '/' or at its end. */
    for (size_t i = 0; rc == E_OK && i <= n; i++) {
        size_t end = i == 0 ? 1 : i; /* the prefix is real[0..end) */
        char saved = real[end];
        mode_t mode = 0;
        if (i > 0 && real[i] != '/' && real[i] != '\0') {
            continue;
        }
        real[end] = '\0';
        if (!searchable(&mode, lp, real)) {
            rc = err_set(err, E_DENIED,
                         "the data dir %s: the sandbox user (uid %u) cannot reach it: %s is "
                         "not searchable by that user (mode %04o); choose a --data-dir "
                         "outside it (e.g. /var/lib/diverge) or make it searchable "
                         "(chmod o+x %s)",
                         dir, (unsigned)lp->uid, real, (unsigned)(mode & 07777), real);
        }
        real[end] = saved;
    }
    free(real);
    return rc;
}

/* Runs bwrap once with the sandbox's namespaces (and TOOLS bound, when not NULL); E_OK
 * when it works here. */
static int probe_bwrap(struct local_provider *lp, const char *tools, struct err *err)
{
    struct child_plan pl;
    struct argv_b a = {.n = 0};
    static char path_env[] = "PATH=/usr/bin:/bin";
    char *const envp[] = {path_env, NULL};
    int devnull = open("/dev/null", O_WRONLY | O_CLOEXEC), status = 0, rc;
    pid_t pid;

    plan_init(&pl, lp);
    pl.out_fd = devnull;
    base_args(&a, lp, false); /* the probe has no workspace to change to */
    if (tools != NULL) {
        arg(&a, "--ro-bind");
        arg(&a, tools);
        arg(&a, tools);
    }
    arg(&a, "--");
    arg(&a, "/usr/bin/true");
    pl.argv = a.v;
    pl.envp = envp;
    rc = fork_exec(&pid, &pl, err);
    if (rc == E_OK) {
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
        }
        if ((!WIFEXITED(status) || WEXITSTATUS(status) != 0) && tools != NULL) {
            rc = err_set(err, E_FAIL,
                         "--sandbox-tools %s: the sandbox user (uid %u) cannot reach it: "
                         "every folder on its path must be searchable by that user",
                         tools, (unsigned)lp->uid);
        } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            rc = err_set(err, E_FAIL,
                         "bubblewrap cannot create the sandbox's namespaces here "
                         "(exit %d): enable unprivileged user namespaces "
                         "(sysctl kernel.unprivileged_userns_clone=1, "
                         "user.max_user_namespaces>0; on Ubuntu also "
                         "kernel.apparmor_restrict_unprivileged_userns=0)",
                         WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        }
    }
    if (devnull >= 0) {
        close(devnull);
    }
    args_free(&a);
    return rc;
}

int sandbox_local_new(struct sandbox_provider **out, const struct sandbox_local_opts *o,
                      struct err *err)
{
    struct local_provider *lp = xcalloc(1, sizeof(*lp));
    struct err perr = {0};

    (void)err;
    lp->base.ops = &local_ops;
    lp->base.on_exit = o->on_exit;
    lp->base.on_exit_userdata = o->on_exit_userdata;
    sbx_set_init(&lp->set, &lp->base, o->state_dir, &local_hooks, lp);
    lp->bwrap = xstrdup(access("/usr/bin/bwrap", X_OK) == 0 ? "/usr/bin/bwrap" : "bwrap");
    lp->tools = o->tools != NULL ? xstrdup(o->tools) : NULL;
    if (access(lp->bwrap, X_OK) != 0) {
        lp->problem = xstrdup("bubblewrap is not installed: install it (apt-get install "
                              "bubblewrap) or run with --sandbox-provider process (no "
                              "isolation, development only)");
    } else if (local_user(lp, o->user, &perr) != E_OK || probe_bwrap(lp, NULL, &perr) != E_OK ||
               (lp->tools != NULL && probe_bwrap(lp, lp->tools, &perr) != E_OK) ||
               dir_reachable(lp, o->state_dir, &perr) != E_OK) {
        lp->problem = xstrdup(perr.msg);
    }
    if (lp->problem == NULL) {
        local_cgroup_init(lp, o);
    }
    local_warm_init(lp);
    local_seccomp_init(lp);
    *out = &lp->base;
    return E_OK;
}
