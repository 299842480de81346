/* SPDX-License-Identifier: Apache-2.0 */
/* The queue's record of waiting tasks (under queue_lock): written by the queue's pass
 * (queue.c), read by a task's reconcile (may it take a slot now?). Apart from the pass so
 * that the pass, which reconciles the tasks it admits, sits above reconcile and nothing
 * below calls back up into it. */
#include <stdlib.h>
#include <string.h>

#include "common/hash.h"
#include "controller/controller_int.h"

#define QUEUED_BUCKETS_MIN 64

/* The hash of NS and NAME under C's seed (set on first use: task names are the users'). */
static uint64_t queued_hash(struct controller *c, const char *ns, const char *name)
{
    if (c->queued_seed == 0) {
        c->queued_seed = hash_seed(c);
    }
    return hash_fnv1a_pair(c->queued_seed, ns, name);
}

struct controller_queued *controller_queued_find(struct controller *c, const char *ns,
                                                 const char *name)
{
    uint64_t h;

    if (c->queued_buckets == 0) {
        return NULL;
    }
    h = queued_hash(c, ns, name);
    for (struct controller_queued *q = c->queued_index[h % c->queued_buckets]; q != NULL;
         q = q->hnext) {
        if (q->hash == h && strcmp(q->ns, ns) == 0 && strcmp(q->name, name) == 0) {
            return q;
        }
    }
    return NULL;
}

/* Puts every record into N buckets (N > 0). */
static void queued_rehash(struct controller *c, size_t n)
{
    free(c->queued_index);
    c->queued_index = xcalloc(n, sizeof(*c->queued_index));
    c->queued_buckets = n;
    for (struct controller_queued *q = c->queued; q != NULL; q = q->next) {
        q->hnext = c->queued_index[q->hash % n];
        c->queued_index[q->hash % n] = q;
    }
}

struct controller_queued *controller_queued_add(struct controller *c, const char *ns,
                                                const char *name)
{
    struct controller_queued *q = xcalloc(1, sizeof(*q));
    size_t b;

    q->ns = xstrdup(ns);
    q->name = xstrdup(name);
    q->round = -1;
    q->hash = queued_hash(c, ns, name);
    q->next = c->queued;
    c->queued = q;
    c->queued_count++;
    if (c->queued_count > c->queued_buckets) {
        queued_rehash(c, c->queued_buckets != 0 ? c->queued_buckets * 2 : QUEUED_BUCKETS_MIN);
    } else {
        b = q->hash % c->queued_buckets;
        q->hnext = c->queued_index[b];
        c->queued_index[b] = q;
    }
    return q;
}

static void queued_free(struct controller_queued *q)
{
    free(q->ns);
    free(q->name);
    free(q);
}

void controller_queued_prune(struct controller *c)
{
    struct controller_queued **pp = &c->queued;
    size_t before = c->queued_count;

    while (*pp != NULL) {
        struct controller_queued *q = *pp;
        if (!q->seen) {
            *pp = q->next;
            queued_free(q);
            c->queued_count--;
        } else {
            q->seen = false;
            pp = &q->next;
        }
    }
    if (c->queued_count != before) {
        /* Rebuilt rather than unlinked one by one; smaller once most have gone. */
        size_t n = c->queued_buckets;
        while (n > QUEUED_BUCKETS_MIN && c->queued_count < n / 4) {
            n /= 2;
        }
        queued_rehash(c, n > 0 ? n : QUEUED_BUCKETS_MIN);
    }
}

bool controller_queue_admitted(struct controller *c, const char *ns, const char *name)
{
    struct controller_queued *q;
    bool ok;

    if (c->max_running <= 0 && !atomic_load(&c->ns_caps)) {
        return true;
    }
    pthread_mutex_lock(&c->queue_lock);
    q = controller_queued_find(c, ns, name);
    ok = q != NULL && q->admitted;
    pthread_mutex_unlock(&c->queue_lock);
    return ok;
}

/* Whether a record waits (not admitted); the caller holds queue_lock. */
static bool any_waiting(const struct controller *c)
{
    for (const struct controller_queued *q = c->queued; q != NULL; q = q->next) {
        if (!q->admitted) {
            return true;
        }
    }
    return false;
}

bool controller_queue_waiting(struct controller *c)
{
    bool waiting;

    if (c->max_running <= 0 && !atomic_load(&c->ns_caps)) {
        return false;
    }
    pthread_mutex_lock(&c->queue_lock);
    waiting = any_waiting(c);
    pthread_mutex_unlock(&c->queue_lock);
    return waiting;
}

bool controller_queue_holds(struct controller *c, const struct task_event *ev)
{
    struct controller_queued *q;
    bool holds = false;

    if (c->sandboxes == NULL || c->problem != NULL || ev->phase != TASK_PENDING || ev->suspended ||
        (c->max_running <= 0 && !atomic_load(&c->ns_caps))) {
        return false;
    }
    pthread_mutex_lock(&c->queue_lock);
    q = controller_queued_find(c, ev->ns, ev->name);
    if (q != NULL) {
        holds = !q->admitted;
    } else if (ev->type == TASK_EVENT_ADDED) {
        holds = any_waiting(c); /* it joins them */
    }
    pthread_mutex_unlock(&c->queue_lock);
    return holds && !controller_disk_over(c, ev->ns, ev->name, NULL);
}

void controller_queue_poke(struct controller *c)
{
    if (c == NULL) {
        return;
    }
    pthread_mutex_lock(&c->notes_lock);
    atomic_store(&c->queue_poked, true);
    pthread_cond_signal(&c->notes_cond);
    pthread_mutex_unlock(&c->notes_lock);
}

void controller_queue_free(struct controller *c)
{
    while (c->queued != NULL) {
        struct controller_queued *q = c->queued;
        c->queued = q->next;
        queued_free(q);
    }
    free(c->queued_index);
    c->queued_index = NULL;
    c->queued_buckets = 0;
    c->queued_count = 0;
}
