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
    /* A namespace's list is read by every meter batch: a cached statement. */
    int rc = ns != NULL ? sqlst_stmt(&q, s, SQLST_QUOTA_LIST_NS, err)
                        : sqlst_prepare(
                              &q, s, "SELECT doc FROM spend_quotas ORDER BY namespace, name", err),
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
    if (ns != NULL) {
        sqlite3_reset(q);
    } else {
        sqlite3_finalize(q);
    }
    return rc;
}

int sqlst_txn_quota_put(struct task_txn *tx, json_t *q, struct err *err)
{
    return sqlst_obj_put(sqlst_txn_store(tx), "spend_quotas", "spendquota", q, err);
}

int sqlst_txn_quota_delete(struct task_txn *tx, const char *ns, const char *name, struct err *err)
{
    return sqlst_obj_delete(sqlst_txn_store(tx), "spend_quotas", "spendquota", ns, name, err);
}
