/* SPDX-License-Identifier: Apache-2.0 */
/* What wakes the tick thread (run.c): notes naming a task to reconcile again (a runner
 * exited, a mirror fetch finished, the disk watchdog stopped a sandbox) and the timeout
 * timers of running tasks. Both are under notes_lock; nothing here reconciles. */
#include <stdlib.h>
#include <string.h>

#include "controller/controller_int.h"

void controller_timer_set(struct controller *c, const char *ns, const char *name,
                          int64_t deadline_ms)
{
    struct controller_timer **pp, *t = NULL;

    pthread_mutex_lock(&c->notes_lock);
    for (pp = &c->timers; *pp != NULL; pp = &(*pp)->next) {
        if (strcmp((*pp)->ns, ns) == 0 && strcmp((*pp)->name, name) == 0) {
            t = *pp;
            break;
        }
    }
    if (deadline_ms <= 0 && t != NULL) {
        *pp = t->next;
        free(t->ns);
        free(t->name);
        free(t->meter_id);
        free(t);
    } else if (deadline_ms > 0) {
        if (t == NULL) {
            t = xcalloc(1, sizeof(*t));
            t->ns = xstrdup(ns);
            t->name = xstrdup(name);
            t->next = c->timers;
            c->timers = t;
        }
        t->deadline_ms = deadline_ms;
        t->active_ms = clock_now_ms(clock_system()); /* (re)started: active now */
        t->log_size = -1;
        t->no_progress = false;
        t->stalled = false;
    }
    pthread_mutex_unlock(&c->notes_lock);
}

void controller_timer_warn(struct controller *c, const char *ns, const char *name, int64_t warn_ms)
{
    pthread_mutex_lock(&c->notes_lock);
    for (struct controller_timer *t = c->timers; t != NULL; t = t->next) {
        if (strcmp(t->ns, ns) == 0 && strcmp(t->name, name) == 0) {
            t->warn_ms = warn_ms;
            t->warned = false;
        }
    }
    pthread_mutex_unlock(&c->notes_lock);
}

void controller_on_exit(const char *ns, const char *name, void *userdata)
{
    struct controller *c = userdata;
    struct controller_note *n;

    if (strcmp(ns, CONTROLLER_SLOT_NS) == 0) {
        return; /* a warm slot's runner, no task's: a claim finds it gone */
    }
    n = xcalloc(1, sizeof(*n));
    n->ns = xstrdup(ns);
    n->name = xstrdup(name);
    pthread_mutex_lock(&c->notes_lock);
    n->next = c->notes;
    c->notes = n;
    pthread_cond_signal(&c->notes_cond);
    pthread_mutex_unlock(&c->notes_lock);
}
