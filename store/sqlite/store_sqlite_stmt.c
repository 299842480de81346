/* SPDX-License-Identifier: Apache-2.0 */
/* The statement helpers of the SQLite task_store (declared in store_sqlite_int.h): SQLite codes
 * into ours, the cached prepared statements of the hot paths, and reading and writing a task row
 * with its event. Callers hold the store's mu. */
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/jsonw.h"
#include "store/store.h"
#include "store/sqlite/store_sqlite_int.h"

int sqlst_db_err(struct sqlite_store *s, int rc, const char *what, struct err *err)
{
    if (rc == SQLITE_BUSY || rc == SQLITE_LOCKED) {
        return err_set(err, E_AGAIN, "%s: database busy", what);
    }
    return err_set(err, E_FAIL, "%s: %s", what, sqlite3_errmsg(s->db));
}

/* BEGIN IMMEDIATE and COMMIT, run once per group commit, from cached statements (no
 * parse each time); E_OK when SQL is neither and *ran stays false. */
static int exec_cached(bool *ran, struct sqlite_store *s, const char *sql, struct err *err)
{
    enum sqlst_stmt_id id;
    sqlite3_stmt *st = NULL;
    int rc, step;

    *ran = false;
    if (strcmp(sql, "BEGIN IMMEDIATE") == 0) {
        id = SQLST_BEGIN_IMMEDIATE;
    } else if (strcmp(sql, "COMMIT") == 0) {
        id = SQLST_COMMIT;
    } else {
        return E_OK;
    }
    *ran = true;
    rc = sqlst_stmt(&st, s, id, err);
    if (rc != E_OK) {
        return rc;
    }
    step = sqlite3_step(st);
    rc = step == SQLITE_DONE ? E_OK
                             : err_set(err, step == SQLITE_BUSY ? E_AGAIN : E_FAIL, "sqlite: %s",
                                       sqlite3_errmsg(s->db));
    sqlite3_reset(st);
    return rc;
}

int sqlst_exec(struct sqlite_store *s, const char *sql, struct err *err)
{
    char *msg = NULL;
    bool cached = false;
    int rc = exec_cached(&cached, s, sql, err);

    if (cached) {
        return rc;
    }
    rc = sqlite3_exec(s->db, sql, NULL, NULL, &msg);

    if (rc != SQLITE_OK) {
        int code = err_set(err, rc == SQLITE_BUSY ? E_AGAIN : E_FAIL, "sqlite: %s",
                           msg != NULL ? msg : sqlite3_errstr(rc));
        sqlite3_free(msg);
        return code;
    }
    return E_OK;
}

/* --- small statement helpers ------------------------------------------------------- */

int sqlst_prepare(sqlite3_stmt **out, struct sqlite_store *s, const char *sql, struct err *err)
{
    int rc = sqlite3_prepare_v2(s->db, sql, -1, out, NULL);
    return rc == SQLITE_OK ? E_OK : sqlst_db_err(s, rc, "prepare", err);
}

int sqlst_prepare_cached(sqlite3_stmt **out, struct sqlite_store *s, const char *sql,
                         struct err *err)
{
    int rc;

    for (size_t i = 0; i < s->nby_text; i++) {
        if (strcmp(s->by_text[i].sql, sql) == 0) {
            sqlite3_reset(s->by_text[i].st);
            sqlite3_clear_bindings(s->by_text[i].st);
            *out = s->by_text[i].st;
            return E_OK;
        }
    }
    *out = NULL;
    rc = sqlite3_prepare_v3(s->db, sql, -1, SQLITE_PREPARE_PERSISTENT, out, NULL);
    if (rc != SQLITE_OK) {
        return sqlst_db_err(s, rc, "prepare", err);
    }
    if (s->nby_text < SQLST_BY_TEXT_MAX) {
        s->by_text[s->nby_text].sql = xstrdup(sql);
        s->by_text[s->nby_text].st = *out;
        s->nby_text++;
    }
    return E_OK;
}

void sqlst_unprepare(struct sqlite_store *s, sqlite3_stmt *st)
{
    for (size_t i = 0; i < s->nby_text; i++) {
        if (s->by_text[i].st == st) {
            sqlite3_reset(st);
            return;
        }
    }
    sqlite3_finalize(st);
}

void sqlst_by_text_free(struct sqlite_store *s)
{
    for (size_t i = 0; i < s->nby_text; i++) {
        sqlite3_finalize(s->by_text[i].st);
        free(s->by_text[i].sql);
    }
    s->nby_text = 0;
}

char *sqlst_col_dup(sqlite3_stmt *q, int col)
{
    const char *t = (const char *)sqlite3_column_text(q, col);
    return t != NULL ? xstrdup(t) : NULL;
}

json_t *sqlst_column_json(sqlite3_stmt *st, int col)
{
    const char *text = (const char *)sqlite3_column_text(st, col);
    return text != NULL ? json_loads(text, 0, NULL) : NULL;
}

/* Reads one object; E_NOTFOUND when absent. Caller holds mu. */
int sqlst_read_obj(json_t **out, struct sqlite_store *s, const char *table, const char *ns,
                   const char *name, struct err *err)
{
    sqlite3_stmt *st = NULL;
    char *sql = xasprintf("SELECT doc FROM %s WHERE namespace=?1 AND name=?2", table);
    int rc = sqlst_prepare(&st, s, sql, err), step;

    *out = NULL;
    free(sql);
    if (rc != E_OK) {
        return rc;
    }
    sqlite3_bind_text(st, 1, ns, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, name, -1, SQLITE_STATIC);
    step = sqlite3_step(st);
    if (step == SQLITE_ROW) {
        *out = sqlst_column_json(st, 0);
        rc = *out != NULL ? E_OK : err_set(err, E_FAIL, "stored object %s/%s is corrupt", ns, name);
    } else if (step == SQLITE_DONE) {
        rc = err_set(err, E_NOTFOUND, "agenttasks \"%s\" not found", name);
    } else {
        rc = sqlst_db_err(s, step, "read", err);
    }
    sqlite3_finalize(st);
    return rc;
}

/* Server-owned metadata of OBJ: kept from OLD (may be NULL), else set now; *rv_out the
 * next resourceVersion. */
static void server_fields(json_t *obj, const json_t *old, struct sqlite_store *s, int64_t *rv_out)
{
    json_t *md = json_object_get(obj, "metadata");
    const json_t *omd = json_object_get(old, "metadata");
    const char *uid = json_string_value(json_object_get(omd, "uid"));
    const char *ts = json_string_value(json_object_get(omd, "creationTimestamp"));
    const char *orv = json_string_value(json_object_get(omd, "resourceVersion"));
    char fresh[37], now[CLOCK_RFC3339_MAX];

    if (uid == NULL) {
        store_new_uid(fresh);
        uid = fresh;
    }
    if (ts == NULL) {
        clock_rfc3339(now, clock_now_ms(s->base.clock));
        ts = now;
    }
    json_object_set_new(md, "uid", json_string(uid));
    json_object_set_new(md, "creationTimestamp", json_string(ts));
    *rv_out = (orv != NULL ? strtoll(orv, NULL, 10) : 0) + 1;
    sqlst_set_rv(obj, *rv_out);
}

int sqlst_obj_put(struct sqlite_store *s, const char *table, const char *kind, json_t *obj,
                  struct err *err)
{
    json_t *md = json_object_get(obj, "metadata"), *old = NULL;
    const char *ns = json_string_value(json_object_get(md, "namespace"));
    const char *name = json_string_value(json_object_get(md, "name"));
    sqlite3_stmt *q = NULL;
    int64_t rv = 0;
    char *text, *sql;
    int rc;

    if (ns == NULL || name == NULL) {
        return err_set(err, E_INVALID, "%s without metadata.namespace/name", kind);
    }
    rc = sqlst_read_obj(&old, s, table, ns, name, NULL);
    if (rc != E_OK && rc != E_NOTFOUND) {
        json_decref(old);
        return err_set(err, rc, "read %s %s/%s", kind, ns, name);
    }
    server_fields(obj, old, s, &rv);
    json_decref(old);
    sql = xasprintf("INSERT INTO %s(namespace, name, resource_version, doc)"
                    " VALUES (?1, ?2, ?3, ?4) ON CONFLICT(namespace, name) DO UPDATE SET"
                    " resource_version=excluded.resource_version, doc=excluded.doc",
                    table);
    rc = sqlst_prepare(&q, s, sql, err);
    free(sql);
    if (rc != E_OK) {
        return rc;
    }
    text = json_dumps(obj, JSON_COMPACT);
    sqlite3_bind_text(q, 1, ns, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 2, name, -1, SQLITE_STATIC);
    sqlite3_bind_int64(q, 3, rv);
    sqlite3_bind_text(q, 4, text, -1, SQLITE_STATIC);
    sql = xasprintf("write %s", kind);
    rc = sqlst_step_done(s, q, sql, err);
    free(sql);
    sqlite3_finalize(q);
    free(text);
    return rc;
}

int sqlst_obj_delete(struct sqlite_store *s, const char *table, const char *kind, const char *ns,
                     const char *name, struct err *err)
{
    sqlite3_stmt *q = NULL;
    char *sql = xasprintf("DELETE FROM %s WHERE namespace=?1 AND name=?2", table);
    int rc = sqlst_prepare(&q, s, sql, err);

    free(sql);
    if (rc != E_OK) {
        return rc;
    }
    sqlite3_bind_text(q, 1, ns, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 2, name, -1, SQLITE_STATIC);
    sql = xasprintf("delete %s", kind);
    rc = sqlst_step_done(s, q, sql, err);
    free(sql);
    sqlite3_finalize(q);
    return rc;
}

void sqlst_set_rv(json_t *obj, int64_t rv)
{
    char buf[32];

    snprintf(buf, sizeof(buf), "%lld", (long long)rv);
    json_object_set_new(json_object_get(obj, "metadata"), "resourceVersion", json_string(buf));
}

static const char *const g_stmt_sql[SQLST_COUNT] = {
    [SQLST_INSERT_TASK] = "INSERT INTO tasks(namespace,name,uid,resource_version,phase,doc) "
                          "VALUES(?1,?2,?3,?4,?5,?6)",
    [SQLST_UPDATE_TASK] = "UPDATE tasks SET uid=?3, resource_version=?4, phase=?5, doc=?6 "
                          "WHERE namespace=?1 AND name=?2",
    /* The usual update: the uid is the stored one, so its UNIQUE index is left alone. */
    [SQLST_UPDATE_TASK_SAME_UID] = "UPDATE tasks SET resource_version=?4, phase=?5, doc=?6 "
                                   "WHERE namespace=?1 AND name=?2 AND uid=?3",
    [SQLST_BUMP_RV] = "UPDATE meta SET value=?1 WHERE key='resource_version'",
    [SQLST_GET_TASK] = "SELECT doc FROM tasks WHERE namespace=?1 AND name=?2",
    [SQLST_METER_IDS] = "SELECT id, task_uid, request_id FROM meter_log ORDER BY id",
    [SQLST_METER_INSERT] = "INSERT INTO meter_log(task_uid,request_id,charged_ms,"
                           "tokens,cost_micros) VALUES(?1,?2,?3,?4,?5)",
    [SQLST_METER_SEEN] = "SELECT 1 FROM meter_requests WHERE task_uid=?1 AND request_id=?2",
    [SQLST_METER_MOVE] = "INSERT OR IGNORE INTO meter_requests(task_uid,request_id,charged_ms,"
                         "tokens,cost_micros) SELECT task_uid,request_id,charged_ms,tokens,"
                         "cost_micros FROM meter_log WHERE id<=?1 "
                         "ORDER BY task_uid,request_id",
    [SQLST_METER_DROP] = "DELETE FROM meter_log WHERE id<=?1",
    [SQLST_TOKEN_CURRENT] = "SELECT token_id, generation, state, token FROM tokens "
                            "WHERE namespace=?1 AND name=?2 ORDER BY generation DESC LIMIT 1",
    [SQLST_TOKEN_INSERT] = "INSERT INTO tokens(namespace,name,generation,token_id,state,token,"
                           "created_ms) VALUES(?1,?2,?3,?4,'active',?5,?6)",
    [SQLST_TOKEN_REVOKE] = "UPDATE tokens SET state='revoked', revoked_ms=?3 "
                           "WHERE namespace=?1 AND name=?2 AND state='active'",
    [SQLST_SAVEPOINT] = "SAVEPOINT job",
    [SQLST_RELEASE] = "RELEASE job",
    [SQLST_ROLLBACK_TO] = "ROLLBACK TO job",
    [SQLST_BEGIN_IMMEDIATE] = "BEGIN IMMEDIATE",
    [SQLST_COMMIT] = "COMMIT",
    [SQLST_QUOTA_LIST_NS] = "SELECT doc FROM spend_quotas WHERE namespace=?1 ORDER BY name",
    [SQLST_INBOX_INSERT] = "INSERT OR IGNORE INTO inbox(provider,delivery_id,project,number,"
                           "comment_id,author,author_association,author_id,installation_id,"
                           "body,extra,next_ms,received_ms) VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,"
                           "?10,?11,?12,?12)",
    [SQLST_RESV_PUT] = "INSERT OR REPLACE INTO llm_reservations(request_id,namespace,name,token,"
                       "model,provider,tokens,cost_micros,created_ms) "
                       "VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9)",
    [SQLST_RESV_DROP] = "DELETE FROM llm_reservations WHERE request_id=?1",
};

int sqlst_stmt(sqlite3_stmt **out, struct sqlite_store *s, enum sqlst_stmt_id id, struct err *err)
{
    int rc;

    *out = NULL;
    if (s->stmts[id] == NULL) {
        rc = sqlite3_prepare_v3(s->db, g_stmt_sql[id], -1, SQLITE_PREPARE_PERSISTENT, &s->stmts[id],
                                NULL);
        if (rc != SQLITE_OK) {
            return sqlst_db_err(s, rc, "prepare", err);
        }
    }
    sqlite3_reset(s->stmts[id]);
    sqlite3_clear_bindings(s->stmts[id]);
    *out = s->stmts[id];
    return E_OK;
}

int sqlst_step_done(struct sqlite_store *s, sqlite3_stmt *st, const char *what, struct err *err)
{
    int step = sqlite3_step(st);

    sqlite3_reset(st);
    if (step == SQLITE_DONE) {
        return E_OK;
    }
    if (step == SQLITE_CONSTRAINT) {
        return err_set(err, E_CONFLICT, "%s: already exists", what);
    }
    return sqlst_db_err(s, step, what, err);
}

int sqlst_bump_rv(struct sqlite_store *s, int64_t rv, struct err *err)
{
    sqlite3_stmt *bump = NULL;
    int rc = sqlst_stmt(&bump, s, SQLST_BUMP_RV, err);

    if (rc != E_OK) {
        return rc;
    }
    sqlite3_bind_int64(bump, 1, rv);
    return sqlst_step_done(s, bump, "bump resourceVersion", err);
}

/* Inserts or updates OBJ's row with its JSON text DOC at rv s->rv + 1. */
static int write_task_row(struct sqlite_store *s, const json_t *obj, bool is_new, const char *doc,
                          struct err *err)
{
    const json_t *md = json_object_get(obj, "metadata");
    const json_t *status = json_object_get(obj, "status");
    enum sqlst_stmt_id id = is_new ? SQLST_INSERT_TASK : SQLST_UPDATE_TASK_SAME_UID;

    for (;;) {
        sqlite3_stmt *st = NULL;
        int rc = sqlst_stmt(&st, s, id, err);
        if (rc != E_OK) {
            return rc;
        }
        sqlite3_bind_text(st, 1, json_string_value(json_object_get(md, "namespace")), -1,
                          SQLITE_STATIC);
        sqlite3_bind_text(st, 2, json_string_value(json_object_get(md, "name")), -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 3, json_string_value(json_object_get(md, "uid")), -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 4, s->rv + 1);
        sqlite3_bind_text(st, 5, json_string_value(json_object_get(status, "phase")), -1,
                          SQLITE_STATIC);
        sqlite3_bind_text(st, 6, doc, -1, SQLITE_STATIC);
        rc = sqlst_step_done(s, st, "write task", err);
        if (rc == E_CONFLICT) {
            return err_set(err, E_CONFLICT, "agenttasks \"%s\" already exists",
                           json_string_value(json_object_get(md, "name")));
        }
        if (rc != E_OK || id != SQLST_UPDATE_TASK_SAME_UID || sqlite3_changes(s->db) > 0) {
            return rc;
        }
        id = SQLST_UPDATE_TASK; /* the row holds another uid: the update that sets it */
    }
}

int sqlst_write_obj(struct sqlite_store *s, const json_t *obj, bool is_new, bool in_txn,
                    char **json_out, struct err *err)
{
    char *doc = NULL;
    int rc;

    if (!in_txn) {
        rc = sqlst_exec(s, "BEGIN IMMEDIATE", err);
        if (rc != E_OK) {
            return rc;
        }
    }
    doc = jsonw_dumps(obj);
    rc = write_task_row(s, obj, is_new, doc, err);
    /* Inside a sqlst_txn the counter row is written once, before its COMMIT. */
    if (rc == E_OK && !in_txn) {
        rc = sqlst_bump_rv(s, s->rv + 1, err);
    }
    if (!in_txn && rc == E_OK) {
        rc = sqlst_exec(s, "COMMIT", err);
    }
    if (rc != E_OK) {
        if (!in_txn) {
            (void)sqlst_exec(s, "ROLLBACK", NULL);
        }
        free(doc);
        return rc;
    }
    s->rv++;
    if (json_out != NULL) {
        *json_out = doc;
    } else {
        free(doc);
    }
    return E_OK;
}
