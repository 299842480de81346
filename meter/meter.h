/* SPDX-License-Identifier: Apache-2.0 */
/* Metering (SPEC §7): the request parser, the budget decision as a pure function of
 * (task, token grant, request), and the group-commit service that applies decisions
 * durably: a 200 or 429 is answered only after its transaction is fsync'd. */
#ifndef DIVERGE_METER_METER_H
#define DIVERGE_METER_METER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "store/store.h"
#include "token/token.h"

#define METER_REQUEST_ID_MAX 256 /* bytes of a requestId (UTF-8, no control characters) */

/* A parsed meter body. */
struct meter_request {
    char *request_id;    /* owned; non-empty */
    bool has_iteration;  /* "iteration" was given */
    int64_t iteration;   /* >= 0 */
    char *model;         /* owned; NULL when missing */
    int64_t tokens_used; /* >= 0, delta of this call */
    int64_t cost_micros; /* >= 0, delta of this call, exact micro-dollars */
};

/* Parses BODY[0..len) into *out (caller storage; release with meter_request_cleanup even
 * on failure). Returns E_INVALID (HTTP 400) with a message for: not JSON or not an object,
 * duplicate keys, non-UTF-8, a requestId that is missing, not a string, empty or all
 * whitespace, longer than METER_REQUEST_ID_MAX or holding a control character (NUL
 * included), a negative, non-numeric, fractional (tokens) or over-precise (> 6 decimals of
 * cost) amount, and numbers too large to add up. */
int meter_request_parse(struct meter_request *out, const char *body, size_t len, struct err *err);
void meter_request_cleanup(struct meter_request *r);

#define METER_COMPLETE_MESSAGE_MAX 4096 /* bytes of a completion's message */

/* A parsed body of POST /api/v1/agenttask/complete (SPEC §14). */
struct meter_completion {
    bool succeeded; /* "result": "succeeded" (else "failed") */
    char *message;  /* owned; "" when absent */
};

/* Parses BODY[0..len) into *out (caller storage; release with meter_completion_cleanup even
 * on failure). Returns E_INVALID (HTTP 400) with a message for: not a JSON object,
 * duplicate keys, a "result" other than "succeeded" or "failed", a "message" that is not
 * a string, longer than METER_COMPLETE_MESSAGE_MAX or holding a control character other
 * than newline or tab. */
int meter_completion_parse(struct meter_completion *out, const char *body, size_t len,
                           struct err *err);
void meter_completion_cleanup(struct meter_completion *c);

/* Converts a JSON real COST (dollars) to micro-dollars through its shortest round-trip
 * decimal form, so 0.0225 is 22500; a cost finer than that is rounded to the nearest
 * micro-dollar and at least one (0.1 + 0.2 is 300000, 0.0000001 is 1). A negative,
 * infinite or NaN value, or one over METER_COST_MAX_USD, is an error (E_INVALID). */
int meter_cost_from_double(int64_t *micros_out, double cost, struct err *err);

/* Everything the decision needs, read inside the transaction. */
struct meter_state {
    bool task_found;            /* the token's task exists */
    bool token_current;         /* the presented token is the task's active token */
    bool caveats_ok;            /* every caveat held (signature checked before) */
    enum task_phase phase;      /* status.phase */
    bool body_ok;               /* the body parsed */
    bool model_ok;              /* spec.capabilities and every models caveat allow the model */
    bool seen;                  /* requestId already charged to this task */
    int64_t spec_budget_usd;    /* spec.budgetUSD micro-dollars, 0 = unset */
    int64_t spec_budget_tokens; /* spec.budgetTokens, 0 = unset */
    int64_t max_iterations;     /* spec.maxIterations, 0 = unset */
    struct token_grant grant;   /* max_cost_usd / max_tokens caveats */
    int64_t tokens_consumed;    /* status.tokensConsumed before this call */
    int64_t cost_micros;        /* status.costUSD before this call */
    int64_t iteration;          /* status.iteration before this call */
    bool has_quota_usd;         /* a SpendQuota of the namespace sets monthlyUSD */
    int64_t quota_usd_left;     /* the least monthlyUSD - usedUSD before this call */
    bool has_quota_tokens;      /* a SpendQuota of the namespace sets monthlyTokens */
    int64_t quota_tokens_left;  /* the least monthlyTokens - usedTokens before this call */
};

enum meter_outcome {
    METER_UNAUTHORIZED,    /* 401 */
    METER_BAD_REQUEST,     /* 400 */
    METER_FORBIDDEN,       /* 403 */
    METER_DUPLICATE,       /* 200, nothing added */
    METER_ALLOWED,         /* 200, charged */
    METER_OVER_BUDGET,     /* 429, charged, task paused, token revoked */
    METER_OVER_ITERATIONS, /* 429, charged, task paused, token revoked */
    METER_OVER_QUOTA,      /* 429, charged (task and quotas), task paused, token revoked */
};

struct meter_decision {
    enum meter_outcome outcome;
    int status;                /* HTTP status */
    const char *reason;        /* static message, "" when allowed */
    int64_t total_tokens;      /* after this call */
    int64_t total_cost_micros; /* after this call */
    int64_t iteration;         /* after this call */
    bool has_budget_usd;       /* an effective USD budget exists */
    int64_t budget_usd;        /* effective USD budget, micro-dollars */
    bool has_budget_tokens;    /* an effective token budget exists */
    int64_t budget_tokens;     /* effective token budget */
    bool has_quota_usd;        /* the namespace has a USD quota (SpendQuota, SPEC §15) */
    int64_t quota_usd_left;    /* what it leaves after this call (may be negative) */
    bool has_quota_tokens;     /* the namespace has a token quota */
    int64_t quota_tokens_left; /* what it leaves after this call */
};

/* The effective budgets (SPEC §7): the spec field when positive, else the smallest
 * caveat. */
void meter_effective_budgets(struct meter_decision *out, const struct meter_state *st);

/* Decides REQ (may be NULL when !st->body_ok) against ST. Pure: no I/O, no clock. */
void meter_decide(struct meter_decision *out, const struct meter_state *st,
                  const struct meter_request *req);

/* --- the service ------------------------------------------------------------------ */

struct meter_service;

/* Starts the committer thread over STORE (borrowed, must outlive the service) with the
 * macaroon ROOT_KEY (copied). Caller stops it with meter_service_free(). */
int meter_service_new(struct meter_service **out, struct task_store *store,
                      const unsigned char root_key[TOKEN_ROOT_KEY_LEN], struct err *err);
/* Stops the committer after the batches queued so far; NULL is a no-op. */
void meter_service_free(struct meter_service *m);

/* Handles one meter call end to end: AUTH is the Authorization header value (NULL when
 * missing), AUTH_COUNT how many Authorization headers came, BODY the raw body. Blocks
 * until the outcome is durable. *status_out gets the HTTP status and *body_out a new JSON
 * text (caller frees). Thread-safe; called from many request threads at once. */
void meter_service_handle(int *status_out, char **body_out, struct meter_service *m,
                          const char *auth, int auth_count, const char *body, size_t len);

/* POST /api/v1/agenttask/complete (SPEC §14): the token's own task ends Completed or
 * Failed (reason AgentReported, status.message the agent's message), its token revoked,
 * in one transaction through the same committer as the meter. Arguments and results as
 * meter_service_handle: 200 {"phase","reason","message"} (again with "duplicate": true
 * when the same token already finished its task the same way), 400 bad body, 401 as the
 * meter's step 1 (a task that is not Active included), 503. */
void meter_service_complete(int *status_out, char **body_out, struct meter_service *m,
                            const char *auth, int auth_count, const char *body, size_t len);

struct meter_stats {
    int64_t batches;  /* transactions committed */
    int64_t requests; /* requests answered by the committer */
};
void meter_service_stats(struct meter_stats *out, struct meter_service *m);

/* --- the LLM gateway (SPEC §13): the same checks, charges and pauses as a meter call,
 * through the same committer, for calls the gateway forwards --- */

/* What the gateway learns of a task before forwarding a call. */
struct meter_gate {
    int status;              /* 200; 401 or 403 as the meter answers; 503 store failure */
    const char *reason;      /* static: why not 200 ("token revoked", ...); "" when 200 */
    char *ns, *name;         /* owned: the token's task (set once the token verified) */
    char *guidance;          /* owned: the divergedev.com/guidance annotation, or NULL */
    struct meter_decision d; /* status 200: totals and effective budgets, nothing added */
};

/* Checks TOKEN (the encoded macaroon, may be NULL) for a call of MODEL as the meter's
 * steps 1-3 do, and reads the task's totals and budgets, writing nothing. A task already
 * over its budget is status 200 with totals over it. Blocks on the committer;
 * thread-safe. Release *out with meter_gate_cleanup(). */
void meter_gate_check(struct meter_gate *out, struct meter_service *m, const char *token,
                      const char *model);
void meter_gate_cleanup(struct meter_gate *g);

/* Charges a call the gateway let through (TOKENS, COST_MICROS, once per REQUEST_ID) as a
 * meter call does (steps 4-6, same transaction, task and namespace quotas, task paused
 * over a budget or a quota), even when
 * the task paused or its token was revoked since. *out (may be NULL) gets the totals.
 * Returns 200, 429 (charged, and the task paused), 401 (token or task gone) or 503 (not
 * recorded). GUIDANCE_SENT: the call carried the task's guidance (the first such charge
 * of a guidance text sets status.guidanceDeliveredAt). Blocks until durable; thread-safe. */
int meter_gate_settle(struct meter_decision *out, struct meter_service *m, const char *token,
                      const char *request_id, const char *model, int64_t tokens,
                      int64_t cost_micros, bool guidance_sent);

/* Pauses TOKEN's task BudgetExceeded and revokes its token, exactly as a meter 429 does,
 * adding nothing (REQUEST_ID is remembered like a charge's). MODEL is the refused call's:
 * a task restricted to some models checks it as a meter call's. Returns 429 when it
 * paused, 401 when the token no longer holds (already paused), 403, 503. Thread-safe. */
int meter_gate_exhausted(struct meter_service *m, const char *token, const char *request_id,
                         const char *model);
/* As meter_gate_exhausted when what is missing is the namespace's quota: the task pauses
 * QuotaExceeded. */
int meter_gate_quota_exhausted(struct meter_service *m, const char *token, const char *request_id,
                               const char *model);

/* --- the gateway's reservation records (SPEC §13): a call let through is recorded,
 * beside its forwarding, so that a server that dies before its charge charges it at its
 * next start; the charge (meter_gate_settle with the same request id) removes the record
 * in its own transaction. Only where the store keeps them (the SQLite store). --- */

/* Whether M's store keeps reservation records. */
bool meter_keeps_resv(const struct meter_service *m);

/* A queued record, collected with meter_gate_reserve_wait. */
struct meter_pending;

/* Queues the record of the call REQUEST_ID of TOKEN's task (MODEL, PROVIDER a static name,
 * the reserved TOKENS and COST_MICROS) through the committer WITHOUT waiting for it.
 * NULL when the store keeps no records or TOKEN does not verify. Thread-safe. */
struct meter_pending *meter_gate_reserve_post(struct meter_service *m, const char *token,
                                              const char *request_id, const char *model,
                                              const char *provider, int64_t tokens,
                                              int64_t cost_micros);
/* Waits until P is durable and frees P: 200 when recorded, 503 when not (NULL: 503). */
int meter_gate_reserve_wait(struct meter_pending *p);
/* Removes the record REQUEST_ID without a charge (the call is not charged: the upstream
 * failed); blocks until durable. 200 (also when the store keeps none), 401, 503. */
int meter_gate_resv_drop(struct meter_service *m, const char *token, const char *request_id);

#endif
