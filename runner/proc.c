/* SPDX-License-Identifier: Apache-2.0 */
/* Children of the runner: posix_spawn with an argv array (no shell interpolates data
 * here), stdin from /dev/null, output passed through to the task log and its tail kept. */
#define _GNU_SOURCE /* syscall */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "runner/runner_int.h"

void runner_say(const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    flockfile(stdout); /* one whole line: the relays and the first heartbeat say from threads */
    fputs("diverge-agent-runner: ", stdout);
    vfprintf(stdout, fmt, ap);
    fputc('\n', stdout);
    fflush(stdout);
    funlockfile(stdout);
    va_end(ap);
}

void runner_tail_add(struct runner_tail *t, const char *data, size_t len)
{
    if (len >= sizeof(t->data)) {
        data += len - RUNNER_TAIL_BYTES;
        len = RUNNER_TAIL_BYTES;
        t->len = 0;
    }
    if (t->len + len > sizeof(t->data)) {
        /* Keep the newest RUNNER_TAIL_BYTES - len bytes (at least what fits). */
        size_t keep = RUNNER_TAIL_BYTES > len ? RUNNER_TAIL_BYTES - len : 0;
        if (keep > t->len) {
            keep = t->len;
        }
        memmove(t->data, t->data + t->len - keep, keep);
        t->len = keep;
    }
    memcpy(t->data + t->len, data, len);
    t->len += len;
}

static bool name_in(const char *entry, const char *const *names)
{
    for (size_t i = 0; names != NULL && names[i] != NULL; i++) {
        size_t n = strlen(names[i]);
        if (strncmp(entry, names[i], n) == 0 && entry[n] == '=') {
            return true;
        }
    }
    return false;
}

char **runner_env_build(char *const *base, const char *const *unset, const char *const *set)
{
    size_t nb = 0, ns = 0, j = 0;
    char **env;

    while (base != NULL && base[nb] != NULL) {
        nb++;
    }
    while (set != NULL && set[ns] != NULL) {
        ns++;
    }
    env = xcalloc(nb + ns + 1, sizeof(*env));
    for (size_t i = 0; i < nb; i++) {
        if (!name_in(base[i], unset)) {
            env[j++] = xstrdup(base[i]);
        }
    }
    for (size_t i = 0; i < ns; i++) {
        env[j++] = xstrdup(set[i]);
    }
    env[j] = NULL;
    return env;
}

void runner_env_free(char **env)
{
    for (size_t i = 0; env != NULL && env[i] != NULL; i++) {
        free(env[i]);
    }
    free(env);
}

char *runner_which(const char *prog)
{
    const char *path = getenv("PATH");
    char *copy = xstrdup(path != NULL && *path != '\0' ? path : "/usr/bin:/bin");
    char *found = NULL, *p = copy;

    while (p != NULL && found == NULL) {
        char *colon = strchr(p, ':');
        char *cand;
        if (colon != NULL) {
            *colon = '\0';
        }
        if (*p == '/') {
            cand = xasprintf("%s/%s", p, prog);
            if (access(cand, X_OK) == 0) {
                found = cand;
            } else {
                free(cand);
            }
        }
        p = colon != NULL ? colon + 1 : NULL;
    }
    free(copy);
    return found;
}

/* Starts SP's child into *PID: stdin from /dev/null, stdout (and stderr with a tail) to WFD
 * when >= 0, SIGPIPE back to its default, its own process group when followed, in SP's
 * cwd. posix_spawn (a vfork-style clone sharing the runner's memory until the exec), not
 * fork: the runner has threads and libcurl mapped, and a fork copies their page tables
 * while it holds the memory map's lock, which stalls every other thread's page fault. 0 or
 * the error of the exec (then no child exists). */
static int spawn_child(pid_t *pid, const struct runner_spawn *sp, int wfd)
{
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    sigset_t dfl;
    short flags = POSIX_SPAWN_SETSIGDEF;
    int rc;

    posix_spawn_file_actions_init(&fa);
    posix_spawnattr_init(&at);
    (void)posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    if (wfd >= 0) {
        (void)posix_spawn_file_actions_adddup2(&fa, wfd, STDOUT_FILENO);
        if (sp->tail != NULL) {
            (void)posix_spawn_file_actions_adddup2(&fa, wfd, STDERR_FILENO);
        }
    }
    if (sp->cwd != NULL) {
        (void)posix_spawn_file_actions_addchdir_np(&fa, sp->cwd);
    }
    sigemptyset(&dfl);
    sigaddset(&dfl, SIGPIPE);
    (void)posix_spawnattr_setsigdefault(&at, &dfl);
    if (sp->follow != NULL) {
        flags |= POSIX_SPAWN_SETPGROUP; /* a stop kills the agent and whatever it started */
        (void)posix_spawnattr_setpgroup(&at, 0);
    }
    (void)posix_spawnattr_setflags(&at, flags);
    rc = posix_spawn(pid, sp->argv[0], &fa, &at, (char *const *)(uintptr_t)sp->argv, sp->envp);
    posix_spawnattr_destroy(&at);
    posix_spawn_file_actions_destroy(&fa);
    return rc;
}

static void write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) {
            continue;
        }
        if (w <= 0) {
            return;
        }
        p += w;
        n -= (size_t)w;
    }
}

/* Passes one read's bytes on; false at EOF or on an error other than "no data yet". */
static bool pump_once(const struct runner_spawn *sp, int rfd, bool *more)
{
    char chunk[8192];
    ssize_t n = read(rfd, chunk, sizeof(chunk));

    *more = false;
    if (n < 0) {
        return errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK;
    }
    if (n == 0) {
        return false;
    }
    if (sp->capture != NULL) {
        (void)buf_append(sp->capture, chunk, (size_t)n); /* over the cap: dropped */
    }
    if (sp->tail != NULL) {
        write_all(STDOUT_FILENO, chunk, (size_t)n);
        runner_tail_add(sp->tail, chunk, (size_t)n);
    }
    *more = true;
    return true;
}

static int64_t mono_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* How long one wait for output lasts: at most 100 ms, at most the follow period. */
static int follow_wait_ms(const struct runner_spawn *sp)
{
    return sp->follow != NULL && sp->follow_ms < 100 ? (int)sp->follow_ms : 100;
}

/* Calls SP's follow callback when its period has passed; kills the child's process group
 * (once) when it says stop. */
static void follow_tick(const struct runner_spawn *sp, pid_t pid, int64_t *next, bool *killed)
{
    int64_t now;

    if (sp->follow == NULL || *killed) {
        return;
    }
    now = mono_ms();
    if (now < *next) {
        return;
    }
    *next = now + sp->follow_ms;
    if (!sp->follow(sp->follow_userdata)) {
        (void)kill(-pid, SIGKILL);
        (void)kill(pid, SIGKILL);
        *killed = true;
    }
}

/* A descriptor that becomes readable when PID exits (pidfd_open, Linux 5.3), or -1. */
static int exit_fd(pid_t pid)
{
#ifdef SYS_pidfd_open
    int fd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (fd >= 0) {
        (void)fcntl(fd, F_SETFD, FD_CLOEXEC);
    }
    return fd;
#else
    (void)pid;
    return -1;
#endif
}

/* waitpid of PID, without blocking when POLLING (then, when it still runs, a wait of up
 * to WAIT_MS that ends as soon as it exits when XFD, its exit_fd, is there: its pipe is
 * gone, but its usage is still followed). The pipe reads end of file a moment before the
 * child can be reaped (its files are closed early in its exit): a plain pause here made
 * about every other iteration wait the whole WAIT_MS for nothing. */
static pid_t reap(int *wst, pid_t pid, int xfd, bool polling, int wait_ms)
{
    pid_t w = waitpid(pid, wst, polling ? WNOHANG : 0);

    if (w == 0 && wait_ms > 0) {
        struct pollfd p = {.fd = xfd, .events = POLLIN};
        (void)poll(xfd >= 0 ? &p : NULL, xfd >= 0 ? 1 : 0, wait_ms);
    }
    return w;
}

/* The runner's one inotify instance (follow_watch), kept open for the process's life:
 * closing one waits in the kernel, uninterruptibly, for an SRCU grace period (tens of ms
 * measured on a loaded box), and a freeze of the sandbox cannot complete while the runner
 * waits there. Spawns that follow run one at a time (the agent). */
static int g_follow_fd = -1;

static bool follow_touched(const struct runner_spawn *sp, int ifd);

/* A watch of the directory of SP's follow_path, so a write to the file wakes the follow
 * at once; -1 without one (then the follow runs every follow_ms only). Made before the
 * child starts: its first write is not missed. Events left from an earlier spawn are
 * drained first. */
static int follow_watch(const struct runner_spawn *sp)
{
    const char *path = sp->follow_path, *slash = path != NULL ? strrchr(path, '/') : NULL;
    char *dir;
    int fd;

    if (sp->follow == NULL || slash == NULL || slash[1] == '\0') {
        return -1;
    }
    if (g_follow_fd < 0) {
        g_follow_fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    }
    fd = g_follow_fd;
    if (fd < 0) {
        return -1;
    }
    (void)follow_touched(sp, fd);
    dir = slash == path ? xstrdup("/") : xasprintf("%.*s", (int)(slash - path), path);
    /* The same directory again keeps its one watch (its mask replaced). */
    if (inotify_add_watch(fd, dir, IN_MODIFY | IN_MOVED_TO | IN_ONLYDIR | IN_DONT_FOLLOW) < 0) {
        fd = -1;
    }
    free(dir);
    return fd;
}

/* Drains the events of IFD (follow_watch); true when one was about SP's follow_path (or
 * some were lost). */
static bool follow_touched(const struct runner_spawn *sp, int ifd)
{
    char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
    const char *name = strrchr(sp->follow_path, '/') + 1;
    bool hit = false;
    ssize_t n;

    while ((n = read(ifd, buf, sizeof(buf))) > 0) {
        for (size_t pos = 0; pos + sizeof(struct inotify_event) <= (size_t)n;) {
            const struct inotify_event *ev = (const struct inotify_event *)(buf + pos);
            hit = hit || (ev->mask & IN_Q_OVERFLOW) != 0 ||
                  (ev->len > 0 && strncmp(ev->name, name, ev->len) == 0);
            pos += sizeof(*ev) + ev->len;
        }
    }
    return hit;
}

/* Passes the child's output on until the child exited and the pipe is drained. A
 * background process the child left behind may keep the pipe open: once the child
 * itself is gone, what is buffered is read and the rest is not waited for. Returns the
 * child's wait status in *wst. */
/* Waits up to WAIT_MS for output on RFD (passed on), the end of the pipe, or the exit of
 * the child (XFD, when there); false once the pipe is done. */
static bool pump_wait(const struct runner_spawn *sp, const int fd[3], int wait_ms, bool *more,
                      int64_t *next)
{
    /* The output, the child's exit, a write to the followed file (-1s are skipped). */
    struct pollfd pfd[3] = {{.fd = fd[0], .events = POLLIN},
                            {.fd = fd[1], .events = POLLIN},
                            {.fd = fd[2], .events = POLLIN}};

    if (poll(pfd, 3, wait_ms) <= 0) {
        return true;
    }
    if (pfd[2].revents != 0 && follow_touched(sp, fd[2])) {
        *next = 0; /* a usage line may be complete: follow now */
    }
    return pfd[0].revents != 0 ? pump_once(sp, fd[0], more) : true;
}

static int pump(int *wst, const struct runner_spawn *sp, int rfd, pid_t pid, int ifd)
{
    bool open_pipe = fcntl(rfd, F_SETFL, O_NONBLOCK) == 0, more = false, killed = false;
    const int fd[3] = {rfd, exit_fd(pid), ifd};
    int xfd = fd[1];
    int wait_ms = follow_wait_ms(sp), rc = E_OK;
    int64_t next = mono_ms() + wait_ms;
    pid_t w;

    for (;;) {
        if (open_pipe) {
            open_pipe = pump_wait(sp, fd, wait_ms, &more, &next);
        }
        follow_tick(sp, pid, &next, &killed);
        w = reap(wst, pid, xfd, open_pipe || (sp->follow != NULL && !killed),
                 open_pipe ? 0 : wait_ms);
        if (w == pid) {
            break;
        }
        if (w < 0 && errno != EINTR) {
            rc = E_FAIL;
            break;
        }
    }
    while (rc == E_OK && open_pipe && pump_once(sp, rfd, &more) && more) {
    }
    if (xfd >= 0) {
        close(xfd);
    }
    return rc;
}

/* Opens the output pipe, both ends close-on-exec; on failure nothing is left open. */
static int open_cloexec_pipe(int fds[2], struct err *err)
{
    if (pipe(fds) != 0 || fcntl(fds[0], F_SETFD, FD_CLOEXEC) != 0 ||
        fcntl(fds[1], F_SETFD, FD_CLOEXEC) != 0) {
        if (fds[0] >= 0) {
            close(fds[0]);
            close(fds[1]);
        }
        return err_set(err, E_FAIL, "pipe: %s", strerror(errno));
    }
    return E_OK;
}

/* Waits for PID, passing its output on from the read end FDS[0] when PIPED (both ends
 * are closed here). Stores the wait status in *wst. */
static int wait_child(int *wst, const struct runner_spawn *sp, int fds[2], bool piped, pid_t pid,
                      int ifd, struct err *err)
{
    if (piped) {
        int prc;
        close(fds[1]);
        prc = pump(wst, sp, fds[0], pid, ifd);
        close(fds[0]);
        if (prc != E_OK) {
            return err_set(err, E_FAIL, "waitpid: %s", strerror(errno));
        }
        return E_OK;
    }
    while (waitpid(pid, wst, 0) < 0) {
        if (errno != EINTR) {
            return err_set(err, E_FAIL, "waitpid: %s", strerror(errno));
        }
    }
    return E_OK;
}

/* The shell's convention: the exit code, 128 + the signal, else 127. */
static int exit_code_of(int wst)
{
    if (WIFEXITED(wst)) {
        return WEXITSTATUS(wst);
    }
    if (WIFSIGNALED(wst)) {
        return 128 + WTERMSIG(wst);
    }
    return 127;
}

int runner_spawn_run(int *status_out, const struct runner_spawn *sp, struct err *err)
{
    int fds[2] = {-1, -1}, wst = 0, ifd, rc;
    bool piped = sp->capture != NULL || sp->tail != NULL;
    pid_t pid;

    *status_out = 127;
    if (piped) {
        rc = open_cloexec_pipe(fds, err);
        if (rc != E_OK) {
            return rc;
        }
    }
    ifd = piped ? follow_watch(sp) : -1;
    fflush(stdout);
    fflush(stderr);
    rc = spawn_child(&pid, sp, piped ? fds[1] : -1);
    if (rc != 0) {
        if (piped) {
            close(fds[0]);
            close(fds[1]);
        }
        /* No process (EAGAIN, ENOMEM) is an error; an exec that failed is status 127. */
        return rc == EAGAIN || rc == ENOMEM
                   ? err_set(err, E_FAIL, "start %s: %s", sp->argv[0], strerror(rc))
                   : E_OK;
    }
    if (sp->follow != NULL) {
        (void)setpgid(pid, pid); /* also here: the group exists before any kill */
    }
    rc = wait_child(&wst, sp, fds, piped, pid, ifd, err);
    if (rc != E_OK) {
        return rc;
    }
    *status_out = exit_code_of(wst);
    return E_OK;
}
