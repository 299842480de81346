/* SPDX-License-Identifier: Apache-2.0 */
/* A request that suspends a running task freezes its sandbox before the change is
 * committed (SPEC §4 pause): the freeze does not wait for the change's fsync, the
 * controller's wake-up and its plan. The reconcile that follows stays the one owner of
 * the pause: it finds the sandbox frozen (controller_pause_freeze), revokes the token
 * (Pausing) and writes Paused; a change that did not suspend the task thaws it again
 * before the reconcile lock is released. */
#include <pthread.h>
#include <string.h>

#include "controller/controller_int.h"

/* Whether NS/NAME is Active; *SUSPENDED: its spec.suspended (C->lock held). */
static bool active(bool *suspended, struct controller *c, const char *ns, const char *name)
{
    struct task_view v;
    json_t *doc = NULL;
    bool yes = false;

    *suspended = false;
    if (task_store_get(&doc, c->store, ns, name, NULL) == E_OK) {
        task_view_of(&v, doc);
        yes = v.phase == TASK_ACTIVE;
        *suspended = v.suspended;
        json_decref(doc);
    }
    return yes;
}

/* Whether NS/NAME is Active, not suspended, and its sandbox runs (C->lock held). */
static bool runs_unsuspended(struct controller *c, const char *ns, const char *name)
{
    struct sandbox_status st;
    bool suspended;

    if (!active(&suspended, c, ns, name) || suspended) {
        return false;
    }
    sandbox_status(&st, c->sandboxes, ns, name);
    return st.state == SANDBOX_RUNNING;
}

/* Whether NS/NAME is Active and suspended: the reconcile of that change pauses it. */
static bool suspended_active(struct controller *c, const char *ns, const char *name)
{
    bool suspended;

    return active(&suspended, c, ns, name) && suspended;
}

int controller_suspend_change(struct controller *c, const char *ns, const char *name,
                              int (*change)(void *userdata), void *userdata)
{
    bool froze = false;
    int rc;

    /* A reconcile at work (it may take long: a start; pushes run off the lock) is not
     * waited for: the change then takes the usual way, the freeze planned by its own
     * reconcile. So does a provider whose freeze is not a local one (agent: the cluster's
     * API). */
    if (c == NULL || c->sandboxes == NULL ||
        (strcmp(c->provider, "local") != 0 && strcmp(c->provider, "process") != 0) ||
        pthread_mutex_trylock(&c->lock) != 0) {
        return change(userdata);
    }
    /* The freeze first, in this thread: it takes well under a millisecond (a v1 freezer's
     * kernel switch is kept on: sandbox/local/cgroup.c), less than a thread to run it beside
     * the commit took to start. A sandbox that does not freeze is left to the reconcile (it
     * stops it). */
    if (!atomic_load(&c->stopping) && runs_unsuspended(c, ns, name)) {
        froze = sandbox_suspend(c->sandboxes, ns, name, NULL) == E_OK;
    }
    rc = change(userdata);
    /* Every change committed from here on is reconciled after the unlock, whatever the
     * feed batches: the reconcile of a task Active again with its sandbox frozen thaws it
     * (controller_decide: THAW, with a fresh token). */
    if (froze && (rc != E_OK || !suspended_active(c, ns, name))) {
        (void)sandbox_resume(c->sandboxes, ns, name, NULL);
    }
    pthread_mutex_unlock(&c->lock);
    return rc;
}
