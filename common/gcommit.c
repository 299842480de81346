/* SPDX-License-Identifier: Apache-2.0 */
/* Group commit (gcommit.h): one committer thread, a queue of waiting request threads, and a
 * wake-up that fans out as a tree so the committer can start the next batch at once. */
#include "common/gcommit.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>

struct gcommit {
    gcommit_fn fn;
    void *userdata;
    enum gcommit_wake wake;
    char name[16];
    pthread_mutex_t mu;               /* guards the queue, stop and the stats */
    pthread_cond_t work;              /* items queued, or stopping */
    struct gcommit_item *head, *tail; /* queued items, oldest first */
    bool stop;
    pthread_t thread;
    int64_t batches, items;
};

/* Wakes every thread of BATCH itself, oldest first. */
static void wake_all(struct gcommit_item *batch)
{
    struct gcommit_item *it = batch, *next;

    while (it != NULL) {
        next = it->next; /* IT may be gone once its thread woke */
        sem_post(&it->done);
        it = next;
    }
}

/* Wakes the threads of BATCH as a binary tree: the committer posts only the root and every
 * woken thread posts its two children (gcommit_run), so waking 64 threads costs the
 * committer one futex call and takes log2(64) rounds. Items queued by gcommit_post are
 * posted directly, after the tree is built (their memory may be gone once posted). */
static void wake_tree(struct gcommit_item *batch)
{
    struct gcommit_item *small[128], **all = small, *it;
    size_t n = 0, cap = ARRAY_LEN(small), tree = 0;

    for (it = batch; it != NULL; it = it->next) {
        if (n == cap) {
            cap *= 2;
            all = all == small ? memcpy(xmalloc(cap * sizeof(*all)), small, sizeof(small))
                               : xrealloc(all, cap * sizeof(*all));
        }
        all[n++] = it;
    }
    /* The tree's items to the front, the posted ones behind them. */
    for (size_t i = 0; i < n; i++) {
        if (!all[i]->posted) {
            struct gcommit_item *t = all[i];
            all[i] = all[tree];
            all[tree++] = t;
        }
    }
    for (size_t i = 0; i < tree; i++) {
        all[i]->wake[0] = 2 * i + 1 < tree ? all[2 * i + 1] : NULL;
        all[i]->wake[1] = 2 * i + 2 < tree ? all[2 * i + 2] : NULL;
    }
    for (size_t i = tree; i < n; i++) {
        sem_post(&all[i]->done);
    }
    if (tree > 0) {
        sem_post(&all[0]->done);
    }
    if (all != small) {
        free(all);
    }
}

static void *committer(void *arg)
{
    struct gcommit *g = arg;

    prctl(PR_SET_NAME, g->name, 0, 0, 0);
    pthread_mutex_lock(&g->mu);
    for (;;) {
        struct gcommit_item *batch;
        int64_t n;
        while (g->head == NULL && !g->stop) {
            pthread_cond_wait(&g->work, &g->mu);
        }
        if (g->head == NULL) {
            break; /* stopping, and nothing is left to commit */
        }
        batch = g->head;
        g->head = g->tail = NULL;
        pthread_mutex_unlock(&g->mu);
        g->fn(batch, g->userdata);
        n = 0;
        for (struct gcommit_item *it = batch; it != NULL; it = it->next) {
            n++;
        }
        /* Counted before the wake-up: a woken thread may read the stats at once, and
         * BATCH's items may be gone once their threads woke. */
        pthread_mutex_lock(&g->mu);
        g->batches++;
        g->items += n;
        pthread_mutex_unlock(&g->mu);
        if (g->wake == GCOMMIT_WAKE_TREE) {
            wake_tree(batch);
        } else {
            wake_all(batch);
        }
        pthread_mutex_lock(&g->mu);
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

int gcommit_new(struct gcommit **out, const char *name, enum gcommit_wake wake, gcommit_fn fn,
                void *userdata, struct err *err)
{
    struct gcommit *g = xcalloc(1, sizeof(*g));

    *out = NULL;
    g->fn = fn;
    g->wake = wake;
    g->userdata = userdata;
    snprintf(g->name, sizeof(g->name), "%s", name);
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->work, NULL);
    if (pthread_create(&g->thread, NULL, committer, g) != 0) {
        pthread_mutex_destroy(&g->mu);
        pthread_cond_destroy(&g->work);
        free(g);
        return err_set(err, E_FAIL, "cannot start the %s committer thread", name);
    }
    *out = g;
    return E_OK;
}

void gcommit_free(struct gcommit *g)
{
    if (g == NULL) {
        return;
    }
    pthread_mutex_lock(&g->mu);
    g->stop = true;
    pthread_cond_signal(&g->work);
    pthread_mutex_unlock(&g->mu);
    pthread_join(g->thread, NULL);
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->work);
    free(g);
}

static void enqueue(struct gcommit *g, struct gcommit_item *item, bool posted)
{
    item->next = NULL;
    item->wake[0] = item->wake[1] = NULL;
    item->posted = posted;
    sem_init(&item->done, 0, 0);
    pthread_mutex_lock(&g->mu);
    if (g->tail != NULL) {
        g->tail->next = item;
    } else {
        g->head = item;
    }
    g->tail = item;
    pthread_cond_signal(&g->work);
    pthread_mutex_unlock(&g->mu);
}

static void wait_done(struct gcommit_item *item)
{
    while (sem_wait(&item->done) != 0) {
        /* EINTR: wait again */
    }
}

void gcommit_run(struct gcommit *g, struct gcommit_item *item)
{
    enqueue(g, item, false);
    wait_done(item);
    /* Pass the wake-up on before anything else (see wake_tree; NULL under wake_all). */
    for (int k = 0; k < 2; k++) {
        if (item->wake[k] != NULL) {
            sem_post(&item->wake[k]->done);
        }
    }
    sem_destroy(&item->done);
}

void gcommit_post(struct gcommit *g, struct gcommit_item *item)
{
    enqueue(g, item, true);
}

void gcommit_wait(struct gcommit_item *item)
{
    wait_done(item);
    sem_destroy(&item->done);
}

void gcommit_stats(int64_t *batches_out, int64_t *items_out, struct gcommit *g)
{
    pthread_mutex_lock(&g->mu);
    *batches_out = g->batches;
    *items_out = g->items;
    pthread_mutex_unlock(&g->mu);
}
