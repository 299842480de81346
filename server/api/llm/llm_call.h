/* SPDX-License-Identifier: Apache-2.0 */
/* One call through the gateway, inside server/api/llm/ only: its admission against the
 * task's budget (llm_call.c) and its forwarding and relay (llm_forward.c). */
#ifndef DIVERGE_SERVER_API_LLM_LLM_CALL_H
#define DIVERGE_SERVER_API_LLM_LLM_CALL_H

#include <jansson.h>

#include "server/api/llm/llm_int.h"

#define LLM_REQUEST_ID_LEN 64 /* "llm-<provider>-<24 hex>" and a NUL */
#define LLM_EXTRA_HEADERS 6

struct meter_pending; /* meter/meter.h */

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
    struct llm_task *project;           /* owned reference: the namespace's quota table */
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
    bool strip_usage_chunk; /* Chat stream: the usage chunk was asked for by us, not passed on */
    bool metered;           /* charged (not count_tokens) */
    char request_id[LLM_REQUEST_ID_LEN]; /* once admitted: the charge's requestId, the record's */
    struct meter_pending *record;        /* owned: the reservation record being committed */
    int record_status;                   /* 0: not waited for; 200: durable; else not recorded */
    bool held;                           /* under gw->mu: reserved_* count in task and project */
    bool ended; /* under gw->mu: answered while held (counted in task->ended, project->ended) */
};

enum llm_admit {
    LLM_ADMIT_OK,        /* reserved; forward with the allowed output limit */
    LLM_ADMIT_DENIED,    /* the meter refused (gate_status, gate_reason) */
    LLM_ADMIT_EXHAUSTED, /* no budget left for even one output token: refuse and pause */
    LLM_ADMIT_BUSY,      /* the budget is held by calls in flight: refuse, no pause */
    LLM_ADMIT_QUOTA,     /* the namespace's SpendQuota has no room left: refuse and pause */
};

/* Checks C's token and model with the meter and reserves the most C can cost, output up
 * to WANT_OUT tokens or less as the budget allows (*out_allowed). Thread-safe. */
enum llm_admit llm_call_admit(int64_t *out_allowed, struct llm_call *c, int64_t want_out);
/* Pauses C's task BudgetExceeded (QUOTA: QuotaExceeded) as a meter 429 does, and says so
 * in the task log. */
void llm_call_pause(struct llm_call *c, bool quota);
/* Charges C with U (NULL or incomplete: its reservation), writes the task-log line and
 * releases the reservation once the charge is durable. Blocks; no-op when not reserved. */
void llm_call_settle(struct llm_call *c, const struct llm_usage *u);
/* Releases C's reservation without a charge (the upstream answered an error); its
 * reservation record, when one was made, is removed (blocks until durable). */
void llm_call_release(struct llm_call *c);
/* Queues C's reservation record (SPEC §13: the call is charged its reservation at the next
 * start should the server die before its charge) without waiting: called as C is
 * forwarded, its commit overlaps the upstream call. No-op when C reserved nothing or the
 * store keeps no records. */
void llm_call_record(struct llm_call *c);
/* Whether C's reservation record is durable (waits for its commit, once). False when none
 * was made: the answer's end must then wait for the charge itself. */
bool llm_call_recorded(struct llm_call *c);
/* Notes that C's answer ends before its charge (or release): an admission the budget
 * binds waits for such calls to settle, so that it decides on their real cost. */
void llm_call_ended(struct llm_call *c);
/* Starts FN(ARG) on a detached thread (256 KiB stack) counted in GW's calls in flight
 * (gw->active), which FN ends with llm_gateway_idle_one; pthread_create's result (not
 * counted when it failed). */
int llm_gateway_thread(struct llm_gateway *gw, void *(*fn)(void *), void *arg);
/* One of GW's calls in flight (gw->active) is done: the last wakes llm_gateway_free. */
void llm_gateway_idle_one(struct llm_gateway *gw);
/* Charges C (USAGE, or without it its reservation) when CHARGE, else releases it, then
 * frees C, on a thread of its own counted in the gateway's calls in flight (so that the
 * answer already queued is not held by the commit); in this thread when none starts. */
void llm_call_finish_later(struct llm_call *c, const struct llm_usage *usage, bool charge);
void llm_call_set_model(struct llm_call *c, const char *model);
/* S fit for a log line in OUT[0..size): printable ASCII without spaces ('?' for the rest),
 * cut. */
void llm_log_safe(char *out, size_t size, const char *s);
void llm_call_new_request_id(char out[LLM_REQUEST_ID_LEN], enum llm_provider p);
/* Releases everything of C (the reservation too); NULL is a no-op. */
void llm_call_free(struct llm_call *c);

/* --- forwarding (llm_forward.c) --- */

/* Sends C upstream and answers R: a non-streamed call in this thread; a stream relayed as
 * it arrives by a worker thread, its charge started as soon as its final usage arrived
 * (else at its end: the reservation), and its end sent once the charge is durable. Takes
 * ownership of C. */
int llm_forward(struct request *r, struct llm_call *c);
/* What went wrong, mapped per provider to its status and error JSON (llm_send_error). */
enum llm_err {
    LLM_ERR_INVALID,     /* 400: a body the gateway cannot read */
    LLM_ERR_AUTH,        /* 401: no token, or the meter refused it */
    LLM_ERR_PERMISSION,  /* 403: model not allowed or not priced */
    LLM_ERR_BUDGET,      /* 402 (OpenAI: 429 insufficient_quota): budget exceeded */
    LLM_ERR_UNAVAILABLE, /* 503: no upstream key, the budget unreadable, no thread */
    LLM_ERR_UPSTREAM,    /* 502: the upstream could not be reached */
};

/* Sends MESSAGE as KIND in P's own error shape and status (SPEC §13). */
int llm_send_error(struct request *r, enum llm_provider p, enum llm_err kind, const char *message);

/* --- one route (llm_route.c) ------------------------------------------------------- */

/* What differs between providers' routes; the flow (auth, price, admission, rewriting,
 * forwarding) is llm_route_call's. Hooks may be NULL where noted. */
struct llm_route {
    enum llm_provider provider;
    enum llm_dialect dialect;
    bool metered; /* false: forwarded without a charge (count_tokens) */
    /* The task token R presents, or NULL when none or ambiguous. */
    const char *(*token_of)(struct request *r);
    /* Why BODY is refused (400) though well formed, or NULL (the hook may be NULL). */
    const char *(*refuse)(const json_t *body);
    /* The model the call names (BODY, or the path for Gemini), or NULL. */
    const char *(*model_of)(struct request *r, const json_t *body);
    /* Whether the client asked for a stream. */
    bool (*stream_of)(struct request *r, const json_t *body);
    /* The output limit BODY asks for, 0 when none. */
    int64_t (*output_of)(const json_t *body);
    /* Sets BODY's output limit to N tokens. */
    void (*set_output)(json_t *body, int64_t n);
    /* Adds TEXT (the prefixed guidance) to BODY's system prompt. */
    void (*add_guidance)(json_t *body, const char *text);
    /* Last changes to BODY before it is sent (NULL: none); returns whether it changed. */
    bool (*rewrite)(struct llm_call *c, json_t *body);
    /* Sets C's url, key_header and extra_headers for R. */
    void (*finish)(struct llm_call *c, struct request *r);
};

/* Shared hooks and pieces of the routes (llm_route.c). */
/* The token of R's one Authorization: Bearer header, or NULL (none, several, empty). */
const char *llm_bearer_token(struct request *r);
/* BODY's "model" (the model_of hook of routes that name it in the body). */
const char *llm_body_model(struct request *r, const json_t *body);
/* BODY's "stream": true (the stream_of hook of routes that ask in the body). */
bool llm_body_stream(struct request *r, const json_t *body);
/* BODY's FIELD as a believable output limit (1 .. LLM_TOKENS_MAX), 0 when not one. */
int64_t llm_body_limit(const json_t *body, const char *field);
/* Appends TEXT to BODY's string FIELD after a blank line, or sets it when absent or null;
 * false (BODY unchanged) when FIELD holds something else. */
bool llm_append_text(json_t *body, const char *field, const char *text);

/* Removes from BODY the tools DIALECT's provider would run itself (web search, URL fetch,
 * code execution, remote MCP, file search, image generation: unbounded cost, network
 * outside the sandbox's policy); NAMES (CAP bytes) gets their kinds, comma-separated and
 * cut. Returns how many were removed (llm_tools.c). */
size_t llm_drop_hosted_tools(json_t *body, enum llm_dialect dialect, char *names, size_t cap);

/* Serves R as one call of route RT (SPEC §13). */
int llm_route_call(struct request *r, const struct llm_route *rt);
/* Adds "NAME: value" of R's header NAME (else DEF, when not NULL) to C's extra headers. */
void llm_pass_header(struct llm_call *c, struct request *r, const char *name, const char *def);

#endif
