/* SPDX-License-Identifier: Apache-2.0 */
/* The disk watchdog of the providers whose sandboxes write under the data dir (local,
 * process): the workspace, staging repository and state dir of a task share the data dir's
 * filesystem with the database, so one task must not fill it. A thread measures the files
 * of every running task each CONTROLLER_DISK_PERIOD_MS (st_blocks of the tree, never
 * following symlinks) and stops the sandbox of a task over --sandbox-disk, and while the
 * filesystem has less than the reserve free, the biggest running one. It marks the task
 * first, so the reconcile that follows fails it (DiskLimit) instead of restarting it. A
 * watchdog, not a quota: a task may go over by what it writes within one period (the free
 * space is looked at every CONTROLLER_DISK_FREE_MS). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "controller/controller_int.h"

#define MIB (1024 * 1024)

/* A task the watchdog stopped, until its reconcile failed it or it was deleted. */
struct disk_mark {
    char *ns, *name; /* owned */
    char *msg;       /* owned: why */
    struct disk_mark *next;
};

struct controller_disk {
    pthread_t thread;
    bool running;         /* the thread was started (and not joined yet) */
    pthread_mutex_t lock; /* guards stop and marks */
    pthread_cond_t cond;  /* CLOCK_MONOTONIC: wakes the thread to stop */
    bool stop;
    struct disk_mark *marks;
};

/* --- measuring -------------------------------------------------------------------- */

struct walk {
    int64_t bytes;    /* st_blocks * 512 of every entry seen */
    int64_t stop_at;  /* 0: never stop early */
    int64_t *entries; /* entries left before the walk gives up */
    dev_t dev;        /* the filesystem of the root: never left */
    bool skip_links;  /* the server's hard-linked files do not count (controller_disk_usage) */
    bool too_deep, too_many, failed;
    int error; /* errno of the failure */
};

static bool walk_done(const struct walk *w)
{
    return w->too_deep || w->too_many || w->failed || (w->stop_at > 0 && w->bytes > w->stop_at);
}

static void walk_dir(struct walk *w, int dfd, int depth);

/* Adds the entry NAME of the directory DFD (at DEPTH), and what is under it. */
static void walk_entry(struct walk *w, int dfd, const char *name, int depth)
{
    struct stat st;
    int fd;

    if (--*w->entries < 0) {
        w->too_many = true;
        return;
    }
    if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
        return; /* gone meanwhile */
    }
    if (!(w->skip_links && S_ISREG(st.st_mode) && st.st_nlink > 1 && st.st_uid == geteuid())) {
        w->bytes += (int64_t)st.st_blocks * 512;
    }
    if (!S_ISDIR(st.st_mode) || st.st_dev != w->dev || walk_done(w)) {
        return;
    }
    if (depth >= CONTROLLER_DISK_DEPTH_MAX) {
        w->too_deep = true;
        return;
    }
    fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) {
        walk_dir(w, fd, depth + 1);
    } else if (errno == EMFILE || errno == ENFILE || errno == ENOMEM) {
        w->failed = true;
        w->error = errno;
    } /* else replaced by something else meanwhile */
}

/* Adds the entries under the directory DFD (taken over) at DEPTH. Names are opened relative
 * to their directory, so no path grows with the depth of the tree. */
static void walk_dir(struct walk *w, int dfd, int depth)
{
    DIR *d = fdopendir(dfd);
    struct dirent *de;

    if (d == NULL) {
        close(dfd);
        return;
    }
    while (!walk_done(w) && (de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0) {
            walk_entry(w, dirfd(d), de->d_name, depth);
        }
    }
    closedir(d);
}

int controller_disk_usage(int64_t *bytes_out, const char *path, int64_t stop_at, int64_t *entries,
                          bool skip_links, struct err *err)
{
    struct walk w = {.stop_at = stop_at, .entries = entries, .skip_links = skip_links};
    struct stat st;
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

    *bytes_out = 0;
    if (fd < 0) {
        return errno == ENOENT ? E_OK : err_set(err, E_FAIL, "open %s: %s", path, strerror(errno));
    }
    if (fstat(fd, &st) != 0) {
        close(fd);
        return err_set(err, E_FAIL, "stat %s: %s", path, strerror(errno));
    }
    w.dev = st.st_dev;
    w.bytes = (int64_t)st.st_blocks * 512;
    walk_dir(&w, fd, 1);
    *bytes_out = w.bytes;
    if (w.failed) {
        return err_set(err, E_FAIL, "measure %s: %s", path, strerror(w.error));
    }
    if (w.too_deep) {
        return err_set(err, E_TOOBIG, "a directory tree deeper than %d levels",
                       CONTROLLER_DISK_DEPTH_MAX);
    }
    if (w.too_many) {
        return err_set(err, E_TOOBIG, "more than %d files and directories",
                       CONTROLLER_DISK_ENTRIES_MAX);
    }
    return E_OK;
}

int64_t controller_disk_free(const char *path)
{
    struct statvfs sv;

    if (statvfs(path, &sv) != 0) {
        return -1;
    }
    return (int64_t)sv.f_bavail * (int64_t)sv.f_frsize;
}

/* --- marks ------------------------------------------------------------------------ */

static struct disk_mark **mark_find(struct controller_disk *d, const char *ns, const char *name)
{
    struct disk_mark **pp;

    for (pp = &d->marks; *pp != NULL; pp = &(*pp)->next) {
        if (strcmp((*pp)->ns, ns) == 0 && strcmp((*pp)->name, name) == 0) {
            break;
        }
    }
    return pp;
}

/* Marks NS/NAME with MSG (taken over). */
static void mark_add(struct controller_disk *d, const char *ns, const char *name, char *msg)
{
    struct disk_mark *m;

    pthread_mutex_lock(&d->lock);
    m = *mark_find(d, ns, name);
    if (m == NULL) {
        m = xcalloc(1, sizeof(*m));
        m->ns = xstrdup(ns);
        m->name = xstrdup(name);
        m->next = d->marks;
        d->marks = m;
    }
    free(m->msg);
    m->msg = msg;
    pthread_mutex_unlock(&d->lock);
}

static void mark_free(struct disk_mark *m)
{
    free(m->ns);
    free(m->name);
    free(m->msg);
    free(m);
}

bool controller_disk_over(struct controller *c, const char *ns, const char *name, char **msg_out)
{
    struct disk_mark *m;
    bool over;

    if (c->disk == NULL) {
        return false; /* a controller made by hand (tests) */
    }
    pthread_mutex_lock(&c->disk->lock);
    m = *mark_find(c->disk, ns, name);
    over = m != NULL;
    if (over && msg_out != NULL) {
        free(*msg_out);
        *msg_out = xstrdup(m->msg);
    }
    pthread_mutex_unlock(&c->disk->lock);
    return over;
}

void controller_disk_clear(struct controller *c, const char *ns, const char *name)
{
    struct disk_mark **pp, *m;

    if (c->disk == NULL) {
        return;
    }
    pthread_mutex_lock(&c->disk->lock);
    pp = mark_find(c->disk, ns, name);
    m = *pp;
    if (m != NULL) {
        *pp = m->next;
        mark_free(m);
    }
    pthread_mutex_unlock(&c->disk->lock);
}

/* --- the watchdog ----------------------------------------------------------------- */

/* Whether C's sandboxes write their files under the data dir on this host. */
static bool local_files(const struct controller *c)
{
    return c->sandboxes != NULL &&
           (strcmp(c->provider, "local") == 0 || strcmp(c->provider, "process") == 0);
}

/* Marks NS/NAME with MSG (taken over), stops its sandbox and queues its reconcile. */
static void trip(struct controller *c, const char *ns, const char *name, char *msg)
{
    char *log = sandbox_log_path(c->data_dir, ns, name);

    sandbox_log_event(log, "[diverge] disk limit: %s; stopping every process", msg);
    log_kv(LOG_WARN, "disk_limit", "namespace", ns, "task", name, "reason", msg, NULL);
    mark_add(c->disk, ns, name, msg); /* first: a reconcile after the stop fails it */
    sandbox_stop(c->sandboxes, ns, name);
    controller_on_exit(ns, name, c);
    free(log);
}

/* The bytes of NS/NAME's files, measured up to past C's limit; E_TOOBIG (*why_out a new
 * string) when they are over it. */
static int measure(int64_t *bytes_out, struct controller *c, const char *ns, const char *name,
                   char **why_out)
{
    char *dirs[] = {
        xasprintf("%s/workspaces/%s/%s", c->data_dir, ns, name),
        xasprintf("%s/staging/%s/%s.git", c->data_dir, ns, name),
        xasprintf("%s/state/%s/%s", c->data_dir, ns, name),
    };
    int64_t entries = CONTROLLER_DISK_ENTRIES_MAX, total = 0, part;
    struct err err = {0};
    int rc = E_OK;

    for (size_t i = 0; i < ARRAY_LEN(dirs) && rc == E_OK; i++) {
        int64_t left = c->sandbox_disk > 0 ? c->sandbox_disk - total : 0;
        rc = controller_disk_usage(&part, dirs[i], c->sandbox_disk > 0 ? (left > 0 ? left : 1) : 0,
                                   &entries, c->chown_files, &err);
        total += part;
    }
    for (size_t i = 0; i < ARRAY_LEN(dirs); i++) {
        free(dirs[i]);
    }
    *bytes_out = total;
    if (rc == E_TOOBIG) {
        *why_out = xasprintf("the task's files hold %s (a limit of the disk watchdog)", err.msg);
    } else if (rc == E_OK && c->sandbox_disk > 0 && total > c->sandbox_disk) {
        *why_out = xasprintf("the task's files (workspace, staging repository, state) take more "
                             "than the limit of %lld MiB (--sandbox-disk)",
                             (long long)(c->sandbox_disk / MIB));
        rc = E_TOOBIG;
    } else if (rc != E_OK) {
        log_kv(LOG_WARN, "disk_measure_failed", "namespace", ns, "task", name, "error", err.msg,
               NULL);
    }
    return rc;
}

/* The running task with the most bytes, while the filesystem is short of space. */
struct biggest {
    char *ns, *name; /* owned, NULL: none */
    int64_t bytes;
};

/* What a pass does. */
struct pass {
    bool low;           /* the filesystem has less than the reserve free */
    bool requeue;       /* marked tasks get another reconcile (the periodic pass) */
    struct biggest big; /* while low */
};

/* One task of the pass: queues the reconcile of a marked one, measures a running one. */
static void check_task(struct controller *c, const char *ns, const char *name, struct pass *p)
{
    struct biggest *big = &p->big;
    struct sandbox_status st;
    char *why = NULL;
    int64_t bytes = 0;

    if (controller_disk_over(c, ns, name, NULL)) {
        if (p->requeue) {
            controller_on_exit(ns, name, c); /* until a reconcile could fail it */
        }
        return;
    }
    sandbox_status(&st, c->sandboxes, ns, name);
    if (st.state != SANDBOX_RUNNING) {
        return; /* frozen, exited or none: nothing writes */
    }
    if (measure(&bytes, c, ns, name, &why) == E_TOOBIG) {
        trip(c, ns, name, why);
    } else if (p->low && bytes >= big->bytes) {
        free(big->ns);
        free(big->name);
        big->ns = xstrdup(ns);
        big->name = xstrdup(name);
        big->bytes = bytes;
    }
}

/* Every task of namespace NS (a directory under <data-dir>/workspaces). */
static void check_namespace(struct controller *c, const char *root, const char *ns, struct pass *p)
{
    char *path = xasprintf("%s/%s", root, ns);
    DIR *d = opendir(path);
    struct dirent *de;

    free(path);
    if (d == NULL) {
        return;
    }
    while ((de = readdir(d)) != NULL) {
        if (task_name_valid(de->d_name)) {
            check_task(c, ns, de->d_name, p);
        }
    }
    closedir(d);
}

/* REQUEUE: the periodic pass (not one for a look that found the filesystem short). */
static void pass(struct controller *c, bool requeue)
{
    char *root = xasprintf("%s/workspaces", c->data_dir);
    int64_t avail = c->disk_reserve > 0 ? controller_disk_free(c->data_dir) : -1;
    struct pass p = {.low = avail >= 0 && avail < c->disk_reserve, .requeue = requeue};
    struct biggest big = {0};
    DIR *d = opendir(root);
    struct dirent *de;

    while (d != NULL && (de = readdir(d)) != NULL) {
        if (task_name_valid(de->d_name)) {
            check_namespace(c, root, de->d_name, &p);
        }
    }
    big = p.big;
    if (d != NULL) {
        closedir(d);
    }
    /* One task a pass: the next pass sees what stopping it changed. */
    if (big.ns != NULL) {
        trip(c, big.ns, big.name,
             xasprintf("the data dir's filesystem has %lld MiB free, less than its reserve of "
                       "%lld MiB (--data-dir-reserve), and this task's files were the biggest of "
                       "the running tasks (%lld MiB)",
                       (long long)(avail / MIB), (long long)(c->disk_reserve / MIB),
                       (long long)(big.bytes / MIB)));
    }
    free(big.ns);
    free(big.name);
    free(root);
}

static int64_t mono_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Whether the data dir's filesystem has less than the reserve free. */
static bool below_reserve(const struct controller *c)
{
    int64_t avail = c->disk_reserve > 0 ? controller_disk_free(c->data_dir) : -1;

    return avail >= 0 && avail < c->disk_reserve;
}

/* Milliseconds from now to NEXT (monotonic), at least 1. */
static int64_t ms_until(int64_t next)
{
    int64_t ms = next - mono_ms();

    return ms > 0 ? ms : 1;
}

/* Sleeps MS unless stopped; false once stopped. Called with D->lock held. */
static bool rest(struct controller_disk *d, int64_t ms)
{
    struct timespec until;

    clock_deadline_in(&until, CLOCK_MONOTONIC, ms);
    while (!d->stop && pthread_cond_timedwait(&d->cond, &d->lock, &until) == 0) {
    }
    return !d->stop;
}

/* A pass every CONTROLLER_DISK_PERIOD_MS (after a long one, as long a rest), and one as
 * soon as a look at the free space every CONTROLLER_DISK_FREE_MS finds it under the
 * reserve: a fast writer brings a disk down in less than a period. */
static void *watch(void *arg)
{
    struct controller *c = arg;
    struct controller_disk *d = c->disk;
    int64_t next = 0;

    pthread_mutex_lock(&d->lock);
    do {
        int64_t now = mono_ms();

        pthread_mutex_unlock(&d->lock);
        if (now >= next) {
            pass(c, true);
            int64_t took = mono_ms() - now;
            next =
                mono_ms() + (took > CONTROLLER_DISK_PERIOD_MS ? took : CONTROLLER_DISK_PERIOD_MS);
        } else if (below_reserve(c)) {
            pass(c, false);
        }
        pthread_mutex_lock(&d->lock);
    } while (rest(d, c->disk_reserve > 0 ? CONTROLLER_DISK_FREE_MS : ms_until(next)));
    pthread_mutex_unlock(&d->lock);
    return NULL;
}

void controller_disk_init(struct controller *c)
{
    struct controller_disk *d = xcalloc(1, sizeof(*d));
    pthread_condattr_t attr;

    pthread_mutex_init(&d->lock, NULL);
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&d->cond, &attr);
    pthread_condattr_destroy(&attr);
    c->disk = d;
}

int controller_disk_start(struct controller *c, struct err *err)
{
    struct controller_disk *d = c->disk;

    if (!local_files(c) || (c->sandbox_disk <= 0 && c->disk_reserve <= 0) || d->running) {
        return E_OK;
    }
    if (below_reserve(c)) {
        fprintf(stderr,
                "diverge: serve: the data dir's filesystem has %lld MiB free, less than "
                "--data-dir-reserve (%lld MiB): no sandbox starts and /readyz answers 503 until "
                "space is freed\n",
                (long long)(controller_disk_free(c->data_dir) / MIB),
                (long long)(c->disk_reserve / MIB));
    }
    d->stop = false;
    if (pthread_create(&d->thread, NULL, watch, c) != 0) {
        return err_set(err, E_FAIL, "cannot start the disk watchdog thread");
    }
    d->running = true;
    return E_OK;
}

void controller_disk_stop(struct controller *c)
{
    struct controller_disk *d = c->disk;

    if (d == NULL || !d->running) {
        return;
    }
    pthread_mutex_lock(&d->lock);
    d->stop = true;
    pthread_cond_broadcast(&d->cond);
    pthread_mutex_unlock(&d->lock);
    pthread_join(d->thread, NULL);
    d->running = false;
}

void controller_disk_cleanup(struct controller *c)
{
    struct controller_disk *d = c->disk;

    if (d == NULL) {
        return;
    }
    controller_disk_stop(c);
    while (d->marks != NULL) {
        struct disk_mark *m = d->marks;
        d->marks = m->next;
        mark_free(m);
    }
    pthread_cond_destroy(&d->cond);
    pthread_mutex_destroy(&d->lock);
    free(d);
    c->disk = NULL;
}

bool controller_disk_refuse_start(struct controller *c, struct reconcile *r)
{
    int64_t avail;

    if (c->disk_reserve <= 0 || !local_files(c) ||
        (r->action != CONTROLLER_PROVISION && r->action != CONTROLLER_RESTART &&
         r->action != CONTROLLER_RESUME_START)) {
        return false;
    }
    avail = controller_disk_free(c->data_dir);
    if (avail < 0 || avail >= c->disk_reserve) {
        return false;
    }
    r->action = CONTROLLER_DISK_LIMIT;
    free(r->fail_msg);
    r->fail_msg = xasprintf("the data dir's filesystem has %lld MiB free, less than its reserve "
                            "of %lld MiB (--data-dir-reserve): no sandbox starts",
                            (long long)(avail / MIB), (long long)(c->disk_reserve / MIB));
    return true;
}
