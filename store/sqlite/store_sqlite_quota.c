/* SPDX-License-Identifier: Apache-2.0 */
/* The spend_quotas table (SpendQuotas, SPEC §15): list, put and delete inside a task
 * transaction, so a meter charge adds to the task and to its namespace's quotas in one
 * COMMIT. A quota's resourceVersion is its own counter (not part of the tasks' feed). */
#include <stdlib.h>
#include <string.h>

#include "store/quota.h"
#include "store/sqlite/store_sqlite_int.h"

int sqlst_txn_quota_list(json_t **items_out, struct task_txn *tx, const char *ns, struct err *err)
{
    struct sqlite_store *s = sqlst_txn_store(tx);
    sqlite3_stmt *q = NULL;
    int rc = sqlst_prepare(&q, s,
                           ns != NULL ? "SELECT doc FROM spend_quotas WHERE namespace=?1"
                                        " ORDER BY name"
                                      : "SELECT doc FROM spend_quotas ORDER BY namespace, name",
                           err),
        step;

    *items_out = NULL;
    if (rc != E_OK) {
        return rc;
    }
    if (ns != NULL) {
        sqlite3_bind_text(q, 1, ns, -1, SQLITE_STATIC);
    }
    *items_out = json_array();
    while ((step = sqlite3_step(q)) == SQLITE_ROW) {
        json_t *doc = sqlst_column_json(q, 0);
        if (doc != NULL) {
            json_array_append_new(*items_out, doc);
        }
    }
    if (step != SQLITE_DONE) {
        rc = sqlst_db_err(s, step, "read spend quotas", err);
        json_decref(*items_out);
        *items_out = NULL;
    }
    sqlite3_finalize(q);
    return rc;
}

/* Server-owned metadata of Q: kept from OLD (may be NULL), else set now; *rv_out the next
 * resourceVersion. */
static void server_fields(json_t *q, const json_t *old, struct sqlite_store *s, int64_t *rv_out)
{
    json_t *md = json_object_get(q, "metadata");
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
    sqlst_set_rv(q, *rv_out);
}

int sqlst_txn_quota_put(struct task_txn *tx, json_t *q, struct err *err)
{
    struct sqlite_store *s = sqlst_txn_store(tx);
    json_t *md = json_object_get(q, "metadata"), *old = NULL;
    const char *ns = json_string_value(json_object_get(md, "namespace"));
    const char *name = json_string_value(json_object_get(md, "name"));
    sqlite3_stmt *st = NULL;
    int64_t rv = 0;
    char *text;
    int rc;

    if (ns == NULL || name == NULL) {
        return err_set(err, E_INVALID, "spendquota without metadata.namespace/name");
    }
    rc = sqlst_read_obj(&old, s, "spend_quotas", ns, name, NULL);
    if (rc != E_OK && rc != E_NOTFOUND) {
        json_decref(old);
        return err_set(err, rc, "read spendquota %s/%s", ns, name);
    }
    server_fields(q, old, s, &rv);
    json_decref(old);
    rc = sqlst_prepare(&st, s,
                       "INSERT INTO spend_quotas(namespace, name, resource_version, doc)"
                       " VALUES (?1, ?2, ?3, ?4) ON CONFLICT(namespace, name) DO UPDATE SET"
                       " resource_version=excluded.resource_version, doc=excluded.doc",
                       err);
    if (rc != E_OK) {
        return rc;
    }
    text = json_dumps(q, JSON_COMPACT);
    sqlite3_bind_text(st, 1, ns, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, name, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, rv);
    sqlite3_bind_text(st, 4, text, -1, SQLITE_STATIC);
    rc = sqlst_step_done(s, st, "write spendquota", err);
    sqlite3_finalize(st);
    free(text);
    return rc;
}

int sqlst_txn_quota_delete(struct task_txn *tx, const char *ns, const char *name, struct err *err)
{
    struct sqlite_store *s = sqlst_txn_store(tx);
    sqlite3_stmt *q = NULL;
    int rc = sqlst_prepare(&q, s, "DELETE FROM spend_quotas WHERE namespace=?1 AND name=?2", err);

    if (rc != E_OK) {
        return rc;
    }
    sqlite3_bind_text(q, 1, ns, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 2, name, -1, SQLITE_STATIC);
    rc = sqlst_step_done(s, q, "delete spendquota", err);
    sqlite3_finalize(q);
    return rc;
}
