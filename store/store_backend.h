/* SPDX-License-Identifier: Apache-2.0 */
/* What a task_store backend implements besides struct task_store_ops: the transaction's
 * operations, the queues (inbox, outbox), sticky state, the token index and the `local` SCM.
 * store_dispatch.c routes every public function of store.h through this table, so the
 * SQLite and Kubernetes backends are interchangeable. Below the table, what the backends
 * share (store_backend.c, task_model.c). The one internal header of store/: the backends
 * (store/sqlite/, store/kube/) include it; nothing in store/ includes a backend's header. */
#ifndef DIVERGE_STORE_STORE_BACKEND_H
#define DIVERGE_STORE_STORE_BACKEND_H

#include <pthread.h>
#include <stdbool.h>
#include <time.h>

#include "store/store.h"

/* Every backend's transaction starts with this (container_of to the backend's own). */
struct task_txn {
    struct task_store *st; /* the backend that runs the transaction */
};

/* The operations every backend implements, as X(return type, name, (parameters)); the
 * table below, and each backend's prototypes and table, are made from these lists, so a
 * backend and the table cannot drift apart. Backend B names its functions B_<name>. */
/* clang-format off */
#define STORE_XOPS_SHARED(X) \
    X(int, txn_get, (json_t **out, struct task_txn *tx, const char *ns, const char *name, \
        struct err *err)) \
    X(int, txn_put, (struct task_txn *tx, json_t *doc, struct err *err)) \
    X(int, txn_savepoint, (struct task_txn *tx, struct err *err)) \
    X(int, txn_release, (struct task_txn *tx, struct err *err)) \
    X(void, txn_rollback_savepoint, (struct task_txn *tx)) \
    X(int, txn_meter_claim, (bool *fresh_out, struct task_txn *tx, const char *task_uid, \
        const char *request_id, int64_t tokens, int64_t cost_micros, struct err *err)) \
    X(int, txn_token_current, (struct token_record *out, struct task_txn *tx, const char *ns, \
        const char *name, struct err *err)) \
    X(int, txn_token_add, (struct task_txn *tx, const char *ns, const char *name, \
        int64_t generation, const char *token_id, const char *token, struct err *err)) \
    X(int, txn_token_revoke, (struct task_txn *tx, const char *ns, const char *name, \
        struct err *err)) \
    X(int, txn_create, (json_t **out, struct task_txn *tx, const json_t *obj, struct err *err)) \
    X(int, txn_env_get, (json_t **out, struct task_txn *tx, const char *ns, const char *name, \
        struct err *err)) \
    X(int, txn_env_put, (struct task_txn *tx, json_t *env, struct err *err)) \
    X(int, txn_env_delete, (struct task_txn *tx, const char *ns, const char *name, \
        struct err *err)) \
    X(int, txn_quota_list, (json_t **items_out, struct task_txn *tx, const char *ns, \
        struct err *err)) \
    X(int, txn_quota_put, (struct task_txn *tx, json_t *q, struct err *err)) \
    X(int, txn_quota_delete, (struct task_txn *tx, const char *ns, const char *name, \
        struct err *err)) \
    X(int, txn_inbox_fail, (struct task_txn *tx, int64_t id, const char *error, \
        struct err *err)) \
    X(int, txn_inbox_done, (struct task_txn *tx, int64_t id, struct err *err)) \
    X(int, txn_outbox_add, (int64_t *id_out, struct task_txn *tx, const struct outbox_entry *e, \
        struct err *err)) \
    X(int, txn_sticky_note, (struct task_txn *tx, const char *key, const char *provider, \
        const char *project, int64_t number, const char *ns, const char *name, \
        const char *hash, const char *phase, struct err *err)) \
    X(int, token_current, (struct token_record *out, struct task_store *st, const char *ns, \
        const char *name, struct err *err)) \
    X(int, totals, (struct task_totals *out, struct task_store *st, struct err *err)) \
    X(int, list_text, (int64_t *rv_out, struct task_store *st, const char *ns, task_text_fn fn, \
        void *userdata, struct err *err)) \
    X(int, get_text, (struct task_store *st, const char *ns, const char *name, task_text_fn fn, \
        void *userdata, struct err *err)) \
    X(int, inbox_add, (bool *duplicate_out, struct task_store *st, const struct inbox_entry *e, \
        struct err *err)) \
    X(int, inbox_next_batch, (struct inbox_entry *out, size_t max, size_t *n_out, \
        int64_t *wait_ms_out, struct task_store *st, struct err *err)) \
    X(int, inbox_retry, (struct task_store *st, int64_t id, int64_t delay_ms, bool failed, \
        const char *error, struct err *err)) \
    X(int, inbox_depth, (int64_t *out, struct task_store *st, struct err *err)) \
    X(int, inbox_installation, (int64_t *out, struct task_store *st, const char *provider, \
        const char *project, struct err *err)) \
    X(int, outbox_next, (struct outbox_entry *out, int64_t *wait_ms_out, struct task_store *st, \
        struct err *err)) \
    X(void, outbox_release, (struct task_store *st)) \
    X(int, outbox_done, (struct task_store *st, int64_t id, const char *result, \
        struct err *err)) \
    X(int, outbox_defer, (struct task_store *st, int64_t id, int64_t delay_ms, const char *why, \
        struct err *err)) \
    X(int, outbox_retry, (struct task_store *st, int64_t id, int64_t delay_ms, bool failed, \
        const char *error, struct err *err)) \
    X(int, outbox_result, (char **out, char state_out[16], struct task_store *st, int64_t id, \
        struct err *err)) \
    X(int, outbox_depth, (int64_t *out, struct task_store *st, struct err *err)) \
    X(int64_t, queue_gen, (struct task_store *st, bool outbox)) \
    X(void, queue_wait, (struct task_store *st, bool outbox, int64_t since_gen, \
        int64_t timeout_ms)) \
    X(int, sticky_get, (struct sticky_state *out, struct task_store *st, const char *key, \
        struct err *err)) \
    X(int, sticky_sent, (struct task_store *st, const char *key, const char *comment_id, \
        struct err *err)) \
    X(int, sticky_list, (json_t **out, struct task_store *st, const char *provider, \
        const char *project, int64_t number, struct err *err))
/* The `local` SCM's operations (a backend may leave them NULL). */
#define STORE_XOPS_LOCAL(X) \
    X(int, local_add, (int64_t *id_out, struct task_store *st, const char *project, \
        int64_t number, const char *author, const char *body, struct err *err)) \
    X(int, local_open_pull, (int64_t *number_out, bool *existed_out, struct task_store *st, \
        const char *project, const char *marker, const char *author, const char *body, \
        struct err *err)) \
    X(int, local_update, (struct task_store *st, const char *project, int64_t id, \
        const char *body, struct err *err)) \
    X(int, local_delete, (struct task_store *st, const char *project, int64_t id, \
        struct err *err)) \
    X(int, local_react, (struct task_store *st, const char *project, int64_t id, \
        const char *author, const char *content, struct err *err)) \
    X(int, local_thread, (json_t **out, struct task_store *st, const char *project, \
        int64_t number, struct err *err)) \
    X(int, local_permission_set, (struct task_store *st, const char *project, const char *user, \
        int level, struct err *err)) \
    X(int, local_permission_get, (int *level_out, struct task_store *st, const char *project, \
        const char *user, struct err *err)) \
    X(int, local_pull_set, (bool *created_out, struct task_store *st, const char *project, \
        int64_t number, const char *url, const char *head, const char *base, struct err *err)) \
    X(int, local_pull_get, (json_t **out, struct task_store *st, const char *project, \
        int64_t number, struct err *err))
/* What a backend may not keep (NULL: the caller gets E_INVALID "not kept by this store"). */
#define STORE_XOPS_OPTIONAL(X) \
    X(int, txn_token_epoch, (uint64_t *out, struct task_txn *tx)) \
    X(int, charges, (struct task_charge_point *out, size_t max, size_t *n_out, \
        int64_t *count_out, struct task_store *st, const char *task_uid, struct err *err)) \
    X(int, txn_resv_put, (struct task_txn *tx, const struct store_resv *r, struct err *err)) \
    X(int, txn_resv_drop, (struct task_txn *tx, const char *request_id, struct err *err)) \
    X(int, resv_list, (json_t **items_out, struct task_store *st, struct err *err)) \
    X(int, list_live, (struct task_store *st, task_text_fn fn, void *userdata, struct err *err))
/* clang-format on */
/* A member of struct task_store_xops. */
#define STORE_XOPS_MEMBER(RET, NAME, PARAMS) RET(*NAME) PARAMS;
/* The operations of struct task_store_ops (store.h) by name: a backend names its
 * functions <prefix>_<name> and makes its table from this list. */
/* clang-format off */
#define STORE_OPS_NAMES(X) \
    X(get) \
    X(create) \
    X(mutate) \
    X(remove) \
    X(list) \
    X(watch) \
    X(wake) \
    X(count_phases) \
    X(env_list) \
    X(env_get) \
    X(txn) \
    X(close)
/* clang-format on */
/* The initialiser of a backend's table entry: .NAME = <backend>_NAME. */
#define STORE_XOPS_ENTRY(PREFIX, NAME) .NAME = PREFIX##_##NAME,

/* Semantics as the public functions of the same name in store.h. The local_* entries may
 * be NULL: the backend does not keep `local` SCM threads (E_INVALID to the caller). */
struct task_store_xops {
    STORE_XOPS_SHARED(STORE_XOPS_MEMBER)
    STORE_XOPS_LOCAL(STORE_XOPS_MEMBER)
    STORE_XOPS_OPTIONAL(STORE_XOPS_MEMBER)
};

/* One change of a task, as a backend's change feed keeps it for watchers. */
struct event {
    int64_t rv; /* resourceVersion of this change; 0 = empty slot */
    enum task_event_type type;
    char *json;            /* owned: the object as compact JSON */
    size_t bytes;          /* strlen(json) (store_event_fill), counted in ring_bytes */
    char ns[64];           /* metadata.namespace (DNS label, <= 63) */
    char name[64];         /* metadata.name */
    enum task_phase phase; /* status.phase */
    bool suspended;        /* spec.suspended */
    bool from_scm;         /* the divergedev.com/provider annotation is set */
};

/* The status of a new task: Pending, zero spend. New reference (task_model.c). */
json_t *task_initial_status(void);

/* Fills E for the change RV of OBJ (borrowed) whose JSON text is JSON (taken by E). */
void store_event_fill(struct event *e, int64_t rv, enum task_event_type type, const json_t *obj,
                      char *json);
/* Writes a random (version 4) UUID. */
void store_new_uid(char out[37]);

/* *GEN, read under MU: a queue's change counter (the queue_gen op). */
int64_t store_gen_get(pthread_mutex_t *mu, const int64_t *gen);
/* Sleeps on CV (with MU) until *GEN has moved past SINCE_GEN or TIMEOUT_MS have passed (the
 * queue_wait op). Takes and releases MU. */
void store_gen_wait(pthread_mutex_t *mu, pthread_cond_t *cv, const int64_t *gen, int64_t since_gen,
                    int64_t timeout_ms);

/* What a queue's pick does with one pending entry; the pick walks them in arrival order
 * and keeps one lane (a PR/MR) in order: no entry overtakes an older one of its lane. */
enum store_claim {
    STORE_CLAIM_PASS,  /* its lane is closed: an older entry of it was not taken */
    STORE_CLAIM_TAKE,  /* due and its lane open: handed out */
    STORE_CLAIM_CLOSE, /* not taken: its lane closes behind it */
};

/* The claim step of both backends' pick, pure: the entry due at NEXT_MS, at NOW, whose lane
 * is CLOSED or not; HELD: not to be taken even when due (the pick is full, or the entry is
 * the one being sent). On STORE_CLAIM_CLOSE, *wait_ms (the time until the next due entry,
 * -1 none) becomes this entry's when sooner, or 0 when the entry is due but held. */
enum store_claim store_queue_claim(int64_t *wait_ms, bool closed, int64_t next_ms, int64_t now,
                                   bool held);

#endif
