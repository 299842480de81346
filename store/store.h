/* SPDX-License-Identifier: Apache-2.0 */
/* The AgentTask model (SPEC §4) and the task_store interface. An AgentTask is held as its
 * Kubernetes-shaped JSON object (jansson), always in normalized form: validated, defaults
 * filled, money as canonical decimal strings. Backends persist and version these objects;
 * they never interpret spec fields. */
#ifndef DIVERGE_STORE_STORE_H
#define DIVERGE_STORE_STORE_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/clock.h"
#include "common/err.h"

#define TASK_API_VERSION "divergedev.com/v1alpha1"
#define TASK_KIND "AgentTask"
#define TASK_ANN_GUIDANCE "divergedev.com/guidance"
/* The draft PR opened for a completed task (written by the outbox; not in SPEC §4). */
#define TASK_ANN_PULL_REQUEST_URL "divergedev.com/pull-request-url"
/* The --sandbox-provider the task last started under (written by the controller). */
#define TASK_ANN_SANDBOX_PROVIDER "divergedev.com/sandbox-provider"
/* The branch a run's last checkpoint was pushed to (SPEC §14 "Work in progress"). */
#define TASK_ANN_WIP_BRANCH "divergedev.com/wip-branch"
/* Written by the bot on tasks made from comments (not in SPEC §4): the clone URL of the
 * repository the PR/MR targets, its base branch, and the push grant (token_push_grant)
 * that lets the working branch equal spec.repository.baseBranch. */
#define TASK_ANN_PR_BASE_REPOSITORY "divergedev.com/pr-base-repository"
#define TASK_ANN_PR_BASE_BRANCH "divergedev.com/pr-base-branch"
#define TASK_ANN_PUSH_GRANT "divergedev.com/push-grant"
#define TASK_METER_RING 32                 /* status.lastMeterRequestIds keeps this many ids */
#define STORE_METER_INDEX_IDS 4096         /* request ids the meter keeps in memory */
#define STORE_METER_INDEX_BYTES (1u << 20) /* and at most about this many bytes of them */
#define STORE_EVENT_RING_BYTES (64u << 20) /* JSON kept for watchers; oldest evicted (410) */
#define STORE_TASK_COPY_BYTES (256u << 20) /* task text kept for GET and list (then SQLite) */
#define TASK_OBJECTIVE_MAX 4096            /* bytes of spec.objective; longer is 422 */
#define TASK_COMMAND_MAX 4096              /* bytes of spec.runner.command / verifyCommand */
#define TASK_ALLOWED_HOSTS_MAX 64          /* entries of spec.sandbox.allowedHosts */
#define TASK_ALLOWED_HOST_MAX 270          /* bytes of one entry (253-byte name, ":65535") */
#define TASK_GUIDANCE_MAX 16384 /* bytes of the TASK_ANN_GUIDANCE annotation; longer is 422 */

enum task_phase {
    TASK_PENDING,
    TASK_PROVISIONING,
    TASK_ACTIVE,
    TASK_PAUSING,
    TASK_PAUSED,
    TASK_COMPLETED,
    TASK_FAILED,
    TASK_PHASE_COUNT,
};

/* "Pending", "Active", ... Never NULL for a valid phase. */
const char *task_phase_name(enum task_phase p);
/* Parses a phase name; E_INVALID when unknown. */
int task_phase_parse(enum task_phase *out, const char *s);

/* True when S is a Kubernetes DNS label: [a-z0-9]([-a-z0-9]*[a-z0-9])?, at most 63. */
bool task_name_valid(const char *s);

/* --- Model ------------------------------------------------------------------------ */

/* Validates OBJ, a client's AgentTask for create in namespace NS (from the URL), and
 * returns in *out a new normalized object (caller json_decref()s): metadata reduced to
 * name, namespace, labels and annotations (server fields are set by the store), spec
 * checked and defaulted, status reset to the Pending status. Returns E_INVALID with the
 * field path in err->field (also for spec.objective over TASK_OBJECTIVE_MAX bytes and the
 * guidance annotation over TASK_GUIDANCE_MAX bytes), E_CONFLICT... never. */
int task_normalize_new(json_t **out, const json_t *obj, const char *ns, struct err *err);

/* Validates an entire stored-shape object (metadata, spec, status) without changing
 * server-owned metadata; used after every patch. Returns E_INVALID with the field path. */
int task_validate(const json_t *obj, struct err *err);
/* apiVersion and kind of OBJ, when present, must be ours (divergedev.com/v1alpha1, KIND):
 * E_INVALID with the field. */
int task_check_type_fields(const json_t *obj, const char *kind, struct err *err);
/* *OUT: the parts of metadata MD a client may set (name, labels, annotations), with the
 * namespace NS of the URL (may be NULL) in place of MD's own, which must then equal it.
 * E_INVALID when MD is not an object. For every kind of the task API. */
int task_copy_metadata(json_t **out, const json_t *md, const char *ns, struct err *err);

/* Which part of the object a patch may change. */
enum task_patch_scope {
    TASK_PATCH_MAIN,   /* metadata (labels, annotations) and spec */
    TASK_PATCH_STATUS, /* the /status subresource: status only */
};

/* Applies the RFC 7386 merge patch PATCH to the stored object DOC in place, limited to
 * SCOPE: changes outside the scope are ignored (Kubernetes convention), except that
 * metadata.name/namespace must not change (E_INVALID). When the patch carries
 * metadata.resourceVersion it must equal DOC's (else E_CONFLICT). The result is
 * re-validated; on error DOC may be partly changed and must be discarded. */
int task_apply_merge_patch(json_t *doc, json_t *patch, enum task_patch_scope scope,
                           struct err *err);

/* RFC 7386 merge patch of TARGET by PATCH (generic, in place). Returns TARGET or, when
 * PATCH is not an object, a new reference to PATCH (the caller replaces TARGET). */
json_t *json_merge_patch(json_t *target, json_t *patch);

/* The typed view of a normalized object: strings are borrowed from the object. */
struct task_view {
    const char *name;         /* metadata.name */
    const char *ns;           /* metadata.namespace */
    int64_t resource_version; /* metadata.resourceVersion, 0 when unset */
    const char *objective;    /* spec.objective */
    int64_t budget_usd;       /* spec.budgetUSD micro-dollars, 0 when unset */
    int64_t budget_tokens;    /* spec.budgetTokens, 0 when unset */
    int64_t max_iterations;   /* spec.maxIterations, 0 when unset */
    bool suspended;           /* spec.suspended */
    enum task_phase phase;    /* status.phase */
    int64_t iteration;        /* status.iteration */
    int64_t tokens_consumed;  /* status.tokensConsumed */
    int64_t cost_usd;         /* status.costUSD micro-dollars */
    int64_t run;              /* spec.run: the run asked for, 1 when unset (SPEC §14) */
    int64_t status_run;       /* status.run: the run started last, 1 when unset */
    int64_t queue_position;   /* status.queuePosition, 0 when not queued */
};

/* Fills V from the normalized object OBJ (which must outlive V). */
void task_view_of(struct task_view *v, const json_t *obj);
/* status.phase of the task STATUS (task_view's phase): Pending when unset or unknown. */
enum task_phase task_phase_of(const json_t *status);
/* Fills only what a charge is decided on (the budgets, maxIterations, phase, iteration and
 * spend; the rest zero): the meter's committer reads it once per charge. */
void task_view_spend_of(struct task_view *v, const json_t *obj);

/* Whether V asks for a run that has not started yet: finished (Completed or Failed) with
 * spec.run above status.run (SPEC §14). */
bool task_rerun_due(const struct task_view *v);
/* The status reason of a task that waits for a slot (SPEC §14 queue). */
#define TASK_REASON_QUEUED "Queued"

/* Sets status.phase (and reason/message, which may be NULL for ""). A finished task
 * (Completed, Failed) has nothing left to forecast: the forecast fields are removed. */
void task_set_phase(json_t *obj, enum task_phase phase, const char *reason, const char *message);
/* The spend forecast of a task (SPEC §15, docs/agenttask.md "Forecast"): exact integer
 * arithmetic on what the meter recorded. While the runner works on iteration K
 * (status.iteration), iterations 1..K-1 are done and their spend is status.costUSD; the
 * forecast exists once two are done (K >= 3) and K <= spec.maxIterations:
 *   per iteration  = ceil(cost / (K - 1))            micro-dollars
 *   iterations left = maxIterations - K + 1           (K itself included)
 *   forecast       = per iteration * iterations left (saturating)
 * With a USD budget B it holds when cost + forecast <= B; else it runs out in iteration
 * K - 1 + m, the first m >= 1 with cost + per * m > B (the meter's "over" rule). */
struct task_forecast {
    bool present;            /* the rule applies (else every other field is 0/false) */
    int64_t forecast_micros; /* spend still expected to finish: status.forecastUSD */
    int64_t per_iteration;   /* micro-dollars per iteration so far */
    int64_t iterations_done; /* K - 1 */
    int64_t iterations_left; /* >= 1 */
    int64_t max_iterations;  /* iterations_done + iterations_left: maxIterations then */
    bool has_budget;         /* a USD budget was given */
    bool budget_holds;       /* has_budget and cost + forecast <= budget */
    int64_t runs_out;        /* has_budget && !budget_holds: the iteration it runs out in */
};

/* Computes the forecast from COST_MICROS (status.costUSD), ITERATION (status.iteration),
 * MAX_ITERATIONS (0: unset, no forecast) and, when HAS_BUDGET, BUDGET_MICROS. Pure. */
void task_forecast_compute(struct task_forecast *out, int64_t cost_micros, int64_t iteration,
                           int64_t max_iterations, bool has_budget, int64_t budget_micros);
/* Writes F into STATUS: forecastUSD, forecastPerIterationUSD, forecastIterationsLeft and,
 * with a budget, forecastBudgetHolds and (when it does not) forecastRunsOutIteration; an
 * absent forecast removes them all. */
void task_forecast_store(json_t *status, const struct task_forecast *f);
/* Reads the forecast written by task_forecast_store back from STATUS (iterations_done
 * from status.iteration). Returns false, with *out zeroed, when STATUS holds none or one
 * that does not add up (a hand-written status). */
bool task_forecast_read(struct task_forecast *out, const json_t *status);

/* The limits that apply (SPEC §14 status.effectiveBudgetUSD, effectiveBudgetTokens,
 * effectiveMaxIterations): each the spec field when positive, else USD (micro-dollars),
 * TOKENS or ITERATIONS, which the caller decided (the token caveat, the server default);
 * 0 there means no limit (the status field is removed). */
void task_set_effective_limits(json_t *obj, int64_t usd, int64_t tokens, int64_t iterations);
/* OBJ.KEY as an integer, 0 when absent or not one (task_limits.c). */
int64_t task_json_int(const json_t *obj, const char *key);
/* OBJ.KEY as micro-dollars from its decimal string, 0 when absent or malformed. */
int64_t task_json_money(const json_t *obj, const char *key);
/* Makes OBJ's effective limits follow its spec where a spec limit is set (after a spec
 * change: the spec wins over any caveat or default); the others are left as they are. */
void task_sync_effective_limits(json_t *obj);
/* Which guidance text reached the agent (status.guidanceHash): 16 hex digits of GUIDANCE. */
#define TASK_GUIDANCE_HASH_LEN 17
void task_guidance_hash(char out[TASK_GUIDANCE_HASH_LEN], const char *guidance);

/* --- Store interface --------------------------------------------------------------- */

enum task_event_type {
    TASK_EVENT_ADDED,
    TASK_EVENT_MODIFIED,
    TASK_EVENT_DELETED,
};

const char *task_event_name(enum task_event_type t);

/* Called by task_store_mutate with the current object, inside the write transaction. The
 * callback changes DOC in place; returning non-zero aborts the change with that code.
 * Returning TASK_MUTATE_UNCHANGED keeps the object as it is without a new version. */
#define TASK_MUTATE_UNCHANGED 1
typedef int (*task_mutate_fn)(json_t *doc, struct err *err, void *userdata);

/* One change of the feed. Everything is borrowed for the length of the callback. */
struct task_event {
    enum task_event_type type;
    int64_t rv;            /* resourceVersion of the change */
    const char *ns;        /* metadata.namespace */
    const char *name;      /* metadata.name */
    enum task_phase phase; /* status.phase after the change */
    bool suspended;        /* spec.suspended after the change */
    bool from_scm;         /* made from a PR/MR comment (divergedev.com/provider is set) */
    const char *json;      /* the whole object as compact JSON text */
};

/* Called for each change event since a resourceVersion. Return non-zero to stop. */
typedef int (*task_event_fn)(const struct task_event *ev, void *userdata);

struct task_store;
struct task_txn;

/* Work done inside one write transaction (see task_store_txn). Return E_OK to commit. */
typedef int (*task_txn_fn)(struct task_txn *tx, void *userdata);

/* One row of the token index (the embedded analogue of the diverge-agenttask-tokens
 * Secret): which token a task holds and whether it is still good. */
struct token_record {
    char token_id[160]; /* the macaroon identifier */
    int64_t generation; /* 1 for the first mint, +1 on every re-mint */
    bool active;        /* false once revoked */
    char *token;        /* owned: the serialized token; free() it */
};

struct task_store_ops {
    const char *name;
    /* *out: a new reference to the stored object. E_NOTFOUND when absent. */
    int (*get)(json_t **out, struct task_store *st, const char *ns, const char *name,
               struct err *err);
    /* Stores the normalized object OBJ (borrowed) as new, setting uid, resourceVersion,
     * creationTimestamp, generation; *out a new reference to the stored object.
     * E_CONFLICT when the name exists in the namespace. */
    int (*create)(json_t **out, struct task_store *st, const json_t *obj, struct err *err);
    /* Atomically reads the object, calls FN on a copy, and stores the result with a new
     * resourceVersion (and generation+1 when spec changed). *out (may be NULL) gets the
     * stored object. E_NOTFOUND, or FN's code. */
    int (*mutate)(json_t **out, struct task_store *st, const char *ns, const char *name,
                  task_mutate_fn fn, void *userdata, struct err *err);
    /* Deletes; when EXPECT_RV is non-zero it must match (else E_CONFLICT). *out (may be
     * NULL) gets the last object. E_NOTFOUND. */
    int (*remove)(json_t **out, struct task_store *st, const char *ns, const char *name,
                  int64_t expect_rv, struct err *err);
    /* *items_out: new JSON array of the objects of NS (NULL: every namespace) sorted by
     * namespace, name; *rv_out the store's resourceVersion at the time of the list. */
    int (*list)(json_t **items_out, int64_t *rv_out, struct task_store *st, const char *ns,
                struct err *err);
    /* Delivers every event with resourceVersion > SINCE_RV (filtered to NS unless NULL)
     * to FN, waiting up to TIMEOUT_MS for the first one. *last_rv_out: the rv of the last
     * event delivered (or SINCE_RV). E_AGAIN when SINCE_RV is older than the feed keeps
     * (the client must list again: HTTP 410). */
    int (*watch)(int64_t *last_rv_out, struct task_store *st, const char *ns, int64_t since_rv,
                 int timeout_ms, task_event_fn fn, void *userdata, struct err *err);
    /* Wakes every watcher (used on shutdown). */
    void (*wake)(struct task_store *st);
    /* Counts of tasks per phase (array of TASK_PHASE_COUNT). */
    int (*count_phases)(int64_t counts_out[TASK_PHASE_COUNT], struct task_store *st,
                        struct err *err);
    /* Environments (read side of SPEC §3): *out new JSON array / object. */
    int (*env_list)(json_t **items_out, struct task_store *st, const char *ns, struct err *err);
    int (*env_get)(json_t **out, struct task_store *st, const char *ns, const char *name,
                   struct err *err);
    /* Runs FN inside one write transaction; commits (fsync'd) when FN returns E_OK, else
     * rolls back. Events of committed changes are published after the commit. */
    int (*txn)(struct task_store *st, task_txn_fn fn, void *userdata, struct err *err);
    void (*close)(struct task_store *st);
};

struct task_store_xops; /* store/store_backend.h */

/* Every backend embeds this as its first member. */
struct task_store {
    const struct task_store_ops *ops;
    const struct task_store_xops *xops; /* the rest of the functions below */
    const struct clock *clock;          /* borrowed; timestamps */
};

/* Opens the SQLite backend at PATH (":memory:" for tests), creating or migrating the
 * schema. Caller closes with task_store_close(). */
int task_store_sqlite_open(struct task_store **out, const char *path, const struct clock *clock,
                           struct err *err);

struct kube_client;
/* Opens the Kubernetes backend (docs/cluster-mode.md) over C, which it takes (also on
 * failure): AgentTasks and Environments of every namespace; NS is where the token index
 * Secret and the inbox/outbox/sticky ConfigMaps live. Lists AgentTasks first: E_AGAIN or
 * the client's error when the API server does not answer. */
int task_store_kube_open(struct task_store **out, struct kube_client *c, const char *ns,
                         const struct clock *clock, struct err *err);

static inline int task_store_get(json_t **out, struct task_store *st, const char *ns,
                                 const char *name, struct err *err)
{
    return st->ops->get(out, st, ns, name, err);
}

static inline int task_store_create(json_t **out, struct task_store *st, const json_t *obj,
                                    struct err *err)
{
    return st->ops->create(out, st, obj, err);
}

static inline int task_store_mutate(json_t **out, struct task_store *st, const char *ns,
                                    const char *name, task_mutate_fn fn, void *userdata,
                                    struct err *err)
{
    return st->ops->mutate(out, st, ns, name, fn, userdata, err);
}

static inline int task_store_remove(json_t **out, struct task_store *st, const char *ns,
                                    const char *name, int64_t expect_rv, struct err *err)
{
    return st->ops->remove(out, st, ns, name, expect_rv, err);
}

static inline int task_store_list(json_t **items_out, int64_t *rv_out, struct task_store *st,
                                  const char *ns, struct err *err)
{
    return st->ops->list(items_out, rv_out, st, ns, err);
}

static inline int task_store_watch(int64_t *last_rv_out, struct task_store *st, const char *ns,
                                   int64_t since_rv, int timeout_ms, task_event_fn fn,
                                   void *userdata, struct err *err)
{
    return st->ops->watch(last_rv_out, st, ns, since_rv, timeout_ms, fn, userdata, err);
}

static inline void task_store_wake(struct task_store *st)
{
    st->ops->wake(st);
}

static inline int task_store_count_phases(int64_t counts_out[TASK_PHASE_COUNT],
                                          struct task_store *st, struct err *err)
{
    return st->ops->count_phases(counts_out, st, err);
}

static inline int task_store_env_list(json_t **items_out, struct task_store *st, const char *ns,
                                      struct err *err)
{
    return st->ops->env_list(items_out, st, ns, err);
}

static inline int task_store_env_get(json_t **out, struct task_store *st, const char *ns,
                                     const char *name, struct err *err)
{
    return st->ops->env_get(out, st, ns, name, err);
}

static inline int task_store_txn(struct task_store *st, task_txn_fn fn, void *userdata,
                                 struct err *err)
{
    return st->ops->txn(st, fn, userdata, err);
}

/* Totals over every task, for metrics. */
struct task_totals {
    double cost_usd; /* sum of status.costUSD (a float: for display only) */
    int64_t tokens;  /* sum of status.tokensConsumed */
};

/* Fills *out; E_FAIL on database errors. */
int task_store_totals(struct task_totals *out, struct task_store *st, struct err *err);

/* Called with one stored object as compact JSON text (LEN bytes, NUL-terminated, borrowed
 * for the call). Return E_OK to go on, anything else to stop with that code. */
typedef int (*task_text_fn)(const char *json, size_t len, void *userdata);
/* As the list op, without parsing: FN gets each task of NS (NULL: every namespace) in
 * namespace, name order, as stored; all from one snapshot whose resourceVersion is
 * *rv_out (set before the first call). Never waits behind a write transaction. */
int task_store_list_text(int64_t *rv_out, struct task_store *st, const char *ns, task_text_fn fn,
                         void *userdata, struct err *err);
/* As task_store_get, without parsing: FN gets the task as stored (compact JSON text) and
 * its return is returned. E_NOTFOUND when absent. Never waits behind a write transaction. */
int task_store_get_text(struct task_store *st, const char *ns, const char *name, task_text_fn fn,
                        void *userdata, struct err *err);

/* One point of a task's spend over time: every charge up to T_MS (meter and LLM gateway
 * alike, every run of the task) adds up to TOKENS and COST_MICROS. */
struct task_charge_point {
    int64_t t_ms;        /* epoch ms of the last charge the point covers */
    int64_t tokens;      /* cumulative tokens up to t_ms */
    int64_t cost_micros; /* cumulative micro-dollars up to t_ms */
};
#define TASK_CHARGE_POINTS_MAX 500 /* the most points task_store_charges gives */

/* The spend curve of the task with uid TASK_UID from the charges the store recorded, in at
 * most MAX points (1..TASK_CHARGE_POINTS_MAX; more is cut to it): the time from the first
 * charge to the last is cut into MAX equal slices and each slice with a charge gives one
 * point, at its last charge, so the last point is the task's whole spend on record. *n_out
 * points in OUT (time order), *count_out the charges behind them (0: none yet). E_INVALID
 * when the backend keeps no times of charges (the Kubernetes store). */
int task_store_charges(struct task_charge_point *out, size_t max, size_t *n_out, int64_t *count_out,
                       struct task_store *st, const char *task_uid, struct err *err);

/* --- inside a transaction (only valid during the task_txn_fn call) ------------------ */

/* *out: a new reference to the stored task, SHARED with the store's cache of parsed tasks
 * (so hot paths skip the JSON parse): change it only to hand it to task_txn_put in this
 * transaction; a transaction that fails is rolled back together with the cache.
 * E_NOTFOUND. */
int task_txn_get(json_t **out, struct task_txn *tx, const char *ns, const char *name,
                 struct err *err);
/* Writes DOC (a task read in this transaction and changed; validated by the caller) with a
 * new resourceVersion, which is set in DOC. The MODIFIED event is published on commit. */
int task_txn_put(struct task_txn *tx, json_t *doc, struct err *err);
/* Savepoints: one unit of work that can be undone without undoing the transaction. */
int task_txn_savepoint(struct task_txn *tx, struct err *err);
int task_txn_release(struct task_txn *tx, struct err *err);
void task_txn_rollback_savepoint(struct task_txn *tx);
/* Records REQUEST_ID (with its amounts, for audits) as charged to the task with uid
 * TASK_UID, unless it was already: *fresh_out tells which (false = a retry). Every id
 * ever charged is remembered (in SQLite); memory stays under STORE_METER_INDEX_IDS ids
 * and about STORE_METER_INDEX_BYTES, plus the SQLite file store's fixed 4 MiB filter of
 * the archived ids (store/sqlite/store_sqlite_idf.h). */
int task_txn_meter_claim(bool *fresh_out, struct task_txn *tx, const char *task_uid,
                         const char *request_id, int64_t tokens, int64_t cost_micros,
                         struct err *err);

/* The LLM gateway's reservation records (SPEC §13): a call it let through, durable from
 * its admission until its charge, so a server that dies before the charge still charges
 * it at its next start (exactly once: the record's request id is the charge's). Kept by
 * the SQLite backend only (task_store_keeps_resv). */
struct store_resv {
    const char *request_id; /* the gateway's id of the call, the charge's requestId */
    const char *ns, *name;  /* the task */
    const char *token;      /* the task token the call presented (the charge's) */
    const char *model;      /* the call's model */
    const char *provider;   /* "anthropic", "openai", "gemini" */
    int64_t tokens;         /* tokens reserved */
    int64_t cost_micros;    /* micro-dollars reserved */
};
/* Whether ST keeps reservation records (else the functions below return E_INVALID). */
bool task_store_keeps_resv(struct task_store *st);
/* Records R in the transaction (a record with the same request id is replaced). */
int task_txn_resv_put(struct task_txn *tx, const struct store_resv *r, struct err *err);
/* Removes the record REQUEST_ID in the transaction (a no-op when absent). */
int task_txn_resv_drop(struct task_txn *tx, const char *request_id, struct err *err);
/* *items_out: a new JSON array of every record, oldest first, each {"requestId",
 * "namespace", "name", "token", "model", "provider", "tokens", "costMicros", "createdMs"}. */
int task_store_resv_list(json_t **items_out, struct task_store *st, struct err *err);

/* As task_store_list_text over every namespace, for at least every task whose phase is
 * neither Completed nor Failed (those that may hold or wait for a sandbox slot), in no
 * particular order, from one snapshot: what the queue's pass reads after every change,
 * without the finished tasks a server keeps. A backend that cannot select them by phase
 * gives every task (the caller looks at the phase anyway). */
int task_store_list_live(struct task_store *st, task_text_fn fn, void *userdata, struct err *err);

/* What the SQLite backend holds in memory for the meter and for watchers. */
struct task_store_mem {
    size_t meter_index_ids;   /* request ids in memory, < STORE_METER_INDEX_IDS */
    size_t meter_index_bytes; /* their estimated bytes, < STORE_METER_INDEX_BYTES + one id */
    bool meter_filter_ready;  /* the filter in front of the archive's lookups is in use */
    uint64_t meter_lookups;   /* lookups of fresh-looking ids in the archive so far */
    size_t event_bytes;       /* JSON of the events kept for watchers */
    size_t events;            /* events kept for watchers */
    size_t task_copies;       /* tasks whose text is kept to answer GET and list */
    size_t task_copy_bytes;   /* their bytes (text and keys), <= STORE_TASK_COPY_BYTES */
    bool task_copy_on;        /* false: past the limit, reads go to the database */
};
/* Fills *out for ST (a store from task_store_sqlite_open). Thread-safe. */
void task_store_sqlite_mem(struct task_store_mem *out, struct task_store *st);
/* Sets the limit of the tasks' text kept in memory (STORE_TASK_COPY_BYTES at open); past
 * it the copy is dropped and reads go to the database until the store is opened again. */
void task_store_sqlite_copy_limit(struct task_store *st, size_t max_bytes);
/* The task's latest token; E_NOTFOUND when it never had one. Free out->token. */
int task_txn_token_current(struct token_record *out, struct task_txn *tx, const char *ns,
                           const char *name, struct err *err);
/* Adds an active token of generation GENERATION. */
int task_txn_token_add(struct task_txn *tx, const char *ns, const char *name, int64_t generation,
                       const char *token_id, const char *token, struct err *err);
/* Revokes every active token of the task (a no-op when none is active). */
int task_txn_token_revoke(struct task_txn *tx, const char *ns, const char *name, struct err *err);
/* *out: a number that changes whenever any task's token may have changed (added, revoked,
 * task deleted) since it was last read, in this process: a token state read in a
 * transaction under the same number still holds. E_INVALID: the backend does not count
 * (read the token each time). */
int task_txn_token_epoch(uint64_t *out, struct task_txn *tx);
/* The store's clock (for timestamps written inside a transaction). */
const struct clock *task_txn_clock(struct task_txn *tx);

/* Linked preview Environments (SPEC §4), written with the task that owns them. An
 * Environment is a Kubernetes-shaped object whose metadata.ownerReferences[0].uid is its
 * task's uid: deleting the task deletes it in the same transaction. */
#define TASK_ENV_KIND "Environment"
/* *out: a new reference to the stored Environment NS/NAME; E_NOTFOUND. */
int task_txn_env_get(json_t **out, struct task_txn *tx, const char *ns, const char *name,
                     struct err *err);
/* Creates or replaces ENV (by its metadata.namespace/name); uid and creationTimestamp are
 * kept from the stored one (else set), metadata.resourceVersion is bumped (set in ENV). */
int task_txn_env_put(struct task_txn *tx, json_t *env, struct err *err);
/* Deletes the Environment NS/NAME (a no-op when absent). */
int task_txn_env_delete(struct task_txn *tx, const char *ns, const char *name, struct err *err);

/* Outside a transaction: the task's latest token record. E_NOTFOUND. */
int task_store_token_current(struct token_record *out, struct task_store *st, const char *ns,
                             const char *name, struct err *err);

/* Creates the normalized task OBJ (borrowed) inside the transaction, as
 * task_store_create does; *out (may be NULL) gets the stored object. E_CONFLICT. */
int task_txn_create(json_t **out, struct task_txn *tx, const json_t *obj, struct err *err);

/* --- the durable inbox of SCM comments and outbox of SCM calls (SQLite backend) ------- */

#define STORE_PROVIDER_MAX 16

/* One accepted comment, waiting to be applied by the bot. */
struct inbox_entry {
    int64_t id;                        /* arrival order, set by the store */
    char provider[STORE_PROVIDER_MAX]; /* "github", "gitlab", "local" */
    char *delivery_id;                 /* owned; NULL when the provider sent none */
    char *project;                     /* owned; "owner/repo" or the GitLab path */
    int64_t number;                    /* PR number or MR iid */
    char *comment_id;                  /* owned */
    char *author;                      /* owned: the commenter's login */
    char *author_association;          /* owned; GitHub's, NULL elsewhere */
    int64_t author_id;                 /* the commenter's numeric id, 0 when unknown */
    int64_t installation_id;           /* GitHub App installation, 0 when none */
    char *body;                        /* owned: the comment text */
    char *extra;                       /* owned JSON object text of provider details, or NULL */
    int attempts;                      /* tries so far */
};

/* Frees E's strings (E itself is caller storage). */
void inbox_entry_cleanup(struct inbox_entry *e);

/* Adds E durably unless its delivery id or its comment (provider, project, comment id) was
 * accepted before, in which case *duplicate_out is set and nothing changes. */
int task_store_inbox_add(bool *duplicate_out, struct task_store *st, const struct inbox_entry *e,
                         struct err *err);
/* The next entry to apply: the oldest pending one that is due and has no older pending
 * entry of the same PR/MR (commands apply in order per PR). E_NOTFOUND when none is due;
 * then *wait_ms_out is the time until the next due one, or -1 when none is pending. */
int task_store_inbox_next(struct inbox_entry *out, int64_t *wait_ms_out, struct task_store *st,
                          struct err *err);
/* As task_store_inbox_next for up to MAX entries at once, *n_out of them, in arrival
 * order; entries of one PR come consecutively from its oldest pending one, so applying
 * them in order keeps the PR's order. Each is cleaned up by the caller. */
int task_store_inbox_next_batch(struct inbox_entry *out, size_t max, size_t *n_out,
                                int64_t *wait_ms_out, struct task_store *st, struct err *err);
/* Gives up on entry ID for good, inside a transaction, with ERROR. */
int task_txn_inbox_fail(struct task_txn *tx, int64_t id, const char *error, struct err *err);
/* After a transient failure: try entry ID again in DELAY_MS (attempts + 1); with FAILED,
 * give up on it for good (it stops blocking its PR). */
int task_store_inbox_retry(struct task_store *st, int64_t id, int64_t delay_ms, bool failed,
                           const char *error, struct err *err);
/* Marks entry ID applied, inside the transaction that applied it: exactly once. */
int task_txn_inbox_done(struct task_txn *tx, int64_t id, struct err *err);
/* Counts pending inbox entries. */
int task_store_inbox_depth(int64_t *out, struct task_store *st, struct err *err);
/* The GitHub App installation of the newest accepted comment of PROJECT at PROVIDER that
 * carried one, in *out; 0 when none did. */
int task_store_inbox_installation(int64_t *out, struct task_store *st, const char *provider,
                                  const char *project, struct err *err);

/* One call to make at an SCM, durable until it succeeded or failed for good. */
struct outbox_entry {
    int64_t id;                        /* set by the store */
    char provider[STORE_PROVIDER_MAX]; /* "github", "gitlab", "local" */
    char kind[16];                     /* "react", "comment", "edit", "delete" */
    char *project;                     /* owned */
    int64_t number;                    /* PR number or MR iid */
    char *target;                      /* owned: comment id for react/edit/delete, else NULL */
    char *body;                        /* owned: reaction content or comment text */
    char *coalesce_key;                /* owned or NULL: a newer entry with the same key
                                          replaces a pending older one */
    int64_t installation_id;           /* GitHub App installation, 0 when none */
    int64_t not_before_ms;             /* do not send before (epoch ms); 0: now */
    int attempts;                      /* tries so far */
};

void outbox_entry_cleanup(struct outbox_entry *e);
/* Queues E in the transaction (see coalesce_key). *id_out (may be NULL) gets its id. */
int task_txn_outbox_add(int64_t *id_out, struct task_txn *tx, const struct outbox_entry *e,
                        struct err *err);
/* The next call to make: the oldest due pending entry with no older pending entry of the
 * same PR/MR. E_NOTFOUND when none is due; *wait_ms_out as for the inbox. */
int task_store_outbox_next(struct outbox_entry *out, int64_t *wait_ms_out, struct task_store *st,
                           struct err *err);
/* Puts back the entry handed out by task_store_outbox_next without trying it (e.g. the
 * rate budget is spent): newer bodies may coalesce into it again. */
void task_store_outbox_release(struct task_store *st);
/* Records that entry ID succeeded, with RESULT (e.g. the new comment's id; may be NULL). */
int task_store_outbox_done(struct task_store *st, int64_t id, const char *result, struct err *err);
/* Puts entry ID back to be tried again in DELAY_MS without counting an attempt (the call
 * was not made: something it needs is not known yet), noting WHY (may be NULL). */
int task_store_outbox_defer(struct task_store *st, int64_t id, int64_t delay_ms, const char *why,
                            struct err *err);
/* As task_store_inbox_retry, for the outbox. */
int task_store_outbox_retry(struct task_store *st, int64_t id, int64_t delay_ms, bool failed,
                            const char *error, struct err *err);
/* The result of a finished entry (e.g. a created comment's id): *out new string or NULL
 * while pending; *state_out "pending", "done" or "failed". E_NOTFOUND. */
int task_store_outbox_result(char **out, char state_out[16], struct task_store *st, int64_t id,
                             struct err *err);
/* Counts pending outbox entries. */
int task_store_outbox_depth(int64_t *out, struct task_store *st, struct err *err);

/* The inbox's (or outbox's) change counter: read it BEFORE asking for the next entry, and
 * pass it to task_store_queue_wait, so an entry added in between is never slept through. */
int64_t task_store_queue_gen(struct task_store *st, bool outbox);
/* Sleeps until the counter moved past SINCE_GEN (an entry was added, or the store was
 * woken) or TIMEOUT_MS passed. */
void task_store_queue_wait(struct task_store *st, bool outbox, int64_t since_gen,
                           int64_t timeout_ms);

/* --- sticky status comments (SPEC §6) ---------------------------------------------- */

/* What was last queued and sent for one task's sticky comment on one PR/MR. */
struct sticky_state {
    char *comment_id;     /* owned; NULL until the comment exists */
    char body_hash[17];   /* hash of the last body queued ("" when none) */
    char phase[16];       /* the task phase of that body */
    int64_t last_sent_ms; /* when the SCM last took a body, 0 never */
};

void sticky_state_cleanup(struct sticky_state *s);
/* E_NOTFOUND when KEY has no state. */
int task_store_sticky_get(struct sticky_state *out, struct task_store *st, const char *key,
                          struct err *err);
/* Records in the transaction that a body with HASH for PHASE was queued for KEY. */
int task_txn_sticky_note(struct task_txn *tx, const char *key, const char *provider,
                         const char *project, int64_t number, const char *ns, const char *name,
                         const char *hash, const char *phase, struct err *err);
/* Records that the SCM took a body for KEY: its COMMENT_ID and the time. */
int task_store_sticky_sent(struct task_store *st, const char *key, const char *comment_id,
                           struct err *err);
/* The comment id of every sticky comment of one PR/MR, as "ns/name" -> id (new object). */
int task_store_sticky_list(json_t **out, struct task_store *st, const char *provider,
                           const char *project, int64_t number, struct err *err);

/* --- the offline `local` SCM's threads ---------------------------------------------- */

/* Adds a comment; *id_out gets its id. */
int task_store_local_add(int64_t *id_out, struct task_store *st, const char *project,
                         int64_t number, const char *author, const char *body, struct err *err);
/* Opens a local pull request thread in PROJECT whose first comment, by AUTHOR, is BODY
 * (which contains MARKER), numbered after the project's last thread; when a comment of
 * PROJECT already contains MARKER nothing is added and *existed_out is set. *number_out:
 * the thread's number. */
int task_store_local_open_pull(int64_t *number_out, bool *existed_out, struct task_store *st,
                               const char *project, const char *marker, const char *author,
                               const char *body, struct err *err);
/* E_NOTFOUND when the comment is gone. */
int task_store_local_update(struct task_store *st, const char *project, int64_t id,
                            const char *body, struct err *err);
int task_store_local_delete(struct task_store *st, const char *project, int64_t id,
                            struct err *err);
int task_store_local_react(struct task_store *st, const char *project, int64_t id,
                           const char *author, const char *content, struct err *err);
/* The thread: a new array of {id, author, body, createdAt, updatedAt, reactions[]}. */
int task_store_local_thread(json_t **out, struct task_store *st, const char *project,
                            int64_t number, struct err *err);
int task_store_local_permission_set(struct task_store *st, const char *project, const char *user,
                                    int level, struct err *err);
/* *level_out 0 when unknown. */
int task_store_local_permission_get(int *level_out, struct task_store *st, const char *project,
                                    const char *user, struct err *err);
/* Binds local PR PROJECT#NUMBER to the repository URL, head branch HEAD and base BASE
 * (`diverge local pr open`); again with other values rebinds it. *created_out: it was not
 * bound before. */
int task_store_local_pull_set(bool *created_out, struct task_store *st, const char *project,
                              int64_t number, const char *url, const char *head, const char *base,
                              struct err *err);
/* The binding as a new {project, number, repository, head, base, createdAt}; E_NOTFOUND
 * when the PR was never opened. */
int task_store_local_pull_get(json_t **out, struct task_store *st, const char *project,
                              int64_t number, struct err *err);

static inline void task_store_close(struct task_store *st)
{
    if (st != NULL) {
        st->ops->close(st);
    }
}

/* --- background workers ------------------------------------------------------------- */

/* The one shape of every background worker (bot, outbox, notifier, controller): a thread
 * woken by store changes or a deadline that takes a batch, applies it and sleeps. A
 * worker either drains a queue (STORE_WORKER_INBOX/OUTBOX: STEP is called until it says
 * there is nothing to do, then the thread sleeps until the queue's counter moves or the
 * wait STEP asked for passes) or follows the change feed (STORE_WORKER_FEED: RESYNC looks
 * at everything and returns the resourceVersion it saw; of each batch of later events
 * that WANTS keeps, APPLY gets the newest one of each task, in feed order; a feed that
 * fell behind calls RESYNC again). */
enum store_worker_wake {
    STORE_WORKER_INBOX,
    STORE_WORKER_OUTBOX,
    STORE_WORKER_FEED,
};

struct store_worker_config {
    const char *name;            /* thread name (at most 15 bytes shown), borrowed */
    enum store_worker_wake wake; /* what wakes the thread */
    /* Queue workers: applies one batch; returns 0 to be called again at once, else the ms
     * to sleep at most (-1: no deadline) before the next call. */
    int64_t (*step)(void *userdata);
    int64_t (*resync)(void *userdata); /* feed workers: returns the resourceVersion seen */
    /* Feed workers: whether EV (borrowed) needs APPLY; NULL keeps every event. */
    bool (*wants)(const struct task_event *ev, void *userdata);
    /* Feed workers: applies EV (borrowed for the call; json and names are copies). */
    void (*apply)(const struct task_event *ev, void *userdata);
};

struct store_worker;

/* Starts the thread over STORE and CFG (both borrowed; they must outlive the worker); every
 * callback gets USERDATA. On success *out is stopped and freed with store_worker_stop().
 * E_FAIL when no thread can be made. */
int store_worker_start(struct store_worker **out, struct task_store *store,
                       const struct store_worker_config *cfg, void *userdata, struct err *err);
/* True once store_worker_stop() was called: long batches check it between items. */
bool store_worker_stopping(const struct store_worker *w);
/* Asks the thread to stop, wakes it, waits for it and frees W; NULL is a no-op. */
void store_worker_stop(struct store_worker *w);

#endif
