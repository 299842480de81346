/* SPDX-License-Identifier: Apache-2.0 */
/* SpendQuota (SPEC §15): a namespace's monthly spend limits, a Kubernetes-shaped object
 * kept by the task store beside the tasks. The model (validation, the UTC calendar month,
 * the headroom left) is pure; the store functions read and write quotas inside a task
 * transaction, so the meter charges a task and its namespace's quotas atomically. */
#ifndef DIVERGE_STORE_QUOTA_H
#define DIVERGE_STORE_QUOTA_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"
#include "store/store.h"

#define QUOTA_KIND "SpendQuota"
#define QUOTA_PLURAL "spendquotas"
#define QUOTA_PER_NAMESPACE_MAX 16 /* quotas one namespace may hold; one more is 422 */

/* The typed view of a normalized SpendQuota: strings borrowed from the object. */
struct quota_view {
    const char *name;        /* metadata.name */
    const char *ns;          /* metadata.namespace */
    bool has_usd;            /* spec.monthlyUSD is set */
    int64_t monthly_usd;     /* spec.monthlyUSD micro-dollars */
    bool has_tokens;         /* spec.monthlyTokens is set */
    int64_t monthly_tokens;  /* spec.monthlyTokens */
    bool has_running;        /* spec.maxRunningTasks is set */
    int64_t max_running;     /* spec.maxRunningTasks */
    int64_t used_usd;        /* status.usedUSD micro-dollars */
    int64_t used_tokens;     /* status.usedTokens */
    int64_t period_start_ms; /* status.periodStart, epoch ms (0 when unset) */
};

/* Fills V from the normalized quota Q (which must outlive V). */
void quota_view_of(struct quota_view *v, const json_t *q);

/* A quota's period is the UTC calendar month: clock_month_start / clock_next_month. */

/* Validates OBJ, a client's SpendQuota for create in namespace NS (from the URL), into a
 * new normalized object *out: metadata reduced to name, namespace, labels, annotations;
 * spec checked (monthlyUSD a decimal string, monthlyTokens and maxRunningTasks
 * non-negative integers, each optional, nothing else); status the zero status of the
 * month of NOW_MS. E_INVALID with the field path in err->field. */
int quota_normalize_new(json_t **out, const json_t *obj, const char *ns, int64_t now_ms,
                        struct err *err);
/* Validates (and canonicalizes in place) the spec and metadata of a stored-shape quota
 * after a patch. E_INVALID with the field path. */
int quota_validate(json_t *q, struct err *err);
/* Validates a status a client wrote through the /status subresource (usedUSD decimal,
 * usedTokens non-negative, periodStart RFC 3339), canonicalizing in place. E_INVALID. */
int quota_validate_status(json_t *status, struct err *err);

/* When Q's period ended before NOW_MS's month: used amounts to zero and periodStart to
 * this month's start. Returns whether Q changed. */
bool quota_roll(json_t *q, int64_t now_ms);
/* Adds TOKENS and COST_MICROS to Q's used amounts (saturating). */
void quota_add(json_t *q, int64_t tokens, int64_t cost_micros);

/* The tightest headroom of a namespace's quotas. */
struct quota_room {
    bool has_usd;            /* some quota sets monthlyUSD */
    int64_t usd_left;        /* the least monthlyUSD - usedUSD (may be negative) */
    const char *usd_name;    /* borrowed: the quota it comes from */
    bool has_tokens;         /* some quota sets monthlyTokens */
    int64_t tokens_left;     /* the least monthlyTokens - usedTokens */
    const char *tokens_name; /* borrowed */
};
/* The headroom of QUOTAS (an array of normalized quotas, already rolled to now). */
void quota_room_of(struct quota_room *out, const json_t *quotas);
/* The first quota of QUOTAS (rolled to now) that is used up (usedUSD >= monthlyUSD or
 * usedTokens >= monthlyTokens), borrowed, or NULL. */
const json_t *quota_used_up(const json_t *quotas);

/* --- the store (inside a transaction of task_store_txn) ------------------------------ */

/* *items_out: a new array of copies of the quotas of NS (NULL: every namespace), in
 * namespace, name order, as stored (not rolled). Copies: change them, then put them. */
int task_txn_quota_list(json_t **items_out, struct task_txn *tx, const char *ns, struct err *err);
/* Creates or replaces Q (by its metadata.namespace/name); uid and creationTimestamp are
 * kept from the stored one (else set); metadata.resourceVersion is bumped and set in Q. */
int task_txn_quota_put(struct task_txn *tx, json_t *q, struct err *err);
/* Deletes the quota NS/NAME (a no-op when absent). */
int task_txn_quota_delete(struct task_txn *tx, const char *ns, const char *name, struct err *err);

/* --- the store, each call its own transaction (the API's and readers' side) ----------- */

/* *items_out: the quotas of NS (NULL: all), rolled to now (not written). */
int task_store_quota_list(json_t **items_out, struct task_store *st, const char *ns,
                          struct err *err);
/* *out: the quota NS/NAME rolled to now; E_NOTFOUND. */
int task_store_quota_get(json_t **out, struct task_store *st, const char *ns, const char *name,
                         struct err *err);
/* Creates the normalized quota OBJ; *out the stored object. E_CONFLICT when the name is
 * taken; E_INVALID past QUOTA_PER_NAMESPACE_MAX. */
int task_store_quota_create(json_t **out, struct task_store *st, const json_t *obj,
                            struct err *err);
/* Changes the quota NS/NAME with FN (on a copy; FN validates, returns E_OK to write);
 * *out the stored result. E_NOTFOUND, E_CONFLICT (FN's resourceVersion check). */
typedef int (*quota_mutate_fn)(json_t *q, struct err *err, void *userdata);
int task_store_quota_mutate(json_t **out, struct task_store *st, const char *ns, const char *name,
                            quota_mutate_fn fn, void *userdata, struct err *err);
/* Deletes the quota NS/NAME; with EXPECT_RV > 0 only at that resourceVersion (else
 * E_CONFLICT). *last_out: the object as it was. E_NOTFOUND. */
int task_store_quota_delete(json_t **last_out, struct task_store *st, const char *ns,
                            const char *name, int64_t expect_rv, struct err *err);

#endif
