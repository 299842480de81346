/* SPDX-License-Identifier: Apache-2.0 */
/* The write side of the environments table (linked preview Environments, SPEC §4): put,
 * get and delete inside a task transaction, so the controller changes an Environment
 * atomically with the task that owns it. An Environment's resourceVersion is its own
 * counter (it is not part of the tasks' change feed). */
#include <stdlib.h>
#include <string.h>

#include "store/sqlite/store_sqlite_int.h"

int sqlst_txn_env_get(json_t **out, struct task_txn *tx, const char *ns, const char *name,
                      struct err *err)
{
    int rc = sqlst_read_obj(out, sqlst_txn_store(tx), "environments", ns, name, err);

    if (rc == E_NOTFOUND) {
        rc = err_set(err, E_NOTFOUND, "environments \"%s\" not found", name);
    }
    return rc;
}

/* Server-owned metadata of ENV: kept from OLD (may be NULL), else set now. */
static void env_server_fields(json_t *env, const json_t *old, struct sqlite_store *s,
                              int64_t *rv_out)
{
    json_t *md = json_object_get(env, "metadata");
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
    sqlst_set_rv(env, *rv_out);
}

int sqlst_txn_env_put(struct task_txn *tx, json_t *env, struct err *err)
{
    struct sqlite_store *s = sqlst_txn_store(tx);
    json_t *md = json_object_get(env, "metadata"), *old = NULL;
    const char *ns = json_string_value(json_object_get(md, "namespace"));
    const char *name = json_string_value(json_object_get(md, "name"));
    sqlite3_stmt *q = NULL;
    int64_t rv = 0;
    char *text;
    int rc;

    if (ns == NULL || name == NULL) {
        return err_set(err, E_INVALID, "environment without metadata.namespace/name");
    }
    rc = sqlst_read_obj(&old, s, "environments", ns, name, NULL);
    if (rc != E_OK && rc != E_NOTFOUND) {
        json_decref(old);
        return err_set(err, rc, "read environment %s/%s", ns, name);
    }
    env_server_fields(env, old, s, &rv);
    json_decref(old);
    rc = sqlst_prepare(&q, s,
                       "INSERT INTO environments(namespace, name, resource_version, doc)"
                       " VALUES (?1, ?2, ?3, ?4) ON CONFLICT(namespace, name) DO UPDATE SET"
                       " resource_version=excluded.resource_version, doc=excluded.doc",
                       err);
    if (rc != E_OK) {
        return rc;
    }
    text = json_dumps(env, JSON_COMPACT);
    sqlite3_bind_text(q, 1, ns, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 2, name, -1, SQLITE_STATIC);
    sqlite3_bind_int64(q, 3, rv);
    sqlite3_bind_text(q, 4, text, -1, SQLITE_STATIC);
    rc = sqlst_step_done(s, q, "write environment", err);
    sqlite3_finalize(q);
    free(text);
    return rc;
}

int sqlst_txn_env_delete(struct task_txn *tx, const char *ns, const char *name, struct err *err)
{
    struct sqlite_store *s = sqlst_txn_store(tx);
    sqlite3_stmt *q = NULL;
    int rc = sqlst_prepare(&q, s, "DELETE FROM environments WHERE namespace=?1 AND name=?2", err);

    if (rc != E_OK) {
        return rc;
    }
    sqlite3_bind_text(q, 1, ns, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 2, name, -1, SQLITE_STATIC);
    rc = sqlst_step_done(s, q, "delete environment", err);
    sqlite3_finalize(q);
    return rc;
}

int sqlst_env_delete_owned(struct sqlite_store *s, const char *ns, const char *owner_uid,
                           struct err *err)
{
    sqlite3_stmt *q = NULL;
    int rc = sqlst_prepare(&q, s,
                           "DELETE FROM environments WHERE namespace=?1 AND"
                           " json_extract(doc, '$.metadata.ownerReferences[0].uid')=?2",
                           err);

    if (rc != E_OK) {
        return rc;
    }
    sqlite3_bind_text(q, 1, ns, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 2, owner_uid, -1, SQLITE_STATIC);
    rc = sqlst_step_done(s, q, "delete owned environments", err);
    sqlite3_finalize(q);
    return rc;
}
