/* SPDX-License-Identifier: Apache-2.0 */
/* Declarations shared inside meter/ only. */
#ifndef DIVERGE_METER_METER_INT_H
#define DIVERGE_METER_METER_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "meter/meter.h"

/* meter_request_parse's two ways (request.c), for the tests that compare them: the plain
 * body read in place (true: parsed into *out, caller storage, released with
 * meter_request_cleanup; false: *out holds nothing, the body is not one it reads), and the
 * general path through jansson, which reads and refuses everything else. */
bool meter_request_parse_plain(struct meter_request *out, const char *body, size_t len);
int meter_request_parse_json(struct meter_request *out, const char *body, size_t len,
                             struct err *err);

#define METER_TOKEN_CACHE_SLOTS 1024
#define METER_TOKEN_CACHE_WAYS 8 /* slots per set: tokens whose hashes collide still fit */

/* A presented token whose signature verified, shared by the requests that present it. */
struct verified_token {
    char *text;        /* owned: the encoded token exactly as presented */
    struct token *tok; /* owned: decoded, signature verified */
    const char *ns;    /* borrowed from tok: its only namespace caveat */
    const char *name;  /* borrowed from tok: its only task_id caveat */
    int refs;          /* under the cache's mutex */
    /* The last caveat check, reused while its inputs are the same. Touched only by the
     * meter's committer thread. */
    char *ck_repo, *ck_branch, *ck_model; /* owned; the context checked (NULL = none) */
    struct token_grant ck_grant;          /* its result */
    int64_t ck_until_ms;                  /* valid before this time (expires), or INT64_MAX */
    bool ck_valid;
    /* Whether it was its task's current, active token when the store's token epoch
     * (task_txn_token_epoch) was cur_epoch. Committer thread only, like ck_*. */
    uint64_t cur_epoch;
    bool cur_known, cur_value;
};

/* token_check_caveats() for VT in CTX, remembering the answer for the same repo, branch
 * and model until the token's expiry. Committer thread only. */
int token_cache_check(struct token_grant *out, struct verified_token *vt,
                      const struct token_context *ctx);

/* Verified tokens by their text. Only the signature is cached: revocation, expiry and
 * every other caveat are checked on each call, inside the transaction. */
struct token_cache {
    pthread_mutex_t mu;
    struct verified_token *slots[METER_TOKEN_CACHE_SLOTS];
    uint64_t used[METER_TOKEN_CACHE_SLOTS]; /* when each slot was last hit: LRU in a set */
    uint64_t clock;                         /* ticks once per lookup */
};

void token_cache_init(struct token_cache *c);
void token_cache_cleanup(struct token_cache *c);

/* Decodes and verifies TEXT against ROOT_KEY, or finds it verified already. *out is a
 * reference the caller gives back with token_cache_release(). Returns E_DENIED with the
 * 401 message in ERR: malformed, bad signature, or no single task_id/namespace caveat. */
int token_cache_get(struct verified_token **out, struct token_cache *c, const char *text,
                    const unsigned char root_key[TOKEN_ROOT_KEY_LEN], struct err *err);
void token_cache_release(struct token_cache *c, struct verified_token *vt);

#endif
