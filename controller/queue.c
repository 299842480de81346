/* SPDX-License-Identifier: Apache-2.0 */
/* The queue of tasks waiting for a sandbox slot (SPEC §14, --max-running-tasks). Every
 * sandbox that exists (running or frozen) holds a slot, and so does a task that is being
 * provisioned or runs (Provisioning, Active, Pausing). A task that needs a new sandbox
 * (Pending, or Paused and resumed after its runner exited) waits until a slot is free:
 * it keeps its phase, with reason Queued and status.queuePosition (1 = next). The order
 * is first come first served with round robin across namespaces (controller_queue_order).
 * One pass (controller_queue_pass) looks at every task not finished (a server keeps the
 * finished ones; the store selects the others by an index), admits the first waiting ones
 * into the free slots (their reconcile then starts them: controller_observed.slot) and
 * writes the positions of the others that are due, many to a transaction. Every step is
 * O(n log n) or better in the tasks not finished: thousands may wait. Every change the
 * controller applies and every runner exit asks for one; the tick thread runs it, one pass
 * for all that asked meanwhile, spaced by its own cost (run.c); a new task when nothing
 * waits gets its pass at once. In cluster mode only the leader runs the controller, so
 * one limit holds for every replica. */
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "common/jsonscan.h"
#include "common/log.h"
#include "controller/controller_int.h"
#include "store/quota.h"

/* --- the pure ordering ---------------------------------------------------------------- */

static int by_arrival(const void *pa, const void *pb)
{
    const struct controller_queue_item *a = pa, *b = pb;
    int c;

    if (a->arrival != b->arrival) {
        return a->arrival < b->arrival ? -1 : 1;
    }
    c = strcmp(a->ns, b->ns);
    return c != 0 ? c : strcmp(a->name, b->name);
}

static int by_round(const void *pa, const void *pb)
{
    const struct controller_queue_item *a = pa, *b = pb;

    if (a->round != b->round) {
        return a->round < b->round ? -1 : 1;
    }
    return by_arrival(pa, pb);
}

/* An item's namespace and place, sorted by namespace to number the namespaces. */
struct ns_at {
    const char *ns;
    size_t i;
};

static int by_ns(const void *pa, const void *pb)
{
    return strcmp(((const struct ns_at *)pa)->ns, ((const struct ns_at *)pb)->ns);
}

/* The namespaces of ITEMS numbered: IDS[i] is the number of items[i].ns, equal names
 * equal numbers, 0 .. (the return value) - 1. O(n log n): thousands may wait. */
static size_t ns_ids(size_t *ids, const struct controller_queue_item *items, size_t n)
{
    struct ns_at *at = xcalloc(n + 1, sizeof(*at));
    size_t k = 0;

    for (size_t i = 0; i < n; i++) {
        at[i] = (struct ns_at){.ns = items[i].ns, .i = i};
    }
    if (n > 0) {
        qsort(at, n, sizeof(*at), by_ns);
    }
    for (size_t i = 0; i < n; i++) {
        k += i > 0 && strcmp(at[i].ns, at[i - 1].ns) != 0 ? 1 : 0;
        ids[at[i].i] = k;
    }
    free(at);
    return n > 0 ? k + 1 : 0;
}

void controller_queue_order(struct controller_queue_item *items, size_t n)
{
    size_t *ids, k;
    int64_t *fixed, *fixed_seen, *seen;

    if (n == 0) {
        return; /* ITEMS may be NULL: qsort must not see it */
    }
    qsort(items, n, sizeof(*items), by_arrival);
    /* A new task's round (kept while it waits, so that no task ever passes another that
     * was ahead of it): the slots its namespace holds plus the tasks of its namespace that
     * wait already (those before it, and those after it that have their round). Round 0
     * holds the oldest task of each namespace with nothing running, round 1 the next ones,
     * ...: one namespace's many tasks never starve another's one. Within a round, by
     * arrival. Counted per namespace in one sweep. */
    ids = xcalloc(n, sizeof(*ids));
    k = ns_ids(ids, items, n);
    fixed = xcalloc(k, sizeof(*fixed));
    fixed_seen = xcalloc(k, sizeof(*fixed_seen));
    seen = xcalloc(k, sizeof(*seen));
    for (size_t i = 0; i < n; i++) {
        fixed[ids[i]] += items[i].round >= 0 ? 1 : 0;
    }
    for (size_t i = 0; i < n; i++) {
        size_t id = ids[i];
        if (items[i].round >= 0) {
            fixed_seen[id]++;
        } else {
            items[i].round = items[i].running + seen[id] + (fixed[id] - fixed_seen[id]);
        }
        seen[id]++;
    }
    free(seen);
    free(fixed_seen);
    free(fixed);
    free(ids);
    qsort(items, n, sizeof(*items), by_round);
}

void controller_queue_admit(struct controller_queue_item *items, size_t n, bool limited,
                            int64_t free_slots)
{
    int64_t waiting = 0, *admitted;
    size_t *ids = xcalloc(n + 1, sizeof(*ids)), k = ns_ids(ids, items, n);

    admitted = xcalloc(k + 1, sizeof(*admitted)); /* per namespace, so far */
    for (size_t i = 0; i < n; i++) {
        struct controller_queue_item *it = &items[i];
        int64_t used = it->running + admitted[ids[i]];
        it->ns_full = it->ns_cap >= 0 && used >= it->ns_cap;
        if (!it->ns_full && (!limited || free_slots > 0)) {
            it->position = 0;
            free_slots--;
            admitted[ids[i]]++;
        } else {
            it->position = ++waiting;
        }
    }
    free(admitted);
    free(ids);
}

/* --- the controller's queue state ------------------------------------------------------ */

/* What the pass reads of one task: a few fields picked from its stored text, without a
 * parse into a tree (thousands of tasks may wait, and every change asks for a pass). */
struct seen_task {
    const char *ns, *name, *created, *reason, *url; /* in the pass's arena; NULL when absent */
    size_t at[5];          /* where they are in the arena + 1 while the list grows it, 0: absent */
    enum task_phase phase; /* Pending when absent or unknown */
    bool suspended;
    int64_t status_run;     /* 1 when unset */
    int64_t queue_position; /* 0 when unset */
};

/* What one pass found: the waiting tasks, and the slots in use. */
struct pass {
    struct controller *c;
    struct seen_task *seen; /* every task listed (owned) */
    size_t n_seen, cap_seen;
    struct buf arena; /* the strings of seen, NUL-terminated: one allocation, not five a task */
    struct controller_queue_item *items; /* waiting, not admitted yet */
    size_t n, cap;
    int64_t held;   /* slots in use (admitted tasks included) */
    int64_t now_ms; /* arrival of tasks seen waiting for the first time */
    char **clear;   /* "ns\0name" of tasks whose queue status must go (owned) */
    size_t n_clear;
    char **keys;          /* "ns\0name" of items[i], copied (owned) */
    int64_t *shown;       /* the queue status items[i]'s listed object showed (owned) */
    const char **held_ns; /* the namespace of each slot in use (borrowed from seen) */
    size_t n_held_ns;
    json_t *quotas;    /* every SpendQuota (owned), for the namespaces' maxRunningTasks */
    int64_t starts_ns; /* spent in the reconciles that start the admitted tasks */
};

/* The slots namespace NS may hold: the least maxRunningTasks of its SpendQuotas (SPEC
 * §15), -1 when none sets one. */
static int64_t ns_cap_of(const json_t *quotas, const char *ns)
{
    int64_t cap = -1;
    const json_t *q;
    size_t i;

    json_array_foreach(quotas, i, q)
    {
        struct quota_view v;
        quota_view_of(&v, q);
        if (v.has_running && v.ns != NULL && strcmp(v.ns, ns) == 0 &&
            (cap < 0 || v.max_running < cap)) {
            cap = v.max_running;
        }
    }
    return cap;
}

/* Whether some SpendQuota caps its namespace's running tasks. */
static bool any_cap(const json_t *quotas)
{
    const json_t *q;
    size_t i;

    json_array_foreach(quotas, i, q)
    {
        struct quota_view v;
        quota_view_of(&v, q);
        if (v.has_running) {
            return true;
        }
    }
    return false;
}

static void note_held(struct pass *p, const char *ns)
{
    p->held++;
    p->held_ns = xrealloc(p->held_ns, (p->n_held_ns + 1) * sizeof(*p->held_ns));
    p->held_ns[p->n_held_ns++] = ns;
}

/* The fields of struct seen_task, picked by jsonscan_extract. */
enum {
    SEEN_NS,
    SEEN_NAME,
    SEEN_CREATED,
    SEEN_SUSPENDED,
    SEEN_URL,
    SEEN_PHASE,
    SEEN_REASON,
    SEEN_RUN,
    SEEN_QPOS,
    SEEN_COUNT
};

static const struct jsonscan_path g_seen_paths[SEEN_COUNT] = {
    [SEEN_NS] = {"metadata.namespace"},
    [SEEN_NAME] = {"metadata.name"},
    [SEEN_CREATED] = {"metadata.creationTimestamp"},
    [SEEN_SUSPENDED] = {"spec.suspended"},
    [SEEN_URL] = {"spec.repository.url"},
    [SEEN_PHASE] = {"status.phase"},
    [SEEN_REASON] = {"status.reason"},
    [SEEN_RUN] = {"status.run"},
    [SEEN_QPOS] = {"status.queuePosition"},
};

/* Copies the string V (unescaped) into ARENA: where it is + 1, 0 when V is no string. */
static size_t arena_put(struct buf *arena, const struct jsonscan_value *v)
{
    char *s = jsonscan_string(v);
    size_t at = arena->len;

    if (s == NULL) {
        return 0;
    }
    (void)buf_append(arena, s, strlen(s) + 1);
    free(s);
    return at + 1;
}

/* The strings of the tasks seen, once the arena no longer moves. */
static void seen_resolve(struct pass *p)
{
    for (size_t i = 0; i < p->n_seen; i++) {
        struct seen_task *t = &p->seen[i];
        const char **out[] = {&t->ns, &t->name, &t->created, &t->reason, &t->url};
        for (size_t k = 0; k < ARRAY_LEN(out); k++) {
            *out[k] = t->at[k] != 0 ? p->arena.data + t->at[k] - 1 : NULL;
        }
    }
}

/* Reads one listed task (its stored JSON text) into the pass's list; read as task_view_of
 * reads the parsed object. A text that is not JSON, or without a name, is skipped (as a
 * corrupt row always was). */
static int see_task(const char *json, size_t len, void *userdata)
{
    struct pass *p = userdata;
    static const int strings[] = {SEEN_NS, SEEN_NAME, SEEN_CREATED, SEEN_REASON, SEEN_URL};
    struct jsonscan_value v[SEEN_COUNT];
    struct seen_task t = {.phase = TASK_PENDING, .status_run = 1};
    size_t mark = p->arena.len;
    char *phase;
    int64_t n;

    if (jsonscan_extract(v, json, len, g_seen_paths, SEEN_COUNT, NULL) != E_OK) {
        return E_OK;
    }
    for (size_t k = 0; k < ARRAY_LEN(strings); k++) {
        t.at[k] = arena_put(&p->arena, &v[strings[k]]);
    }
    if (t.at[0] == 0 || t.at[1] == 0) { /* no namespace or name */
        p->arena.len = mark;
        if (p->arena.data != NULL) {
            p->arena.data[mark] = '\0';
        }
        return E_OK;
    }
    phase = jsonscan_string(&v[SEEN_PHASE]);
    if (phase != NULL) {
        (void)task_phase_parse(&t.phase, phase);
        free(phase);
    }
    t.suspended = v[SEEN_SUSPENDED].present && v[SEEN_SUSPENDED].len == 4 &&
                  memcmp(v[SEEN_SUSPENDED].start, "true", 4) == 0;
    if (jsonscan_int(&n, &v[SEEN_RUN]) == E_OK && n > 0) {
        t.status_run = n;
    }
    if (jsonscan_int(&n, &v[SEEN_QPOS]) == E_OK) {
        t.queue_position = n;
    }
    if (p->n_seen == p->cap_seen) {
        p->cap_seen = p->cap_seen != 0 ? p->cap_seen * 2 : 64;
        p->seen = xrealloc(p->seen, p->cap_seen * sizeof(*p->seen));
    }
    p->seen[p->n_seen++] = t;
    return E_OK;
}

/* Whether task T waits for a slot, holds one, or neither. */
enum slot_use { SLOT_NONE, SLOT_HELD, SLOT_WAITING };

static enum slot_use slot_use_of(struct controller *c, const struct seen_task *t)
{
    struct sandbox_status st;

    switch (t->phase) {
    case TASK_PROVISIONING:
    case TASK_ACTIVE:
    case TASK_PAUSING:
        return SLOT_HELD;
    case TASK_PENDING:
        return t->suspended ? SLOT_NONE : SLOT_WAITING;
    case TASK_PAUSED:
        sandbox_status(&st, c->sandboxes, t->ns, t->name);
        if (st.state == SANDBOX_RUNNING || st.state == SANDBOX_PAUSED) {
            return SLOT_HELD; /* frozen, or a meter-paused runner on its way out */
        }
        return t->suspended ? SLOT_NONE : SLOT_WAITING;
    case TASK_COMPLETED:
    case TASK_FAILED:
    case TASK_PHASE_COUNT:
        break;
    }
    return SLOT_NONE;
}

/* The arrival of a task first seen waiting: a new task's creation time (a restarted server
 * keeps their order), else now (a rerun or a resume joins at the end). */
static int64_t first_arrival(const struct pass *p, const struct seen_task *t)
{
    int64_t ms;

    if (t->phase == TASK_PENDING && t->status_run <= 1 && t->created != NULL &&
        clock_parse_rfc3339(&ms, t->created) == E_OK && ms <= p->now_ms) {
        return ms;
    }
    return p->now_ms;
}

static bool shows_queued(const struct seen_task *t)
{
    return t->reason != NULL && strcmp(t->reason, TASK_REASON_QUEUED) == 0;
}

/* The queue status T shows, as write_queue_status() compares it: its queuePosition when
 * its reason is Queued, 0 when it shows none, -1 for anything else (a reason Queued
 * without a position, or a position without the reason). */
static int64_t shown_position(const struct seen_task *t)
{
    if (shows_queued(t)) {
        return t->queue_position > 0 ? t->queue_position : -1;
    }
    return t->queue_position == 0 ? 0 : -1;
}

static void note_waiting(struct pass *p, const struct seen_task *t)
{
    struct controller *c = p->c;
    struct controller_queued *q = controller_queued_find(c, t->ns, t->name);

    if (q == NULL) {
        q = controller_queued_add(c, t->ns, t->name);
        q->arrival = first_arrival(p, t);
    }
    q->seen = true;
    q->shown = shown_position(t);
    if (q->admitted) {
        note_held(p, q->ns); /* its reconcile is about to start it */
        return;
    }
    if (p->n == p->cap) {
        p->cap = p->cap != 0 ? p->cap * 2 : 16;
        p->items = xrealloc(p->items, p->cap * sizeof(*p->items));
    }
    p->items[p->n++] = (struct controller_queue_item){.ns = q->ns,
                                                      .name = q->name,
                                                      .arrival = q->arrival,
                                                      .round = q->round,
                                                      .position = 0,
                                                      .url = t->url};
}

static char *key_of(const char *ns, const char *name)
{
    size_t nl = strlen(ns), ml = strlen(name);
    char *key = xmalloc(nl + ml + 2);

    memcpy(key, ns, nl + 1);
    memcpy(key + nl + 1, name, ml + 1);
    return key;
}

static void note_task(struct pass *p, const struct seen_task *t)
{
    switch (slot_use_of(p->c, t)) {
    case SLOT_HELD:
        note_held(p, t->ns);
        break;
    case SLOT_WAITING:
        note_waiting(p, t);
        return;
    case SLOT_NONE:
        break;
    }
    if (t->queue_position > 0 || shows_queued(t)) {
        p->clear = xrealloc(p->clear, (p->n_clear + 1) * sizeof(*p->clear));
        p->clear[p->n_clear++] = key_of(t->ns, t->name);
    }
}

/* The queue status written to a waiting task (and cleared from one that no longer waits). */
struct queue_write {
    int64_t position; /* 0: clear */
    int64_t limit;    /* --max-running-tasks */
    int64_t ns_cap;   /* the namespace's cap when it is what the task waits for, else -1 */
};

static int write_queue_status(json_t *doc, struct err *err, void *userdata)
{
    const struct queue_write *w = userdata;
    json_t *status = json_object_get(doc, "status");
    struct task_view v;
    const char *reason = json_string_value(json_object_get(status, "reason"));
    bool queued = reason != NULL && strcmp(reason, TASK_REASON_QUEUED) == 0;
    char msg[160];

    (void)err;
    task_view_of(&v, doc);
    if (w->position == 0) {
        if (!queued && v.queue_position == 0) {
            return TASK_MUTATE_UNCHANGED;
        }
        json_object_del(status, "queuePosition");
        if (queued) {
            json_object_set_new(status, "reason", json_string(""));
            json_object_set_new(status, "message", json_string(""));
        }
        return E_OK;
    }
    if ((v.phase != TASK_PENDING && v.phase != TASK_PAUSED) || v.suspended ||
        (queued && v.queue_position == w->position)) {
        return TASK_MUTATE_UNCHANGED; /* moved on meanwhile, or already says so */
    }
    if (w->ns_cap >= 0) {
        snprintf(msg, sizeof(msg),
                 "waiting for a sandbox slot: this project may run %lld at once (SpendQuota "
                 "maxRunningTasks)",
                 (long long)w->ns_cap);
    } else {
        snprintf(msg, sizeof(msg),
                 "waiting for a sandbox slot: all %lld are in use (--max-running-tasks)",
                 (long long)w->limit);
    }
    json_object_set_new(status, "reason", json_string(TASK_REASON_QUEUED));
    json_object_set_new(status, "message", json_string(msg));
    json_object_set_new(status, "queuePosition", json_integer(w->position));
    return E_OK;
}

static void write_position(struct controller *c, const char *ns, const char *name, int64_t pos,
                           int64_t ns_cap)
{
    struct queue_write w = {.position = pos, .limit = c->max_running, .ns_cap = ns_cap};
    struct err err = {0};
    int rc = task_store_mutate(NULL, c->store, ns, name, write_queue_status, &w, &err);

    if (rc != E_OK && rc != TASK_MUTATE_UNCHANGED && rc != E_NOTFOUND) {
        log_kv(LOG_WARN, "queue_status_failed", "namespace", ns, "name", name, "error", err.msg,
               NULL);
    }
}

/* Admits the first waiting tasks into the free slots (position 0) and numbers the others,
 * with the queue lock held: the store is written afterwards (write_positions). */
static void place(struct pass *p)
{
    struct controller *c = p->c;

    for (size_t i = 0; i < p->n; i++) {
        for (size_t j = 0; j < p->n_held_ns; j++) {
            p->items[i].running += strcmp(p->held_ns[j], p->items[i].ns) == 0 ? 1 : 0;
        }
        p->items[i].ns_cap = ns_cap_of(p->quotas, p->items[i].ns);
    }
    controller_queue_order(p->items, p->n);
    controller_queue_admit(p->items, p->n, c->max_running > 0, c->max_running - p->held);
    p->shown = xcalloc(p->n + 1, sizeof(*p->shown));
    for (size_t i = 0; i < p->n; i++) {
        struct controller_queue_item *it = &p->items[i];
        struct controller_queued *q = controller_queued_find(c, it->ns, it->name);
        q->round = it->round; /* admitted only once the slots fit (admit) */
        p->shown[i] = q->shown;
    }
}

/* After the queue lock, before the admitted start: the warm slots are fitted into what
 * --max-running-tasks leaves (SPEC §14: every sandbox holds a slot), those the admitted
 * tasks will take kept. */
static void fit_slots(struct pass *p)
{
    const char **urls = xcalloc(p->n + 1, sizeof(*urls));
    int64_t held = p->held;
    size_t n = 0;

    for (size_t i = 0; i < p->n; i++) {
        if (p->items[i].position == 0) {
            held++;
            urls[n] = p->items[i].url;
            n += urls[n] != NULL ? 1 : 0;
        }
    }
    controller_slots_fit(p->c, p->c->max_running - held, urls, n);
    free(urls);
}

/* After fit_slots: the tasks placed first are admitted. Not before, or a reconcile of one
 * that runs meanwhile (its own change woke it) could start its sandbox beside a warm slot
 * that fit_slots has not stopped yet: one sandbox more than --max-running-tasks. */
static void admit(struct pass *p)
{
    struct controller *c = p->c;

    pthread_mutex_lock(&c->queue_lock);
    for (size_t i = 0; i < p->n; i++) {
        if (p->items[i].position == 0) {
            const char *ns = p->keys[i], *name = p->keys[i] + strlen(p->keys[i]) + 1;
            struct controller_queued *q = controller_queued_find(c, ns, name);
            if (q != NULL) {
                q->admitted = true;
            }
        }
    }
    pthread_mutex_unlock(&c->queue_lock);
}

/* One queue status to write: to the task KEY ("ns\0name", borrowed). */
struct status_write {
    const char *key;
    struct queue_write w;
};

/* Queue statuses written per transaction: one commit for many (a slot that comes free
 * moves every waiting task up one), few enough that no other writer waits long. */
#define QUEUE_WRITES_PER_TXN 128

struct status_chunk {
    const struct status_write *w;
    size_t n;
};

static int write_chunk(struct task_txn *tx, void *userdata)
{
    const struct status_chunk *ch = userdata;

    for (size_t i = 0; i < ch->n; i++) {
        const char *ns = ch->w[i].key, *name = ns + strlen(ns) + 1;
        struct err err = {0};
        json_t *doc = NULL;
        int rc = task_txn_get(&doc, tx, ns, name, &err);

        if (rc == E_OK) {
            rc = write_queue_status(doc, &err, (void *)(uintptr_t)&ch->w[i].w);
            if (rc == E_OK) {
                rc = task_txn_put(tx, doc, &err);
            }
        }
        json_decref(doc);
        if (rc != E_OK && rc != TASK_MUTATE_UNCHANGED && rc != E_NOTFOUND) {
            return rc;
        }
    }
    return E_OK;
}

/* Writes the N statuses W, QUEUE_WRITES_PER_TXN to a transaction; a transaction that
 * fails (a conflict in cluster mode, say) is done again one task at a time. */
static void write_statuses(struct controller *c, const struct status_write *w, size_t n)
{
    for (size_t at = 0; at < n; at += QUEUE_WRITES_PER_TXN) {
        struct status_chunk ch = {
            .w = w + at, .n = n - at < QUEUE_WRITES_PER_TXN ? n - at : QUEUE_WRITES_PER_TXN};
        struct err err = {0};

        if (task_store_txn(c->store, write_chunk, &ch, &err) == E_OK) {
            continue;
        }
        for (size_t i = 0; i < ch.n; i++) {
            const char *ns = ch.w[i].key;
            write_position(c, ns, ns + strlen(ns) + 1, ch.w[i].w.position, ch.w[i].w.ns_cap);
        }
    }
}

/* As controller_int.h says: exact among the first ten, else once moved by a tenth. */
#define QUEUE_EXACT_POSITIONS 10 /* the places always written exactly */

bool controller_queue_position_due(int64_t shown, int64_t position)
{
    int64_t moved = shown > position ? shown - position : position - shown;

    if (shown <= 0 || position <= 0 || position <= QUEUE_EXACT_POSITIONS ||
        shown <= QUEUE_EXACT_POSITIONS) {
        return shown != position;
    }
    return moved * 10 >= shown;
}

/* After the queue lock: the statuses that are due (a task's listed object
 * that shows its place already is not written again, and every task event asks for a pass),
 * then the reconciles that start the admitted. */
static void write_positions(struct pass *p)
{
    struct controller *c = p->c;
    struct status_write *w = xcalloc(p->n_clear + p->n + 1, sizeof(*w));
    size_t i, n = 0;

    for (i = 0; i < p->n_clear; i++) {
        w[n++] = (struct status_write){.key = p->clear[i],
                                       .w = {.position = 0, .limit = c->max_running, .ns_cap = -1}};
    }
    for (i = 0; i < p->n; i++) {
        if (!controller_queue_position_due(p->shown[i], p->items[i].position)) {
            continue;
        }
        w[n++] =
            (struct status_write){.key = p->keys[i],
                                  .w = {.position = p->items[i].position,
                                        .limit = c->max_running,
                                        .ns_cap = p->items[i].ns_full ? p->items[i].ns_cap : -1}};
    }
    write_statuses(c, w, n);
    free(w);
    for (i = 0; i < p->n; i++) {
        struct err err = {0};
        const char *ns = p->keys[i], *name = p->keys[i] + strlen(p->keys[i]) + 1;
        if (p->items[i].position != 0) {
            controller_mirror_unwanted(c, ns, name); /* it waits: its start fetches anew */
        } else {
            int64_t t0 = clock_mono_ns();
            if (controller_reconcile(c, ns, name, &err) != E_OK && err.code != E_NOTFOUND) {
                log_kv(LOG_WARN, "reconcile_error", "namespace", ns, "task", name, "error", err.msg,
                       NULL);
            }
            p->starts_ns += clock_mono_ns() - t0;
        }
    }
}

/* Frees what pass P holds. */
static void pass_cleanup(struct pass *p)
{
    size_t i;

    for (i = 0; i < p->n_clear; i++) {
        free(p->clear[i]);
    }
    for (i = 0; p->keys != NULL && i < p->n; i++) {
        free(p->keys[i]);
    }
    free(p->seen);
    buf_cleanup(&p->arena);
    free(p->keys);
    free(p->shown);
    free(p->held_ns);
    free(p->clear);
    free(p->items);
    json_decref(p->quotas);
}

int64_t controller_queue_pass(struct controller *c)
{
    struct pass p = {.c = c, .now_ms = clock_now_ms(clock_system())};
    int64_t began = clock_mono_ns();
    size_t i;
    struct err err = {0};

    buf_init(&p.arena, 0);
    if (c->sandboxes == NULL || atomic_load(&c->stopping)) {
        return 0;
    }
    /* One pass at a time; the store is never called with queue_lock held (a reconcile
     * takes queue_lock inside its store transaction). */
    pthread_mutex_lock(&c->pass_lock);
    if (task_store_quota_list(&p.quotas, c->store, NULL, &err) != E_OK) {
        p.quotas = json_array(); /* logged; the server-wide limit still holds */
        log_kv(LOG_WARN, "queue_quota_list_failed", "error", err.msg, NULL);
    }
    atomic_store(&c->ns_caps, any_cap(p.quotas));
    if (c->max_running <= 0 && !atomic_load(&c->ns_caps)) {
        pthread_mutex_unlock(&c->pass_lock);
        pass_cleanup(&p);
        return clock_mono_ns() - began;
    }
    /* Sized as the last pass's: no array moved again and again while the list grows. */
    p.cap_seen = c->queue_hint_seen + c->queue_hint_seen / 4 + 64;
    p.seen = xcalloc(p.cap_seen, sizeof(*p.seen));
    buf_reserve(&p.arena, c->queue_hint_bytes + c->queue_hint_bytes / 4 + 4096);
    if (task_store_list_live(c->store, see_task, &p, &err) != E_OK) {
        pthread_mutex_unlock(&c->pass_lock);
        log_kv(LOG_WARN, "queue_list_failed", "error", err.msg, NULL);
        pass_cleanup(&p);
        return clock_mono_ns() - began;
    }
    seen_resolve(&p);
    pthread_mutex_lock(&c->queue_lock);
    for (i = 0; i < p.n_seen; i++) {
        note_task(&p, &p.seen[i]);
    }
    controller_queued_prune(c);
    place(&p);
    /* Copies of the names: the records may go once the lock is released. */
    p.keys = xcalloc(p.n + 1, sizeof(char *));
    for (i = 0; i < p.n; i++) {
        p.keys[i] = key_of(p.items[i].ns, p.items[i].name);
    }
    pthread_mutex_unlock(&c->queue_lock);
    fit_slots(&p);
    admit(&p);
    write_positions(&p);
    c->queue_hint_seen = p.n_seen;
    c->queue_hint_bytes = p.arena.len;
    pthread_mutex_unlock(&c->pass_lock);
    pass_cleanup(&p);
    return clock_mono_ns() - began - p.starts_ns;
}
