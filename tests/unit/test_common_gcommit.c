/* SPDX-License-Identifier: Apache-2.0 */
/* Group commit (common/gcommit.c), under both wake-ups: every queued item is committed
 * exactly once, by one commit at a time, before its gcommit_run returns; one thread's items
 * are committed in the order it queued them; the stats count batches and items. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/gcommit.h"
#include "tests/t_check.h"

#define THREADS 12
#define PER_THREAD 300

struct job {
    int thread, seq;
    int64_t batch; /* set by the commit: the batch that held it */
    struct gcommit_item link;
};

struct ledger {
    atomic_int inside;                  /* commits running now */
    atomic_int overlaps;                /* commits that found another one running */
    int64_t batches;                    /* the committer's own count */
    int64_t largest;                    /* the largest batch */
    int committed[THREADS][PER_THREAD]; /* times each job was committed */
    int order_breaks;                   /* a thread's job committed before an earlier one */
    int last_seq[THREADS];              /* the last committed seq of each thread */
};

static void commit(struct gcommit_item *batch, void *userdata)
{
    struct ledger *l = userdata;
    int64_t n = 0;

    if (atomic_fetch_add(&l->inside, 1) != 0) {
        atomic_fetch_add(&l->overlaps, 1);
    }
    l->batches++;
    for (struct gcommit_item *it = batch; it != NULL; it = it->next) {
        struct job *j = container_of(it, struct job, link);
        j->batch = l->batches;
        l->committed[j->thread][j->seq]++;
        if (j->seq != l->last_seq[j->thread] + 1) {
            l->order_breaks++;
        }
        l->last_seq[j->thread] = j->seq;
        n++;
    }
    if (n > l->largest) {
        l->largest = n;
    }
    atomic_fetch_sub(&l->inside, 1);
}

struct worker {
    struct gcommit *g;
    int thread;
    int unanswered; /* gcommit_run returned before the job's batch was set */
};

static void *work(void *arg)
{
    struct worker *w = arg;

    for (int i = 0; i < PER_THREAD; i++) {
        struct job j = {.thread = w->thread, .seq = i};
        gcommit_run(w->g, &j.link);
        w->unanswered += j.batch == 0;
    }
    return NULL;
}

static void concurrent(enum gcommit_wake wake)
{
    static struct ledger l;
    struct worker w[THREADS];
    pthread_t t[THREADS];
    struct gcommit *g = NULL;
    struct err err = {0};
    int64_t batches = 0, items = 0;

    memset(&l, 0, sizeof(l));
    for (int i = 0; i < THREADS; i++) {
        l.last_seq[i] = -1;
    }
    CHECK_OK(gcommit_new(&g, "test-commit", wake, commit, &l, &err));
    ASSERT(g != NULL);
    for (int i = 0; i < THREADS; i++) {
        w[i] = (struct worker){.g = g, .thread = i};
        ASSERT(pthread_create(&t[i], NULL, work, &w[i]) == 0);
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        CHECK_EQ_INT(w[i].unanswered, 0);
    }
    gcommit_stats(&batches, &items, g);
    gcommit_free(g);
    for (int i = 0; i < THREADS; i++) {
        for (int k = 0; k < PER_THREAD; k++) {
            CHECK_EQ_INT(l.committed[i][k], 1);
        }
    }
    CHECK_EQ_INT(atomic_load(&l.overlaps), 0);
    CHECK_EQ_INT(l.order_breaks, 0);
    CHECK_EQ_INT(items, THREADS * PER_THREAD);
    CHECK_EQ_INT(batches, l.batches);
    CHECK(batches >= 1 && batches <= items);
    CHECK(l.largest >= 1 && l.largest <= THREADS);
}

TEST(every_item_once_one_commit_at_a_time_in_order_tree_wake)
{
    concurrent(GCOMMIT_WAKE_TREE);
}

TEST(every_item_once_one_commit_at_a_time_in_order_wake_all)
{
    concurrent(GCOMMIT_WAKE_ALL);
}

TEST(one_thread_one_item_per_batch)
{
    static struct ledger l;
    struct gcommit *g = NULL;
    struct err err = {0};
    int64_t batches = 0, items = 0;

    l.last_seq[0] = -1;
    CHECK_OK(gcommit_new(&g, "test-commit", GCOMMIT_WAKE_TREE, commit, &l, &err));
    for (int i = 0; i < 5; i++) {
        struct job j = {.thread = 0, .seq = i};
        gcommit_run(g, &j.link);
        CHECK_EQ_INT(j.batch, i + 1);
    }
    gcommit_stats(&batches, &items, g);
    CHECK_EQ_INT(batches, 5);
    CHECK_EQ_INT(items, 5);
    gcommit_free(g);
    gcommit_free(NULL);
}

/* Items queued with gcommit_post are never part of a tree: the threads queued beside them
 * are all woken although the posting thread collects its answers only later. */
TEST(posted_items_never_hold_the_tree)
{
    static struct ledger l;
    struct job posted[4];
    struct worker w[THREADS];
    pthread_t t[THREADS];
    struct gcommit *g = NULL;
    struct err err = {0};

    memset(&l, 0, sizeof(l));
    for (int i = 0; i < THREADS; i++) {
        l.last_seq[i] = -1;
    }
    CHECK_OK(gcommit_new(&g, "test-commit", GCOMMIT_WAKE_TREE, commit, &l, &err));
    /* Thread slot 0 is the poster's: its items are seqs 0..3, before the workers' runs
     * (which use the slots 1..THREADS-1). */
    for (int i = 0; i < 4; i++) {
        posted[i] = (struct job){.thread = 0, .seq = i};
        gcommit_post(g, &posted[i].link);
    }
    for (int i = 1; i < THREADS; i++) {
        w[i] = (struct worker){.g = g, .thread = i};
        ASSERT(pthread_create(&t[i], NULL, work, &w[i]) == 0);
    }
    for (int i = 1; i < THREADS; i++) {
        pthread_join(t[i], NULL); /* would hang were a posted item a tree's inner node */
        CHECK_EQ_INT(w[i].unanswered, 0);
    }
    for (int i = 0; i < 4; i++) {
        gcommit_wait(&posted[i].link);
        CHECK(posted[i].batch >= 1);
        CHECK_EQ_INT(l.committed[0][i], 1);
    }
    gcommit_free(g);
    CHECK_EQ_INT(l.order_breaks, 0);
    CHECK_EQ_INT(atomic_load(&l.overlaps), 0);
}

T_MAIN
