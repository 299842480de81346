/* SPDX-License-Identifier: Apache-2.0 */
/* Multi-statement write transactions on the SQLite store: the meter's group commit and the
 * controller's token lifecycle change a task, the meter request ids and the token index
 * atomically. Events are held back until COMMIT succeeds, so watchers never see a change
 * that was rolled back. */
#include <stdlib.h>
#include <string.h>

#include "store/store_int.h"

struct task_txn {
    struct sqlite_store *s;          /* borrowed; mu held for the whole transaction */
    int64_t rv_begin;                /* s->rv at BEGIN: restored on rollback */
    int64_t rv_savepoint;            /* s->rv at the open savepoint */
    struct event *events;            /* owned: held back until COMMIT */
    size_t nevents, capevents;
    size_t nevents_savepoint;        /* events before the open savepoint */
};

static void drop_events(struct task_txn *tx, size_t keep)
{
    for (size_t i = keep; i < tx->nevents; i++) {
        free(tx->events[i].json);
    }
    tx->nevents = keep;
}

int sqlst_txn(struct task_store *st, task_txn_fn fn, void *userdata, struct err *err)
{
    struct sqlite_store *s = sqlst_of(st);
    struct task_txn tx = {.s = s};
    int rc;

    pthread_mutex_lock(&s->mu);
    tx.rv_begin = s->rv;
    rc = sqlst_exec(s, "BEGIN IMMEDIATE", err);
    if (rc != E_OK) {
        goto out;
    }
    rc = fn(&tx, userdata);
    if (rc == E_OK) {
        rc = sqlst_exec(s, "COMMIT", err);
    }
    if (rc != E_OK) {
        (void)sqlst_exec(s, "ROLLBACK", NULL);
        s->rv = tx.rv_begin;
        drop_events(&tx, 0);
        /* Cached objects may carry changes that were just undone. */
        json_object_clear(s->cache);
        json_decref(s->meter_ids); /* may hold ids just rolled back: reload on next use */
        s->meter_ids = NULL;
        goto out;
    }
    for (size_t i = 0; i < tx.nevents; i++) {
        sqlst_publish(s, &tx.events[i]);
    }
    drop_events(&tx, 0);
out:
    pthread_mutex_unlock(&s->mu);
    free(tx.events);
    return rc;
}

/* The cache holds at most this many parsed tasks; past it, it starts over. */
#define CACHE_MAX 4096

static char *cache_key(const char *ns, const char *name)
{
    return xasprintf("%s/%s", ns, name);
}

void sqlst_cache_forget(struct sqlite_store *s, const char *ns, const char *name)
{
    char *key;

    if (ns == NULL || name == NULL) {
        return;
    }
    key = cache_key(ns, name);
    json_object_del(s->cache, key);
    free(key);
}

int task_txn_get(json_t **out, struct task_txn *tx, const char *ns, const char *name,
                 struct err *err)
{
    char *key = cache_key(ns, name);
    json_t *hit = json_object_get(tx->s->cache, key);
    int rc;

    *out = NULL;
    if (hit != NULL) {
        *out = json_incref(hit);
        free(key);
        return E_OK;
    }
    rc = sqlst_read_obj(out, tx->s, "tasks", ns, name, err);
    if (rc == E_OK) {
        if (json_object_size(tx->s->cache) >= CACHE_MAX) {
            json_object_clear(tx->s->cache);
        }
        json_object_set(tx->s->cache, key, *out);
    }
    free(key);
    return rc;
}

int task_txn_put(struct task_txn *tx, json_t *doc, struct err *err)
{
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
    sqlst_event_fill(&tx->events[tx->nevents], tx->s->rv, TASK_EVENT_MODIFIED, doc, text);
    {
        struct task_view v;
        char *key;
        task_view_of(&v, doc);
        key = cache_key(v.ns, v.name);
        json_object_set(tx->s->cache, key, doc);
        free(key);
    }
    tx->nevents++;
    return E_OK;
}

static int run_stmt(struct task_txn *tx, enum sqlst_stmt_id id, const char *what, struct err *err)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlst_stmt(&st, tx->s, id, err);

    return rc != E_OK ? rc : sqlst_step_done(tx->s, st, what, err);
}

int task_txn_savepoint(struct task_txn *tx, struct err *err)
{
    tx->rv_savepoint = tx->s->rv;
    tx->nevents_savepoint = tx->nevents;
    return run_stmt(tx, SQLST_SAVEPOINT, "savepoint", err);
}

int task_txn_release(struct task_txn *tx, struct err *err)
{
    return run_stmt(tx, SQLST_RELEASE, "release savepoint", err);
}

void task_txn_rollback_savepoint(struct task_txn *tx)
{
    json_object_clear(tx->s->cache);
    json_decref(tx->s->meter_ids);
    tx->s->meter_ids = NULL;
    (void)run_stmt(tx, SQLST_ROLLBACK_TO, "rollback to savepoint", NULL);
    (void)run_stmt(tx, SQLST_RELEASE, "release savepoint", NULL);
    tx->s->rv = tx->rv_savepoint;
    drop_events(tx, tx->nevents_savepoint);
}

/* Loads every charged request id (both the old table and the log) into memory, once. */
static int load_meter_ids(struct sqlite_store *s, struct err *err)
{
    sqlite3_stmt *st = NULL;
    int rc, step;

    if (s->meter_ids != NULL) {
        return E_OK;
    }
    rc = sqlst_stmt(&st, s, SQLST_METER_IDS, err);
    if (rc != E_OK) {
        return rc;
    }
    s->meter_ids = json_object();
    while ((step = sqlite3_step(st)) == SQLITE_ROW) {
        const char *uid = (const char *)sqlite3_column_text(st, 0);
        json_t *set = json_object_get(s->meter_ids, uid);
        if (set == NULL) {
            set = json_object();
            json_object_set_new(s->meter_ids, uid, set);
        }
        json_object_set_new(set, (const char *)sqlite3_column_text(st, 1), json_true());
    }
    sqlite3_reset(st);
    if (step != SQLITE_DONE) {
        json_decref(s->meter_ids);
        s->meter_ids = NULL;
        return sqlst_db_err(s, step, "load meter ids", err);
    }
    return E_OK;
}

int task_txn_meter_claim(bool *fresh_out, struct task_txn *tx, const char *task_uid,
                         const char *request_id, int64_t tokens, int64_t cost_micros,
                         struct err *err)
{
    struct sqlite_store *s = tx->s;
    sqlite3_stmt *st = NULL;
    json_t *set;
    int rc = load_meter_ids(s, err);

    *fresh_out = false;
    if (rc != E_OK) {
        return rc;
    }
    set = json_object_get(s->meter_ids, task_uid);
    if (set != NULL && json_object_get(set, request_id) != NULL) {
        return E_OK; /* a retry */
    }
    rc = sqlst_stmt(&st, s, SQLST_METER_INSERT, err);
    if (rc != E_OK) {
        return rc;
    }
    sqlite3_bind_text(st, 1, task_uid, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, request_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, clock_now_ms(s->base.clock));
    sqlite3_bind_int64(st, 4, tokens);
    sqlite3_bind_int64(st, 5, cost_micros);
    rc = sqlst_step_done(s, st, "record meter request", err);
    if (rc == E_OK) {
        if (set == NULL) {
            set = json_object();
            json_object_set_new(s->meter_ids, task_uid, set);
        }
        json_object_set_new(set, request_id, json_true());
        *fresh_out = true;
    }
    return rc;
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

int task_txn_token_current(struct token_record *out, struct task_txn *tx, const char *ns,
                           const char *name, struct err *err)
{
    return token_current(out, tx->s, ns, name, err);
}

int task_store_token_current(struct token_record *out, struct task_store *st, const char *ns,
                             const char *name, struct err *err)
{
    struct sqlite_store *s = sqlst_of(st);
    int rc;

    pthread_mutex_lock(&s->mu);
    rc = token_current(out, s, ns, name, err);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int task_txn_token_add(struct task_txn *tx, const char *ns, const char *name, int64_t generation,
                       const char *token_id, const char *token, struct err *err)
{
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
    return sqlst_step_done(tx->s, st, "add token", err);
}

int task_txn_token_revoke(struct task_txn *tx, const char *ns, const char *name,
                          struct err *err)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlst_stmt(&st, tx->s, SQLST_TOKEN_REVOKE, err);

    if (rc != E_OK) {
        return rc;
    }
    sqlite3_bind_text(st, 1, ns, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, name, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, clock_now_ms(tx->s->base.clock));
    return sqlst_step_done(tx->s, st, "revoke token", err);
}

const struct clock *task_txn_clock(struct task_txn *tx)
{
    return tx->s->base.clock;
}

struct sqlite_store *sqlst_txn_store(struct task_txn *tx)
{
    return tx->s;
}

int task_txn_create(json_t **out, struct task_txn *tx, const json_t *obj, struct err *err)
{
    json_t *doc = json_deep_copy(obj);
    json_t *md = json_object_get(doc, "metadata");
    char uid[37], ts[CLOCK_RFC3339_MAX];
    char *text = NULL;
    int rc;

    if (out != NULL) {
        *out = NULL;
    }
    sqlst_new_uid(uid);
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
    sqlst_event_fill(&tx->events[tx->nevents], tx->s->rv, TASK_EVENT_ADDED, doc, text);
    tx->nevents++;
    if (out != NULL) {
        *out = doc;
    } else {
        json_decref(doc);
    }
    return E_OK;
}
