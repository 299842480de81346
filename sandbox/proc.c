/* SPDX-License-Identifier: Apache-2.0 */
/* The live-sandbox table shared by the providers. Each sandbox has one thread that pumps
 * the leader's output into the task log line by line and reaps the leader through a
 * pidfd; once it exited, whatever else is left of the sandbox is killed, so nothing
 * outlives the runner. A record file per sandbox (leader pid and start time) lets the
 * next server kill what a server killed with -9 left behind. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/log.h"
#include "sandbox/sandbox_int.h"

char *sbx_record_path(const struct sbx_set *set, const char *ns, const char *name)
{
    return xasprintf("%s/%s.%s", set->state_dir, ns, name);
}

static void kill_recorded(struct sbx_set *set, const char *ns, const char *name);

/* Kills what every record of a previous server names (a frozen or stopped sandbox, or one
 * of a task deleted while no server ran): nothing of this server runs yet. */
static void sweep_records(struct sbx_set *set)
{
    DIR *d = opendir(set->state_dir);
    struct dirent *e;

    while (d != NULL && (e = readdir(d)) != NULL) {
        char *dot = strchr(e->d_name, '.');
        if (dot == NULL || dot == e->d_name || strchr(dot + 1, '.') != NULL || dot[1] == '\0') {
            continue; /* ".", "..", "<ns>.<task>.pause" */
        }
        char *ns = xstrdup(e->d_name);
        ns[dot - e->d_name] = '\0';
        kill_recorded(set, ns, ns + (dot - e->d_name) + 1);
        free(ns);
    }
    if (d != NULL) {
        closedir(d);
    }
}

void sbx_set_init(struct sbx_set *set, struct sandbox_provider *base, const char *state_dir,
                  const struct sbx_hooks *hooks, void *ctx)
{
    memset(set, 0, sizeof(*set));
    pthread_mutex_init(&set->lock, NULL);
    set->base = base;
    set->state_dir = xstrdup(state_dir);
    set->hooks = hooks;
    set->ctx = ctx;
    (void)sandbox_mkdirs(state_dir, true);
    sweep_records(set);
}

static struct sbx *find(struct sbx_set *set, const char *ns, const char *name)
{
    for (struct sbx *x = set->head; x != NULL; x = x->next) {
        if (strcmp(x->ns, ns) == 0 && strcmp(x->name, name) == 0) {
            return x;
        }
    }
    return NULL;
}

/* Writes whole lines of BUF[0..*len) to the log as sandbox lines, keeping a partial last
 * line unless it fills the buffer (or FLUSH). */
static void pump_lines(struct sbx *x, char *buf, size_t *len, bool flush)
{
    size_t start = 0;

    pthread_mutex_lock(&x->log_lock);
    for (size_t i = 0; i < *len; i++) {
        if (buf[i] == '\n') {
            sandbox_log_output(x->log_path, x->log_cap, buf + start, i - start);
            start = i + 1;
        }
    }
    if (start < *len && (flush || (start == 0 && *len == SBX_LINE_MAX))) {
        sandbox_log_output(x->log_path, x->log_cap, buf + start, *len - start);
        start = *len;
    }
    pthread_mutex_unlock(&x->log_lock);
    memmove(buf, buf + start, *len - start);
    *len -= start;
}

static void kill_rest(struct sbx *x)
{
    if (x->set->hooks != NULL && x->set->hooks->kill_rest != NULL) {
        x->set->hooks->kill_rest(x, x->set->ctx);
    }
    if (x->pid > 1) {
        /* Descendants that left the group (setsid) while the leader still holds them. */
        sbx_signal_tree(x->pid, SIGKILL);
        kill(-x->pid, SIGKILL);
        kill(-x->pid, SIGCONT);
    }
}

/* The leader exited (seen without reaping it, so its process group id cannot be reused
 * yet): kill the rest of the sandbox, then reap. */
static int reap(struct sbx *x)
{
    siginfo_t info;
    int status = 0;

    memset(&info, 0, sizeof(info));
    while (waitid(P_PID, (id_t)x->pid, &info, WEXITED | WNOWAIT) < 0 && errno == EINTR) {
    }
    pthread_mutex_lock(&x->set->lock);
    kill_rest(x);
    while (waitpid(x->pid, &status, 0) < 0 && errno == EINTR) {
    }
    x->reaped = true;
    pthread_mutex_unlock(&x->set->lock);
    return status;
}

/* Reads what the output pipe has into BUF[*len..] and logs the whole lines; true at end of
 * file (or on an error other than EINTR/EAGAIN). */
static bool pump_read(struct sbx *x, char *buf, size_t *len)
{
    ssize_t got = read(x->out_fd, buf + *len, SBX_LINE_MAX - *len);

    if (got <= 0) {
        return got == 0 || (errno != EINTR && errno != EAGAIN);
    }
    *len += (size_t)got;
    pump_lines(x, buf, len, false);
    return false;
}

/* Logs the sandbox's output until the leader exited (and was reaped) and the pipe is at
 * end of file; returns the leader's wait status. */
static int pump_until_exit(struct sbx *x)
{
    char buf[SBX_LINE_MAX];
    size_t len = 0;
    bool exited = false, eof = false;
    int status = 0, drain_rounds = 0;

    while (!exited || !eof) {
        struct pollfd p[2] = {{.fd = eof ? -1 : x->out_fd, .events = POLLIN},
                              {.fd = exited ? -1 : x->pidfd, .events = POLLIN}};
        int n = poll(p, 2, exited ? 100 : -1);

        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n == 0 && exited && ++drain_rounds > 20) {
            break; /* something outside kept the pipe open: give up on the rest */
        }
        if (!exited && (p[1].revents & (POLLIN | POLLHUP)) != 0) {
            status = reap(x);
            exited = true;
        }
        if (!eof && (p[0].revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
            eof = pump_read(x, buf, &len);
        }
    }
    pump_lines(x, buf, &len, true);
    return status;
}

/* The sandbox is gone: drop its record, log the exit, publish the exit code and tell the
 * owner, unless it is being stopped on purpose. */
static void pump_finish(struct sbx *x, int status)
{
    if (x->set->hooks != NULL && x->set->hooks->forget != NULL) {
        x->set->hooks->forget(x, x->set->ctx);
    }
    /* Nothing inside can use the egress proxy or the meter socket any more: their sockets
     * and threads go now. */
    sandbox_egress_free(x->egress);
    x->egress = NULL;
    sandbox_meter_free(x->meter);
    x->meter = NULL;
    unlink(x->record);
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    pthread_mutex_lock(&x->set->lock);
    bool notify = !x->stopping;
    pthread_mutex_unlock(&x->set->lock);
    if (notify) {
        /* Logged before the state changes: a reconcile of the exit comes after it. */
        char line[80];
        int n = snprintf(line, sizeof(line), "[diverge] runner exited (status %d)", code);
        pthread_mutex_lock(&x->log_lock);
        sandbox_log_write(x->log_path, x->log_cap, line, (size_t)n);
        pthread_mutex_unlock(&x->log_lock);
    }
    pthread_mutex_lock(&x->set->lock);
    x->exit_code = code;
    x->state = SANDBOX_EXITED;
    notify = !x->stopping;
    pthread_mutex_unlock(&x->set->lock);
    if (notify && x->set->base->on_exit != NULL) {
        x->set->base->on_exit(x->ns, x->name, x->set->base->on_exit_userdata);
    }
}

static void *pump(void *arg)
{
    struct sbx *x = arg;

    pump_finish(x, pump_until_exit(x));
    return NULL;
}

static void sbx_free(struct sbx *x)
{
    sandbox_egress_free(x->egress);
    sandbox_meter_free(x->meter);
    close(x->out_fd);
    close(x->pidfd);
    free(x->ns);
    free(x->name);
    free(x->log_path);
    free(x->record);
    free(x->ext);
    pthread_mutex_destroy(&x->log_lock);
    free(x);
}

/* Unlinks X from the table (lock held). */
static void unlink_sbx(struct sbx_set *set, struct sbx *x)
{
    for (struct sbx **pp = &set->head; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == x) {
            *pp = x->next;
            return;
        }
    }
}

/* Kills X, waits for its thread and frees it (X already unlinked). */
static void finish(struct sbx *x)
{
    pthread_mutex_lock(&x->set->lock);
    if (!x->reaped) {
        kill_rest(x);
    }
    pthread_mutex_unlock(&x->set->lock);
    pthread_join(x->thread, NULL);
    sbx_free(x);
}

static void write_record(const struct sbx *x)
{
    char line[64];
    int fd = open(x->record, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    int n = snprintf(line, sizeof(line), "%d %llu\n", (int)x->pid, sbx_starttime(x->pid));

    if (fd >= 0) {
        (void)!write(fd, line, (size_t)n);
        close(fd);
    }
}

/* Kills what the record of NS/NAME (from a previous server) names, and removes it. */
static void kill_recorded(struct sbx_set *set, const char *ns, const char *name)
{
    char *path = sbx_record_path(set, ns, name);
    char line[64] = {0};
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);

    if (fd >= 0) {
        if (read(fd, line, sizeof(line) - 1) > 0) {
            char *end = NULL;
            long pid = strtol(line, &end, 10);
            unsigned long long st = end != NULL ? strtoull(end, NULL, 10) : 0;
            sbx_kill_group((pid_t)pid, st);
        }
        close(fd);
        unlink(path);
    }
    free(path);
}

int sbx_launch(struct sbx_set *set, const struct sandbox_spec *s, sbx_spawn_fn spawn, void *ext,
               struct err *err)
{
    struct sbx *x, *old;
    int pipefd[2];
    pid_t pid = -1;
    int rc;

    pthread_mutex_lock(&set->lock);
    old = find(set, s->ns, s->name);
    if (old != NULL && old->state != SANDBOX_EXITED) {
        pthread_mutex_unlock(&set->lock);
        free(ext);
        sandbox_egress_free(s->egress);
        sandbox_meter_free(s->meter);
        return err_set(err, E_CONFLICT, "a sandbox already runs for this task");
    }
    if (old != NULL) {
        unlink_sbx(set, old);
    }
    pthread_mutex_unlock(&set->lock);
    if (old != NULL) {
        finish(old);
    } else {
        kill_recorded(set, s->ns, s->name);
    }
    if (pipe2(pipefd, O_CLOEXEC) != 0) {
        free(ext);
        sandbox_egress_free(s->egress);
        sandbox_meter_free(s->meter);
        return err_set(err, E_FAIL, "pipe: %s", strerror(errno));
    }
    x = xcalloc(1, sizeof(*x));
    x->ns = xstrdup(s->ns);
    x->name = xstrdup(s->name);
    x->log_path = xstrdup(s->log_path);
    x->log_cap = s->log_cap;
    pthread_mutex_init(&x->log_lock, NULL);
    x->record = sbx_record_path(set, s->ns, s->name);
    x->ext = ext;
    x->egress = s->egress;
    x->meter = s->meter;
    x->set = set;
    x->out_fd = pipefd[0];
    x->pidfd = -1;
    rc = spawn(&pid, s, pipefd[1], x, err);
    close(pipefd[1]);
    if (rc == E_OK) {
        x->pid = pid;
        x->pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
        if (x->pidfd < 0) {
            kill(-pid, SIGKILL);
            waitpid(pid, NULL, 0);
            rc = err_set(err, E_FAIL, "pidfd_open: %s", strerror(errno));
        }
    }
    if (rc == E_OK) {
        write_record(x);
        x->state = SANDBOX_RUNNING;
        if (pthread_create(&x->thread, NULL, pump, x) != 0) {
            kill(-pid, SIGKILL);
            waitpid(pid, NULL, 0);
            unlink(x->record);
            rc = err_set(err, E_FAIL, "cannot start the sandbox's log thread");
        }
    }
    if (rc != E_OK) {
        sbx_free(x);
        return rc;
    }
    pthread_mutex_lock(&set->lock);
    x->next = set->head;
    set->head = x;
    pthread_mutex_unlock(&set->lock);
    return E_OK;
}

/* Hands X (running, lock held) to NS/NAME: its record file renamed, its name and log. */
static int claim_locked(struct sbx *x, const char *ns, const char *name, const char *log_path,
                        size_t log_cap, struct err *err)
{
    char *record = sbx_record_path(x->set, ns, name);

    if (rename(x->record, record) != 0) {
        int e = errno;
        free(record);
        return err_set(err, E_FAIL, "rename the sandbox's record: %s", strerror(e));
    }
    free(x->record);
    x->record = record;
    free(x->ns);
    free(x->name);
    x->ns = xstrdup(ns);
    x->name = xstrdup(name);
    pthread_mutex_lock(&x->log_lock);
    free(x->log_path);
    x->log_path = xstrdup(log_path);
    x->log_cap = log_cap;
    pthread_mutex_unlock(&x->log_lock);
    return E_OK;
}

int sbx_claim(struct sbx_set *set, const char *from_ns, const char *from_name, const char *ns,
              const char *name, const char *log_path, size_t log_cap,
              void (*seen)(const void *ext, void *arg), void *arg, struct err *err)
{
    struct sbx *x;
    int rc;

    kill_recorded(set, ns, name); /* what a previous server left under that name */
    pthread_mutex_lock(&set->lock);
    x = find(set, from_ns, from_name);
    if (x == NULL || x->state != SANDBOX_RUNNING || x->reaped || x->stopping) {
        rc = err_set(err, E_NOTFOUND, "the warm sandbox does not run any more");
    } else if (!sbx_tree_runs(x->pid, strrchr(SANDBOX_IN_RUNNER, '/') + 1)) {
        /* bubblewrap still sets it up: it reaches the bound folders by the names their
         * descriptors point at, which the claim is about to rename. */
        rc = err_set(err, E_AGAIN, "the warm sandbox is still starting");
    } else if (find(set, ns, name) != NULL) {
        rc = err_set(err, E_CONFLICT, "a sandbox already runs for this task");
    } else {
        /* Not reaped: the pump thread reads the name only after its reap, under this
         * lock, so it sees the new one. */
        rc = claim_locked(x, ns, name, log_path, log_cap, err);
        if (rc == E_OK && seen != NULL) {
            seen(x->ext, arg);
        }
    }
    pthread_mutex_unlock(&set->lock);
    return rc;
}

/* Sends SIG to X's process group and to every descendant of its leader. */
static void signal_group(struct sbx *x, int sig)
{
    kill(-x->pid, sig);
    sbx_signal_tree(x->pid, sig);
}

int sbx_suspend(struct sbx_set *set, const char *ns, const char *name, struct err *err)
{
    struct sbx *x;
    int rc = E_OK;

    pthread_mutex_lock(&set->lock);
    x = find(set, ns, name);
    if (x == NULL || x->state == SANDBOX_EXITED) {
        rc = err_set(err, E_NOTFOUND, "no sandbox runs for this task");
    } else if (x->state == SANDBOX_RUNNING) {
        if (set->hooks != NULL && set->hooks->freeze != NULL) {
            rc = set->hooks->freeze(x, set->ctx, err);
        } else {
            signal_group(x, SIGSTOP);
        }
        if (rc == E_OK) {
            x->state = SANDBOX_PAUSED;
        }
    }
    pthread_mutex_unlock(&set->lock);
    return rc;
}

int sbx_resume(struct sbx_set *set, const char *ns, const char *name, struct err *err)
{
    struct sbx *x;
    int rc = E_OK;

    pthread_mutex_lock(&set->lock);
    x = find(set, ns, name);
    if (x == NULL || x->state == SANDBOX_EXITED) {
        rc = err_set(err, E_NOTFOUND, "no sandbox is paused for this task");
    } else if (x->state == SANDBOX_PAUSED) {
        if (set->hooks != NULL && set->hooks->thaw != NULL) {
            rc = set->hooks->thaw(x, set->ctx, err);
        } else {
            signal_group(x, SIGCONT);
        }
        if (rc == E_OK) {
            x->state = SANDBOX_RUNNING;
        }
    }
    pthread_mutex_unlock(&set->lock);
    return rc;
}

void sbx_status(struct sandbox_status *out, struct sbx_set *set, const char *ns, const char *name)
{
    struct sbx *x;

    pthread_mutex_lock(&set->lock);
    x = find(set, ns, name);
    out->state = x != NULL ? x->state : SANDBOX_ABSENT;
    out->exit_code = x != NULL ? x->exit_code : 0;
    pthread_mutex_unlock(&set->lock);
}

void sbx_stop(struct sbx_set *set, const char *ns, const char *name)
{
    struct sbx *x;

    bool paused = false;

    pthread_mutex_lock(&set->lock);
    x = find(set, ns, name);
    if (x != NULL) {
        x->stopping = true;
        paused = x->state == SANDBOX_PAUSED;
        unlink_sbx(set, x);
    }
    pthread_mutex_unlock(&set->lock);
    if (x != NULL) {
        if (paused && set->hooks != NULL && set->hooks->thaw != NULL) {
            (void)set->hooks->thaw(x, set->ctx, NULL); /* frozen tasks die only when thawed */
        }
        finish(x);
        return;
    }
    kill_recorded(set, ns, name);
    if (set->hooks != NULL && set->hooks->kill_rest != NULL) {
        struct sbx tmp = {
            .ns = (char *)(uintptr_t)ns, .name = (char *)(uintptr_t)name, .pid = -1, .set = set};
        set->hooks->kill_rest(&tmp, set->ctx);
        if (set->hooks->forget != NULL) {
            set->hooks->forget(&tmp, set->ctx);
        }
    }
}

void sbx_set_cleanup(struct sbx_set *set)
{
    struct sbx *x;

    pthread_mutex_lock(&set->lock);
    for (x = set->head; x != NULL; x = x->next) {
        x->stopping = true;
        /* Frozen processes take SIGKILL only once thawed. */
        if (x->state == SANDBOX_PAUSED && set->hooks != NULL && set->hooks->thaw != NULL) {
            (void)set->hooks->thaw(x, set->ctx, NULL);
        }
    }
    x = set->head;
    set->head = NULL;
    pthread_mutex_unlock(&set->lock);
    while (x != NULL) {
        struct sbx *next = x->next;
        finish(x);
        x = next;
    }
    free(set->state_dir);
    pthread_mutex_destroy(&set->lock);
}
