/* SPDX-License-Identifier: Apache-2.0 */
/* The embedded task_store: one SQLite file in WAL mode with synchronous=FULL, so a write
 * is on disk before it is acknowledged. resourceVersion is one global counter (like etcd's
 * revision) bumped by every write; an in-memory ring of the latest events feeds watchers.
 * Writes go through one connection (under mu); reads run on a pool of read-only
 * connections (store_sqlite_read.c); the statement helpers are in store_sqlite_stmt.c. */
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/store.h"
#include "store/sqlite/store_sqlite_int.h"
#include "store/sqlite/store_sqlite_read.h"

/* Schema migrations, applied in order; PRAGMA user_version is the index of the next. */
static const char *const g_migrations[] = {
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL) STRICT;"
    "INSERT INTO meta VALUES ('resource_version', 0);"
    "CREATE TABLE tasks (namespace TEXT NOT NULL, name TEXT NOT NULL,"
    " uid TEXT NOT NULL UNIQUE, resource_version INTEGER NOT NULL, phase TEXT NOT NULL,"
    " doc TEXT NOT NULL, PRIMARY KEY (namespace, name)) STRICT;"
    "CREATE TABLE environments (namespace TEXT NOT NULL, name TEXT NOT NULL,"
    " resource_version INTEGER NOT NULL, doc TEXT NOT NULL,"
    " PRIMARY KEY (namespace, name)) STRICT;",
    /* 2: the meter's remembered request ids (every id of every task, keyed by task uid so
     * a re-created task starts fresh) and the token index (task -> token generations). */
    "CREATE TABLE meter_requests (task_uid TEXT NOT NULL, request_id TEXT NOT NULL,"
    " charged_ms INTEGER NOT NULL, tokens INTEGER NOT NULL, cost_micros INTEGER NOT NULL,"
    " PRIMARY KEY (task_uid, request_id)) STRICT, WITHOUT ROWID;"
    "CREATE TABLE tokens (namespace TEXT NOT NULL, name TEXT NOT NULL,"
    " generation INTEGER NOT NULL, token_id TEXT NOT NULL UNIQUE, state TEXT NOT NULL"
    " CHECK (state IN ('active','revoked')), token TEXT NOT NULL, created_ms INTEGER NOT NULL,"
    " revoked_ms INTEGER, PRIMARY KEY (namespace, name, generation)) STRICT;",
    /* 3: the durable inbox (accepted comments) and outbox (SCM calls). */
    "CREATE TABLE inbox (id INTEGER PRIMARY KEY, provider TEXT NOT NULL, delivery_id TEXT,"
    " project TEXT NOT NULL, number INTEGER NOT NULL, comment_id TEXT NOT NULL,"
    " author TEXT NOT NULL, author_association TEXT, author_id INTEGER NOT NULL,"
    " installation_id INTEGER NOT NULL, body TEXT NOT NULL, extra TEXT,"
    " state TEXT NOT NULL DEFAULT 'pending' CHECK (state IN ('pending','done','failed')),"
    " attempts INTEGER NOT NULL DEFAULT 0, next_ms INTEGER NOT NULL, error TEXT,"
    " received_ms INTEGER NOT NULL, UNIQUE (provider, delivery_id),"
    " UNIQUE (provider, project, comment_id)) STRICT;"
    "CREATE INDEX inbox_pending ON inbox(state, provider, project, number, id);"
    "CREATE TABLE outbox (id INTEGER PRIMARY KEY, provider TEXT NOT NULL, kind TEXT NOT NULL,"
    " project TEXT NOT NULL, number INTEGER NOT NULL, target TEXT, body TEXT,"
    " coalesce_key TEXT, installation_id INTEGER NOT NULL,"
    " state TEXT NOT NULL DEFAULT 'pending' CHECK (state IN ('pending','done','failed')),"
    " attempts INTEGER NOT NULL DEFAULT 0, next_ms INTEGER NOT NULL, error TEXT, result TEXT,"
    " created_ms INTEGER NOT NULL) STRICT;"
    "CREATE INDEX outbox_pending ON outbox(state, provider, project, number, id);"
    "CREATE INDEX outbox_coalesce ON outbox(coalesce_key) WHERE state = 'pending';",
    /* 4: sticky comment state, and the offline `local` SCM's threads. */
    "CREATE TABLE sticky (key TEXT PRIMARY KEY, provider TEXT NOT NULL, project TEXT NOT NULL,"
    " number INTEGER NOT NULL, namespace TEXT NOT NULL, name TEXT NOT NULL, comment_id TEXT,"
    " body_hash TEXT, phase TEXT, last_sent_ms INTEGER NOT NULL DEFAULT 0) STRICT;"
    "CREATE TABLE local_comments (id INTEGER PRIMARY KEY, project TEXT NOT NULL,"
    " number INTEGER NOT NULL, author TEXT NOT NULL, body TEXT NOT NULL,"
    " created_ms INTEGER NOT NULL, updated_ms INTEGER NOT NULL) STRICT;"
    "CREATE INDEX local_comments_thread ON local_comments(project, number, id);"
    "CREATE TABLE local_reactions (comment_id INTEGER NOT NULL, author TEXT NOT NULL,"
    " content TEXT NOT NULL, PRIMARY KEY (comment_id, author, content)) STRICT;"
    "CREATE TABLE local_permissions (project TEXT NOT NULL, user TEXT NOT NULL,"
    " level INTEGER NOT NULL, PRIMARY KEY (project, user)) STRICT;",
    /* 5: charged meter request ids as an append-only log (one hot page per commit instead
     * of one B-tree leaf per task); uniqueness is kept by an in-memory index of it. */
    "CREATE TABLE meter_log (id INTEGER PRIMARY KEY, task_uid TEXT NOT NULL,"
    " request_id TEXT NOT NULL, charged_ms INTEGER NOT NULL, tokens INTEGER NOT NULL,"
    " cost_micros INTEGER NOT NULL) STRICT;",
    /* 6: the queues are walked in arrival order over their pending rows only. */
    "DROP INDEX inbox_pending; DROP INDEX outbox_pending;"
    "CREATE INDEX inbox_pending_id ON inbox(id) WHERE state = 'pending';"
    "CREATE INDEX outbox_pending_id ON outbox(id) WHERE state = 'pending';",
    /* 7: meter_log is now only the recent tail of the charged ids (the meter's in-memory
     * index holds exactly it); older ids live in meter_requests, keyed for lookups. */
    "INSERT OR IGNORE INTO meter_requests(task_uid,request_id,charged_ms,tokens,cost_micros)"
    " SELECT task_uid,request_id,charged_ms,tokens,cost_micros FROM meter_log"
    " ORDER BY task_uid,request_id;"
    "DELETE FROM meter_log;",
    /* 8: SpendQuotas (SPEC §15), one row per quota; the meter reads a namespace's. */
    "CREATE TABLE spend_quotas (namespace TEXT NOT NULL, name TEXT NOT NULL,"
    " resource_version INTEGER NOT NULL, doc TEXT NOT NULL,"
    " PRIMARY KEY (namespace, name)) STRICT;",
    /* 9: the LLM gateway's reservation records (a call admitted, not yet charged). */
    "CREATE TABLE llm_reservations (request_id TEXT PRIMARY KEY, namespace TEXT NOT NULL,"
    " name TEXT NOT NULL, token TEXT NOT NULL, model TEXT NOT NULL, provider TEXT NOT NULL,"
    " tokens INTEGER NOT NULL, cost_micros INTEGER NOT NULL, created_ms INTEGER NOT NULL)"
    " STRICT;",
    /* 10: the tasks not finished, for the controller's queue pass (a server keeps every
     * finished task: the pass must not read them all after every change). */
    "CREATE INDEX tasks_live ON tasks(phase) WHERE phase NOT IN ('Completed','Failed');",
};

static int migrate(struct sqlite_store *s, struct err *err)
{
    sqlite3_stmt *st = NULL;
    int version = 0, rc;

    if (sqlite3_prepare_v2(s->db, "PRAGMA user_version", -1, &st, NULL) != SQLITE_OK) {
        return sqlst_db_err(s, SQLITE_ERROR, "read schema version", err);
    }
    if (sqlite3_step(st) == SQLITE_ROW) {
        version = sqlite3_column_int(st, 0);
    }
    sqlite3_finalize(st);
    if (version > (int)ARRAY_LEN(g_migrations)) {
        return err_set(err, E_FAIL, "database schema version %d is newer than this binary (%zu)",
                       version, ARRAY_LEN(g_migrations));
    }
    for (; version < (int)ARRAY_LEN(g_migrations); version++) {
        char pragma[64];
        rc = sqlst_exec(s, "BEGIN IMMEDIATE", err);
        if (rc != E_OK) {
            return rc;
        }
        snprintf(pragma, sizeof(pragma), "PRAGMA user_version = %d", version + 1);
        rc = sqlst_exec(s, g_migrations[version], err);
        if (rc == E_OK) {
            rc = sqlst_exec(s, pragma, err);
        }
        if (rc != E_OK) {
            (void)sqlst_exec(s, "ROLLBACK", NULL);
            return rc;
        }
        rc = sqlst_exec(s, "COMMIT", err);
        if (rc != E_OK) {
            return rc;
        }
    }
    return E_OK;
}

static int load_rv(struct sqlite_store *s, struct err *err)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(s->db, "SELECT value FROM meta WHERE key='resource_version'", -1,
                                &st, NULL);

    if (rc != SQLITE_OK) {
        return sqlst_db_err(s, rc, "read resourceVersion", err);
    }
    rc = sqlite3_step(st);
    s->rv = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
    s->ring_rv = s->rv; /* at open, before any watcher: the feed starts here */
    sqlite3_finalize(st);
    return rc == SQLITE_ROW ? E_OK : sqlst_db_err(s, rc, "read resourceVersion", err);
}

/* --- ops --------------------------------------------------------------------------- */

struct create_args {
    json_t **out;
    const json_t *obj;
    struct err *err;
};

static int create_txn(struct task_txn *tx, void *userdata)
{
    struct create_args *a = userdata;
    return sqlst_txn_create(a->out, tx, a->obj, a->err);
}

static int sqlst_create(json_t **out, struct task_store *st, const json_t *obj, struct err *err)
{
    struct create_args a = {.out = out, .obj = obj, .err = err};

    *out = NULL;
    return sqlst_txn(st, create_txn, &a, err);
}

static int sqlst_mutate(json_t **out, struct task_store *st, const char *ns, const char *name,
                        task_mutate_fn fn, void *userdata, struct err *err)
{
    struct sqlite_store *s = sqlst_of(st);
    json_t *cur = NULL, *doc = NULL;
    char *text = NULL;
    int rc;

    if (out != NULL) {
        *out = NULL;
    }
    pthread_mutex_lock(&s->mu);
    sqlst_cache_forget(s, ns, name);
    rc = sqlst_read_obj(&cur, s, "tasks", ns, name, err);
    if (rc != E_OK) {
        goto out;
    }
    doc = json_deep_copy(cur);
    rc = fn(doc, err, userdata);
    if (rc == TASK_MUTATE_UNCHANGED || (rc == E_OK && json_equal(doc, cur))) {
        /* Nothing changed: no new version, no event (Kubernetes does the same). */
        json_decref(doc);
        doc = json_incref(cur);
        rc = E_OK;
        goto out;
    }
    if (rc != E_OK) {
        goto out;
    }
    {
        json_t *md = json_object_get(doc, "metadata");
        json_t *omd = json_object_get(cur, "metadata");
        /* Server-owned metadata is never taken from the callback. */
        static const char *const owned[] = {"uid", "creationTimestamp", "name", "namespace"};
        for (size_t i = 0; i < ARRAY_LEN(owned); i++) {
            json_object_set(md, owned[i], json_object_get(omd, owned[i]));
        }
        json_int_t gen = json_integer_value(json_object_get(omd, "generation"));
        if (!json_equal(json_object_get(doc, "spec"), json_object_get(cur, "spec"))) {
            gen++;
        }
        json_object_set_new(md, "generation", json_integer(gen));
    }
    sqlst_set_rv(doc, s->rv + 1);
    rc = sqlst_write_obj(s, doc, false, false, &text, err);
    if (rc == E_OK) {
        struct event ev;
        store_event_fill(&ev, s->rv, TASK_EVENT_MODIFIED, doc, text);
        sqlst_mem_apply(s->mem, &ev, 1);
        sqlst_publish(s, &ev);
    }
out:
    pthread_mutex_unlock(&s->mu);
    if (rc == E_OK && out != NULL) {
        *out = doc;
        doc = NULL;
    }
    json_decref(doc);
    json_decref(cur);
    return rc;
}

/* Inside the delete of task NS/NAME (CUR): its linked preview Environment goes with it
 * (owner reference, SPEC §4) and its tokens stop working at once. */
static int remove_dependents(struct sqlite_store *s, const json_t *cur, const char *ns,
                             const char *name, struct err *err)
{
    const char *uid = json_string_value(json_object_get(json_object_get(cur, "metadata"), "uid"));
    sqlite3_stmt *rev = NULL;
    int rc = uid != NULL ? sqlst_env_delete_owned(s, ns, uid, err) : E_OK;

    if (rc == E_OK) {
        rc = sqlst_stmt(&rev, s, SQLST_TOKEN_REVOKE, err);
    }
    if (rc == E_OK) {
        sqlite3_bind_text(rev, 1, ns, -1, SQLITE_STATIC);
        sqlite3_bind_text(rev, 2, name, -1, SQLITE_STATIC);
        sqlite3_bind_int64(rev, 3, clock_now_ms(s->base.clock));
        s->token_epoch++;
        rc = sqlst_step_done(s, rev, "revoke tokens", err);
    }
    return rc;
}

static int sqlst_remove(json_t **out, struct task_store *st, const char *ns, const char *name,
                        int64_t expect_rv, struct err *err)
{
    struct sqlite_store *s = sqlst_of(st);
    struct task_view v;
    sqlite3_stmt *del = NULL;
    json_t *cur = NULL;
    int rc, step;

    if (out != NULL) {
        *out = NULL;
    }
    pthread_mutex_lock(&s->mu);
    sqlst_cache_forget(s, ns, name);
    rc = sqlst_read_obj(&cur, s, "tasks", ns, name, err);
    if (rc != E_OK) {
        goto out;
    }
    task_view_of(&v, cur);
    if (expect_rv != 0 && v.resource_version != expect_rv) {
        rc = err_set(err, E_CONFLICT, "the object has been modified; delete precondition failed");
        goto out;
    }
    rc = sqlst_exec(s, "BEGIN IMMEDIATE", err);
    if (rc != E_OK) {
        goto out;
    }
    rc = sqlst_prepare(&del, s, "DELETE FROM tasks WHERE namespace=?1 AND name=?2", err);
    if (rc == E_OK) {
        sqlite3_bind_text(del, 1, ns, -1, SQLITE_STATIC);
        sqlite3_bind_text(del, 2, name, -1, SQLITE_STATIC);
        step = sqlite3_step(del);
        rc = step == SQLITE_DONE ? E_OK : sqlst_db_err(s, step, "delete task", err);
        sqlite3_finalize(del);
    }
    if (rc == E_OK) {
        rc = sqlst_exec(s, "UPDATE meta SET value=value+1 WHERE key='resource_version'", err);
    }
    if (rc == E_OK) {
        rc = remove_dependents(s, cur, ns, name, err);
    }
    if (rc == E_OK) {
        rc = sqlst_exec(s, "COMMIT", err);
    }
    if (rc != E_OK) {
        (void)sqlst_exec(s, "ROLLBACK", NULL);
        goto out;
    }
    s->rv++;
    sqlst_set_rv(cur, s->rv);
    {
        struct event ev;
        store_event_fill(&ev, s->rv, TASK_EVENT_DELETED, cur, json_dumps(cur, JSON_COMPACT));
        sqlst_mem_apply(s->mem, &ev, 1);
        sqlst_publish(s, &ev);
    }
out:
    pthread_mutex_unlock(&s->mu);
    if (rc == E_OK && out != NULL) {
        *out = cur;
        cur = NULL;
    }
    json_decref(cur);
    return rc;
}

static bool event_matches(const struct event *e, const char *ns)
{
    return ns == NULL || strcmp(e->ns, ns) == 0;
}

static int sqlst_watch(int64_t *last_rv_out, struct task_store *st, const char *ns,
                       int64_t since_rv, int timeout_ms, task_event_fn fn, void *userdata,
                       struct err *err)
{
    struct sqlite_store *s = sqlst_of(st);
    struct timespec deadline;
    int64_t wake_gen;
    int rc = E_OK;

    *last_rv_out = since_rv;
    clock_deadline_in(&deadline, CLOCK_REALTIME, timeout_ms);
    pthread_mutex_lock(&s->ring_mu);
    wake_gen = s->wake_gen;
    while (s->ring_rv <= since_rv && s->wake_gen == wake_gen) {
        if (pthread_cond_timedwait(&s->changed, &s->ring_mu, &deadline) != 0) {
            break;
        }
    }
    if (s->ring_rv > since_rv && since_rv < s->ring_rv - EVENT_RING) {
        rc = err_set(err, E_AGAIN, "too old resource version: %lld", (long long)since_rv);
        goto out;
    }
    for (int64_t rv = since_rv + 1; rv <= s->ring_rv; rv++) {
        const struct event *e = &s->ring[rv % EVENT_RING];
        if (e->rv != rv) {
            /* Written before this process started: not in the feed. */
            rc = err_set(err, E_AGAIN, "too old resource version: %lld", (long long)since_rv);
            goto out;
        }
        *last_rv_out = rv;
        if (event_matches(e, ns)) {
            struct task_event ev = {.type = e->type,
                                    .rv = e->rv,
                                    .ns = e->ns,
                                    .name = e->name,
                                    .phase = e->phase,
                                    .suspended = e->suspended,
                                    .from_scm = e->from_scm,
                                    .json = e->json};
            if (fn(&ev, userdata) != 0) {
                break;
            }
        }
    }
out:
    pthread_mutex_unlock(&s->ring_mu);
    return rc;
}

static void sqlst_wake(struct task_store *st)
{
    struct sqlite_store *s = sqlst_of(st);

    pthread_mutex_lock(&s->ring_mu);
    s->wake_gen++;
    pthread_cond_broadcast(&s->changed);
    pthread_mutex_unlock(&s->ring_mu);
    pthread_mutex_lock(&s->mu);
    s->inbox_gen++;
    s->outbox_gen++;
    pthread_cond_broadcast(&s->inbox_cv);
    pthread_cond_broadcast(&s->outbox_cv);
    pthread_mutex_unlock(&s->mu);
}

static void sqlst_close(struct task_store *st)
{
    struct sqlite_store *s = sqlst_of(st);

    gcommit_free(s->inbox_committer); /* commits what is queued: before the connection goes */
    for (size_t i = 0; i < EVENT_RING; i++) {
        free(s->ring[i].json);
    }
    for (size_t i = 0; i < SQLST_COUNT; i++) {
        sqlite3_finalize(s->stmts[i]);
    }
    sqlst_by_text_free(s);
    json_decref(s->cache);
    sqlst_meter_archiver_close(s);
    sqlst_meter_index_free(s);
    sqlst_readers_close(s); /* before the writer's connection: it checkpoints last */
    sqlst_mem_close(s->mem);
    sqlite3_close(s->db);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->ring_mu);
    pthread_cond_destroy(&s->changed);
    pthread_cond_destroy(&s->inbox_cv);
    pthread_cond_destroy(&s->outbox_cv);
    free(s);
}

#define SQLST_XOP_ENTRY(RET, NAME, PARAMS) STORE_XOPS_ENTRY(sqlst, NAME)

static const struct task_store_xops sqlite_xops = {STORE_XOPS_SHARED(
    SQLST_XOP_ENTRY) STORE_XOPS_LOCAL(SQLST_XOP_ENTRY) STORE_XOPS_OPTIONAL(SQLST_XOP_ENTRY)};

#define SQLST_OP_ENTRY(NAME) STORE_XOPS_ENTRY(sqlst, NAME)

static const struct task_store_ops sqlite_ops = {.name = "sqlite", STORE_OPS_NAMES(SQLST_OP_ENTRY)};

int task_store_sqlite_open(struct task_store **out, const char *path, const struct clock *clock,
                           struct err *err)
{
    struct sqlite_store *s = xcalloc(1, sizeof(*s));
    int rc;

    *out = NULL;
    s->base.ops = &sqlite_ops;
    s->base.xops = &sqlite_xops;
    s->base.clock = clock;
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->ring_mu, NULL);
    pthread_cond_init(&s->changed, NULL);
    pthread_cond_init(&s->inbox_cv, NULL);
    pthread_cond_init(&s->outbox_cv, NULL);
    s->cache = json_object();
    s->meter_ids = NULL;
    rc = sqlite3_open_v2(path, &s->db,
                         SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, NULL);
    if (rc != SQLITE_OK) {
        rc = err_set(err, E_FAIL, "open %s: %s", path,
                     s->db != NULL ? sqlite3_errmsg(s->db) : sqlite3_errstr(rc));
        goto out;
    }
    sqlite3_busy_timeout(s->db, 5000);
    /* WAL + synchronous=FULL: a committed transaction is fsync'd before COMMIT returns, so
     * an acknowledged write survives kill -9 and power loss. */
    rc = sqlst_exec(s, "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA foreign_keys=ON;",
                    err);
    if (rc == E_OK) {
        rc = migrate(s, err);
    }
    if (rc == E_OK) {
        rc = load_rv(s, err);
    }
    if (rc == E_OK) {
        rc = sqlst_mem_open(&s->mem, s->db, s->rv, err);
    }
    if (rc == E_OK) {
        rc = sqlst_readers_open(s, path, err);
    }
    if (rc == E_OK) {
        rc = sqlst_inbox_committer_start(s, err);
    }
    if (rc == E_OK) {
        rc = sqlst_meter_archiver_open(s, path, err);
    }
out:
    if (rc != E_OK) {
        sqlst_close(&s->base);
        return rc;
    }
    *out = &s->base;
    return E_OK;
}
