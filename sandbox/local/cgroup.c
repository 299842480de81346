/* SPDX-License-Identifier: Apache-2.0 */
/* The local provider's host side: the sandbox user, per-task cgroups (v2 unified, or the
 * v1 freezer/memory/pids/cpu hierarchies) with limits, freeze/thaw/kill through them, and
 * the seccomp filter (flatpak's deny list plus io_uring, ptrace, process_vm_*, and the
 * TIOCSTI/TIOCLINUX ioctls matched on 32 bits). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pwd.h>
#include <sched.h>
#include <seccomp.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/hash.h"
#include "common/log.h"
#include "sandbox/local/local_int.h"

#define LOCAL_USER "diverge-sandbox"

static void cg_kill(struct sbx *x, void *ctx);
static void cg_forget(struct sbx *x, void *ctx);

static const char *const g_v1[LOCAL_CG_MAX] = {"freezer", "memory", "pids", "cpu"};

static int lookup(struct local_provider *lp, const char *name)
{
    struct passwd pw, *res = NULL;
    char buf[4096];

    if (getpwnam_r(name, &pw, buf, sizeof(buf), &res) != 0 || res == NULL) {
        return E_NOTFOUND;
    }
    lp->uid = pw.pw_uid;
    lp->gid = pw.pw_gid;
    return E_OK;
}

int local_user(struct local_provider *lp, const char *name, struct err *err)
{
    bool root = geteuid() == 0;

    if (!root && name == NULL) {
        lp->uid = getuid();
        lp->gid = getgid();
        lp->drop = false;
        return E_OK;
    }
    if (name == NULL) {
        name = LOCAL_USER;
    }
    if (lookup(lp, name) != E_OK && root) {
        const char *argv[] = {"useradd",           "--system",     "--no-create-home",
                              "--home-dir",        "/nonexistent", "--shell",
                              "/usr/sbin/nologin", name,           NULL};
        pid_t pid;
        int status = 0;
        if (posix_spawnp(&pid, "useradd", NULL, NULL, (char *const *)(uintptr_t)argv, NULL) == 0) {
            waitpid(pid, &status, 0);
        }
    }
    if (lookup(lp, name) != E_OK) {
        return err_set(err, E_FAIL,
                       "the sandbox user %s does not exist: create it "
                       "(useradd --system %s) or pass --sandbox-user",
                       name, name);
    }
    if (lp->uid == 0) {
        return err_set(err, E_FAIL,
                       "the sandbox user must not be root (its uid would map "
                       "to host root): pass another --sandbox-user");
    }
    if (!root && lp->uid != getuid()) {
        return err_set(err, E_FAIL, "--sandbox-user needs the server to run as root");
    }
    lp->drop = root;
    return E_OK;
}

static bool exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

static void enable_controllers(const char *dir)
{
    char *p = xasprintf("%s/cgroup.subtree_control", dir);
    int fd = open(p, O_WRONLY | O_CLOEXEC);

    if (fd >= 0) {
        (void)!write(fd, "+memory +pids +cpu", 18);
        close(fd);
    }
    free(p);
}

static bool put(const char *dir, const char *file, const char *value)
{
    char *p = xasprintf("%s/%s", dir, file);
    int fd = open(p, O_WRONLY | O_CLOEXEC);
    bool ok = fd >= 0 && write(fd, value, strlen(value)) == (ssize_t)strlen(value);

    if (fd >= 0) {
        close(fd);
    }
    free(p);
    return ok;
}

/* Kills whatever a previous server with this data dir left in its cgroups (frozen
 * sandboxes ignore the parent-death signal until thawed) and removes them. */
static void sweep(struct local_provider *lp)
{
    for (int i = 0; i < LOCAL_CG_MAX; i++) {
        DIR *d = lp->cg_root[i] != NULL ? opendir(lp->cg_root[i]) : NULL;
        struct dirent *e;
        while (d != NULL && (e = readdir(d)) != NULL) {
            char *dot = strchr(e->d_name, '.');
            if (e->d_type != DT_DIR || dot == NULL || dot == e->d_name || e->d_name[0] == '.' ||
                strncmp(e->d_name, "cgroup", 6) == 0) {
                continue;
            }
            char *ns = xstrdup(e->d_name);
            ns[dot - e->d_name] = '\0';
            struct sbx tmp = {.ns = ns, .name = ns + (dot - e->d_name) + 1, .pid = -1};
            cg_kill(&tmp, lp);
            cg_forget(&tmp, lp);
            free(ns);
        }
        if (d != NULL) {
            closedir(d);
        }
    }
}

/* The v1 freezer turns a kernel-wide static key on when a cgroup starts freezing and off
 * when the last one thaws, and each turn rewrites kernel text on every CPU: a pause's write
 * of FROZEN took 4 to 9 ms here for that alone, 0.6 ms with the key left on
 * (bench/RESULTS.md). An empty freezer cgroup kept FROZEN while the server runs keeps it
 * on. It holds no process; what it costs is the freezer's slow check in the kernel's
 * freezing() for every task of the host. Its name has no dot, so sweep() never takes it
 * for a sandbox's. v2 freezes without that key. */
#define CG_V1_PIN "freeze-pin"

static char *v1_pin(const struct local_provider *lp)
{
    return !lp->v2 && lp->cg_root[0] != NULL ? xasprintf("%s/" CG_V1_PIN, lp->cg_root[0]) : NULL;
}

void local_cgroup_init(struct local_provider *lp, const struct sandbox_local_opts *o)
{
    /* One subtree per data dir: servers of different data dirs never touch each other's
     * sandboxes, even for tasks of the same name. */
    unsigned long long id = (unsigned long long)hash_fnv1a_str(o->state_dir);

    lp->memory = o->memory_bytes;
    lp->pids = o->pids;
    lp->cpus_milli = o->cpus_milli;
    if (geteuid() != 0) {
        return; /* no delegated cgroup: SIGSTOP pauses, no limits */
    }
    if (exists("/sys/fs/cgroup/cgroup.controllers")) {
        lp->v2 = true;
        mkdir("/sys/fs/cgroup/diverge", 0755);
        enable_controllers("/sys/fs/cgroup/diverge");
        lp->cg_root[0] = xasprintf("/sys/fs/cgroup/diverge/%016llx", id);
        mkdir(lp->cg_root[0], 0755);
        enable_controllers(lp->cg_root[0]);
    } else {
        for (int i = 0; i < LOCAL_CG_MAX; i++) {
            char *base = xasprintf("/sys/fs/cgroup/%s", g_v1[i]);
            if (exists(base)) {
                char *top = xasprintf("%s/diverge", base);
                mkdir(top, 0755);
                lp->cg_root[i] = xasprintf("%s/%016llx", top, id);
                mkdir(lp->cg_root[i], 0755);
                free(top);
            }
            free(base);
        }
        char *pin = v1_pin(lp);
        if (pin != NULL) {
            mkdir(pin, 0755); /* a previous server's (kill -9) is taken over */
            if (!put(pin, "freezer.state", "FROZEN")) {
                log_kv(LOG_WARN, "cgroup_freeze_pin_failed", "cgroup", pin, "error",
                       strerror(errno), "message",
                       "not frozen: each pause pays the kernel's switch of the v1 freezer", NULL);
            }
            free(pin);
        }
    }
    sweep(lp);
}

void local_cgroup_cleanup(struct local_provider *lp)
{
    /* Sandboxes die with the server (SPEC §9): what is left are the cgroups made ahead for
     * starts that never came (local_warm) and those of sandboxes that already stopped. A
     * data dir that is never served again (a test's) would keep them for good. */
    sweep(lp);
    char *pin = v1_pin(lp);
    if (pin != NULL) {
        (void)rmdir(pin); /* empty: removed frozen, which also turns its key off */
        free(pin);
    }
    for (int i = 0; i < LOCAL_CG_MAX; i++) {
        if (lp->cg_root[i] != NULL) {
            (void)rmdir(lp->cg_root[i]); /* empty once every sandbox stopped */
        }
        free(lp->cg_root[i]);
    }
}

static char *cg_dir(struct local_provider *lp, int i, const char *ns, const char *name)
{
    return lp->cg_root[i] != NULL ? xasprintf("%s/%s.%s", lp->cg_root[i], ns, name) : NULL;
}

/* The cgroup of sandbox X: named at its start (its EXT, which a claim keeps), else by its
 * task (a record of a previous server). */
static char *cg_dir_of(struct local_provider *lp, int i, const struct sbx *x)
{
    if (x->ext == NULL) {
        return cg_dir(lp, i, x->ns, x->name);
    }
    return lp->cg_root[i] != NULL
               ? xasprintf("%s/%s", lp->cg_root[i], ((const struct local_ext *)x->ext)->cg)
               : NULL;
}

/* What local_cgroup_create managed to set up, for the limits description. */
struct cg_applied {
    bool mem;    /* a memory limit was written */
    bool pids;   /* a pids limit was written */
    bool cpu;    /* a cpu quota was written */
    bool freeze; /* a freezer cgroup exists */
};

static bool cg_limit_memory(struct local_provider *lp, const char *d)
{
    char v[64];

    snprintf(v, sizeof(v), "%lld", (long long)lp->memory);
    return lp->memory > 0 && put(d, lp->v2 ? "memory.max" : "memory.limit_in_bytes", v);
}

static bool cg_limit_pids(struct local_provider *lp, const char *d)
{
    char v[64];

    snprintf(v, sizeof(v), "%lld", (long long)lp->pids);
    return lp->pids > 0 && put(d, "pids.max", v);
}

static bool cg_limit_cpu(struct local_provider *lp, const char *d)
{
    char v[64];

    if (lp->v2) {
        snprintf(v, sizeof(v), "%lld 100000", (long long)(lp->cpus_milli * 100));
        return lp->cpus_milli > 0 && put(d, "cpu.max", v);
    }
    snprintf(v, sizeof(v), "%lld", (long long)(lp->cpus_milli * 100));
    return lp->cpus_milli > 0 && put(d, "cpu.cfs_quota_us", v);
}

/* Writes the limits that controller I (every one under v2) is in charge of into D. */
static void cg_limit_dir(struct cg_applied *a, struct local_provider *lp, int i, const char *d)
{
    if (lp->v2 || i == 1) {
        a->mem = cg_limit_memory(lp, d);
    }
    if (lp->v2 || i == 2) {
        a->pids = cg_limit_pids(lp, d);
    }
    if (lp->v2 || i == 3) {
        a->cpu = cg_limit_cpu(lp, d);
    }
    a->freeze = a->freeze || lp->v2 || i == 0;
}

static bool cg_any(const struct local_provider *lp)
{
    for (int i = 0; i < LOCAL_CG_MAX; i++) {
        if (lp->cg_root[i] != NULL) {
            return true;
        }
    }
    return false;
}

static const char *limited(bool on)
{
    return on ? "limited" : "not limited";
}

void local_cgroup_create(struct local_provider *lp, const char *ns, const char *name, char *limits,
                         size_t limits_len)
{
    struct cg_applied a = {0};

    for (int i = 0; i < LOCAL_CG_MAX; i++) {
        char *d = cg_dir(lp, i, ns, name);
        if (d != NULL && (mkdir(d, 0755) == 0 || errno == EEXIST)) {
            cg_limit_dir(&a, lp, i, d);
        }
        free(d);
    }
    if (!cg_any(lp)) {
        snprintf(limits, limits_len,
                 "no cgroup (the server is not root): memory, pids and "
                 "cpu not limited, pause by SIGSTOP of every process");
        return;
    }
    snprintf(limits, limits_len, "cgroup %s %s/%s.%s: memory %s, pids %s, cpu %s, pause by %s",
             lp->v2 ? "v2" : "v1", lp->cg_root[0] != NULL ? lp->cg_root[0] : "-", ns, name,
             limited(a.mem), limited(a.pids), limited(a.cpu),
             a.freeze ? "cgroup freezer" : "SIGSTOP");
}

void local_cgroup_join(int *fds, struct local_provider *lp, const char *ns, const char *name)
{
    for (int i = 0; i < LOCAL_CG_MAX; i++) {
        char *d = cg_dir(lp, i, ns, name);
        char *p = d != NULL ? xasprintf("%s/cgroup.procs", d) : NULL;
        fds[i] = p != NULL ? open(p, O_WRONLY | O_CLOEXEC) : -1;
        free(p);
        free(d);
    }
}

static void sleep_us(long us)
{
    struct timespec ts = {.tv_sec = us / 1000000L, .tv_nsec = (us % 1000000L) * 1000L};
    nanosleep(&ts, NULL);
}

static void sleep_ms(long ms)
{
    sleep_us(ms * 1000L);
}

static bool file_has(const char *path, const char *text)
{
    char buf[512];

    return sbx_read_small(path, buf, sizeof(buf)) > 0 && strstr(buf, text) != NULL;
}

#define CG_V1_REFREEZE_NS INT64_C(2000000) /* a FREEZING v1 freezer is told FROZEN again */

/* Waits up to ~5 s for the freezer cgroup D to read frozen (STATE: its freezer.state or
 * cgroup.events). A freeze usually completes within a millisecond: the state is read
 * again after 50 us, then twice as late each time up to every 2 ms, so the pause is not
 * reported a whole 2 ms late. A v1 freezer that stays FREEZING (a task it could not stop
 * yet, e.g. one in the middle of a fork or an uninterruptible wait) only tries again on
 * another write of FROZEN: one every CG_V1_REFREEZE_NS (a write of an already frozen
 * task is a no-op, so it is cheap; at every 100 ms, 1 to 4 of 40 pauses of a task whose
 * runner forks all the time took 110 ms: bench/RESULTS.md). v2 keeps trying by itself. */
static bool cg_wait_frozen(struct local_provider *lp, const char *d, const char *state)
{
    int64_t start = clock_mono_ns(), retried = start, now;
    long pause_us = 50;

    while (!file_has(state, lp->v2 ? "frozen 1" : "FROZEN")) {
        now = clock_mono_ns();
        if (now - start > INT64_C(5000000000)) {
            return false;
        }
        if (!lp->v2 && now - retried >= CG_V1_REFREEZE_NS) {
            (void)put(d, "freezer.state", "FROZEN");
            retried = now;
        }
        sleep_us(pause_us);
        pause_us = pause_us < 1000 ? pause_us * 2 : 2000;
    }
    return true;
}

static int cg_freeze(struct sbx *x, void *ctx, struct err *err)
{
    struct local_provider *lp = ctx;
    char *d = cg_dir_of(lp, 0, x);
    char *state =
        d != NULL ? xasprintf("%s/%s", d, lp->v2 ? "cgroup.events" : "freezer.state") : NULL;
    int rc = E_OK;

    if (d == NULL || !put(d, lp->v2 ? "cgroup.freeze" : "freezer.state", lp->v2 ? "1" : "FROZEN")) {
        sbx_signal_tree(x->pid, SIGSTOP); /* no cgroup: every process of the sandbox */
    } else if (!cg_wait_frozen(lp, d, state)) {
        rc = err_set(err, E_FAIL, "the sandbox did not freeze");
    }
    free(state);
    free(d);
    return rc;
}

static int cg_thaw(struct sbx *x, void *ctx, struct err *err)
{
    struct local_provider *lp = ctx;
    char *d = cg_dir_of(lp, 0, x);

    (void)err;
    if (d == NULL || !put(d, lp->v2 ? "cgroup.freeze" : "freezer.state", lp->v2 ? "0" : "THAWED")) {
        sbx_signal_tree(x->pid, SIGCONT);
    }
    free(d);
    return E_OK;
}

/* Reads D/cgroup.procs (D may be NULL) into BUF as a string; false if there was nothing. */
static bool cg_read_procs(char *buf, size_t size, const char *d)
{
    char *p = d != NULL ? xasprintf("%s/cgroup.procs", d) : NULL;
    int fd = p != NULL ? open(p, O_RDONLY | O_CLOEXEC) : -1;
    ssize_t n = fd >= 0 ? read(fd, buf, size - 1) : -1;

    if (fd >= 0) {
        close(fd);
    }
    free(p);
    if (n <= 0) {
        return false;
    }
    buf[n] = '\0';
    return true;
}

/* SIGKILLs every pid (except 0 and 1) of a newline-separated list. */
static void kill_pid_list(const char *list)
{
    for (const char *s = list; *s != '\0';) {
        char *end = NULL;
        long pid = strtol(s, &end, 10);
        if (end == s) {
            break;
        }
        if (pid > 1) {
            kill((pid_t)pid, SIGKILL);
        }
        s = end + (*end != '\0');
    }
}

/* SIGKILLs every process of the task's cgroups (thawing them so the kill lands). */
static void cg_kill(struct sbx *x, void *ctx)
{
    struct local_provider *lp = ctx;

    for (int i = 0; i < LOCAL_CG_MAX; i++) {
        char *d = cg_dir_of(lp, i, x);
        char buf[8192];
        bool listed = cg_read_procs(buf, sizeof(buf), d);

        if (lp->v2 && d != NULL) {
            (void)put(d, "cgroup.kill", "1"); /* Linux 5.14+: the whole subtree at once */
        }
        if (listed) {
            kill_pid_list(buf);
        }
        if (i == 0 && d != NULL) {
            (void)put(d, lp->v2 ? "cgroup.freeze" : "freezer.state", lp->v2 ? "0" : "THAWED");
        }
        free(d);
    }
}

static void cg_forget(struct sbx *x, void *ctx)
{
    struct local_provider *lp = ctx;

    for (int i = 0; i < LOCAL_CG_MAX; i++) {
        char *d = cg_dir_of(lp, i, x);
        for (int tries = 0; d != NULL && tries < 50 && rmdir(d) != 0 && errno == EBUSY; tries++) {
            cg_kill(x, ctx);
            sleep_ms(10);
        }
        free(d);
    }
}

void local_cgroup_remove(struct local_provider *lp, const char *ns, const char *name)
{
    struct sbx tmp = {.ns = (char *)(uintptr_t)ns, .name = (char *)(uintptr_t)name, .pid = -1};

    cg_forget(&tmp, lp);
}

const struct sbx_hooks local_hooks = {
    .kill_rest = cg_kill,
    .freeze = cg_freeze,
    .thaw = cg_thaw,
    .forget = cg_forget,
};

/* socket() and socketpair() only for AF_UNIX, AF_INET and AF_INET6 (flatpak's allowlist
 * without netlink); EAFNOSUPPORT for the rest, e.g. AF_VSOCK, which network namespaces do
 * not isolate, or AF_NETLINK. The kernel reads the family as an int: a value with any of
 * the upper 32 bits set is refused too. */
static int seccomp_families(scmp_filter_ctx ctx)
{
    static const int allowed[] = {AF_UNIX, AF_INET, AF_INET6}; /* in numerical order */
    static const int calls[] = {SCMP_SYS(socket), SCMP_SYS(socketpair)};
    int rc = 0;

    for (size_t c = 0; c < ARRAY_LEN(calls) && rc == 0; c++) {
        int next = 0;
        for (size_t i = 0; i < ARRAY_LEN(allowed) && rc == 0; i++) {
            for (int fam = next; fam < allowed[i] && rc == 0; fam++) {
                rc = seccomp_rule_add_exact(ctx, SCMP_ACT_ERRNO(EAFNOSUPPORT), calls[c], 1,
                                            SCMP_A0(SCMP_CMP_EQ, (scmp_datum_t)fam, 0));
            }
            next = allowed[i] + 1;
        }
        if (rc == 0) {
            rc = seccomp_rule_add_exact(ctx, SCMP_ACT_ERRNO(EAFNOSUPPORT), calls[c], 1,
                                        SCMP_A0(SCMP_CMP_GE, (scmp_datum_t)next, 0));
        }
    }
    return rc;
}

/* personality() only with the default persona (PER_LINUX, 0) or the query 0xffffffff;
 * EPERM for any other (ADDR_NO_RANDOMIZE, READ_IMPLIES_EXEC, other ABIs). libseccomp takes
 * one comparison per argument and rule, so "low 32 bits neither all 0 nor all 1" is
 * written as "bit 0 differs from bit J" for each J, plus anything above 32 bits. */
static int seccomp_personality(scmp_filter_ctx ctx)
{
    int rc = seccomp_rule_add_exact(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(personality), 1,
                                    SCMP_A0(SCMP_CMP_GT, (scmp_datum_t)0xffffffffu, 0));

    for (unsigned j = 1; j < 32 && rc == 0; j++) {
        scmp_datum_t mask = 1u | (scmp_datum_t)1u << j;
        rc = seccomp_rule_add_exact(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(personality), 1,
                                    SCMP_A0(SCMP_CMP_MASKED_EQ, mask, (scmp_datum_t)1u));
        if (rc == 0) {
            rc = seccomp_rule_add_exact(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(personality), 1,
                                        SCMP_A0(SCMP_CMP_MASKED_EQ, mask, (scmp_datum_t)1u << j));
        }
    }
    return rc;
}

/* Builds the filter and exports it into a new memfd (at offset 0) in *FD_OUT. */
static int build_filter(int *fd_out, struct err *err)
{
    static const char *const eperm[] = {"syslog",         "uselib",           "acct",
                                        "modify_ldt",     "quotactl",         "add_key",
                                        "keyctl",         "request_key",      "move_pages",
                                        "mbind",          "get_mempolicy",    "set_mempolicy",
                                        "migrate_pages",  "unshare",          "setns",
                                        "mount",          "umount",           "umount2",
                                        "pivot_root",     "chroot",           "perf_event_open",
                                        "ptrace",         "process_vm_readv", "process_vm_writev",
                                        "io_uring_setup", "io_uring_enter",   "io_uring_register"};
    static const char *const enosys[] = {"clone3",   "open_tree", "move_mount", "fsopen",
                                         "fsconfig", "fsmount",   "fspick",     "mount_setattr"};
    scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
    int fd = -1, rc = E_OK;

    *fd_out = -1;
    if (ctx == NULL) {
        return err_set(err, E_FAIL, "seccomp_init failed");
    }
    for (size_t i = 0; i < ARRAY_LEN(eperm); i++) {
        int nr = seccomp_syscall_resolve_name(eperm[i]);
        if (nr != __NR_SCMP_ERROR) {
            (void)seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), nr, 0);
        }
    }
    for (size_t i = 0; i < ARRAY_LEN(enosys); i++) {
        int nr = seccomp_syscall_resolve_name(enosys[i]);
        if (nr != __NR_SCMP_ERROR) {
            (void)seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), nr, 0);
        }
    }
    /* clone with CLONE_NEWUSER; ioctl TIOCSTI/TIOCLINUX compared on the low 32 bits. */
    (void)seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1,
                           SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER));
    (void)seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(ioctl), 1,
                           SCMP_A1(SCMP_CMP_MASKED_EQ, 0xFFFFFFFFu, (scmp_datum_t)TIOCSTI));
    (void)seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(ioctl), 1,
                           SCMP_A1(SCMP_CMP_MASKED_EQ, 0xFFFFFFFFu, (scmp_datum_t)TIOCLINUX));
    /* Unlike the deny list above (names this libseccomp may not know), these must hold. */
    if (seccomp_families(ctx) != 0 || seccomp_personality(ctx) != 0) {
        seccomp_release(ctx);
        return err_set(err, E_FAIL, "build the seccomp filter: socket family or personality rule");
    }
    fd = memfd_create("diverge-seccomp", MFD_CLOEXEC);
    if (fd < 0 || seccomp_export_bpf(ctx, fd) != 0 || lseek(fd, 0, SEEK_SET) != 0) {
        rc = err_set(err, E_FAIL, "build the seccomp filter: %s", strerror(errno));
        if (fd >= 0) {
            close(fd);
        }
        fd = -1;
    }
    seccomp_release(ctx);
    *fd_out = fd;
    return rc;
}

void local_seccomp_init(struct local_provider *lp)
{
    struct err err = {0};
    struct stat st;
    int fd = -1;

    if (build_filter(&fd, &err) != E_OK) {
        return; /* each spawn builds it again and reports the failure */
    }
    if (fstat(fd, &st) == 0 && st.st_size > 0 && st.st_size < (1 << 20)) {
        unsigned char *prog = xmalloc((size_t)st.st_size);
        if (read(fd, prog, (size_t)st.st_size) == st.st_size) {
            lp->seccomp_prog = prog;
            lp->seccomp_len = (size_t)st.st_size;
        } else {
            free(prog);
        }
    }
    close(fd);
}

int local_seccomp_fd(const struct local_provider *lp, int *fd_out, struct err *err)
{
    int fd;

    if (lp->seccomp_prog == NULL) {
        return build_filter(fd_out, err);
    }
    *fd_out = -1;
    fd = memfd_create("diverge-seccomp", MFD_CLOEXEC);
    if (fd < 0 || write(fd, lp->seccomp_prog, lp->seccomp_len) != (ssize_t)lp->seccomp_len ||
        lseek(fd, 0, SEEK_SET) != 0) {
        int e = errno;
        if (fd >= 0) {
            close(fd);
        }
        return err_set(err, E_FAIL, "write the seccomp filter: %s", strerror(e));
    }
    *fd_out = fd;
    return E_OK;
}
