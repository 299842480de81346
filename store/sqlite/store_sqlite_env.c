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

int sqlst_txn_env_put(struct task_txn *tx, json_t *env, struct err *err)
{
    return sqlst_obj_put(sqlst_txn_store(tx), "environments", "environment", env, err);
}

int sqlst_txn_env_delete(struct task_txn *tx, const char *ns, const char *name, struct err *err)
{
    return sqlst_obj_delete(sqlst_txn_store(tx), "environments", "environment", ns, name, err);
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
