/* SPDX-License-Identifier: Apache-2.0 */
/* Adding to the durable inbox by group commit: concurrent webhook requests queue their
 * entry and one leader writes the whole queue in one fsync'd transaction; each request
 * answers only after the COMMIT that holds its entry. */
#include <semaphore.h>
#include <stdlib.h>
#include <string.h>

#include "store/sqlite/store_sqlite_int.h"

/* Group commit of inbox inserts: concurrent webhook requests queue their entry; one of
 * them (the leader) writes every queued entry in ONE transaction, then hands leadership
 * to the next queued request. Each request still gets its own answer, after the fsync'd
 * COMMIT that holds its entry. */
struct inbox_waiter {
    const struct inbox_entry *e; /* borrowed */
    bool dup;                    /* out */
    int rc;                      /* out */
    struct err err;              /* out */
    bool lead;                   /* this request runs the next batch */
    sem_t done;                  /* posted when answered or made leader */
    struct inbox_waiter *next;
};

static int insert_one(struct sqlite_store *s, struct inbox_waiter *w, int64_t now)
{
    const struct inbox_entry *e = w->e;
    sqlite3_stmt *q = NULL;
    int rc = sqlst_stmt(&q, s, SQLST_INBOX_INSERT, &w->err);

    if (rc != E_OK) {
        return rc;
    }
    sqlite3_bind_text(q, 1, e->provider, -1, SQLITE_STATIC);
    sqlst_bind_opt(q, 2, e->delivery_id);
    sqlite3_bind_text(q, 3, e->project, -1, SQLITE_STATIC);
    sqlite3_bind_int64(q, 4, e->number);
    sqlite3_bind_text(q, 5, e->comment_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 6, e->author, -1, SQLITE_STATIC);
    sqlst_bind_opt(q, 7, e->author_association);
    sqlite3_bind_int64(q, 8, e->author_id);
    sqlite3_bind_int64(q, 9, e->installation_id);
    sqlite3_bind_text(q, 10, e->body, -1, SQLITE_STATIC);
    sqlst_bind_opt(q, 11, e->extra);
    sqlite3_bind_int64(q, 12, now);
    rc = sqlst_step_done(s, q, "inbox add", &w->err);
    w->dup = rc == E_OK && sqlite3_changes(s->db) == 0;
    return rc;
}

static void run_batch(struct sqlite_store *s, struct inbox_waiter *batch, struct inbox_waiter *self)
{
    int64_t now = clock_now_ms(s->base.clock);
    struct err err = {0};
    bool added = false;
    int rc;

    pthread_mutex_lock(&s->mu);
    rc = sqlst_exec(s, "BEGIN IMMEDIATE", &err);
    for (struct inbox_waiter *w = batch; w != NULL; w = w->next) {
        w->rc = rc == E_OK ? insert_one(s, w, now) : rc;
        added = added || (w->rc == E_OK && !w->dup);
    }
    if (rc == E_OK) {
        rc = sqlst_exec(s, "COMMIT", &err);
        if (rc != E_OK) {
            (void)sqlst_exec(s, "ROLLBACK", NULL);
        }
    }
    if (rc != E_OK) {
        /* Nothing of this batch is durable: nobody is told otherwise. */
        for (struct inbox_waiter *w = batch; w != NULL; w = w->next) {
            w->rc = rc;
            w->err = err;
        }
        added = false;
    }
    if (added) {
        s->inbox_gen++;
        pthread_cond_broadcast(&s->inbox_cv);
    }
    pthread_mutex_unlock(&s->mu);
    for (struct inbox_waiter *w = batch; w != NULL;) {
        struct inbox_waiter *next = w->next; /* W lives on its waiter's stack */
        if (w != self) {
            sem_post(&w->done);
        }
        w = next;
    }
}

int sqlst_inbox_add(bool *duplicate_out, struct task_store *st, const struct inbox_entry *e,
                    struct err *err)
{
    struct sqlite_store *s = sqlst_of(st);
    struct inbox_waiter w;
    bool lead;

    memset(&w, 0, sizeof(w));
    w.e = e;
    sem_init(&w.done, 0, 0);
    pthread_mutex_lock(&s->gc_mu);
    if (s->gc_tail != NULL) {
        s->gc_tail->next = &w;
    } else {
        s->gc_head = &w;
    }
    s->gc_tail = &w;
    if (!s->gc_leader) {
        s->gc_leader = true;
        w.lead = true;
    }
    /* Read under the lock: a finishing leader may set w.lead (and post) at any time once
     * it is released; after sem_wait the post orders that write before our read. */
    lead = w.lead;
    pthread_mutex_unlock(&s->gc_mu);
    if (!lead) {
        while (sem_wait(&w.done) != 0) {
        }
    }
    if (w.lead) {
        struct inbox_waiter *batch;
        pthread_mutex_lock(&s->gc_mu);
        batch = s->gc_head;
        s->gc_head = s->gc_tail = NULL;
        pthread_mutex_unlock(&s->gc_mu);
        run_batch(s, batch, &w);
        /* Hand over: the oldest request that queued meanwhile leads the next batch. */
        pthread_mutex_lock(&s->gc_mu);
        if (s->gc_head != NULL) {
            s->gc_head->lead = true;
            sem_post(&s->gc_head->done);
        } else {
            s->gc_leader = false;
        }
        pthread_mutex_unlock(&s->gc_mu);
    }
    sem_destroy(&w.done);
    *duplicate_out = w.dup;
    if (w.rc != E_OK && err != NULL) {
        *err = w.err;
    }
    return w.rc;
}
