/* SPDX-License-Identifier: Apache-2.0 */
/* What the tick thread watches in running tasks (SPEC §14 "Runs"): the time left once
 * 80 % of sandbox.timeoutSeconds has passed (status.timeoutAt, which the meter turns into
 * guidance for the agent). The store is written outside notes_lock. */
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "controller/controller_int.h"

/* One task's pending write. */
struct runs_work {
    char *ns, *name;
    int64_t timeout_at_ms; /* > 0: write status.timeoutAt */
    struct runs_work *next;
};

static int timeout_at_txn(struct task_txn *tx, void *userdata)
{
    const struct runs_work *w = userdata;
    char when[CLOCK_RFC3339_MAX];
    struct task_view v;
    json_t *doc = NULL;
    int rc = task_txn_get(&doc, tx, w->ns, w->name, NULL);

    if (rc != E_OK) {
        return rc;
    }
    task_view_of(&v, doc);
    if (v.phase == TASK_ACTIVE && !v.suspended) {
        clock_rfc3339(when, w->timeout_at_ms);
        json_object_set_new(json_object_get(doc, "status"), "timeoutAt", json_string(when));
        rc = task_txn_put(tx, doc, NULL);
    }
    json_decref(doc);
    return rc;
}

void controller_runs_tick(struct controller *c, int64_t now_ms)
{
    struct runs_work *todo = NULL, *w;
    struct err err = {0};

    pthread_mutex_lock(&c->notes_lock);
    for (struct controller_timer *t = c->timers; t != NULL; t = t->next) {
        if (t->warn_ms > 0 && !t->warned && now_ms >= t->warn_ms) {
            t->warned = true;
            w = xcalloc(1, sizeof(*w));
            w->ns = xstrdup(t->ns);
            w->name = xstrdup(t->name);
            w->timeout_at_ms = t->deadline_ms;
            w->next = todo;
            todo = w;
        }
    }
    pthread_mutex_unlock(&c->notes_lock);
    while ((w = todo) != NULL) {
        todo = w->next;
        if (w->timeout_at_ms > 0 && task_store_txn(c->store, timeout_at_txn, w, &err) != E_OK &&
            err.code != E_NOTFOUND) {
            log_kv(LOG_WARN, "timeout_warning_failed", "namespace", w->ns, "name", w->name, "error",
                   err.msg, NULL);
        }
        free(w->ns);
        free(w->name);
        free(w);
    }
}
