/* SPDX-License-Identifier: Apache-2.0 */
/* Multi-statement write transactions on the SQLite store: the meter's group commit and the
 * controller's token lifecycle change a task, the meter request ids and the token index
 * atomically. Events are held back until COMMIT succeeds, so watchers never see a change
 * that was rolled back. */
#include <stdlib.h>
#include <string.h>

#include "store/sqlite/store_sqlite_int.h"

struct sqlst_txn {
    struct task_txn base;   /* must be first: what the dispatch sees */
    struct sqlite_store *s; /* borrowed; mu held for the whole transaction */
    int64_t rv_begin;       /* s->rv at BEGIN: restored on rollback */
    int64_t rv_savepoint;   /* s->rv at the open savepoint */
    struct event *events;   /* owned: held back until COMMIT */
    size_t nevents, capevents;
    size_t nevents_savepoint; /* events before the open savepoint */
};

static struct sqlst_txn *sqtx(struct task_txn *txb)
{
    return container_of(txb, struct sqlst_txn, base);
}

static void drop_events(struct sqlst_txn *tx, size_t keep)
{
    for (size_t i = keep; i < tx->nevents; i++) {
        free(tx->events[i].json);
    }
    tx->nevents = keep;
}

int sqlst_txn(struct task_store *st, task_txn_fn fn, void *userdata, struct err *err)
{
    struct sqlite_store *s = sqlst_of(st);
    struct sqlst_txn tx = {.base = {.st = st}, .s = s};
    int rc;

    pthread_mutex_lock(&s->mu);
    tx.rv_begin = s->rv;
    rc = sqlst_exec(s, "BEGIN IMMEDIATE", err);
    if (rc != E_OK) {
        goto out;
    }
    rc = fn(&tx.base, userdata);
    if (rc == E_OK && s->rv != tx.rv_begin) {
        /* Once per transaction, however many objects it wrote (sqlst_write_obj). */
        rc = sqlst_bump_rv(s, s->rv, err);
    }
    if (rc == E_OK) {
        rc = sqlst_meter_precommit(s, err);
    }
    if (rc == E_OK) {
        rc = sqlst_exec(s, "COMMIT", err);
    }
    if (rc == E_OK) {
        sqlst_meter_committed(s);
    }
    if (rc != E_OK) {
        (void)sqlst_exec(s, "ROLLBACK", NULL);
        s->rv = tx.rv_begin;
        drop_events(&tx, 0);
        /* Cached objects may carry changes that were just undone. */
        json_object_clear(s->cache);
        sqlst_meter_index_free(s); /* may hold ids just rolled back: reload on next use */
        goto out;
    }
    sqlst_mem_apply(s->mem, tx.events, tx.nevents); /* before the change is acknowledged */
    for (size_t i = 0; i < tx.nevents; i++) {
        sqlst_publish(s, &tx.events[i]);
    }
    drop_events(&tx, 0);
out:
    pthread_mutex_unlock(&s->mu);
    free(tx.events);
    return rc;
}

/* --- the change-event ring --------------------------------------------------------------
 * At most EVENT_RING events and STORE_EVENT_RING_BYTES of JSON (security review finding
 * 7b: a copy of a large task per heartbeat): the oldest go first. An evicted slot is empty
 * (rv 0), so a watcher that fell behind it gets "too old resource version" (410). */

static void ring_drop(struct sqlite_store *s, struct event *slot)
{
    if (slot->json != NULL) {
        s->ring_bytes -= slot->bytes;
        free(slot->json);
    }
    memset(slot, 0, sizeof(*slot));
}

void sqlst_publish(struct sqlite_store *s, struct event *ev)
{
    struct event *slot = &s->ring[ev->rv % EVENT_RING];

    pthread_mutex_lock(&s->ring_mu);
    ring_drop(s, slot); /* the event EVENT_RING changes ago */
    if (s->ring_oldest < ev->rv - EVENT_RING + 1) {
        s->ring_oldest = ev->rv - EVENT_RING + 1;
    }
    /* ring_oldest only moves forward, so this loop is O(1) amortized. */
    while (s->ring_bytes + ev->bytes > STORE_EVENT_RING_BYTES && s->ring_oldest < ev->rv) {
        struct event *old = &s->ring[s->ring_oldest % EVENT_RING];
        if (old->rv == s->ring_oldest) {
            ring_drop(s, old);
        }
        s->ring_oldest++;
    }
    *slot = *ev;
    s->ring_bytes += ev->bytes;
    if (ev->rv > s->ring_rv) {
        s->ring_rv = ev->rv;
    }
    ev->json = NULL;
    pthread_cond_broadcast(&s->changed);
    pthread_mutex_unlock(&s->ring_mu);
}

void task_store_sqlite_mem(struct task_store_mem *out, struct task_store *st)
{
    struct sqlite_store *s;

    memset(out, 0, sizeof(*out));
    if (strcmp(st->ops->name, "sqlite") != 0) {
        return; /* another backend: nothing of this in memory */
    }
    s = sqlst_of(st);
    pthread_mutex_lock(&s->mu);
    out->meter_index_ids = json_object_size(s->meter_ids) + json_object_size(s->meter_sealed);
    out->meter_index_bytes = s->meter_ids_bytes + s->meter_sealed_bytes;
    out->meter_filter_ready = s->meter_seen_ready;
    out->meter_lookups = s->meter_lookups;
    pthread_mutex_unlock(&s->mu);
    sqlst_mem_stats(s->mem, &out->task_copies, &out->task_copy_bytes, &out->task_copy_on);
    pthread_mutex_lock(&s->ring_mu);
    out->event_bytes = s->ring_bytes;
    for (size_t i = 0; i < EVENT_RING; i++) {
        out->events += s->ring[i].json != NULL;
    }
    pthread_mutex_unlock(&s->ring_mu);
}

/* The cache holds at most this many parsed tasks; past it, it starts over. */
#define CACHE_MAX 4096

void sqlst_cache_forget(struct sqlite_store *s, const char *ns, const char *name)
{
    char small[SQLST_KEY_SMALL], *key;

    if (ns == NULL || name == NULL) {
        return;
    }
    key = sqlst_key(small, ns, '/', name);
    json_object_del(s->cache, key);
    sqlst_key_free(key, small);
}

int sqlst_txn_get(json_t **out, struct task_txn *txb, const char *ns, const char *name,
                  struct err *err)
{
    struct sqlst_txn *tx = sqtx(txb);
    char small[SQLST_KEY_SMALL], *key = sqlst_key(small, ns, '/', name);
    json_t *hit = json_object_get(tx->s->cache, key);
    int rc;

    *out = NULL;
    if (hit != NULL) {
        *out = json_incref(hit);
        sqlst_key_free(key, small);
        return E_OK;
    }
    rc = sqlst_read_obj(out, tx->s, "tasks", ns, name, err);
    if (rc == E_OK) {
        if (json_object_size(tx->s->cache) >= CACHE_MAX) {
            json_object_clear(tx->s->cache);
        }
        json_object_set(tx->s->cache, key, *out);
    }
    sqlst_key_free(key, small);
    return rc;
}

int sqlst_txn_put(struct task_txn *txb, json_t *doc, struct err *err)
{
    struct sqlst_txn *tx = sqtx(txb);
    char *text = NULL;
    int rc;

    sqlst_set_rv(doc, tx->s->rv + 1);
    rc = sqlst_write_obj(tx->s, doc, false, true, &text, err);
    if (rc != E_OK) {
        return rc;
    }
    if (tx->nevents == tx->capevents) {
        tx->capevents = tx->capevents == 0 ? 16 : tx->capevents * 2;
        tx->events = xrealloc(tx->events, tx->capevents * sizeof(*tx->events));
    }
    store_event_fill(&tx->events[tx->nevents], tx->s->rv, TASK_EVENT_MODIFIED, doc, text);
    {
        const json_t *md = json_object_get(doc, "metadata");
        char small[SQLST_KEY_SMALL];
        char *key = sqlst_key(small, json_string_value(json_object_get(md, "namespace")), '/',
                              json_string_value(json_object_get(md, "name")));
        json_object_set(tx->s->cache, key, doc);
        sqlst_key_free(key, small);
    }
    tx->nevents++;
    return E_OK;
}

static int run_stmt(struct sqlst_txn *tx, enum sqlst_stmt_id id, const char *what, struct err *err)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlst_stmt(&st, tx->s, id, err);

    return rc != E_OK ? rc : sqlst_step_done(tx->s, st, what, err);
}

int sqlst_txn_savepoint(struct task_txn *txb, struct err *err)
{
    struct sqlst_txn *tx = sqtx(txb);
    tx->rv_savepoint = tx->s->rv;
    tx->nevents_savepoint = tx->nevents;
    return run_stmt(tx, SQLST_SAVEPOINT, "savepoint", err);
}

int sqlst_txn_release(struct task_txn *txb, struct err *err)
{
    struct sqlst_txn *tx = sqtx(txb);
    return run_stmt(tx, SQLST_RELEASE, "release savepoint", err);
}

void sqlst_txn_rollback_savepoint(struct task_txn *txb)
{
    struct sqlst_txn *tx = sqtx(txb);
    json_object_clear(tx->s->cache);
    sqlst_meter_index_free(tx->s);
    (void)run_stmt(tx, SQLST_ROLLBACK_TO, "rollback to savepoint", NULL);
    (void)run_stmt(tx, SQLST_RELEASE, "release savepoint", NULL);
    tx->s->rv = tx->rv_savepoint;
    drop_events(tx, tx->nevents_savepoint);
}

static int token_current(struct token_record *out, struct sqlite_store *s, const char *ns,
                         const char *name, struct err *err)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlst_stmt(&st, s, SQLST_TOKEN_CURRENT, err), step;

    memset(out, 0, sizeof(*out));
    if (rc != E_OK) {
        return rc;
    }
    sqlite3_bind_text(st, 1, ns, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, name, -1, SQLITE_STATIC);
    step = sqlite3_step(st);
    if (step == SQLITE_ROW) {
        snprintf(out->token_id, sizeof(out->token_id), "%s",
                 (const char *)sqlite3_column_text(st, 0));
        out->generation = sqlite3_column_int64(st, 1);
        out->active = strcmp((const char *)sqlite3_column_text(st, 2), "active") == 0;
        out->token = xstrdup((const char *)sqlite3_column_text(st, 3));
        rc = E_OK;
    } else if (step == SQLITE_DONE) {
        rc = err_set(err, E_NOTFOUND, "agenttasks \"%s\" has no token", name);
    } else {
        rc = sqlst_db_err(s, step, "token lookup", err);
    }
    sqlite3_reset(st);
    return rc;
}

int sqlst_txn_token_current(struct token_record *out, struct task_txn *txb, const char *ns,
                            const char *name, struct err *err)
{
    struct sqlst_txn *tx = sqtx(txb);
    return token_current(out, tx->s, ns, name, err);
}

int sqlst_token_current(struct token_record *out, struct task_store *st, const char *ns,
                        const char *name, struct err *err)
{
    struct sqlite_store *s = sqlst_of(st);
    int rc;

    pthread_mutex_lock(&s->mu);
    rc = token_current(out, s, ns, name, err);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int sqlst_txn_token_add(struct task_txn *txb, const char *ns, const char *name, int64_t generation,
                        const char *token_id, const char *token, struct err *err)
{
    struct sqlst_txn *tx = sqtx(txb);
    sqlite3_stmt *st = NULL;
    int rc = sqlst_stmt(&st, tx->s, SQLST_TOKEN_INSERT, err);

    if (rc != E_OK) {
        return rc;
    }
    sqlite3_bind_text(st, 1, ns, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, name, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, generation);
    sqlite3_bind_text(st, 4, token_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 5, token, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 6, clock_now_ms(tx->s->base.clock));
    tx->s->token_epoch++;
    return sqlst_step_done(tx->s, st, "add token", err);
}

int sqlst_txn_token_revoke(struct task_txn *txb, const char *ns, const char *name, struct err *err)
{
    struct sqlst_txn *tx = sqtx(txb);
    sqlite3_stmt *st = NULL;
    int rc = sqlst_stmt(&st, tx->s, SQLST_TOKEN_REVOKE, err);

    if (rc != E_OK) {
        return rc;
    }
    sqlite3_bind_text(st, 1, ns, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, name, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, clock_now_ms(tx->s->base.clock));
    tx->s->token_epoch++;
    return sqlst_step_done(tx->s, st, "revoke token", err);
}

int sqlst_txn_token_epoch(uint64_t *out, struct task_txn *txb)
{
    struct sqlst_txn *tx = sqtx(txb);
    *out = tx->s->token_epoch;
    return E_OK;
}

void task_store_sqlite_copy_limit(struct task_store *st, size_t max_bytes)
{
    if (strcmp(st->ops->name, "sqlite") == 0) {
        sqlst_mem_limit(sqlst_of(st)->mem, max_bytes);
    }
}

struct sqlite_store *sqlst_txn_store(struct task_txn *txb)
{
    struct sqlst_txn *tx = sqtx(txb);
    return tx->s;
}

int sqlst_txn_create(json_t **out, struct task_txn *txb, const json_t *obj, struct err *err)
{
    struct sqlst_txn *tx = sqtx(txb);
    json_t *doc = json_deep_copy(obj);
    json_t *md = json_object_get(doc, "metadata");
    char uid[37], ts[CLOCK_RFC3339_MAX];
    char *text = NULL;
    int rc;

    if (out != NULL) {
        *out = NULL;
    }
    store_new_uid(uid);
    clock_rfc3339(ts, clock_now_ms(tx->s->base.clock));
    json_object_set_new(md, "uid", json_string(uid));
    json_object_set_new(md, "creationTimestamp", json_string(ts));
    json_object_set_new(md, "generation", json_integer(1));
    sqlst_set_rv(doc, tx->s->rv + 1);
    rc = sqlst_write_obj(tx->s, doc, true, true, &text, err);
    if (rc != E_OK) {
        json_decref(doc);
        return rc;
    }
    if (tx->nevents == tx->capevents) {
        tx->capevents = tx->capevents == 0 ? 16 : tx->capevents * 2;
        tx->events = xrealloc(tx->events, tx->capevents * sizeof(*tx->events));
    }
    store_event_fill(&tx->events[tx->nevents], tx->s->rv, TASK_EVENT_ADDED, doc, text);
    tx->nevents++;
    if (out != NULL) {
        *out = doc;
    } else {
        json_decref(doc);
    }
    return E_OK;
}
