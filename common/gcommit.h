/* SPDX-License-Identifier: Apache-2.0 */
/* Group commit: request threads queue an item and block; one committer thread takes every
 * item queued so far, commits them all at once (one transaction, one fsync: the caller's
 * function), wakes their threads, then takes the next batch at once. Used by the meter
 * (meter/service.c) and the SQLite inbox (store/sqlite/store_sqlite_inbox.c). */
#ifndef DIVERGE_COMMON_GCOMMIT_H
#define DIVERGE_COMMON_GCOMMIT_H

#include <semaphore.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"

/* One queued request: embedded in the caller's job (container_of to get back to it).
 * Only next is the caller's to read, in the commit function: the batch in arrival order. */
struct gcommit_item {
    struct gcommit_item *next;    /* the batch, oldest first; NULL ends it */
    struct gcommit_item *wake[2]; /* private: the items this item's thread wakes */
    sem_t done;                   /* private: posted once the item's batch is committed */
    bool posted;                  /* private: queued by gcommit_post (woken by the committer) */
};

/* Commits BATCH (linked by next, oldest first) and stores each item's answer in its job.
 * Runs on the committer thread; every item of the batch is answered when it returns. */
typedef void (*gcommit_fn)(struct gcommit_item *batch, void *userdata);

/* How the committer wakes a committed batch's threads. */
enum gcommit_wake {
    /* The committer posts only the oldest; each woken thread posts two more (a binary
     * tree): the committer is free for the next batch after one futex call, the last
     * thread wakes after log2(n) hand-offs. Best when the cores are free. */
    GCOMMIT_WAKE_TREE,
    /* The committer posts every thread itself: n futex calls before the next batch, but no
     * thread waits on another to be scheduled first (a tree's hand-offs each wait for a
     * core when the machine is busy). */
    GCOMMIT_WAKE_ALL,
};

struct gcommit;

/* Starts the committer thread NAME (at most 15 bytes) calling FN(batch, USERDATA) and
 * waking each batch as WAKE says. Caller frees with gcommit_free(). */
int gcommit_new(struct gcommit **out, const char *name, enum gcommit_wake wake, gcommit_fn fn,
                void *userdata, struct err *err);
/* Commits what is still queued, then stops the thread. No gcommit_run may be under way or
 * start. NULL: no-op. */
void gcommit_free(struct gcommit *g);
/* Queues ITEM (caller storage, borrowed until this returns) and blocks until the batch
 * holding it was committed by FN. */
void gcommit_run(struct gcommit *g, struct gcommit_item *item);
/* Queues ITEM (caller storage, borrowed until gcommit_wait returns) without waiting: the
 * caller goes on with other work and collects the answer with gcommit_wait, which it must
 * call exactly once. Such an item is woken by the committer itself, never in a tree (its
 * thread may be busy for long). */
void gcommit_post(struct gcommit *g, struct gcommit_item *item);
/* Blocks until the batch holding ITEM (queued by gcommit_post) was committed. */
void gcommit_wait(struct gcommit_item *item);
/* Batches committed and items in them, since the start. */
void gcommit_stats(int64_t *batches_out, int64_t *items_out, struct gcommit *g);

#endif
