/* SPDX-License-Identifier: Apache-2.0 */
/* Declarations shared inside server/api/llm/ (the LLM gateway, SPEC §13): the price table,
 * the usage parsers, the per-task reservations and the forwarding of one call. */
#ifndef DIVERGE_SERVER_API_LLM_LLM_INT_H
#define DIVERGE_SERVER_API_LLM_LLM_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"
#include "common/err.h"
#include "common/httpc.h"
#include "server/api/llm/llm.h"

#define LLM_RESPONSE_MAX (64u << 20)       /* bytes of a non-streamed upstream answer */
#define LLM_SSE_EVENT_MAX (4u << 20)       /* bytes of one SSE event the usage parser keeps */
#define LLM_RELAY_BUF_MAX (1u << 20)       /* bytes of a stream waiting for a slow client */
#define LLM_UPSTREAM_TIMEOUT_MS 600000L    /* a non-streamed call (10 minutes) */
#define LLM_TOKENS_MAX INT64_C(1000000000) /* a usage figure above this is not believed */
#define LLM_PRICE_MAX_MICROS (INT64_C(100000) * 1000000) /* $100,000 per MTok */
#define LLM_DEFAULT_MAX_OUTPUT 64000 /* output bound when neither request nor table has one */
#define LLM_MODEL_MAX 256            /* bytes of a model name */
#define LLM_POOL_IDLE 64             /* idle upstream handles (and their connections) kept */

/* The provider of a route. */
enum llm_provider {
    LLM_ANTHROPIC,
    LLM_OPENAI,
    LLM_GEMINI,
    LLM_PROVIDER_COUNT,
};

/* Where usage figures sit in a response (SPEC §13 "Token kinds"). */
enum llm_dialect {
    LLM_DIALECT_ANTHROPIC, /* Messages */
    LLM_DIALECT_RESPONSES, /* OpenAI Responses */
    LLM_DIALECT_CHAT,      /* OpenAI Chat Completions */
    LLM_DIALECT_GEMINI,    /* generateContent */
};

/* One row of the price table; amounts in micro-dollars per million tokens. */
struct llm_price {
    char *match;         /* owned: glob on the model ('*' any run, '?' one byte) */
    int64_t input;       /* inputPerMTok */
    int64_t output;      /* outputPerMTok */
    int64_t cache_write; /* cacheWritePerMTok */
    int64_t cache_read;  /* cacheReadPerMTok */
    int64_t max_output;  /* maxOutputTokens, 0 = none */
};

struct llm_prices {
    struct llm_price *rows; /* owned, first match wins */
    size_t count;
};

/* Parses the price table YAML TEXT[0..len) (SPEC §13) into *out (caller storage, released
 * with llm_prices_cleanup even on failure). E_INVALID with the line and field in ERR. */
int llm_prices_parse(struct llm_prices *out, const char *text, size_t len, struct err *err);
/* The built-in table (llm_prices.c, dated there and in the README). */
void llm_prices_default(struct llm_prices *out);
void llm_prices_cleanup(struct llm_prices *p);
/* The first row of P whose glob matches MODEL, or NULL. */
const struct llm_price *llm_prices_find(const struct llm_prices *p, const char *model);
/* Glob match: '*' any run of bytes, '?' one byte, else exact. */
bool llm_glob(const char *pattern, const char *s);

/* Token counts of one call by kind. */
struct llm_usage {
    int64_t input;       /* uncached input tokens */
    int64_t output;      /* output tokens (reasoning included) */
    int64_t cache_write; /* Anthropic cache creation */
    int64_t cache_read;  /* cached input */
    bool complete;       /* every figure SPEC §13 names for the dialect arrived */
};

/* The usage in a non-streamed response BODY[0..len) of DIALECT; out->complete says
 * whether it was there and well formed. Never fails: hostile bytes give !complete. */
void llm_usage_from_body(struct llm_usage *out, enum llm_dialect dialect, const char *body,
                         size_t len);

/* An incremental SSE reader that picks the usage events of DIALECT out of a stream fed in
 * arbitrary pieces. Caller storage: llm_sse_init / llm_sse_cleanup. */
struct llm_sse {
    enum llm_dialect dialect;
    struct buf line;      /* owned: the line being read */
    struct buf data;      /* owned: the data lines of the event being read */
    bool overflow;        /* the event went over LLM_SSE_EVENT_MAX: it is dropped */
    bool saw_start;       /* Anthropic message_start */
    bool saw_delta;       /* Anthropic message_delta */
    struct llm_usage u;   /* what arrived so far; u.complete once the final figures did */
    bool chat_usage_only; /* Chat: the last event was a usage-only chunk (choices empty) */
    unsigned long events; /* events ended so far (blank lines) */
    struct buf raw;       /* owned (llm_sse_relay): the bytes of the event being read */
    bool raw_passing;     /* that event outgrew raw: its bytes are passed on as they come */
};

void llm_sse_init(struct llm_sse *s, enum llm_dialect dialect);
void llm_sse_cleanup(struct llm_sse *s);
/* Feeds DATA[0..len) of the stream. */
void llm_sse_feed(struct llm_sse *s, const char *data, size_t len);
/* Handles one whole event's data text TEXT[0..len) (what llm_sse_feed does at each blank
 * line); exposed for the relay, which looks at events one by one. */
void llm_sse_event(struct llm_sse *s, const char *text, size_t len);
/* As llm_sse_feed, and appends to OUT the bytes to pass on to the client: every event
 * whole and unchanged, except a Chat usage-only chunk (choices empty), which is dropped
 * (SPEC §13: the gateway asked for it, the client did not). An event is passed on once
 * it ended, so it is dropped or kept whole however the stream was split; one larger than
 * LLM_SSE_EVENT_MAX is passed on as it comes. E_TOOBIG when OUT is full. */
int llm_sse_relay(struct llm_sse *s, const char *data, size_t len, struct buf *out);
/* Appends to OUT what llm_sse_relay held back of an event the stream did not end. */
int llm_sse_relay_end(struct llm_sse *s, struct buf *out);

/* The cost of U at P in micro-dollars, rounded up (SPEC §13); saturates at INT64_MAX. */
int64_t llm_cost_micros(const struct llm_price *p, const struct llm_usage *u);
/* The sum of U's token kinds. */
int64_t llm_usage_tokens(const struct llm_usage *u);

/* --- the gateway ------------------------------------------------------------------- */

/* The reservations of one task's calls in flight, or (key without '/') of one namespace's
 * calls against its SpendQuotas. */
struct llm_task {
    char *key;               /* owned: "<namespace>/<name>", or "<namespace>" */
    pthread_mutex_t mu;      /* held from the budget check to the reservation, and over a settle */
    int64_t reserved_micros; /* under gw->mu */
    int64_t reserved_tokens; /* under gw->mu */
    int refs;                /* under gw->mu */
    int64_t ended;           /* under gw->mu: calls answered before their charge, ever */
    int64_t settled;         /* under gw->mu: of those, charged or released since */
    struct llm_task *next;
};

struct llm_gateway {
    char *upstream[LLM_PROVIDER_COUNT]; /* owned: base URLs without a trailing '/' */
    char *key[LLM_PROVIDER_COUNT];      /* owned secret, or NULL: not configured (503) */
    struct llm_prices prices;
    pthread_mutex_t mu;      /* guards tasks, active */
    pthread_cond_t idle;     /* active reached 0 */
    pthread_cond_t settled;  /* a call answered before its charge was charged or released */
    struct llm_task *tasks;  /* tasks with calls in flight */
    int active;              /* streams relayed by worker threads */
    struct httpc_pool *pool; /* owned: kept-alive upstream connections */
    /* Tests only: DIVERGE_TEST_LLM_SETTLE_DELAY_MS (docs/testing.md) holds each charge
     * back this long after its call ended, so a test can kill the server in between. */
    long settle_delay_ms;
};

/* The provider's name as in routes, flags and log lines ("anthropic"). */
const char *llm_provider_name(enum llm_provider p);

#endif
