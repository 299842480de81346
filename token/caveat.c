/* SPDX-License-Identifier: Apache-2.0 */
/* The first-party caveat language ("name = value") and verification against a request
 * context. Fails closed: an unknown name, a malformed value or an unmet predicate
 * denies; repeated caveats all apply, so attenuation can only narrow. */
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/money.h"
#include "token/token.h"
#include "token/token_int.h"

#define CAVEAT_SEP " = "

/* Checks one caveat VALUE against CTX, narrowing G. Returns E_OK or E_DENIED. */
typedef int (*caveat_check_fn)(struct token_grant *g, const char *name, const char *value,
                               const struct token_context *ctx, struct err *err);

struct caveat_def {
    const char *name;      /* the predicate name before " = " */
    caveat_check_fn check; /* applies the value */
};

bool token_caveat_value_valid(const char *value)
{
    size_t len = strlen(value);

    if (len == 0 || value[0] == ' ' || value[len - 1] == ' ') {
        return false;
    }
    for (const unsigned char *p = (const unsigned char *)value; *p != '\0'; p++) {
        if (*p < 0x20 || *p == 0x7f) {
            return false;
        }
    }
    return true;
}

bool token_caveat_list_valid(const char *list, bool wildcard)
{
    const char *p = list;

    for (;;) {
        size_t n = strcspn(p, ",");
        if (n == 0) {
            return false; /* empty entry, leading or doubled comma */
        }
        for (size_t i = 0; i < n; i++) {
            unsigned char c = (unsigned char)p[i];
            if (c <= 0x20 || c == 0x7f || (c == '*' && (!wildcard || i != n - 1))) {
                return false;
            }
        }
        if (p[n] == '\0') {
            return true;
        }
        p += n + 1;
    }
}

/* True when ITEM equals one entry of the comma list LIST. */
static bool list_contains(const char *list, const char *item)
{
    size_t item_len = strlen(item);

    for (const char *p = list;;) {
        size_t n = strcspn(p, ",");
        if (n == item_len && memcmp(p, item, n) == 0) {
            return true;
        }
        if (p[n] == '\0') {
            return false;
        }
        p += n + 1;
    }
}

bool token_model_match(const char *patterns, const char *model)
{
    size_t model_len;

    if (model == NULL || model[0] == '\0') {
        return false;
    }
    model_len = strlen(model);
    for (const char *p = patterns;;) {
        size_t n = strcspn(p, ",");
        if (n > 0 && p[n - 1] == '*') {
            if (model_len >= n - 1 && memcmp(p, model, n - 1) == 0) {
                return true;
            }
        } else if (n == model_len && memcmp(p, model, n) == 0) {
            return true;
        }
        if (p[n] == '\0') {
            return false;
        }
        p += n + 1;
    }
}

static int unmet(const char *name, struct err *err)
{
    return err_set(err, E_DENIED, "caveat %s not satisfied", name);
}

static int malformed(const char *name, struct err *err)
{
    return err_set(err, E_DENIED, "malformed caveat %s", name);
}

static int check_equal(const char *want, const char *name, const char *value, struct err *err)
{
    if (want == NULL || strcmp(want, value) != 0) {
        return unmet(name, err);
    }
    return E_OK;
}

static int check_task_id(struct token_grant *g, const char *name, const char *value,
                         const struct token_context *ctx, struct err *err)
{
    (void)g;
    return check_equal(ctx->task, name, value, err);
}

static int check_namespace(struct token_grant *g, const char *name, const char *value,
                           const struct token_context *ctx, struct err *err)
{
    (void)g;
    return check_equal(ctx->ns, name, value, err);
}

static int check_repo(struct token_grant *g, const char *name, const char *value,
                      const struct token_context *ctx, struct err *err)
{
    (void)g;
    return check_equal(ctx->repo, name, value, err);
}

static int check_branch(struct token_grant *g, const char *name, const char *value,
                        const struct token_context *ctx, struct err *err)
{
    (void)g;
    return check_equal(ctx->branch, name, value, err);
}

/* Tools restrict the sandbox, not the meter: the value only has to be well formed. */
static int check_tools(struct token_grant *g, const char *name, const char *value,
                       const struct token_context *ctx, struct err *err)
{
    (void)g;
    (void)ctx;
    return token_caveat_list_valid(value, false) ? E_OK : malformed(name, err);
}

/* A model mismatch is recorded, not returned: the meter answers it with 403. */
static int check_models(struct token_grant *g, const char *name, const char *value,
                        const struct token_context *ctx, struct err *err)
{
    if (!token_caveat_list_valid(value, true)) {
        return malformed(name, err);
    }
    g->models_restricted = true;
    if (!token_model_match(value, ctx->model)) {
        g->model_allowed = false;
    }
    return E_OK;
}

static int check_max_cost(struct token_grant *g, const char *name, const char *value,
                          const struct token_context *ctx, struct err *err)
{
    int64_t micros;

    (void)ctx;
    /* A plain decimal: money_parse() would also take "$5" and "+5". */
    if (value[0] < '0' || value[0] > '9' || money_parse(&micros, NULL, value, NULL) != E_OK) {
        return malformed(name, err);
    }
    if (!g->has_max_cost || micros < g->max_cost_micros) {
        g->max_cost_micros = micros;
    }
    g->has_max_cost = true;
    return E_OK;
}

int token_parse_count(int64_t *out, const char *s)
{
    int64_t v = 0;

    if (s[0] == '\0') {
        return E_INVALID;
    }
    for (const char *p = s; *p != '\0'; p++) {
        if (*p < '0' || *p > '9' || v > (INT64_MAX - (*p - '0')) / 10) {
            return E_INVALID;
        }
        v = v * 10 + (*p - '0');
    }
    *out = v;
    return E_OK;
}

static int check_max_tokens(struct token_grant *g, const char *name, const char *value,
                            const struct token_context *ctx, struct err *err)
{
    int64_t n;

    (void)ctx;
    if (token_parse_count(&n, value) != E_OK) {
        return malformed(name, err);
    }
    if (!g->has_max_tokens || n < g->max_tokens) {
        g->max_tokens = n;
    }
    g->has_max_tokens = true;
    return E_OK;
}

static int check_expires(struct token_grant *g, const char *name, const char *value,
                         const struct token_context *ctx, struct err *err)
{
    int64_t ms;

    if (clock_parse_rfc3339(&ms, value) != E_OK) {
        return malformed(name, err);
    }
    if (ctx->now_ms >= ms) {
        return err_set(err, E_DENIED, "token expired");
    }
    if (!g->has_expires || ms < g->expires_ms) {
        g->expires_ms = ms;
    }
    g->has_expires = true;
    return E_OK;
}

static const struct caveat_def CAVEAT_DEFS[] = {
    {.name = "task_id", .check = check_task_id},
    {.name = "namespace", .check = check_namespace},
    {.name = "repo", .check = check_repo},
    {.name = "branch", .check = check_branch},
    {.name = "tools", .check = check_tools},
    {.name = "models", .check = check_models},
    {.name = "max_cost_usd", .check = check_max_cost},
    {.name = "max_tokens", .check = check_max_tokens},
    {.name = "expires", .check = check_expires},
};

/* Splits PREDICATE at the first " = " into a known definition and a valid value.
 * NULL when the name is unknown or the shape is wrong; *value_out then is NULL too. */
static const struct caveat_def *caveat_lookup(const char **value_out, const char *predicate)
{
    const char *sep = strstr(predicate, CAVEAT_SEP);
    size_t name_len;

    *value_out = NULL;
    if (sep == NULL) {
        return NULL;
    }
    name_len = (size_t)(sep - predicate);
    for (size_t i = 0; i < ARRAY_LEN(CAVEAT_DEFS); i++) {
        const struct caveat_def *d = &CAVEAT_DEFS[i];
        if (strlen(d->name) == name_len && memcmp(d->name, predicate, name_len) == 0) {
            *value_out = sep + strlen(CAVEAT_SEP);
            return d;
        }
    }
    return NULL;
}

int token_verify(struct token_grant *out, const struct token *t,
                 const unsigned char root_key[TOKEN_ROOT_KEY_LEN], const struct token_context *ctx,
                 struct err *err)
{
    int rc;

    memset(out, 0, sizeof(*out));
    /* The signature first: never interpret caveats an attacker could have written. */
    rc = token_verify_signature(t, root_key, err);
    if (rc != E_OK) {
        return rc;
    }
    return token_check_caveats(out, t, ctx, err);
}

int token_check_caveats(struct token_grant *out, const struct token *t,
                        const struct token_context *ctx, struct err *err)
{
    struct token_grant g = {.model_allowed = true};
    int rc;

    memset(out, 0, sizeof(*out));
    for (size_t i = 0; i < token_caveat_count(t); i++) {
        const char *predicate = token_caveat(t, i), *value;
        const struct caveat_def *d = caveat_lookup(&value, predicate);

        if (d == NULL) {
            return err_set(err, E_DENIED, "unknown caveat \"%.64s\"", predicate);
        }
        if (!token_caveat_value_valid(value)) {
            return malformed(d->name, err);
        }
        rc = d->check(&g, d->name, value, ctx, err);
        if (rc != E_OK) {
            return rc;
        }
    }
    *out = g;
    return E_OK;
}

int token_verify_string(struct token_grant *out, char **id_out, const char *s,
                        const unsigned char root_key[TOKEN_ROOT_KEY_LEN],
                        const struct token_context *ctx, struct err *err)
{
    struct token *t = NULL;
    struct err derr = {0};
    int rc;

    memset(out, 0, sizeof(*out));
    if (id_out != NULL) {
        *id_out = NULL;
    }
    rc = token_decode(&t, s, strlen(s), &derr);
    if (rc != E_OK) {
        rc = err_set(err, E_DENIED, "malformed token: %s", derr.msg);
        goto out;
    }
    rc = token_verify(out, t, root_key, ctx, err);
    if (rc == E_OK && id_out != NULL) {
        *id_out = xstrdup(token_identifier(t));
    }
out:
    token_free(t);
    return rc;
}

/* The value of the next caveat named NAME at or after index *I (advanced past it), or
 * NULL when there is none. Unknown and malformed caveats are skipped here; verification
 * rejects them. */
static const char *next_value(const struct token *t, size_t *i, const char *name)
{
    while (*i < token_caveat_count(t)) {
        const char *value;
        const struct caveat_def *d = caveat_lookup(&value, token_caveat(t, (*i)++));
        if (d != NULL && strcmp(d->name, name) == 0) {
            return value;
        }
    }
    return NULL;
}

bool token_models_allow(const struct token *t, const char *model)
{
    const char *value;
    size_t i = 0;

    while ((value = next_value(t, &i, "models")) != NULL) {
        if (!token_caveat_list_valid(value, true) || !token_model_match(value, model)) {
            return false;
        }
    }
    return true;
}

bool token_tools_allow(const struct token *t, const char *tool)
{
    const char *value;
    size_t i = 0;

    while ((value = next_value(t, &i, "tools")) != NULL) {
        if (tool == NULL || !token_caveat_list_valid(value, false) || !list_contains(value, tool)) {
            return false;
        }
    }
    return true;
}
