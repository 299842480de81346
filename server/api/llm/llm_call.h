/* SPDX-License-Identifier: Apache-2.0 */
/* One call through the gateway, inside server/api/llm/ only: its admission against the
 * task's budget (llm_call.c) and its forwarding and relay (llm_forward.c). */
#ifndef DIVERGE_SERVER_API_LLM_LLM_CALL_H
#define DIVERGE_SERVER_API_LLM_LLM_CALL_H

#include "server/api/llm/llm_int.h"

#define LLM_REQUEST_ID_LEN 64 /* "llm-<provider>-<24 hex>" and a NUL */
#define LLM_EXTRA_HEADERS 6

struct llm_call {
    struct server *srv;                 /* borrowed: outlives every call (see llm_gateway_free) */
    struct llm_gateway *gw;             /* borrowed */
    enum llm_provider provider;         /* whose route */
    enum llm_dialect dialect;           /* where the usage is */
    char *token;                        /* owned, wiped: the task token presented */
    char *model;                        /* owned: the request's model */
    char model_safe[LLM_MODEL_MAX / 2]; /* the model fit for log lines */
    struct llm_price price;             /* its price row (match borrowed from gw) */
    struct llm_task *task;              /* owned reference, or NULL before admission */
    bool reserved;                      /* reserved_* count in task */
    int64_t reserved_micros;            /* most this call can cost */
    int64_t reserved_tokens;            /* most tokens it can use */
    int gate_status;                    /* the meter's answer to the check: 200, 401, 403, 503 */
    const char *gate_reason;            /* static: why not 200 */
    char *guidance;                     /* owned: the task's guidance, or NULL */
    char *ns, *name;                    /* owned: the task, once admitted */
    char *url;                          /* owned: the upstream URL */
    char *key_header;                   /* owned, wiped: "x-api-key: <server key>" */
    char *extra_headers[LLM_EXTRA_HEADERS]; /* owned: passed-through "Name: value" lines */
    char *body;                             /* owned: the body to send */
    size_t body_len;                        /* bytes of the client's body (the input bound) */
    size_t send_len;                        /* bytes of body */
    bool stream;                            /* the client asked for a stream */
    bool metered;                           /* charged (not count_tokens) */
};

enum llm_admit {
    LLM_ADMIT_OK,        /* reserved; forward with the allowed output limit */
    LLM_ADMIT_DENIED,    /* the meter refused (gate_status, gate_reason) */
    LLM_ADMIT_EXHAUSTED, /* no budget left for even one output token: refuse and pause */
    LLM_ADMIT_BUSY,      /* the budget is held by calls in flight: refuse, no pause */
};

/* Checks C's token and model with the meter and reserves the most C can cost, output up
 * to WANT_OUT tokens or less as the budget allows (*out_allowed). Thread-safe. */
enum llm_admit llm_call_admit(int64_t *out_allowed, struct llm_call *c, int64_t want_out);
/* Pauses C's task BudgetExceeded as a meter 429 does, and says so in the task log. */
void llm_call_pause(struct llm_call *c);
/* Charges C with U (NULL or incomplete: its reservation), writes the task-log line and
 * releases the reservation once the charge is durable. Blocks; no-op when not reserved. */
void llm_call_settle(struct llm_call *c, const struct llm_usage *u);
/* Releases C's reservation without a charge (the upstream answered an error). */
void llm_call_release(struct llm_call *c);
void llm_call_set_model(struct llm_call *c, const char *model);
void llm_call_new_request_id(char out[LLM_REQUEST_ID_LEN], enum llm_provider p);
/* Releases everything of C (the reservation too); NULL is a no-op. */
void llm_call_free(struct llm_call *c);

/* --- forwarding (llm_forward.c) --- */

/* Sends C upstream and answers R: a non-streamed call in this thread; a stream relayed as
 * it arrives by a worker thread that settles it at its end. Takes ownership of C. */
int llm_forward(struct request *r, struct llm_call *c);
/* Sends an error in the provider's JSON shape. TYPE is the provider's error type. */
int llm_send_error(struct request *r, enum llm_provider p, int status, const char *type,
                   const char *message);

#endif
