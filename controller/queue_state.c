/* SPDX-License-Identifier: Apache-2.0 */
/* The queue's record of waiting tasks (under queue_lock): written by the queue's pass
 * (queue.c), read by a task's reconcile (may it take a slot now?). Apart from the pass so
 * that the pass, which reconciles the tasks it admits, sits above reconcile and nothing
 * below calls back up into it. */
#include <stdlib.h>
#include <string.h>

#include "controller/controller_int.h"

struct controller_queued *controller_queued_find(struct controller *c, const char *ns,
                                                 const char *name)
{
    for (struct controller_queued *q = c->queued; q != NULL; q = q->next) {
        if (strcmp(q->ns, ns) == 0 && strcmp(q->name, name) == 0) {
            return q;
        }
    }
    return NULL;
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

bool controller_queue_waiting(struct controller *c)
{
    bool waiting = false;

    if (c->max_running <= 0 && !atomic_load(&c->ns_caps)) {
        return false;
    }
    pthread_mutex_lock(&c->queue_lock);
    for (struct controller_queued *q = c->queued; q != NULL && !waiting; q = q->next) {
        waiting = !q->admitted;
    }
    pthread_mutex_unlock(&c->queue_lock);
    return waiting;
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
        free(q->ns);
        free(q->name);
        free(q);
    }
}
