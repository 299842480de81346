/* SPDX-License-Identifier: Apache-2.0 */
/* The Kubernetes backend of task_store (docs/cluster-mode.md), shared inside store/ only:
 * store_kube.c (tasks, Environments, the change feed), store_kube_txn.c (transactions,
 * meter ids, the token index) and store_kube_queue.c (inbox, outbox, sticky state). */
#ifndef DIVERGE_STORE_STORE_KUBE_INT_H
#define DIVERGE_STORE_STORE_KUBE_INT_H

#include <pthread.h>
#include <stdatomic.h>

#include "kube/kube.h"
#include "store/store_int.h"

#define KST_RING 4096     /* task change events kept for watchers */
#define KST_RETRIES 5     /* conflict retries of one write or transaction */
#define KST_SEEN_MS 10000 /* how long a write waits for its own event in the cache */
#define KST_TOKEN_INDEX "diverge-agenttask-tokens"
#define KST_QUEUE_LABEL "divergedev.com/queue"

struct kube_store {
    struct task_store base;      /* must be first */
    struct kube_client *c;       /* owned */
    char *ns;                    /* namespace of the token index and the queue ConfigMaps */
    struct kube_informer *tasks; /* AgentTasks of every namespace */
    struct kube_informer *queue; /* ConfigMaps labelled KST_QUEUE_LABEL in ns */
    pthread_mutex_t mu;          /* guards the fields below */
    pthread_cond_t changed;      /* a task event, a queue event, or wake() */
    struct event ring[KST_RING]; /* slot seq % KST_RING */
    int64_t seq;                 /* events published so far */
    int64_t first;               /* seq of the oldest event kept */
    size_t ring_bytes;           /* JSON bytes held by ring */
    int64_t rv;                  /* newest task resourceVersion published */
    int64_t floor;               /* watches from before this rv must list again (410) */
    int64_t prime_rv;            /* the first list's resourceVersion (its events are skipped) */
    int64_t queue_rv;            /* newest queue ConfigMap resourceVersion seen */
    int64_t wake_gen;            /* bumped by wake() */
    int64_t inbox_gen, outbox_gen;
    char outbox_inflight[64]; /* name of the outbox entry being sent, or "" */
};

static inline struct kube_store *kst_of(struct task_store *st)
{
    return container_of(st, struct kube_store, base);
}

/* metadata.resourceVersion of OBJ as an integer; 0 when absent or not a number. */
int64_t kst_rv_of(const json_t *obj);
/* Waits (bounded) until the task feed (QUEUE false) or the queue cache (true) has seen RV,
 * so a read after one of our writes sees it. */
void kst_wait_seen(struct kube_store *s, int64_t rv, bool queue);
/* Called by the queue informer for every ConfigMap change (store_kube_queue.c). */
void kst_queue_event(enum kube_event type, const json_t *obj, void *userdata);

/* store_kube_txn.c */
int kst_txn(struct task_store *st, task_txn_fn fn, void *userdata, struct err *err);
int kst_txn_get(json_t **out, struct task_txn *tx, const char *ns, const char *name,
                struct err *err);
int kst_txn_put(struct task_txn *tx, json_t *doc, struct err *err);
int kst_txn_savepoint(struct task_txn *tx, struct err *err);
int kst_txn_release(struct task_txn *tx, struct err *err);
void kst_txn_rollback_savepoint(struct task_txn *tx);
int kst_txn_meter_claim(bool *fresh_out, struct task_txn *tx, const char *task_uid,
                        const char *request_id, int64_t tokens, int64_t cost_micros,
                        struct err *err);
int kst_txn_token_current(struct token_record *out, struct task_txn *tx, const char *ns,
                          const char *name, struct err *err);
int kst_txn_token_add(struct task_txn *tx, const char *ns, const char *name, int64_t generation,
                      const char *token_id, const char *token, struct err *err);
int kst_txn_token_revoke(struct task_txn *tx, const char *ns, const char *name, struct err *err);
int kst_txn_create(json_t **out, struct task_txn *tx, const json_t *obj, struct err *err);
int kst_txn_env_get(json_t **out, struct task_txn *tx, const char *ns, const char *name,
                    struct err *err);
int kst_txn_env_put(struct task_txn *tx, json_t *env, struct err *err);
int kst_txn_env_delete(struct task_txn *tx, const char *ns, const char *name, struct err *err);
int kst_token_current(struct token_record *out, struct task_store *st, const char *ns,
                      const char *name, struct err *err);
/* Creates the normalized task OBJ: the object, then its status (the API server drops status
 * on create). *out (may be NULL): the stored object. */
int kst_create_task(json_t **out, struct kube_store *s, const json_t *obj, struct err *err);
/* Writes DOC (read at its metadata.resourceVersion) over ORIG: the main resource when
 * metadata or spec changed, then the status when it changed; DOC's metadata is updated from
 * the result. E_CONFLICT when stale. *rv_out: the last rv written (0 when nothing was). */
int kst_write_task(int64_t *rv_out, struct kube_store *s, json_t *doc, const json_t *orig,
                   struct err *err);

/* store_kube_queue.c: the xops entries of the inbox, outbox and sticky state. */
int kst_txn_inbox_fail(struct task_txn *tx, int64_t id, const char *error, struct err *err);
int kst_txn_inbox_done(struct task_txn *tx, int64_t id, struct err *err);
int kst_txn_outbox_add(int64_t *id_out, struct task_txn *tx, const struct outbox_entry *e,
                       struct err *err);
int kst_txn_sticky_note(struct task_txn *tx, const char *key, const char *provider,
                        const char *project, int64_t number, const char *ns, const char *name,
                        const char *hash, const char *phase, struct err *err);
int kst_inbox_add(bool *duplicate_out, struct task_store *st, const struct inbox_entry *e,
                  struct err *err);
int kst_inbox_next_batch(struct inbox_entry *out, size_t max, size_t *n_out, int64_t *wait_ms_out,
                         struct task_store *st, struct err *err);
int kst_inbox_retry(struct task_store *st, int64_t id, int64_t delay_ms, bool failed,
                    const char *error, struct err *err);
int kst_inbox_depth(int64_t *out, struct task_store *st, struct err *err);
int kst_inbox_installation(int64_t *out, struct task_store *st, const char *provider,
                           const char *project, struct err *err);
int kst_outbox_next(struct outbox_entry *out, int64_t *wait_ms_out, struct task_store *st,
                    struct err *err);
void kst_outbox_release(struct task_store *st);
int kst_outbox_done(struct task_store *st, int64_t id, const char *result, struct err *err);
int kst_outbox_defer(struct task_store *st, int64_t id, int64_t delay_ms, const char *why,
                     struct err *err);
int kst_outbox_retry(struct task_store *st, int64_t id, int64_t delay_ms, bool failed,
                     const char *error, struct err *err);
int kst_outbox_result(char **out, char state_out[16], struct task_store *st, int64_t id,
                      struct err *err);
int kst_outbox_depth(int64_t *out, struct task_store *st, struct err *err);
int64_t kst_queue_gen(struct task_store *st, bool outbox);
void kst_queue_wait(struct task_store *st, bool outbox, int64_t since_gen, int64_t timeout_ms);
int kst_sticky_get(struct sticky_state *out, struct task_store *st, const char *key,
                   struct err *err);
int kst_sticky_sent(struct task_store *st, const char *key, const char *comment_id,
                    struct err *err);
int kst_sticky_list(json_t **out, struct task_store *st, const char *provider, const char *project,
                    int64_t number, struct err *err);

#endif
