/* SPDX-License-Identifier: Apache-2.0 */
/* Warm slots (local provider, --sandbox-warm-slots): a sandbox started ahead for a
 * repository a task recently started on, exactly as a task's sandbox is, but bound to
 * directories of its own under <data-dir>/slots/<id> and to that repository's mirror (a
 * bind cannot change later, and the mirror is per repository). Its runner loads libcurl
 * and waits at its start gate knowing no task. The next fresh start of a task of that
 * repository claims it in place of the prelaunch's spawn (launch.c), once its runner runs
 * (until then bubblewrap resolves the bound folders by name, and a rename under it fails
 * the sandbox; a start that comes earlier starts its own and leaves the slot): the
 * provider makes the sandbox the task's (name, record, log; its cgroups keep their name
 * and carry the same limits), the slot's directories are renamed onto the task's paths
 * (the binds follow the inodes), and the task's environment goes through the gate before
 * the usual "c" and "g" (runner_gate_env: no file holds it). A slot serves one task and
 * is never given back; a slot whose mirror was replaced is stopped, not claimed. At most
 * one per repository and warm_slots in all; made by the tick thread after the exits it
 * was woken for (under the lock, as a start is: a start that comes meanwhile waits the few
 * ms), only for a repository whose mirror exists and that a task started on within
 * CONTROLLER_SLOT_IDLE_MS, and stopped once that long passed without one, at the
 * server's stop, and (as any sandbox) by the next server after a crash. Under
 * --max-running-tasks a slot holds a place as every sandbox does (SPEC §14): one is made
 * only in a place no task holds or was admitted to, and the queue's pass stops those an
 * admitted task needs before that task starts (controller_slots_fit). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "controller/controller_int.h"

struct controller_slot {
    char *id;     /* the sandbox is CONTROLLER_SLOT_NS/<id> until claimed */
    char *mirror; /* the repository's mirror: the slot's key */
    unsigned long long mirror_ino, mirror_dev;
    char *dir, *log; /* <data-dir>/slots/<id> and <id>.log */
    char *meter_env; /* its meter socket's variable, or NULL */
    int gate;        /* the write end of its runner's start gate */
    int64_t made_ms; /* epoch ms */
    bool claimed;    /* its sandbox is a task's now */
    struct controller_slot *next;
};

struct controller_slot_want {
    char *mirror;
    int64_t last_ms; /* the last fresh start of a task of it */
    struct controller_slot_want *next;
};

/* The directories of a slot, in the order of struct controller_paths' task paths. */
static const char *const g_subdirs[] = {"workspace", "state", "token", "staging.git"};

static char *slots_dir(const struct controller *c)
{
    return xasprintf("%s/slots", c->data_dir);
}

void controller_slots_init(struct controller *c, int64_t max)
{
    char *dir = slots_dir(c);

    /* What a previous server left: its sandboxes died with it (or were swept). */
    controller_remove_tree(dir);
    free(dir);
    c->slot_max = c->sandboxes != NULL && strcmp(c->provider, "local") == 0 ? max : 0;
    c->slot_room = c->max_running > 0 ? c->max_running : -1; /* no task holds one yet */
}

/* Stops S's sandbox unless a task took it, removes its files and frees it. */
static void slot_free(struct controller *c, struct controller_slot *s)
{
    if (s->gate >= 0) {
        close(s->gate); /* an unclaimed runner reads the end and exits */
    }
    if (!s->claimed && c->sandboxes != NULL) {
        sandbox_stop(c->sandboxes, CONTROLLER_SLOT_NS, s->id);
    }
    controller_remove_tree(s->dir);
    (void)unlink(s->log);
    free(s->id);
    free(s->mirror);
    free(s->dir);
    free(s->log);
    free(s->meter_env);
    free(s);
}

void controller_slot_want(struct controller *c, const char *url)
{
    char *mirror;
    struct controller_slot_want **pp, *w;
    size_t n = 0;

    if (c->slot_max <= 0 || url == NULL) {
        return;
    }
    mirror = controller_mirror_path(c->data_dir, url);
    for (pp = &c->slot_wants; *pp != NULL && strcmp((*pp)->mirror, mirror) != 0;) {
        pp = &(*pp)->next;
    }
    w = *pp;
    if (w != NULL) {
        *pp = w->next; /* to the front again */
        free(mirror);
    } else {
        w = xcalloc(1, sizeof(*w));
        w->mirror = mirror;
    }
    w->last_ms = clock_now_ms(clock_system());
    c->slot_busy_ms = w->last_ms;
    w->next = c->slot_wants;
    c->slot_wants = w;
    /* At most slot_max repositories are remembered: the oldest goes. */
    for (pp = &c->slot_wants; *pp != NULL; n++) {
        if (n < (size_t)c->slot_max) {
            pp = &(*pp)->next;
            continue;
        }
        w = *pp;
        *pp = w->next;
        free(w->mirror);
        free(w);
    }
}

/* The identity of the directory PATH (false when it is not one). */
static bool dir_id(const char *path, unsigned long long *ino, unsigned long long *dev)
{
    struct stat sb;

    if (lstat(path, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        return false;
    }
    *ino = (unsigned long long)sb.st_ino;
    *dev = (unsigned long long)sb.st_dev;
    return true;
}

/* The slot's directories made and given to the sandbox user. */
static int slot_dirs(struct controller *c, struct controller_slot *s, char **paths, struct err *err)
{
    int rc = E_OK;

    for (size_t i = 0; i < ARRAY_LEN(g_subdirs); i++) {
        paths[i] = xasprintf("%s/%s", s->dir, g_subdirs[i]);
    }
    for (size_t i = 0; i < 3 && rc == E_OK; i++) {
        if (sandbox_mkdirs(paths[i], true) != 0) {
            rc = err_set(err, E_FAIL, "create %s: %s", paths[i], strerror(errno));
        }
    }
    if (rc == E_OK) {
        rc = controller_staging(paths[3], s->log, err);
    }
    for (size_t i = 0; i < ARRAY_LEN(g_subdirs) && rc == E_OK; i++) {
        rc = controller_give(c, paths[i], err);
    }
    return rc;
}

/* Starts S's sandbox on its directories PATHS, gated, knowing no task. */
static int slot_spawn(struct controller *c, struct controller_slot *s, char **paths,
                      struct err *err)
{
    struct sandbox_spec spec = {0};
    struct sandbox_meter *m = NULL;
    char *env[4] = {NULL}, *own[5] = {NULL}, *shared = NULL;
    size_t n = 0;
    int gate[2], rc = controller_meter_open(&m, c, s->log, env, &n, err);

    if (rc != E_OK || pipe2(gate, O_CLOEXEC) != 0) {
        rc = rc != E_OK ? rc : err_set(err, E_FAIL, "start gate: %s", strerror(errno));
        sandbox_meter_free(m);
        free(env[0]);
        return rc;
    }
    s->meter_env = n > 0 ? env[0] : NULL;
    if (c->meter_socket != NULL && c->meter_sockets.open == NULL) {
        shared = xstrdup(c->meter_socket);
        *strrchr(shared, '/') = '\0';
    }
    own[0] = controller_env_path(c);
    own[1] = xstrdup("HOME=" SANDBOX_IN_STATE);
    own[2] = xstrdup("LANG=C.UTF-8");
    own[3] = xasprintf("DIVERGE_START_GATE_FD=%d", gate[0]);
    own[4] = xstrdup("DIVERGE_START_GATE_ENV=1");
    spec = (struct sandbox_spec){.ns = CONTROLLER_SLOT_NS,
                                 .name = s->id,
                                 .runner_path = c->runner_path,
                                 .workspace = paths[0],
                                 .usage_dir = paths[1],
                                 .token_dir = paths[2],
                                 .staging = paths[3],
                                 .mirror = s->mirror,
                                 .sock_dir = m != NULL ? m->dir : shared,
                                 .log_path = s->log,
                                 .log_cap = c->log_cap,
                                 .meter = m,
                                 .gate_fd = gate[0]};
    for (size_t i = 0; i < ARRAY_LEN(own); i++) {
        spec.env[i] = own[i];
    }
    rc = sandbox_start(c->sandboxes, &spec, err); /* takes the meter socket over */
    close(gate[0]);
    s->gate = gate[1];
    for (size_t i = 0; i < ARRAY_LEN(own); i++) {
        free(own[i]);
    }
    free(shared);
    return rc;
}

/* A new slot for the repository whose mirror is MIRROR, or NULL (logged). */
static struct controller_slot *slot_make(struct controller *c, const char *mirror, uint64_t seq)
{
    struct controller_slot *s = xcalloc(1, sizeof(*s));
    char *paths[ARRAY_LEN(g_subdirs)] = {NULL};
    struct err err = {0};
    char *top = slots_dir(c);
    int rc = E_OK;

    s->id = xasprintf("s%llu", (unsigned long long)seq);
    s->mirror = xstrdup(mirror);
    s->dir = xasprintf("%s/%s", top, s->id);
    s->log = xasprintf("%s/%s.log", top, s->id);
    s->gate = -1;
    s->made_ms = clock_now_ms(clock_system());
    free(top);
    if (!dir_id(mirror, &s->mirror_ino, &s->mirror_dev)) {
        rc = err_set(&err, E_NOTFOUND, "no mirror");
    }
    if (rc == E_OK) {
        rc = slot_dirs(c, s, paths, &err);
    }
    if (rc == E_OK) {
        rc = slot_spawn(c, s, paths, &err);
    }
    for (size_t i = 0; i < ARRAY_LEN(paths); i++) {
        free(paths[i]);
    }
    if (rc != E_OK) {
        log_kv(LOG_INFO, "warm_slot_not_made", "mirror", mirror, "error", err.msg, NULL);
        slot_free(c, s);
        return NULL;
    }
    return s;
}

static size_t slot_count(const struct controller *c)
{
    size_t n = 0;

    for (const struct controller_slot *s = c->slots; s != NULL; s = s->next) {
        n++;
    }
    return n;
}

static struct controller_slot **slot_find(struct controller *c, const char *mirror)
{
    struct controller_slot **pp = &c->slots;

    while (*pp != NULL && strcmp((*pp)->mirror, mirror) != 0) {
        pp = &(*pp)->next;
    }
    return pp;
}

static const struct controller_slot_want *want_of(const struct controller *c, const char *mirror)
{
    for (const struct controller_slot_want *w = c->slot_wants; w != NULL; w = w->next) {
        if (strcmp(w->mirror, mirror) == 0) {
            return w;
        }
    }
    return NULL;
}

/* (C->lock held) Moves the slots no start wanted for CONTROLLER_SLOT_IDLE_MS to *GONE. */
static void slots_expire(struct controller *c, int64_t now, struct controller_slot **gone)
{
    struct controller_slot **pp = &c->slots;

    while (*pp != NULL) {
        const struct controller_slot_want *w = want_of(c, (*pp)->mirror);
        if (w == NULL || now - w->last_ms >= CONTROLLER_SLOT_IDLE_MS) {
            struct controller_slot *s = *pp;
            *pp = s->next;
            s->next = *gone;
            *gone = s;
        } else {
            pp = &(*pp)->next;
        }
    }
}

/* (C->lock held) A repository's mirror that wants a slot and may have one (new string), or
 * NULL. */
static char *slots_wanted(struct controller *c, int64_t now)
{
    struct stat sb;

    /* Never beside a start: not while one is under way (its sandbox gated), nor right
     * after one (its runner checks out and starts the agent). The tick comes again. */
    if (slot_count(c) >= (size_t)c->slot_max || c->prelaunches != NULL ||
        (c->slot_room >= 0 && (int64_t)slot_count(c) >= c->slot_room) ||
        now - c->slot_busy_ms < CONTROLLER_SLOT_QUIET_MS) {
        return NULL;
    }
    for (const struct controller_slot_want *w = c->slot_wants; w != NULL; w = w->next) {
        if (now - w->last_ms < CONTROLLER_SLOT_IDLE_MS && *slot_find(c, w->mirror) == NULL &&
            stat(w->mirror, &sb) == 0 && S_ISDIR(sb.st_mode)) {
            return xstrdup(w->mirror);
        }
    }
    return NULL;
}

/* Whether MIRROR is one of MIRRORS[N]. */
static bool mirror_in(const char *mirror, char *const *mirrors, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (strcmp(mirror, mirrors[i]) == 0) {
            return true;
        }
    }
    return false;
}

void controller_slots_fit(struct controller *c, int64_t room, const char *const *urls, size_t n)
{
    struct controller_slot **pp, *gone = NULL, *s;
    char **mirrors;
    int64_t others = 0;

    if (c->slot_max <= 0 || c->max_running <= 0) {
        return;
    }
    mirrors = xcalloc(n + 1, sizeof(*mirrors));
    for (size_t i = 0; i < n; i++) {
        mirrors[i] = controller_mirror_path(c->data_dir, urls[i]);
    }
    pthread_mutex_lock(&c->lock);
    c->slot_room = room > 0 ? room : 0;
    /* The list is newest first: past the first slot_room slots no admitted task takes,
     * the older ones go. */
    for (pp = &c->slots; *pp != NULL;) {
        s = *pp;
        if (mirror_in(s->mirror, mirrors, n) || ++others <= c->slot_room) {
            pp = &s->next;
            continue;
        }
        *pp = s->next;
        s->next = gone;
        gone = s;
    }
    pthread_mutex_unlock(&c->lock);
    for (size_t i = 0; i < n; i++) {
        free(mirrors[i]);
    }
    free(mirrors);
    while (gone != NULL) {
        s = gone;
        gone = s->next;
        log_kv(LOG_INFO, "warm_slot_stopped", "mirror", s->mirror, "reason",
               "a task needs its place under --max-running-tasks", NULL);
        slot_free(c, s);
    }
}

void controller_slots_tick(struct controller *c, int64_t now)
{
    struct controller_slot *gone = NULL, *s = NULL;
    char *mirror = NULL;

    if (c->slot_max <= 0) {
        return;
    }
    pthread_mutex_lock(&c->lock);
    slots_expire(c, now, &gone);
    pthread_mutex_unlock(&c->lock);
    while (gone != NULL) { /* stopped before another is made: the bound holds throughout */
        s = gone;
        gone = s->next;
        slot_free(c, s);
    }
    /* Under the lock, as a start (the sandbox user's files, the meter socket). */
    pthread_mutex_lock(&c->lock);
    mirror = atomic_load(&c->stopping) ? NULL : slots_wanted(c, now);
    s = mirror != NULL ? slot_make(c, mirror, ++c->slot_seq) : NULL;
    if (s != NULL) {
        s->next = c->slots;
        c->slots = s;
    }
    pthread_mutex_unlock(&c->lock);
    free(mirror);
}

void controller_slots_drop_all(struct controller *c)
{
    while (c->slots != NULL) {
        struct controller_slot *s = c->slots;
        c->slots = s->next;
        slot_free(c, s);
    }
    while (c->slot_wants != NULL) {
        struct controller_slot_want *w = c->slot_wants;
        c->slot_wants = w->next;
        free(w->mirror);
        free(w);
    }
}

/* Renames each of S's directories onto the task's path in P (absent, or an empty
 * directory that the rename replaces). */
static int move_dirs(const struct controller_slot *s, const struct controller_paths *p,
                     struct err *err)
{
    const char *to[] = {p->workspace, p->state, p->token_dir, p->staging};

    for (size_t i = 0; i < ARRAY_LEN(to); i++) {
        char *from = xasprintf("%s/%s", s->dir, g_subdirs[i]);
        int ok = sandbox_mkdirs(to[i], false) == 0 && rename(from, to[i]) == 0;
        int e = errno;

        free(from);
        if (!ok) {
            return err_set(err, E_FAIL, "move the warm slot's %s onto %s: %s", g_subdirs[i], to[i],
                           strerror(e));
        }
    }
    return E_OK;
}

/* Writes the whole BUF[0..len) into the gate FD, waiting at most 2 s for room. */
static int gate_write(int fd, const char *buf, size_t len, struct err *err)
{
    int flags = fcntl(fd, F_GETFL);
    size_t done = 0;

    (void)fcntl(fd, F_SETFL, flags | O_NONBLOCK);
    while (done < len) {
        struct pollfd pfd = {.fd = fd, .events = POLLOUT};
        ssize_t n = write(fd, buf + done, len - done);
        if (n > 0) {
            done += (size_t)n;
        } else if (n < 0 && errno == EAGAIN && poll(&pfd, 1, 2000) == 1) {
            continue;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else {
            break;
        }
    }
    (void)fcntl(fd, F_SETFL, flags);
    return done == len ? E_OK : err_set(err, E_FAIL, "the warm sandbox's runner is gone");
}

/* The task's environment ENV[0..n) through the gate: "e", the length, NUL-ended entries. */
static int send_env(int fd, char *const *env, size_t n, struct err *err)
{
    size_t len = 0;
    char *msg;
    int rc;

    for (size_t i = 0; i < n; i++) {
        len += strlen(env[i]) + 1;
    }
    if (len == 0 || len > CONTROLLER_SLOT_ENV_MAX) {
        return err_set(err, E_TOOBIG, "the task's environment does not fit the gate");
    }
    msg = xmalloc(len + 5);
    msg[0] = 'e';
    msg[1] = (char)(len >> 24);
    msg[2] = (char)(len >> 16);
    msg[3] = (char)(len >> 8);
    msg[4] = (char)len;
    len = 5;
    for (size_t i = 0; i < n; i++) {
        size_t k = strlen(env[i]) + 1;
        memcpy(msg + len, env[i], k);
        len += k;
    }
    rc = gate_write(fd, msg, len, err);
    free(msg);
    return rc;
}

/* S given to R: its sandbox (E_AGAIN, nothing changed, while bubblewrap still sets it
 * up: it reaches the folders by name until then), its directories, then R's environment
 * L->env (its start's, with the network and meter variables a slot's start has). */
static int claim(struct controller *c, struct controller_slot *s, struct controller_launch *l,
                 const struct reconcile *r, struct err *err)
{
    int rc = sandbox_claim(c->sandboxes, CONTROLLER_SLOT_NS, s->id, r->ns, r->name, l->p.log,
                           c->log_cap, err);

    if (rc != E_OK) {
        return rc;
    }
    s->claimed = true;
    rc = move_dirs(s, &l->p, err);
    if (rc != E_OK) {
        sandbox_stop(c->sandboxes, r->ns, r->name);
        return rc;
    }
    l->n = l->n_base = controller_build_env(l->env, c, r, &l->p, l->iteration);
    l->env[l->n++] = xstrdup("DIVERGE_SANDBOX_NETWORK=none");
    if (s->meter_env != NULL) {
        l->env[l->n++] = xstrdup(s->meter_env);
    }
    l->env[l->n] = NULL;
    rc = send_env(s->gate, l->env, l->n, err);
    if (rc != E_OK) {
        sandbox_stop(c->sandboxes, r->ns, r->name);
    }
    return rc;
}

bool controller_slot_claim(struct controller *c, struct controller_launch *l,
                           const struct reconcile *r)
{
    struct controller_slot **pp, *s;
    unsigned long long ino = 0, dev = 0;
    struct err err = {0};
    int64_t age;
    int rc;

    if (c->slot_max <= 0 || l->p.mirror == NULL || !controller_egress_none(c, r)) {
        return false; /* a task with the egress proxy starts its own sandbox */
    }
    pp = slot_find(c, l->p.mirror);
    s = *pp;
    if (s == NULL) {
        return false;
    }
    *pp = s->next; /* used once, whatever happens next */
    if (!dir_id(l->p.mirror, &ino, &dev) || ino != s->mirror_ino || dev != s->mirror_dev) {
        slot_free(c, s); /* the mirror was cloned again: the slot binds the old one */
        return false;
    }
    rc = claim(c, s, l, r, &err);
    if (rc == E_AGAIN) {
        s->next = *pp; /* kept for the next start; this one starts its own */
        *pp = s;
        log_kv(LOG_DEBUG, "warm_slot_not_ready", "namespace", r->ns, "task", r->name, NULL);
        return false;
    }
    if (rc != E_OK) {
        log_kv(LOG_INFO, "warm_slot_not_claimed", "namespace", r->ns, "task", r->name, "error",
               err.msg, NULL);
        for (size_t i = 0; i < l->n; i++) {
            free(l->env[i]);
        }
        l->n = l->n_base = 0;
        slot_free(c, s);
        return false;
    }
    l->gate = s->gate;
    s->gate = -1;
    c->slot_busy_ms = clock_now_ms(clock_system());
    age = c->slot_busy_ms - s->made_ms;
    sandbox_log_event(l->p.log,
                      "[diverge] sandbox %s: taken from the warm slot of this repository "
                      "(started %lld ms before); its runner waits until the workspace is made",
                      r->mirror_done ? "started ahead of the workspace"
                                     : "started while the mirror is fetched",
                      (long long)age);
    slot_free(c, s);
    return true;
}
