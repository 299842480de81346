/* SPDX-License-Identifier: Apache-2.0 */
/* How many git smart HTTP requests run at once: at most PER_TASK for one task and TOTAL
 * in all (each holds a thread, a git process and a spooled body). One mutex guards the
 * table; a task's entry lives while it holds a slot and is reused afterwards. */
#include <stdio.h>
#include <string.h>

#include "server/api/git/api_git.h"

void api_git_gate_init(struct api_git_gate *g, int per_task, int total)
{
    ASSERT(per_task > 0 && total > 0 && total <= API_GIT_REQUESTS_MAX);
    memset(g, 0, sizeof(*g));
    pthread_mutex_init(&g->mu, NULL);
    g->per_task = per_task;
    g->total = total;
}

void api_git_gate_cleanup(struct api_git_gate *g)
{
    pthread_mutex_destroy(&g->mu);
}

/* The entry of KEY, else a free one (n == 0), else NULL; g->mu held. */
static struct api_git_slot *entry_of(struct api_git_gate *g, const char *key)
{
    struct api_git_slot *free_one = NULL;

    for (int i = 0; i < g->total; i++) {
        struct api_git_slot *s = &g->slots[i];
        if (s->n > 0 && strcmp(s->key, key) == 0) {
            return s;
        }
        if (s->n == 0 && free_one == NULL) {
            free_one = s;
        }
    }
    return free_one;
}

int api_git_gate_enter(struct api_git_slot **out, struct api_git_gate *g, const char *ns,
                       const char *task, struct err *err)
{
    char key[sizeof(g->slots[0].key)];
    struct api_git_slot *s;
    int rc = E_OK;

    *out = NULL;
    snprintf(key, sizeof(key), "%s/%s", ns, task);
    pthread_mutex_lock(&g->mu);
    s = g->busy < g->total ? entry_of(g, key) : NULL;
    if (s == NULL) {
        rc = err_set(err, E_AGAIN, "the server runs as many git requests as it allows");
    } else if (s->n >= g->per_task) {
        rc = err_set(err, E_AGAIN, "the task already runs %d git requests", g->per_task);
    } else {
        if (s->n == 0) {
            memcpy(s->key, key, sizeof(key));
            s->gate = g;
        }
        s->n++;
        g->busy++;
        *out = s;
    }
    pthread_mutex_unlock(&g->mu);
    return rc;
}

void api_git_gate_leave(void *slot)
{
    struct api_git_slot *s = slot;
    struct api_git_gate *g;

    if (s == NULL) {
        return;
    }
    g = s->gate;
    pthread_mutex_lock(&g->mu);
    ASSERT(s->n > 0 && g->busy > 0);
    s->n--;
    g->busy--;
    pthread_mutex_unlock(&g->mu);
}
