/* SPDX-License-Identifier: Apache-2.0 */
/* The public store functions beyond struct task_store_ops, routed to the backend's
 * struct task_store_xops (store_backend.h). */
#include <string.h>

#include "store/store_backend.h"

static int local_refused(struct err *err)
{
    return err_set(err, E_INVALID, "the local scm needs the embedded (sqlite) store");
}

const struct clock *task_txn_clock(struct task_txn *tx)
{
    return tx->st->clock;
}

int task_store_inbox_next(struct inbox_entry *out, int64_t *wait_ms_out, struct task_store *st,
                          struct err *err)
{
    size_t n = 0;

    return task_store_inbox_next_batch(out, 1, &n, wait_ms_out, st, err);
}

int task_txn_get(json_t **out, struct task_txn *tx, const char *ns, const char *name,
                 struct err *err)
{
    return tx->st->xops->txn_get(out, tx, ns, name, err);
}

int task_txn_put(struct task_txn *tx, json_t *doc, struct err *err)
{
    return tx->st->xops->txn_put(tx, doc, err);
}

int task_txn_savepoint(struct task_txn *tx, struct err *err)
{
    return tx->st->xops->txn_savepoint(tx, err);
}

int task_txn_release(struct task_txn *tx, struct err *err)
{
    return tx->st->xops->txn_release(tx, err);
}

void task_txn_rollback_savepoint(struct task_txn *tx)
{
    tx->st->xops->txn_rollback_savepoint(tx);
}

int task_txn_meter_claim(bool *fresh_out, struct task_txn *tx, const char *task_uid,
                         const char *request_id, int64_t tokens, int64_t cost_micros,
                         struct err *err)
{
    return tx->st->xops->txn_meter_claim(fresh_out, tx, task_uid, request_id, tokens, cost_micros,
                                         err);
}

int task_txn_token_current(struct token_record *out, struct task_txn *tx, const char *ns,
                           const char *name, struct err *err)
{
    return tx->st->xops->txn_token_current(out, tx, ns, name, err);
}

int task_txn_token_add(struct task_txn *tx, const char *ns, const char *name, int64_t generation,
                       const char *token_id, const char *token, struct err *err)
{
    return tx->st->xops->txn_token_add(tx, ns, name, generation, token_id, token, err);
}

int task_txn_token_revoke(struct task_txn *tx, const char *ns, const char *name, struct err *err)
{
    return tx->st->xops->txn_token_revoke(tx, ns, name, err);
}

int task_txn_create(json_t **out, struct task_txn *tx, const json_t *obj, struct err *err)
{
    return tx->st->xops->txn_create(out, tx, obj, err);
}

int task_txn_env_get(json_t **out, struct task_txn *tx, const char *ns, const char *name,
                     struct err *err)
{
    return tx->st->xops->txn_env_get(out, tx, ns, name, err);
}

int task_txn_env_put(struct task_txn *tx, json_t *env, struct err *err)
{
    return tx->st->xops->txn_env_put(tx, env, err);
}

int task_txn_env_delete(struct task_txn *tx, const char *ns, const char *name, struct err *err)
{
    return tx->st->xops->txn_env_delete(tx, ns, name, err);
}

int task_txn_inbox_fail(struct task_txn *tx, int64_t id, const char *error, struct err *err)
{
    return tx->st->xops->txn_inbox_fail(tx, id, error, err);
}

int task_txn_inbox_done(struct task_txn *tx, int64_t id, struct err *err)
{
    return tx->st->xops->txn_inbox_done(tx, id, err);
}

int task_txn_outbox_add(int64_t *id_out, struct task_txn *tx, const struct outbox_entry *e,
                        struct err *err)
{
    return tx->st->xops->txn_outbox_add(id_out, tx, e, err);
}

int task_txn_sticky_note(struct task_txn *tx, const char *key, const char *provider,
                         const char *project, int64_t number, const char *ns, const char *name,
                         const char *hash, const char *phase, struct err *err)
{
    return tx->st->xops->txn_sticky_note(tx, key, provider, project, number, ns, name, hash, phase,
                                         err);
}

int task_store_token_current(struct token_record *out, struct task_store *st, const char *ns,
                             const char *name, struct err *err)
{
    return st->xops->token_current(out, st, ns, name, err);
}

int task_store_totals(struct task_totals *out, struct task_store *st, struct err *err)
{
    return st->xops->totals(out, st, err);
}

int task_store_list_text(int64_t *rv_out, struct task_store *st, const char *ns, task_text_fn fn,
                         void *userdata, struct err *err)
{
    return st->xops->list_text(rv_out, st, ns, fn, userdata, err);
}

int task_store_get_text(struct task_store *st, const char *ns, const char *name, task_text_fn fn,
                        void *userdata, struct err *err)
{
    return st->xops->get_text(st, ns, name, fn, userdata, err);
}

int task_store_inbox_add(bool *duplicate_out, struct task_store *st, const struct inbox_entry *e,
                         struct err *err)
{
    return st->xops->inbox_add(duplicate_out, st, e, err);
}

int task_store_inbox_next_batch(struct inbox_entry *out, size_t max, size_t *n_out,
                                int64_t *wait_ms_out, struct task_store *st, struct err *err)
{
    return st->xops->inbox_next_batch(out, max, n_out, wait_ms_out, st, err);
}

int task_store_inbox_retry(struct task_store *st, int64_t id, int64_t delay_ms, bool failed,
                           const char *error, struct err *err)
{
    return st->xops->inbox_retry(st, id, delay_ms, failed, error, err);
}

int task_store_inbox_depth(int64_t *out, struct task_store *st, struct err *err)
{
    return st->xops->inbox_depth(out, st, err);
}

int task_store_inbox_installation(int64_t *out, struct task_store *st, const char *provider,
                                  const char *project, struct err *err)
{
    return st->xops->inbox_installation(out, st, provider, project, err);
}

int task_store_outbox_next(struct outbox_entry *out, int64_t *wait_ms_out, struct task_store *st,
                           struct err *err)
{
    return st->xops->outbox_next(out, wait_ms_out, st, err);
}

void task_store_outbox_release(struct task_store *st)
{
    st->xops->outbox_release(st);
}

int task_store_outbox_done(struct task_store *st, int64_t id, const char *result, struct err *err)
{
    return st->xops->outbox_done(st, id, result, err);
}

int task_store_outbox_defer(struct task_store *st, int64_t id, int64_t delay_ms, const char *why,
                            struct err *err)
{
    return st->xops->outbox_defer(st, id, delay_ms, why, err);
}

int task_store_outbox_retry(struct task_store *st, int64_t id, int64_t delay_ms, bool failed,
                            const char *error, struct err *err)
{
    return st->xops->outbox_retry(st, id, delay_ms, failed, error, err);
}

int task_store_outbox_result(char **out, char state_out[16], struct task_store *st, int64_t id,
                             struct err *err)
{
    return st->xops->outbox_result(out, state_out, st, id, err);
}

int task_store_outbox_depth(int64_t *out, struct task_store *st, struct err *err)
{
    return st->xops->outbox_depth(out, st, err);
}

int64_t task_store_queue_gen(struct task_store *st, bool outbox)
{
    return st->xops->queue_gen(st, outbox);
}

void task_store_queue_wait(struct task_store *st, bool outbox, int64_t since_gen,
                           int64_t timeout_ms)
{
    st->xops->queue_wait(st, outbox, since_gen, timeout_ms);
}

int task_store_sticky_get(struct sticky_state *out, struct task_store *st, const char *key,
                          struct err *err)
{
    return st->xops->sticky_get(out, st, key, err);
}

int task_store_sticky_sent(struct task_store *st, const char *key, const char *comment_id,
                           struct err *err)
{
    return st->xops->sticky_sent(st, key, comment_id, err);
}

int task_store_sticky_list(json_t **out, struct task_store *st, const char *provider,
                           const char *project, int64_t number, struct err *err)
{
    return st->xops->sticky_list(out, st, provider, project, number, err);
}

int task_store_local_add(int64_t *id_out, struct task_store *st, const char *project,
                         int64_t number, const char *author, const char *body, struct err *err)
{
    if (st->xops->local_add == NULL) {
        return local_refused(err);
    }
    return st->xops->local_add(id_out, st, project, number, author, body, err);
}

int task_store_local_open_pull(int64_t *number_out, bool *existed_out, struct task_store *st,
                               const char *project, const char *marker, const char *author,
                               const char *body, struct err *err)
{
    if (st->xops->local_open_pull == NULL) {
        return local_refused(err);
    }
    return st->xops->local_open_pull(number_out, existed_out, st, project, marker, author, body,
                                     err);
}

int task_store_local_update(struct task_store *st, const char *project, int64_t id,
                            const char *body, struct err *err)
{
    if (st->xops->local_update == NULL) {
        return local_refused(err);
    }
    return st->xops->local_update(st, project, id, body, err);
}

int task_store_local_delete(struct task_store *st, const char *project, int64_t id, struct err *err)
{
    if (st->xops->local_delete == NULL) {
        return local_refused(err);
    }
    return st->xops->local_delete(st, project, id, err);
}

int task_store_local_react(struct task_store *st, const char *project, int64_t id,
                           const char *author, const char *content, struct err *err)
{
    if (st->xops->local_react == NULL) {
        return local_refused(err);
    }
    return st->xops->local_react(st, project, id, author, content, err);
}

int task_store_local_thread(json_t **out, struct task_store *st, const char *project,
                            int64_t number, struct err *err)
{
    if (st->xops->local_thread == NULL) {
        return local_refused(err);
    }
    return st->xops->local_thread(out, st, project, number, err);
}

int task_store_local_permission_set(struct task_store *st, const char *project, const char *user,
                                    int level, struct err *err)
{
    if (st->xops->local_permission_set == NULL) {
        return local_refused(err);
    }
    return st->xops->local_permission_set(st, project, user, level, err);
}

int task_store_local_permission_get(int *level_out, struct task_store *st, const char *project,
                                    const char *user, struct err *err)
{
    if (st->xops->local_permission_get == NULL) {
        return local_refused(err);
    }
    return st->xops->local_permission_get(level_out, st, project, user, err);
}

int task_store_local_pull_set(bool *created_out, struct task_store *st, const char *project,
                              int64_t number, const char *url, const char *head, const char *base,
                              struct err *err)
{
    if (st->xops->local_pull_set == NULL) {
        return local_refused(err);
    }
    return st->xops->local_pull_set(created_out, st, project, number, url, head, base, err);
}

int task_store_local_pull_get(json_t **out, struct task_store *st, const char *project,
                              int64_t number, struct err *err)
{
    if (st->xops->local_pull_get == NULL) {
        return local_refused(err);
    }
    return st->xops->local_pull_get(out, st, project, number, err);
}

int task_store_charges(struct task_charge_point *out, size_t max, size_t *n_out, int64_t *count_out,
                       struct task_store *st, const char *task_uid, struct err *err)
{
    *n_out = 0;
    *count_out = 0;
    if (st->xops->charges == NULL) {
        return err_set(err, E_INVALID, "the %s store keeps no times of charges", st->ops->name);
    }
    if (max > TASK_CHARGE_POINTS_MAX) {
        max = TASK_CHARGE_POINTS_MAX;
    }
    return max == 0 ? E_OK : st->xops->charges(out, max, n_out, count_out, st, task_uid, err);
}

bool task_store_keeps_resv(struct task_store *st)
{
    return st->xops->resv_list != NULL;
}

static int resv_refused(struct task_store *st, struct err *err)
{
    return err_set(err, E_INVALID, "the %s store keeps no reservation records", st->ops->name);
}

int task_txn_token_epoch(uint64_t *out, struct task_txn *tx)
{
    *out = 0;
    if (tx->st->xops->txn_token_epoch == NULL) {
        return E_INVALID;
    }
    return tx->st->xops->txn_token_epoch(out, tx);
}

int task_txn_resv_put(struct task_txn *tx, const struct store_resv *r, struct err *err)
{
    if (tx->st->xops->txn_resv_put == NULL) {
        return resv_refused(tx->st, err);
    }
    return tx->st->xops->txn_resv_put(tx, r, err);
}

int task_txn_resv_drop(struct task_txn *tx, const char *request_id, struct err *err)
{
    if (tx->st->xops->txn_resv_drop == NULL) {
        return resv_refused(tx->st, err);
    }
    return tx->st->xops->txn_resv_drop(tx, request_id, err);
}

int task_store_list_live(struct task_store *st, task_text_fn fn, void *userdata, struct err *err)
{
    int64_t rv = 0;

    if (st->xops->list_live != NULL) {
        return st->xops->list_live(st, fn, userdata, err);
    }
    return task_store_list_text(&rv, st, NULL, fn, userdata, err);
}

int task_store_resv_list(json_t **items_out, struct task_store *st, struct err *err)
{
    *items_out = NULL;
    if (st->xops->resv_list == NULL) {
        return resv_refused(st, err);
    }
    return st->xops->resv_list(items_out, st, err);
}
