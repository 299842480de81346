/* SPDX-License-Identifier: Apache-2.0 */
/* A small direct-mapped cache of verified tokens: an agent presents the same token on
 * every call, so base64 decoding and the HMAC chain run once per token, not per call. */
#include <stdlib.h>
#include <string.h>

#include "common/hash.h"
#include "meter/meter_int.h"

static void vt_free(struct verified_token *vt)
{
    if (vt != NULL) {
        free(vt->ck_repo);
        free(vt->ck_branch);
        free(vt->ck_model);
        token_free(vt->tok);
        free(vt->text);
        free(vt);
    }
}

static void unref(struct verified_token *vt)
{
    if (vt != NULL && --vt->refs == 0) {
        vt_free(vt);
    }
}

void token_cache_init(struct token_cache *c)
{
    memset(c, 0, sizeof(*c));
    pthread_mutex_init(&c->mu, NULL);
}

void token_cache_cleanup(struct token_cache *c)
{
    for (size_t i = 0; i < METER_TOKEN_CACHE_SLOTS; i++) {
        unref(c->slots[i]);
        c->slots[i] = NULL;
    }
    pthread_mutex_destroy(&c->mu);
}

/* The first slot of TEXT's set: a token may sit in any of its METER_TOKEN_CACHE_WAYS
 * slots, so a few dozen tasks' tokens never evict each other over a hash collision (with
 * one slot per hash, two colliding tokens in use re-ran the HMAC chain on every call). */
static size_t set_of(const char *text)
{
    const size_t sets = METER_TOKEN_CACHE_SLOTS / METER_TOKEN_CACHE_WAYS;

    return (size_t)(hash_fnv1a_str(text) % sets) * METER_TOKEN_CACHE_WAYS;
}

/* The slot holding TEXT in the set at SET, or -1. Under the mutex. */
static long find(const struct token_cache *c, size_t set, const char *text)
{
    for (size_t i = set; i < set + METER_TOKEN_CACHE_WAYS; i++) {
        if (c->slots[i] != NULL && strcmp(c->slots[i]->text, text) == 0) {
            return (long)i;
        }
    }
    return -1;
}

/* The slot a new token takes in the set at SET: an empty one, else the least recently
 * used. Under the mutex. */
static size_t victim(const struct token_cache *c, size_t set)
{
    size_t best = set;

    for (size_t i = set; i < set + METER_TOKEN_CACHE_WAYS; i++) {
        if (c->slots[i] == NULL) {
            return i;
        }
        if (c->used[i] < c->used[best]) {
            best = i;
        }
    }
    return best;
}

/* The value of the only caveat NAME of T; NULL when absent or repeated (a token naming
 * two tasks is refused). */
static const char *caveat_value(const struct token *t, const char *name)
{
    size_t n = strlen(name);
    const char *found = NULL;

    for (size_t i = 0; i < token_caveat_count(t); i++) {
        const char *cv = token_caveat(t, i);
        if (strncmp(cv, name, n) == 0 && strncmp(cv + n, " = ", 3) == 0) {
            if (found != NULL) {
                return NULL;
            }
            found = cv + n + 3;
        }
    }
    return found;
}

static int verify(struct verified_token **out, const char *text,
                  const unsigned char root_key[TOKEN_ROOT_KEY_LEN], struct err *err)
{
    struct token *tok = NULL;
    struct verified_token *vt;

    *out = NULL;
    if (token_decode(&tok, text, strlen(text), NULL) != E_OK) {
        return err_set(err, E_DENIED, "malformed token");
    }
    if (token_verify_signature(tok, root_key, NULL) != E_OK) {
        token_free(tok);
        return err_set(err, E_DENIED, "bad token signature");
    }
    vt = xcalloc(1, sizeof(*vt));
    vt->tok = tok;
    vt->text = xstrdup(text);
    vt->name = caveat_value(tok, "task_id");
    vt->ns = caveat_value(tok, "namespace");
    if (vt->name == NULL || vt->ns == NULL) {
        vt_free(vt);
        return err_set(err, E_DENIED, "token names no single task and namespace");
    }
    *out = vt;
    return E_OK;
}

int token_cache_get(struct verified_token **out, struct token_cache *c, const char *text,
                    const unsigned char root_key[TOKEN_ROOT_KEY_LEN], struct err *err)
{
    size_t set = set_of(text), slot;
    struct verified_token *vt;
    long hit;
    int rc;

    pthread_mutex_lock(&c->mu);
    hit = find(c, set, text);
    if (hit >= 0) {
        vt = c->slots[hit];
        vt->refs++;
        c->used[hit] = ++c->clock;
        pthread_mutex_unlock(&c->mu);
        *out = vt;
        return E_OK;
    }
    pthread_mutex_unlock(&c->mu);
    /* Verify outside the lock: the HMAC chain is the expensive part. */
    rc = verify(&vt, text, root_key, err);
    if (rc != E_OK) {
        *out = NULL;
        return rc;
    }
    pthread_mutex_lock(&c->mu);
    hit = find(c, set, text); /* another request verified it meanwhile: share that one */
    if (hit >= 0) {
        vt_free(vt);
        vt = c->slots[hit];
        vt->refs++;
        c->used[hit] = ++c->clock;
    } else {
        slot = victim(c, set);
        vt->refs = 2; /* the slot's and the caller's */
        unref(c->slots[slot]);
        c->slots[slot] = vt;
        c->used[slot] = ++c->clock;
    }
    pthread_mutex_unlock(&c->mu);
    *out = vt;
    return E_OK;
}

void token_cache_release(struct token_cache *c, struct verified_token *vt)
{
    pthread_mutex_lock(&c->mu);
    unref(vt);
    pthread_mutex_unlock(&c->mu);
}

static bool same(const char *a, const char *b)
{
    return (a == NULL && b == NULL) || (a != NULL && b != NULL && strcmp(a, b) == 0);
}

static char *dup_opt(const char *s)
{
    return s != NULL ? xstrdup(s) : NULL;
}

int token_cache_check(struct token_grant *out, struct verified_token *vt,
                      const struct token_context *ctx)
{
    int rc;

    /* The caveats are a pure function of (token, task, namespace, repo, branch, model,
     * time); task and namespace come from the token itself, time only matters for
     * expires, so the answer stands while the rest is unchanged and unexpired. */
    if (vt->ck_valid && ctx->now_ms < vt->ck_until_ms && same(vt->ck_repo, ctx->repo) &&
        same(vt->ck_branch, ctx->branch) && same(vt->ck_model, ctx->model)) {
        *out = vt->ck_grant;
        return E_OK;
    }
    rc = token_check_caveats(out, vt->tok, ctx, NULL);
    if (rc != E_OK) {
        vt->ck_valid = false;
        return rc;
    }
    free(vt->ck_repo);
    free(vt->ck_branch);
    free(vt->ck_model);
    vt->ck_repo = dup_opt(ctx->repo);
    vt->ck_branch = dup_opt(ctx->branch);
    vt->ck_model = dup_opt(ctx->model);
    vt->ck_grant = *out;
    vt->ck_until_ms = out->has_expires ? out->expires_ms : INT64_MAX;
    vt->ck_valid = true;
    return E_OK;
}
