/* SPDX-License-Identifier: Apache-2.0 */
/* The time a task counts toward sandbox.timeoutSeconds (SPEC §4: paused time not
 * counted): only the time a sandbox of it ran under this server. The record lives in
 * <data-dir>/run/<ns>.<task>.active as "used since seen run": the milliseconds of closed
 * intervals, the start of the open one (0: none), when the server last saw it running
 * (a checkpoint every CONTROLLER_CHECKPOINT_MS from the tick thread) and which server run
 * opened it. A server killed with a sandbox running leaves an open interval of an older
 * run: it ends at its last checkpoint, so the time the server was down never counts. */
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "controller/controller_int.h"

/* --- the record: pure -------------------------------------------------------------- */

/* Where the open interval of A ends for server run RUN at NOW: now while that run still
 * holds it, else its last checkpoint. */
static int64_t open_end(const struct controller_active *a, uint64_t run, int64_t now_ms)
{
    return a->run == run ? now_ms : a->seen_ms;
}

static int64_t span(int64_t from, int64_t to)
{
    return to > from ? to - from : 0; /* a clock stepped back counts nothing */
}

int64_t controller_active_total(const struct controller_active *a, uint64_t run, int64_t now_ms)
{
    int64_t used = a->used_ms;

    if (a->since_ms > 0) {
        used += span(a->since_ms, open_end(a, run, now_ms));
    }
    return used;
}

void controller_active_end(struct controller_active *a, uint64_t run, int64_t now_ms)
{
    a->used_ms = controller_active_total(a, run, now_ms);
    a->since_ms = 0;
    a->seen_ms = 0;
    a->run = 0;
}

void controller_active_begin(struct controller_active *a, uint64_t run, int64_t now_ms)
{
    if (a->since_ms > 0 && a->run == run) {
        return; /* already counting in this run */
    }
    controller_active_end(a, run, now_ms);
    a->since_ms = now_ms;
    a->seen_ms = now_ms;
    a->run = run;
}

void controller_active_seen(struct controller_active *a, uint64_t run, int64_t now_ms)
{
    if (a->since_ms > 0 && a->run == run && now_ms > a->seen_ms) {
        a->seen_ms = now_ms;
    }
}

bool controller_active_parse(struct controller_active *a, const char *text)
{
    long long used = 0, since = 0, seen = 0;
    unsigned long long run = 0;

    memset(a, 0, sizeof(*a));
    if (sscanf(text, "%lld %lld %lld %llx", &used, &since, &seen, &run) != 4 || used < 0 ||
        since < 0 || seen < 0 || (since > 0 && seen < since)) {
        return false;
    }
    a->used_ms = used;
    a->since_ms = since;
    a->seen_ms = seen;
    a->run = run;
    return true;
}

int controller_active_format(char *buf, size_t cap, const struct controller_active *a)
{
    return snprintf(buf, cap, "%lld %lld %lld %llx\n", (long long)a->used_ms,
                    (long long)a->since_ms, (long long)a->seen_ms, (unsigned long long)a->run);
}

/* --- the file ---------------------------------------------------------------------- */

enum active_op { ACTIVE_READ, ACTIVE_BEGIN, ACTIVE_END, ACTIVE_SEEN };

static char *active_path(struct controller *c, const char *ns, const char *name)
{
    return xasprintf("%s/run/%s.%s.active", c->data_dir, ns, name);
}

static void active_read(struct controller_active *a, const char *path)
{
    char buf[128] = {0};
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);

    memset(a, 0, sizeof(*a));
    if (fd >= 0) {
        if (read(fd, buf, sizeof(buf) - 1) > 0) {
            (void)controller_active_parse(a, buf);
        }
        close(fd);
    }
}

/* Written to a temporary file and renamed: a crash never leaves half a record. */
static void active_write(const struct controller_active *a, const char *path)
{
    char buf[128], *tmp = xasprintf("%s.tmp", path);
    int n = controller_active_format(buf, sizeof(buf), a);
    int fd;

    (void)sandbox_mkdirs(path, false);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd >= 0) {
        bool ok = n > 0 && write(fd, buf, (size_t)n) == (ssize_t)n;
        close(fd);
        if (!ok || rename(tmp, path) != 0) {
            (void)unlink(tmp);
        }
    }
    free(tmp);
}

/* Applies OP at NOW_MS to the task's record (one at a time: the tick thread checkpoints
 * while reconciles begin and end intervals); returns the counted ms after it. */
static int64_t active_apply(struct controller *c, const char *ns, const char *name,
                            enum active_op op, int64_t now_ms)
{
    struct controller_active a, before;
    char *path = active_path(c, ns, name);
    int64_t used;

    pthread_mutex_lock(&c->active_lock);
    active_read(&a, path);
    before = a;
    if (op == ACTIVE_BEGIN) {
        controller_active_begin(&a, c->run_id, now_ms);
    } else if (op == ACTIVE_END) {
        controller_active_end(&a, c->run_id, now_ms);
    } else if (op == ACTIVE_SEEN) {
        controller_active_seen(&a, c->run_id, now_ms);
    }
    if (memcmp(&a, &before, sizeof(a)) != 0) {
        active_write(&a, path);
    }
    used = controller_active_total(&a, c->run_id, now_ms);
    pthread_mutex_unlock(&c->active_lock);
    free(path);
    return used;
}

int64_t controller_active_ms(struct controller *c, const char *ns, const char *name, int64_t now_ms)
{
    return active_apply(c, ns, name, ACTIVE_READ, now_ms);
}

void controller_note_running(struct controller *c, const char *ns, const char *name, bool running,
                             int64_t now_ms)
{
    (void)active_apply(c, ns, name, running ? ACTIVE_BEGIN : ACTIVE_END, now_ms);
}

void controller_note_seen(struct controller *c, const char *ns, const char *name, int64_t now_ms)
{
    (void)active_apply(c, ns, name, ACTIVE_SEEN, now_ms);
}
