/* SPDX-License-Identifier: Apache-2.0 */
/* The LLM gateway's reservation records (SPEC §13) on the SQLite store: one row per call
 * admitted and not yet charged, written and removed inside the meter's transactions (the
 * removal in the same transaction as the call's charge), listed at start so that a call
 * the server died in is charged its reservation. */
#include <sqlite3.h>

#include "common/clock.h"
#include "store/sqlite/store_sqlite_int.h"

int sqlst_txn_resv_put(struct task_txn *tx, const struct store_resv *r, struct err *err)
{
    struct sqlite_store *s = sqlst_txn_store(tx);
    sqlite3_stmt *q = NULL;
    int rc = sqlst_stmt(&q, s, SQLST_RESV_PUT, err);

    if (rc != E_OK) {
        return rc;
    }
    sqlite3_bind_text(q, 1, r->request_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 2, r->ns, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 3, r->name, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 4, r->token, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 5, r->model, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 6, r->provider, -1, SQLITE_STATIC);
    sqlite3_bind_int64(q, 7, r->tokens);
    sqlite3_bind_int64(q, 8, r->cost_micros);
    sqlite3_bind_int64(q, 9, clock_now_ms(task_txn_clock(tx)));
    return sqlst_step_done(s, q, "record a reservation", err);
}

int sqlst_txn_resv_drop(struct task_txn *tx, const char *request_id, struct err *err)
{
    struct sqlite_store *s = sqlst_txn_store(tx);
    sqlite3_stmt *q = NULL;
    int rc = sqlst_stmt(&q, s, SQLST_RESV_DROP, err);

    if (rc != E_OK) {
        return rc;
    }
    sqlite3_bind_text(q, 1, request_id, -1, SQLITE_STATIC);
    return sqlst_step_done(s, q, "remove a reservation", err);
}

static json_t *resv_row(sqlite3_stmt *q)
{
    return json_pack(
        "{s:s, s:s, s:s, s:s, s:s, s:s, s:I, s:I, s:I}", "requestId",
        (const char *)sqlite3_column_text(q, 0), "namespace",
        (const char *)sqlite3_column_text(q, 1), "name", (const char *)sqlite3_column_text(q, 2),
        "token", (const char *)sqlite3_column_text(q, 3), "model",
        (const char *)sqlite3_column_text(q, 4), "provider",
        (const char *)sqlite3_column_text(q, 5), "tokens", (json_int_t)sqlite3_column_int64(q, 6),
        "costMicros", (json_int_t)sqlite3_column_int64(q, 7), "createdMs",
        (json_int_t)sqlite3_column_int64(q, 8));
}

int sqlst_resv_list(json_t **items_out, struct task_store *st, struct err *err)
{
    struct sqlite_store *s = sqlst_of(st);
    sqlite3_stmt *q = NULL;
    int rc, step;

    *items_out = NULL;
    pthread_mutex_lock(&s->mu);
    rc = sqlst_prepare(&q, s,
                       "SELECT request_id, namespace, name, token, model, provider, tokens,"
                       " cost_micros, created_ms FROM llm_reservations"
                       " ORDER BY created_ms, request_id",
                       err);
    if (rc == E_OK) {
        *items_out = json_array();
        while ((step = sqlite3_step(q)) == SQLITE_ROW) {
            json_t *row = resv_row(q);
            if (row != NULL) {
                json_array_append_new(*items_out, row);
            }
        }
        if (step != SQLITE_DONE) {
            rc = sqlst_db_err(s, step, "read reservations", err);
            json_decref(*items_out);
            *items_out = NULL;
        }
        sqlite3_finalize(q);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}
