/* SPDX-License-Identifier: Apache-2.0 */
/* The queue of tasks waiting for a sandbox slot (SPEC §14, --max-running-tasks). Every
 * sandbox that exists (running or frozen) holds a slot, and so does a task that is being
 * provisioned or runs (Provisioning, Active, Pausing). A task that needs a new sandbox
 * (Pending, or Paused and resumed after its runner exited) waits until a slot is free:
 * it keeps its phase, with reason Queued and status.queuePosition (1 = next). The order
 * is first come first served with round robin across namespaces (controller_queue_order).
 * One pass (controller_queue_pass) looks at every task, admits the first waiting ones
 * into the free slots (their reconcile then starts them: controller_observed.slot) and
 * writes the positions of the others. It runs after every change the controller applies
 * and after runner exits; in cluster mode only the leader runs the controller, so one
 * limit holds for every replica. */
#include <stdlib.h>
#include <string.h>

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

void controller_queue_order(struct controller_queue_item *items, size_t n)
{
    if (n == 0) {
        return; /* ITEMS may be NULL: qsort must not see it */
    }
    qsort(items, n, sizeof(*items), by_arrival);
    /* A new task's round (kept while it waits, so that no task ever passes another that
     * was ahead of it): the slots its namespace holds plus the tasks of its namespace that
     * wait already. Round 0 holds the oldest task of each namespace with nothing running,
     * round 1 the next ones, ...: one namespace's many tasks never starve another's one.
     * Within a round, by arrival. */
    for (size_t i = 0; i < n; i++) {
        int64_t before = 0;
        if (items[i].round >= 0) {
            continue;
        }
        for (size_t j = 0; j < n; j++) {
            bool ahead = j < i || items[j].round >= 0;
            if (j != i && ahead && strcmp(items[j].ns, items[i].ns) == 0) {
                before++;
            }
        }
        items[i].round = items[i].running + before;
    }
    qsort(items, n, sizeof(*items), by_round);
}

void controller_queue_admit(struct controller_queue_item *items, size_t n, bool limited,
                            int64_t free_slots)
{
    int64_t waiting = 0;

    for (size_t i = 0; i < n; i++) {
        struct controller_queue_item *it = &items[i];
        int64_t used = it->running;
        for (size_t j = 0; j < i; j++) {
            used += items[j].position == 0 && strcmp(items[j].ns, it->ns) == 0 ? 1 : 0;
        }
        it->ns_full = it->ns_cap >= 0 && used >= it->ns_cap;
        if (!it->ns_full && (!limited || free_slots > 0)) {
            it->position = 0;
            free_slots--;
        } else {
            it->position = ++waiting;
        }
    }
}

/* --- the controller's queue state ------------------------------------------------------ */

/* What one pass found: the waiting tasks, and the slots in use. */
struct pass {
    struct controller *c;
    struct controller_queue_item *items; /* waiting, not admitted yet */
    size_t n, cap;
    int64_t held;   /* slots in use (admitted tasks included) */
    int64_t now_ms; /* arrival of tasks seen waiting for the first time */
    char **clear;   /* "ns\0name" of tasks whose queue status must go (owned) */
    size_t n_clear;
    char **keys;          /* "ns\0name" of items[i], copied (owned) */
    const char **held_ns; /* the namespace of each slot in use (borrowed) */
    size_t n_held_ns;
    json_t *quotas; /* every SpendQuota (owned), for the namespaces' maxRunningTasks */
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

/* Whether a task with view V (status STATUS) waits for a slot, holds one, or neither. */
enum slot_use { SLOT_NONE, SLOT_HELD, SLOT_WAITING };

static enum slot_use slot_use_of(struct controller *c, const struct task_view *v)
{
    struct sandbox_status st;

    switch (v->phase) {
    case TASK_PROVISIONING:
    case TASK_ACTIVE:
    case TASK_PAUSING:
        return SLOT_HELD;
    case TASK_PENDING:
        return v->suspended ? SLOT_NONE : SLOT_WAITING;
    case TASK_PAUSED:
        sandbox_status(&st, c->sandboxes, v->ns, v->name);
        if (st.state == SANDBOX_RUNNING || st.state == SANDBOX_PAUSED) {
            return SLOT_HELD; /* frozen, or a meter-paused runner on its way out */
        }
        return v->suspended ? SLOT_NONE : SLOT_WAITING;
    case TASK_COMPLETED:
    case TASK_FAILED:
    case TASK_PHASE_COUNT:
        break;
    }
    return SLOT_NONE;
}

/* The arrival of a task first seen waiting: a new task's creation time (a restarted server
 * keeps their order), else now (a rerun or a resume joins at the end). */
static int64_t first_arrival(const struct pass *p, const json_t *doc, const struct task_view *v)
{
    const char *created =
        json_string_value(json_object_get(json_object_get(doc, "metadata"), "creationTimestamp"));
    int64_t ms;

    if (v->phase == TASK_PENDING && v->status_run <= 1 && created != NULL &&
        clock_parse_rfc3339(&ms, created) == E_OK && ms <= p->now_ms) {
        return ms;
    }
    return p->now_ms;
}

static void note_waiting(struct pass *p, const json_t *doc, const struct task_view *v)
{
    struct controller *c = p->c;
    struct controller_queued *q = controller_queued_find(c, v->ns, v->name);

    if (q == NULL) {
        q = xcalloc(1, sizeof(*q));
        q->ns = xstrdup(v->ns);
        q->name = xstrdup(v->name);
        q->arrival = first_arrival(p, doc, v);
        q->round = -1;
        q->next = c->queued;
        c->queued = q;
    }
    q->seen = true;
    if (q->admitted) {
        note_held(p, q->ns); /* its reconcile is about to start it */
        return;
    }
    if (p->n == p->cap) {
        p->cap = p->cap != 0 ? p->cap * 2 : 16;
        p->items = xrealloc(p->items, p->cap * sizeof(*p->items));
    }
    p->items[p->n++] = (struct controller_queue_item){
        .ns = q->ns,
        .name = q->name,
        .arrival = q->arrival,
        .round = q->round,
        .position = 0,
        .url = json_string_value(
            json_object_get(json_object_get(json_object_get(doc, "spec"), "repository"), "url"))};
}

static char *key_of(const char *ns, const char *name)
{
    size_t nl = strlen(ns), ml = strlen(name);
    char *key = xmalloc(nl + ml + 2);

    memcpy(key, ns, nl + 1);
    memcpy(key + nl + 1, name, ml + 1);
    return key;
}

static void note_task(struct pass *p, const json_t *doc)
{
    struct task_view v;
    const char *reason;

    task_view_of(&v, doc);
    if (v.ns == NULL || v.name == NULL) {
        return;
    }
    switch (slot_use_of(p->c, &v)) {
    case SLOT_HELD:
        note_held(p, v.ns);
        break;
    case SLOT_WAITING:
        note_waiting(p, doc, &v);
        return;
    case SLOT_NONE:
        break;
    }
    reason = json_string_value(json_object_get(json_object_get(doc, "status"), "reason"));
    if (v.queue_position > 0 || (reason != NULL && strcmp(reason, TASK_REASON_QUEUED) == 0)) {
        p->clear = xrealloc(p->clear, (p->n_clear + 1) * sizeof(*p->clear));
        p->clear[p->n_clear++] = key_of(v.ns, v.name);
    }
}

/* Forgets the tasks that no longer wait (started, paused, finished, deleted). */
static void prune(struct controller *c)
{
    struct controller_queued **pp = &c->queued;

    while (*pp != NULL) {
        struct controller_queued *q = *pp;
        if (!q->seen) {
            *pp = q->next;
            free(q->ns);
            free(q->name);
            free(q);
        } else {
            q->seen = false;
            pp = &q->next;
        }
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
    for (size_t i = 0; i < p->n; i++) {
        struct controller_queue_item *it = &p->items[i];
        struct controller_queued *q = controller_queued_find(c, it->ns, it->name);
        q->round = it->round; /* admitted only once the slots fit (admit) */
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

/* After the queue lock: the statuses, then the reconciles that start the admitted. */
static void write_positions(struct pass *p)
{
    struct controller *c = p->c;
    size_t i;

    for (i = 0; i < p->n_clear; i++) {
        write_position(c, p->clear[i], p->clear[i] + strlen(p->clear[i]) + 1, 0, -1);
    }
    for (i = 0; i < p->n; i++) {
        write_position(c, p->keys[i], p->keys[i] + strlen(p->keys[i]) + 1, p->items[i].position,
                       p->items[i].ns_full ? p->items[i].ns_cap : -1);
    }
    for (i = 0; i < p->n; i++) {
        struct err err = {0};
        const char *ns = p->keys[i], *name = p->keys[i] + strlen(p->keys[i]) + 1;
        if (p->items[i].position != 0) {
            controller_mirror_unwanted(c, ns, name); /* it waits: its start fetches anew */
        } else if (controller_reconcile(c, ns, name, &err) != E_OK && err.code != E_NOTFOUND) {
            log_kv(LOG_WARN, "reconcile_error", "namespace", ns, "task", name, "error", err.msg,
                   NULL);
        }
    }
}

void controller_queue_pass(struct controller *c)
{
    struct pass p = {.c = c, .now_ms = clock_now_ms(clock_system())};
    json_t *items = NULL, *item;
    size_t i;
    int64_t rv = 0;
    struct err err = {0};

    if (c->sandboxes == NULL || atomic_load(&c->stopping)) {
        return;
    }
    /* One pass at a time; the store is never called with queue_lock held (a reconcile
     * takes queue_lock inside its store transaction). */
    pthread_mutex_lock(&c->pass_lock);
    if (task_store_quota_list(&p.quotas, c->store, NULL, &err) != E_OK) {
        p.quotas = json_array(); /* logged; the server-wide limit still holds */
        log_kv(LOG_WARN, "queue_quota_list_failed", "error", err.msg, NULL);
    }
    atomic_store(&c->ns_caps, any_cap(p.quotas));
    if ((c->max_running <= 0 && !atomic_load(&c->ns_caps)) ||
        task_store_list(&items, &rv, c->store, NULL, &err) != E_OK) {
        pthread_mutex_unlock(&c->pass_lock);
        if (items == NULL && (c->max_running > 0 || atomic_load(&c->ns_caps))) {
            log_kv(LOG_WARN, "queue_list_failed", "error", err.msg, NULL);
        }
        json_decref(p.quotas);
        return;
    }
    pthread_mutex_lock(&c->queue_lock);
    json_array_foreach(items, i, item)
    {
        note_task(&p, item);
    }
    prune(c);
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
    pthread_mutex_unlock(&c->pass_lock);
    for (i = 0; i < p.n_clear; i++) {
        free(p.clear[i]);
    }
    for (i = 0; i < p.n; i++) {
        free(p.keys[i]);
    }
    free(p.keys);
    free(p.held_ns);
    free(p.clear);
    free(p.items);
    json_decref(p.quotas);
    json_decref(items);
}
