/* SPDX-License-Identifier: Apache-2.0 */
/* The Kubernetes backend of task_store (docs/cluster-mode.md), shared inside store/ only:
 * store_kube.c (tasks, Environments, the change feed), store_kube_txn.c (transactions,
 * meter ids, the token index) and store_kube_queue.c (inbox, outbox, sticky state). */
#ifndef DIVERGE_STORE_STORE_KUBE_INT_H
#define DIVERGE_STORE_STORE_KUBE_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "kube/kube.h"
#include "store/store_backend.h"

#define KST_RING 4096     /* task change events kept for watchers */
#define KST_RETRIES 5     /* conflict retries of one write or transaction */
#define KST_SEEN_MS 10000 /* how long a write waits for its own event in the cache */
#define KST_TOKEN_INDEX "diverge-agenttask-tokens"
#define KST_QUEUE_LABEL "divergedev.com/queue"
#define KST_GC_EVERY_MS 60000                      /* queue garbage collection period */
#define KST_INBOX_KEEP_MS (7LL * 24 * 3600 * 1000) /* done inbox entries (redeliveries) */
#define KST_OUTBOX_KEEP_MS (3600LL * 1000)         /* done outbox entries */

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
    int64_t gc_ms[2];         /* last kst_cm_gc of the inbox, the outbox */
};

static inline struct kube_store *kst_of(struct task_store *st)
{
    return container_of(st, struct kube_store, base);
}

/* OBJ with the Pending status of a new task when it has none (an AgentTask written by
 * kubectl, or between our create and its status write: the API server drops status on
 * create), as the embedded store always shows one. Returns OBJ. */
json_t *kst_fill_status(json_t *obj);
/* metadata.resourceVersion of OBJ as an integer; 0 when absent or not a number. */
int64_t kst_rv_of(const json_t *obj);
/* Waits (bounded) until the task feed (QUEUE false) or the queue cache (true) has seen RV,
 * so a read after one of our writes sees it. */
void kst_wait_seen(struct kube_store *s, int64_t rv, bool queue);
/* store_kube_quota.c: SpendQuotas. QUOTAS maps "ns/name" to the quota a transaction put
 * (or null: deleted), ORIG to the quota as read; kst_quota_commit writes them (status
 * through the status subresource), each guarded by the resourceVersion read: E_CONFLICT
 * reruns the transaction. */
int kst_quota_list(json_t **items_out, struct kube_store *s, json_t *quotas, json_t *orig,
                   const char *ns, struct err *err);
int kst_quota_commit(struct kube_store *s, json_t *quotas, json_t *orig, struct err *err);
/* store_kube_feed.c: the change feed. */
void kst_on_task_event(enum kube_event type, const json_t *obj, void *userdata);
int kst_watch(int64_t *last_rv_out, struct task_store *st, const char *ns, int64_t since_rv,
              int timeout_ms, task_event_fn fn, void *userdata, struct err *err);
void kst_wake(struct task_store *st);
/* Called by the queue informer for every ConfigMap change (store_kube_queue.c). */
void kst_queue_event(enum kube_event type, const json_t *obj, void *userdata);

/* store_kube_txn.c */
int kst_txn(struct task_store *st, task_txn_fn fn, void *userdata, struct err *err);
/* Revokes the current token of NS/NAME at once (outside a transaction: a deleted task). */
int kst_token_revoke(struct task_store *st, const char *ns, const char *name, struct err *err);
/* Queues OP (taken) to be written after the transaction's tasks, once (store_kube_txn.c). */
void kst_txn_defer(struct task_txn *tx, json_t *op);
/* A bot step for inbox entry ID ends (its done/fail mark): when a task it changed already
 * carries ID in KST_ANN_APPLIED (a leader applied it and died before the mark), its task
 * changes are undone; else the changed tasks get ID (in the same write as the change). */
void kst_txn_inbox_mark(struct task_txn *tx, int64_t id);
#define KST_ANN_APPLIED "divergedev.com/applied-inbox" /* newest first, comma separated */
#define KST_APPLIED_KEEP 16
bool kst_applied_has(const json_t *doc, int64_t id);
void kst_applied_add(json_t *doc, int64_t id);
/* Writes one deferred queue op: {"op":"outbox"|"sticky"|"edit", ...} (store_kube_outbox.c). */
int kst_queue_apply(struct kube_store *s, const json_t *op, struct err *err);
void kst_outbox_name_replies(json_t *later); /* names replies after their inbox entry */
/* Creates the normalized task OBJ: the object, then its status (the API server drops status
 * on create). *out (may be NULL): the stored object. */
int kst_create_task(json_t **out, struct kube_store *s, const json_t *obj, struct err *err);
/* Writes DOC (read at its metadata.resourceVersion) over ORIG: the main resource when
 * metadata or spec changed, then the status when it changed; DOC's metadata is updated from
 * the result. E_CONFLICT when stale. *rv_out: the last rv written (0 when nothing was). */
int kst_write_task(int64_t *rv_out, struct kube_store *s, json_t *doc, const json_t *orig,
                   struct err *err);

/* store_kube_event.c: Kubernetes Events for phase changes. */
#define KST_EVENT_COMPONENT "diverge" /* source.component of our Events */
#define KST_EVENT_MESSAGE_MAX 1024    /* bytes of an Event's message, with the NUL */
/* status.phase of TASK, "" when it has none. */
const char *kst_phase_of(const json_t *task);
/* The core/v1 Event (new object) recording that TASK (as written, with its new
 * resourceVersion) went from OLD_PHASE ("" for a new task) to its status.phase, at NOW_MS. */
json_t *kst_event_build(const json_t *task, const char *old_phase, int64_t now_ms);
/* Creates that Event when the phase changed. Never fails: an error is logged. */
void kst_event_phase(struct kube_store *s, const json_t *task, const char *old_phase);

/* store_kube_cm.c: the queue ConfigMaps */
#define KST_Q_INBOX "inbox"
#define KST_Q_OUTBOX "outbox"
#define KST_Q_STICKY "sticky"

/* One state change of a queue entry. */
struct kst_edit {
    const char *state; /* new state, or NULL to keep */
    int64_t next_ms;   /* new due time, or -1 to keep */
    int attempts_add;
    const char *error; /* or NULL */
    const char *result;
    bool set_error, set_result;
    int64_t now_ms; /* set by kst_cm_edit_id: doneMs of an entry that leaves pending */
};

/* Changes a ConfigMap read fresh; non-zero: no write, that code. */
typedef int (*kst_cm_edit_fn)(json_t *cm, void *ud);

json_t *kst_str_take(char *s); /* a JSON string of S, which it frees */
uint64_t kst_fnv(const char *s, uint64_t h);
int64_t kst_id_of_name(const char *name); /* an entry's id: 53 bits of its name's hash */
const char *kst_cm_name(const json_t *cm);
const char *kst_cm_str(const json_t *cm, const char *key);
int64_t kst_cm_int(const json_t *cm, const char *key);
void kst_cm_set(json_t *cm, const char *key, const char *value);
void kst_cm_set_int(json_t *cm, const char *key, int64_t v);
char *kst_dupv(const json_t *o, const char *k);
json_t *kst_cm_new(struct kube_store *s, const char *name, const char *queue);
/* Creates CM and waits until the cache has it. E_CONFLICT when the name exists. */
int kst_cm_create(struct kube_store *s, const json_t *cm, struct err *err);
/* Reads NAME, lets FN change it and replaces it rv-guarded, retrying conflicts. */
int kst_cm_update(struct kube_store *s, const char *name, kst_cm_edit_fn fn, void *ud,
                  struct err *err);
/* The cached entries of QUEUE in arrival order (new array). */
json_t *kst_cm_cached(struct kube_store *s, const char *queue);
/* The name of QUEUE's entry ID (new string), or NULL. */
char *kst_cm_name_of_id(struct kube_store *s, const char *queue, int64_t id);
bool kst_cm_pending(const json_t *cm);
int kst_cm_edit_id(struct kube_store *s, const char *queue, int64_t id, const struct kst_edit *e,
                   struct err *err);
/* The due pending entries of QUEUE, at most MAX, each PR's from its oldest pending one while
 * due (a PR's order holds); SKIP is never taken. *wait_ms_out: until the next not-due one,
 * -1 when nothing else is pending. New array. */
json_t *kst_cm_due(int64_t *wait_ms_out, struct kube_store *s, const char *queue, size_t max,
                   const char *skip);
int kst_cm_count_pending(int64_t *out, struct kube_store *s, const char *queue);
/* Deletes QUEUE's entries done or failed more than KEEP_MS ago (at most once a
 * KST_GC_EVERY_MS per queue). Done inbox entries are kept KST_INBOX_KEEP_MS so that a
 * redelivery within that time is still a duplicate. */
void kst_cm_gc(struct kube_store *s, const char *queue, int64_t keep_ms);

/* store_kube_queue.c, store_kube_outbox.c: the xops entries of the inbox, outbox and sticky state.
 */

/* The backend's implementation of every operation of struct task_store_xops. */
#define KST_XOP_DECLARE(RET, NAME, PARAMS) RET kst_##NAME PARAMS;
STORE_XOPS_SHARED(KST_XOP_DECLARE)

#endif
