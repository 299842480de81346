/* SPDX-License-Identifier: Apache-2.0 */
/* The durable inbox (comments accepted from SCMs, applied by the bot exactly once) and
 * outbox (calls to make at SCMs, retried until they succeed). Both hand out work in
 * arrival order per PR/MR, so commands and replies keep the reviewer's order. Adding to
 * the inbox (a group commit) is in store_sqlite_inbox.c. */
#include <stdlib.h>
#include <string.h>

#include "store/sqlite/store_sqlite_int.h"

void sqlst_bind_opt(sqlite3_stmt *q, int idx, const char *v)
{
    if (v != NULL) {
        sqlite3_bind_text(q, idx, v, -1, SQLITE_TRANSIENT);
    } else {
        sqlite3_bind_null(q, idx);
    }
}

/* Runs SQL with one int64 and one optional text parameter, under mu. */
static int run(struct sqlite_store *s, const char *sql, int64_t a, int64_t b, const char *text,
               struct err *err)
{
    sqlite3_stmt *q = NULL;
    int rc = sqlst_prepare_cached(&q, s, sql, err);

    if (rc != E_OK) {
        return rc;
    }
    sqlite3_bind_int64(q, 1, a);
    sqlite3_bind_int64(q, 2, b);
    sqlst_bind_opt(q, 3, text);
    rc = sqlst_step_done(s, q, "queue update", err);
    sqlst_unprepare(s, q);
    return rc;
}

/* --- inbox ------------------------------------------------------------------------ */

/* How many pending rows one pick looks at, at most (a bound on a pathological backlog of
 * many PRs all backing off; the rest is found on a later pick). */
#define NEXT_SCAN_MAX 4096

typedef void (*row_fn)(sqlite3_stmt *q, size_t index, void *userdata);

/* One pending row of a next_due scan (lanes in SEEN): hands it to FN as number *N when it
 * is due and its lane still open, else closes the lane and keeps the shortest wait. */
static void take_row(sqlite3_stmt *q, int key_col, json_t *seen, int64_t now, size_t *n,
                     int64_t *wait_ms, row_fn fn, void *userdata)
{
    const char *key = (const char *)sqlite3_column_text(q, key_col);
    json_t *open = json_object_get(seen, key);

    switch (store_queue_claim(wait_ms, open != NULL && !json_is_true(open),
                              sqlite3_column_int64(q, 0), now, false)) {
    case STORE_CLAIM_TAKE:
        fn(q, (*n)++, userdata);
        json_object_set_new(seen, key, json_true());
        break;
    case STORE_CLAIM_CLOSE:
        json_object_set_new(seen, key, json_false());
        break;
    case STORE_CLAIM_PASS:
        break;
    }
}

/* Hands up to MAX due pending rows of TABLE to FN, oldest first, never one that would
 * overtake an older pending row of its lane that is not handed out with it (rows of one
 * lane come in order, consecutively from its oldest); *n_out how many. A lane is a PR/MR,
 * split further by the SQL expression LANE (the outbox keeps each sticky comment in its own
 * lane, so an edit throttled to later never holds back a reply or a reaction). When none is due:
 * E_NOTFOUND, and *wait_ms_out the time to the next due one (-1 none). Walks the pending rows in
 * arrival order (a partial index), so the usual pick is the first row. Caller holds mu. COLS starts
 * with next_ms. */
static int next_due(size_t *n_out, int64_t *wait_ms_out, struct sqlite_store *s, const char *table,
                    const char *cols, const char *lane, int64_t now, size_t max, row_fn fn,
                    void *userdata, struct err *err)
{
    char *sql = xasprintf("SELECT %s, provider || '/' || project || '#' || number || %s FROM %s "
                          "WHERE state='pending' ORDER BY id",
                          cols, lane, table);
    sqlite3_stmt *q = NULL;
    json_t *seen = NULL;
    int rc = sqlst_prepare_cached(&q, s, sql, err), step = SQLITE_DONE, key_col, scanned = 0;

    free(sql);
    *n_out = 0;
    *wait_ms_out = -1;
    if (rc != E_OK) {
        return rc;
    }
    key_col = sqlite3_column_count(q) - 1;
    /* Per PR: true while every pending row of it so far was due and taken (the next one may
     * follow it into this batch, in order); false once one was not (nothing after it may
     * overtake it). */
    seen = json_object();
    while (*n_out < max && scanned++ < NEXT_SCAN_MAX && (step = sqlite3_step(q)) == SQLITE_ROW) {
        if (*n_out > 0 && scanned > (int)max + 256) {
            break; /* enough found: the rest waits for the next pick */
        }
        take_row(q, key_col, seen, now, n_out, wait_ms_out, fn, userdata);
    }
    json_decref(seen);
    sqlst_unprepare(s, q);
    if (step != SQLITE_ROW && step != SQLITE_DONE) {
        return sqlst_db_err(s, step, "queue next", err);
    }
    if (*n_out > 0) {
        return E_OK;
    }
    if (step == SQLITE_ROW && *wait_ms_out < 0) {
        *wait_ms_out = 1000; /* the scan was cut short: look again soon */
    }
    return E_NOTFOUND;
}

#define INBOX_COLS                                                                                 \
    "next_ms, id, provider, delivery_id, project, number, comment_id, author, "                    \
    "author_association, author_id, installation_id, body, extra, attempts"

static void inbox_row(sqlite3_stmt *q, size_t index, void *userdata)
{
    struct inbox_entry *out = (struct inbox_entry *)userdata + index;

    out->id = sqlite3_column_int64(q, 1);
    snprintf(out->provider, sizeof(out->provider), "%s", sqlite3_column_text(q, 2));
    out->delivery_id = sqlst_col_dup(q, 3);
    out->project = sqlst_col_dup(q, 4);
    out->number = sqlite3_column_int64(q, 5);
    out->comment_id = sqlst_col_dup(q, 6);
    out->author = sqlst_col_dup(q, 7);
    out->author_association = sqlst_col_dup(q, 8);
    out->author_id = sqlite3_column_int64(q, 9);
    out->installation_id = sqlite3_column_int64(q, 10);
    out->body = sqlst_col_dup(q, 11);
    out->extra = sqlst_col_dup(q, 12);
    out->attempts = sqlite3_column_int(q, 13);
}

int sqlst_inbox_next_batch(struct inbox_entry *out, size_t max, size_t *n_out, int64_t *wait_ms_out,
                           struct task_store *st, struct err *err)
{
    struct sqlite_store *s = sqlst_of(st);
    int rc;

    memset(out, 0, max * sizeof(*out));
    pthread_mutex_lock(&s->mu);
    rc = next_due(n_out, wait_ms_out, s, "inbox", INBOX_COLS, "''", clock_now_ms(st->clock), max,
                  inbox_row, out, err);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

static int retry(struct task_store *st, const char *table, int64_t id, int64_t delay_ms,
                 bool failed, const char *error, struct err *err)
{
    struct sqlite_store *s = sqlst_of(st);
    char *sql = xasprintf("UPDATE %s SET attempts=attempts+1, next_ms=?2, error=?3, state=%s "
                          "WHERE id=?1",
                          table, failed ? "'failed'" : "'pending'");
    int rc;

    pthread_mutex_lock(&s->mu);
    rc = run(s, sql, id, clock_now_ms(st->clock) + delay_ms, error, err);
    if (strcmp(table, "outbox") == 0) {
        s->outbox_inflight = 0;
    }
    pthread_mutex_unlock(&s->mu);
    free(sql);
    return rc;
}

int sqlst_inbox_retry(struct task_store *st, int64_t id, int64_t delay_ms, bool failed,
                      const char *error, struct err *err)
{
    return retry(st, "inbox", id, delay_ms, failed, error, err);
}

int sqlst_txn_inbox_fail(struct task_txn *tx, int64_t id, const char *error, struct err *err)
{
    return run(
        sqlst_txn_store(tx),
        "UPDATE inbox SET state='failed', attempts=attempts+1, error=?3 WHERE id=?1 AND ?2=?2", id,
        0, error, err);
}

int sqlst_txn_inbox_done(struct task_txn *tx, int64_t id, struct err *err)
{
    return run(sqlst_txn_store(tx), "UPDATE inbox SET state='done', error=?3 WHERE id=?1 AND ?2=?2",
               id, 0, NULL, err);
}

static int count_pending(int64_t *out, struct task_store *st, const char *table, struct err *err)
{
    struct sqlite_store *s = sqlst_of(st);
    char *sql = xasprintf("SELECT count(*) FROM %s WHERE state='pending'", table);
    sqlite3_stmt *q = NULL;
    int rc;

    *out = 0;
    pthread_mutex_lock(&s->mu);
    rc = sqlst_prepare(&q, s, sql, err);
    if (rc == E_OK && sqlite3_step(q) == SQLITE_ROW) {
        *out = sqlite3_column_int64(q, 0);
    }
    sqlite3_finalize(q);
    pthread_mutex_unlock(&s->mu);
    free(sql);
    return rc;
}

int sqlst_inbox_depth(int64_t *out, struct task_store *st, struct err *err)
{
    return count_pending(out, st, "inbox", err);
}

int sqlst_inbox_installation(int64_t *out, struct task_store *st, const char *provider,
                             const char *project, struct err *err)
{
    struct sqlite_store *s = sqlst_of(st);
    sqlite3_stmt *q = NULL;
    int rc, step;

    *out = 0;
    pthread_mutex_lock(&s->mu);
    /* The (provider, project, comment_id) unique index narrows this to the project. */
    rc = sqlst_prepare(&q, s,
                       "SELECT installation_id FROM inbox WHERE provider=?1 AND project=?2 AND "
                       "installation_id<>0 ORDER BY id DESC LIMIT 1",
                       err);
    if (rc == E_OK) {
        sqlite3_bind_text(q, 1, provider, -1, SQLITE_STATIC);
        sqlite3_bind_text(q, 2, project, -1, SQLITE_STATIC);
        step = sqlite3_step(q);
        if (step == SQLITE_ROW) {
            *out = sqlite3_column_int64(q, 0);
        } else if (step != SQLITE_DONE) {
            rc = sqlst_db_err(s, step, "inbox installation", err);
        }
        sqlite3_finalize(q);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* --- outbox ------------------------------------------------------------------------ */

int sqlst_txn_outbox_add(int64_t *id_out, struct task_txn *tx, const struct outbox_entry *e,
                         struct err *err)
{
    struct sqlite_store *s = sqlst_txn_store(tx);
    int64_t now = clock_now_ms(s->base.clock);
    sqlite3_stmt *q = NULL;
    int rc;

    if (id_out != NULL) {
        *id_out = 0;
    }
    if (e->coalesce_key != NULL) {
        /* A pending entry with the same key takes the newer body (and stays in its place
         * in the queue): a newer edit supersedes an older one not yet sent. It may go out
         * sooner, unless it waits after a failure: Retry-After and backoff still hold. */
        rc = sqlst_prepare_cached(&q, s,
                                  "UPDATE outbox SET body=?2, next_ms=CASE WHEN attempts > 0 THEN "
                                  "next_ms ELSE min(next_ms, max(?3, ?4)) END WHERE "
                                  "coalesce_key=?1 AND state='pending' AND id<>?5 RETURNING id",
                                  err);
        if (rc != E_OK) {
            return rc;
        }
        sqlite3_bind_text(q, 1, e->coalesce_key, -1, SQLITE_STATIC);
        sqlst_bind_opt(q, 2, e->body);
        sqlite3_bind_int64(q, 3, now);
        sqlite3_bind_int64(q, 4, e->not_before_ms);
        /* Never into the entry being sent: its newer body would be marked sent unsent. */
        sqlite3_bind_int64(q, 5, s->outbox_inflight);
        if (sqlite3_step(q) == SQLITE_ROW) {
            if (id_out != NULL) {
                *id_out = sqlite3_column_int64(q, 0);
            }
            sqlst_unprepare(s, q);
            s->outbox_gen++;
            pthread_cond_broadcast(&s->outbox_cv);
            return E_OK;
        }
        sqlst_unprepare(s, q);
    }
    /* Both statements are cached: the bot queues a reply or a reaction for most comments. */
    rc = sqlst_prepare_cached(&q, s,
                              "INSERT INTO outbox(provider,kind,project,number,target,body,"
                              "coalesce_key,installation_id,next_ms,created_ms) "
                              "VALUES(?1,?2,?3,?4,?5,?6,?7,?8,max(?9,?10),?9)",
                              err);
    if (rc != E_OK) {
        return rc;
    }
    sqlite3_bind_text(q, 1, e->provider, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 2, e->kind, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 3, e->project, -1, SQLITE_STATIC);
    sqlite3_bind_int64(q, 4, e->number);
    sqlst_bind_opt(q, 5, e->target);
    sqlst_bind_opt(q, 6, e->body);
    sqlst_bind_opt(q, 7, e->coalesce_key);
    sqlite3_bind_int64(q, 8, e->installation_id);
    sqlite3_bind_int64(q, 9, now);
    sqlite3_bind_int64(q, 10, e->not_before_ms);
    rc = sqlst_step_done(s, q, "outbox add", err);
    sqlst_unprepare(s, q);
    if (rc == E_OK) {
        if (id_out != NULL) {
            *id_out = sqlite3_last_insert_rowid(s->db);
        }
        s->outbox_gen++;
        pthread_cond_broadcast(&s->outbox_cv);
    }
    return rc;
}

/* Sticky comments ("sticky/..." coalescing keys) each get a lane of their own; every other
 * call of a PR/MR (reactions, replies) shares the PR's lane, in order. */
#define OUTBOX_LANE                                                                                \
    "CASE WHEN substr(coalesce_key, 1, 7) = 'sticky/' THEN ' ' || coalesce_key ELSE '' END"

static void outbox_row(sqlite3_stmt *q, size_t index, void *userdata)
{
    struct outbox_entry *out = (struct outbox_entry *)userdata + index;

    out->id = sqlite3_column_int64(q, 1);
    snprintf(out->provider, sizeof(out->provider), "%s", sqlite3_column_text(q, 2));
    snprintf(out->kind, sizeof(out->kind), "%s", sqlite3_column_text(q, 3));
    out->project = sqlst_col_dup(q, 4);
    out->number = sqlite3_column_int64(q, 5);
    out->target = sqlst_col_dup(q, 6);
    out->body = sqlst_col_dup(q, 7);
    out->coalesce_key = sqlst_col_dup(q, 8);
    out->installation_id = sqlite3_column_int64(q, 9);
    out->attempts = sqlite3_column_int(q, 10);
}

int sqlst_outbox_next(struct outbox_entry *out, int64_t *wait_ms_out, struct task_store *st,
                      struct err *err)
{
    struct sqlite_store *s = sqlst_of(st);
    size_t n = 0;
    int rc;

    memset(out, 0, sizeof(*out));
    pthread_mutex_lock(&s->mu);
    rc = next_due(&n, wait_ms_out, s, "outbox",
                  "next_ms, id, provider, kind, project, number, target, body, coalesce_key, "
                  "installation_id, attempts",
                  OUTBOX_LANE, clock_now_ms(st->clock), 1, outbox_row, out, err);
    if (rc == E_OK) {
        s->outbox_inflight = out->id;
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int sqlst_outbox_done(struct task_store *st, int64_t id, const char *result, struct err *err)
{
    struct sqlite_store *s = sqlst_of(st);
    int rc;

    pthread_mutex_lock(&s->mu);
    rc = run(s, "UPDATE outbox SET state='done', result=?3, error=NULL WHERE id=?1 AND ?2=?2", id,
             0, result, err);
    s->outbox_inflight = 0;
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int sqlst_outbox_defer(struct task_store *st, int64_t id, int64_t delay_ms, const char *why,
                       struct err *err)
{
    struct sqlite_store *s = sqlst_of(st);
    int rc;

    pthread_mutex_lock(&s->mu);
    rc = run(s, "UPDATE outbox SET next_ms=?2, error=?3 WHERE id=?1 AND state='pending'", id,
             clock_now_ms(st->clock) + delay_ms, why, err);
    s->outbox_inflight = 0;
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int sqlst_outbox_retry(struct task_store *st, int64_t id, int64_t delay_ms, bool failed,
                       const char *error, struct err *err)
{
    return retry(st, "outbox", id, delay_ms, failed, error, err);
}

int sqlst_outbox_result(char **out, char state_out[16], struct task_store *st, int64_t id,
                        struct err *err)
{
    struct sqlite_store *s = sqlst_of(st);
    sqlite3_stmt *q = NULL;
    int rc, step;

    *out = NULL;
    state_out[0] = '\0';
    pthread_mutex_lock(&s->mu);
    rc = sqlst_prepare(&q, s, "SELECT state, result FROM outbox WHERE id=?1", err);
    if (rc == E_OK) {
        sqlite3_bind_int64(q, 1, id);
        step = sqlite3_step(q);
        if (step == SQLITE_ROW) {
            snprintf(state_out, 16, "%s", sqlite3_column_text(q, 0));
            *out = sqlst_col_dup(q, 1);
        } else {
            rc = err_set(err, E_NOTFOUND, "no outbox entry %lld", (long long)id);
        }
        sqlite3_finalize(q);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int sqlst_outbox_depth(int64_t *out, struct task_store *st, struct err *err)
{
    return count_pending(out, st, "outbox", err);
}

int64_t sqlst_queue_gen(struct task_store *st, bool outbox)
{
    struct sqlite_store *s = sqlst_of(st);

    return store_gen_get(&s->mu, outbox ? &s->outbox_gen : &s->inbox_gen);
}

void sqlst_queue_wait(struct task_store *st, bool outbox, int64_t since_gen, int64_t timeout_ms)
{
    struct sqlite_store *s = sqlst_of(st);

    /* each queue has its own condition variable: an inbox add wakes no outbox worker */
    store_gen_wait(&s->mu, outbox ? &s->outbox_cv : &s->inbox_cv,
                   outbox ? &s->outbox_gen : &s->inbox_gen, since_gen, timeout_ms);
}

int sqlst_totals(struct task_totals *out, struct task_store *st, struct err *err)
{
    struct sqlite_store *s = sqlst_of(st);
    sqlite3_stmt *q = NULL;
    int rc;

    memset(out, 0, sizeof(*out));
    pthread_mutex_lock(&s->mu);
    rc = sqlst_prepare(&q, s,
                       "SELECT total(CAST(json_extract(doc,'$.status.costUSD') AS REAL)), "
                       "total(json_extract(doc,'$.status.tokensConsumed')) FROM tasks",
                       err);
    if (rc == E_OK && sqlite3_step(q) == SQLITE_ROW) {
        out->cost_usd = sqlite3_column_double(q, 0);
        out->tokens = (int64_t)sqlite3_column_double(q, 1);
    }
    sqlite3_finalize(q);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

void sqlst_outbox_release(struct task_store *st)
{
    struct sqlite_store *s = sqlst_of(st);

    pthread_mutex_lock(&s->mu);
    s->outbox_inflight = 0;
    pthread_mutex_unlock(&s->mu);
}
