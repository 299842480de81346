/* SPDX-License-Identifier: Apache-2.0 */
/* Adding to the durable inbox by group commit (common/gcommit.h): concurrent webhook
 * requests queue their entry, the store's inbox committer writes every queued entry in ONE
 * fsync'd transaction, and each request answers only after the COMMIT that holds its
 * entry. A delivery already in the inbox (its delivery id, or its comment) is not written
 * again and is answered as a duplicate. */
#include <stdlib.h>
#include <string.h>

#include "store/sqlite/store_sqlite_int.h"

/* One queued inbox add. */
struct inbox_job {
    const struct inbox_entry *e; /* borrowed */
    bool dup;                    /* out */
    int rc;                      /* out */
    struct err err;              /* out */
    struct gcommit_item link;    /* the committer's queue */
};

static struct inbox_job *queued_add(struct gcommit_item *it)
{
    return it != NULL ? container_of(it, struct inbox_job, link) : NULL;
}

static int insert_one(struct sqlite_store *s, struct inbox_job *w, int64_t now)
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

/* The committer's function: every queued add in one transaction. */
static void commit_adds(struct gcommit_item *batch, void *userdata)
{
    struct sqlite_store *s = userdata;
    int64_t now = clock_now_ms(s->base.clock);
    struct err err = {0};
    bool added = false;
    int rc;

    pthread_mutex_lock(&s->mu);
    rc = sqlst_exec(s, "BEGIN IMMEDIATE", &err);
    for (struct inbox_job *w = queued_add(batch); w != NULL; w = queued_add(w->link.next)) {
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
        for (struct inbox_job *w = queued_add(batch); w != NULL; w = queued_add(w->link.next)) {
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
}

int sqlst_inbox_committer_start(struct sqlite_store *s, struct err *err)
{
    return gcommit_new(&s->inbox_committer, "inbox-commit", GCOMMIT_WAKE_ALL, commit_adds, s, err);
}

int sqlst_inbox_add(bool *duplicate_out, struct task_store *st, const struct inbox_entry *e,
                    struct err *err)
{
    struct sqlite_store *s = sqlst_of(st);
    struct inbox_job w;

    memset(&w, 0, sizeof(w));
    w.e = e;
    gcommit_run(s->inbox_committer, &w.link);
    *duplicate_out = w.dup;
    if (w.rc != E_OK && err != NULL) {
        *err = w.err;
    }
    return w.rc;
}
