/* SPDX-License-Identifier: Apache-2.0 */
/* The model price table of the LLM gateway (SPEC §13): the --llm-prices YAML, the built-in
 * table, first-match glob lookup and exact costs in micro-dollars, rounded up per call. */
#include <stdlib.h>
#include <string.h>

#include "common/money.h"
#include "common/yamldoc.h"
#include "server/api/llm/llm_int.h"

/* The built-in table: the providers' published list prices for the current models, as of
 * 2025-11-20 (README "LLM gateway" carries the same date). USD per million tokens, as
 * exact decimal strings; the first match wins, so longer names come before their prefix.
 * Where a provider has no cache-write price, the input price applies. */
static const struct default_price {
    const char *match, *input, *output, *cache_write, *cache_read;
    int64_t max_output;
} g_defaults[] = {
    /* Anthropic: cache write = 5-minute cache (1.25x input), cache read 0.1x input. */
    {"claude-opus-4-5*", "5.00", "25.00", "6.25", "0.50", 64000},
    {"claude-opus-4*", "15.00", "75.00", "18.75", "1.50", 32000},
    {"claude-sonnet-4*", "3.00", "15.00", "3.75", "0.30", 64000},
    {"claude-haiku-4*", "1.00", "5.00", "1.25", "0.10", 64000},
    {"claude-3-7-sonnet*", "3.00", "15.00", "3.75", "0.30", 64000},
    {"claude-3-5-sonnet*", "3.00", "15.00", "3.75", "0.30", 8192},
    {"claude-3-5-haiku*", "0.80", "4.00", "1.00", "0.08", 8192},
    {"claude-3-haiku*", "0.25", "1.25", "0.30", "0.03", 4096},
    /* OpenAI: cached input is the cache read. */
    {"gpt-5-mini*", "0.25", "2.00", "0.25", "0.025", 128000},
    {"gpt-5-nano*", "0.05", "0.40", "0.05", "0.005", 128000},
    {"gpt-5*", "1.25", "10.00", "1.25", "0.125", 128000},
    {"gpt-4.1-mini*", "0.40", "1.60", "0.40", "0.10", 32768},
    {"gpt-4.1-nano*", "0.10", "0.40", "0.10", "0.025", 32768},
    {"gpt-4.1*", "2.00", "8.00", "2.00", "0.50", 32768},
    {"gpt-4o-mini*", "0.15", "0.60", "0.15", "0.075", 16384},
    {"gpt-4o*", "2.50", "10.00", "2.50", "1.25", 16384},
    {"o4-mini*", "1.10", "4.40", "1.10", "0.275", 100000},
    {"o3-mini*", "1.10", "4.40", "1.10", "0.55", 100000},
    {"o3*", "2.00", "8.00", "2.00", "0.50", 100000},
    /* Gemini: prompts up to 200k tokens (longer ones cost more and are priced here as
     * such only through --llm-prices). */
    {"gemini-3-pro*", "2.00", "12.00", "2.00", "0.20", 65536},
    {"gemini-2.5-pro*", "1.25", "10.00", "1.25", "0.125", 65536},
    {"gemini-2.5-flash-lite*", "0.10", "0.40", "0.10", "0.01", 65536},
    {"gemini-2.5-flash*", "0.30", "2.50", "0.30", "0.03", 65536},
    {"gemini-2.0-flash-lite*", "0.075", "0.30", "0.075", "0.075", 8192},
    {"gemini-2.0-flash*", "0.10", "0.40", "0.10", "0.025", 8192},
};

bool llm_glob(const char *pattern, const char *s)
{
    const char *star = NULL, *retry = NULL;

    /* Iterative with one backtrack point: linear in practice, never recursive. */
    while (*s != '\0') {
        if (*pattern == '*') {
            star = pattern++;
            retry = s;
        } else if (*pattern == '?' || *pattern == *s) {
            pattern++;
            s++;
        } else if (star != NULL) {
            pattern = star + 1;
            s = ++retry;
        } else {
            return false;
        }
    }
    while (*pattern == '*') {
        pattern++;
    }
    return *pattern == '\0';
}

const struct llm_price *llm_prices_find(const struct llm_prices *p, const char *model)
{
    for (size_t i = 0; model != NULL && i < p->count; i++) {
        if (llm_glob(p->rows[i].match, model)) {
            return &p->rows[i];
        }
    }
    return NULL;
}

void llm_prices_cleanup(struct llm_prices *p)
{
    for (size_t i = 0; i < p->count; i++) {
        free(p->rows[i].match);
    }
    free(p->rows);
    memset(p, 0, sizeof(*p));
}

static int amount(int64_t *out, const char *text, const char *field, size_t line, struct err *err)
{
    if (text == NULL || money_parse(out, NULL, text, NULL) != E_OK || text[0] == '+' ||
        text[0] == '$' || *out > LLM_PRICE_MAX_MICROS) {
        return err_set(err, E_INVALID,
                       "line %zu: %s must be a decimal string of USD per million tokens (at "
                       "most 6 decimals, at most 100000)",
                       line, field);
    }
    return E_OK;
}

void llm_prices_default(struct llm_prices *out)
{
    memset(out, 0, sizeof(*out));
    out->rows = xcalloc(ARRAY_LEN(g_defaults), sizeof(*out->rows));
    for (size_t i = 0; i < ARRAY_LEN(g_defaults); i++) {
        const struct default_price *d = &g_defaults[i];
        struct llm_price *p = &out->rows[out->count++];
        int rc;
        p->match = xstrdup(d->match);
        rc = amount(&p->input, d->input, "input", 0, NULL) |
             amount(&p->output, d->output, "output", 0, NULL) |
             amount(&p->cache_write, d->cache_write, "cache write", 0, NULL) |
             amount(&p->cache_read, d->cache_read, "cache read", 0, NULL);
        ASSERT(rc == E_OK); /* the table above is constant: a bad amount is a bug */
        p->max_output = d->max_output;
    }
}

static const char *scalar_of(const struct yamldoc_node *n)
{
    return n != NULL && yamldoc_kind(n) == YAMLDOC_SCALAR &&
                   strlen(yamldoc_scalar(n)) == yamldoc_scalar_len(n)
               ? yamldoc_scalar(n)
               : NULL;
}

static int parse_max_output(int64_t *out, const char *text, size_t line, struct err *err)
{
    char *end = NULL;
    long long v;

    if (text == NULL || text[0] < '0' || text[0] > '9') {
        goto bad;
    }
    v = strtoll(text, &end, 10);
    if (*end != '\0' || v < 0 || v > LLM_TOKENS_MAX) {
        goto bad;
    }
    *out = v;
    return E_OK;
bad:
    return err_set(err, E_INVALID, "line %zu: maxOutputTokens must be a whole number of tokens",
                   line);
}

/* Every key of mapping N is a known field with a scalar value. */
static int check_keys(const struct yamldoc *d, const struct yamldoc_node *n, struct err *err)
{
    static const char *const known[] = {
        "match",          "inputPerMTok", "outputPerMTok", "cacheWritePerMTok", "cacheReadPerMTok",
        "maxOutputTokens"};

    for (size_t i = 0; i < yamldoc_count(n); i++) {
        const struct yamldoc_node *k, *v;
        bool ok = false;
        yamldoc_pair(&k, &v, d, n, i);
        for (size_t j = 0; scalar_of(k) != NULL && j < ARRAY_LEN(known); j++) {
            ok = ok || strcmp(scalar_of(k), known[j]) == 0;
        }
        if (!ok || scalar_of(v) == NULL) {
            return err_set(err, E_INVALID, "line %zu: unknown or non-scalar field",
                           yamldoc_line(k));
        }
    }
    return E_OK;
}

/* One item of models: into ROW. */
static int parse_row(struct llm_price *row, const struct yamldoc *d, const struct yamldoc_node *n,
                     struct err *err)
{
    size_t line = yamldoc_line(n);
    const char *match, *cw, *cr;
    int rc;

    if (yamldoc_kind(n) != YAMLDOC_MAPPING) {
        return err_set(err, E_INVALID, "line %zu: each model must be a mapping", line);
    }
    rc = check_keys(d, n, err);
    if (rc != E_OK) {
        return rc;
    }
    match = scalar_of(yamldoc_get(d, n, "match"));
    if (match == NULL || match[0] == '\0' || strlen(match) > LLM_MODEL_MAX) {
        return err_set(err, E_INVALID, "line %zu: match (a glob on the model) is required", line);
    }
    row->match = xstrdup(match);
    rc = amount(&row->input, scalar_of(yamldoc_get(d, n, "inputPerMTok")), "inputPerMTok", line,
                err);
    if (rc == E_OK) {
        rc = amount(&row->output, scalar_of(yamldoc_get(d, n, "outputPerMTok")), "outputPerMTok",
                    line, err);
    }
    /* Without cache prices, cached tokens cost what input costs (never less than real). */
    cw = scalar_of(yamldoc_get(d, n, "cacheWritePerMTok"));
    cr = scalar_of(yamldoc_get(d, n, "cacheReadPerMTok"));
    row->cache_write = row->cache_read = row->input;
    if (rc == E_OK && cw != NULL) {
        rc = amount(&row->cache_write, cw, "cacheWritePerMTok", line, err);
    }
    if (rc == E_OK && cr != NULL) {
        rc = amount(&row->cache_read, cr, "cacheReadPerMTok", line, err);
    }
    if (rc == E_OK && yamldoc_get(d, n, "maxOutputTokens") != NULL) {
        rc = parse_max_output(&row->max_output, scalar_of(yamldoc_get(d, n, "maxOutputTokens")),
                              line, err);
    }
    return rc;
}

static int parse_doc(struct llm_prices *out, const struct yamldoc *d, struct err *err)
{
    const struct yamldoc_node *root = yamldoc_root(d), *models;
    const char *version;

    if (root == NULL || yamldoc_kind(root) != YAMLDOC_MAPPING) {
        return err_set(err, E_INVALID, "the price table must be a mapping (version, models)");
    }
    version = scalar_of(yamldoc_get(d, root, "version"));
    if (version == NULL || strcmp(version, "1") != 0) {
        return err_set(err, E_INVALID, "version must be \"1\"");
    }
    models = yamldoc_get(d, root, "models");
    if (models == NULL || yamldoc_kind(models) != YAMLDOC_SEQUENCE) {
        return err_set(err, E_INVALID, "models must be a list");
    }
    out->rows = xcalloc(yamldoc_count(models) + 1, sizeof(*out->rows));
    for (size_t i = 0; i < yamldoc_count(models); i++) {
        int rc = parse_row(&out->rows[out->count], d, yamldoc_item(d, models, i), err);
        out->count++; /* the row owns what it parsed, even when it failed */
        if (rc != E_OK) {
            return rc;
        }
    }
    return E_OK;
}

int llm_prices_parse(struct llm_prices *out, const char *text, size_t len, struct err *err)
{
    struct yamldoc_reader *r = NULL;
    struct yamldoc *d = NULL;
    struct yamldoc_syntax syn = {0};
    int rc;

    memset(out, 0, sizeof(*out));
    rc = yamldoc_reader_new(&r, text, len);
    if (rc != E_OK) {
        return err_set(err, E_FAIL, "cannot start the YAML parser");
    }
    rc = yamldoc_next(&d, r, &syn);
    if (rc != E_OK) {
        rc = err_set(err, E_INVALID, "line %zu: %s", syn.line,
                     syn.problem != NULL ? syn.problem : "not YAML");
    } else {
        rc = parse_doc(out, d, err);
    }
    yamldoc_free(d);
    yamldoc_reader_free(r);
    return rc;
}

int64_t llm_cost_micros(const struct llm_price *p, const struct llm_usage *u)
{
    /* Σ tokens × price per MTok / 10^6, rounded up once for the call. */
    __extension__ unsigned __int128 sum =
        (unsigned __int128)u->input * (uint64_t)p->input +
        (unsigned __int128)u->output * (uint64_t)p->output +
        (unsigned __int128)u->cache_write * (uint64_t)p->cache_write +
        (unsigned __int128)u->cache_read * (uint64_t)p->cache_read;
    __extension__ unsigned __int128 q = (sum + (MONEY_MICROS_PER_USD - 1)) / MONEY_MICROS_PER_USD;

    return q > INT64_MAX ? INT64_MAX : (int64_t)q;
}

int64_t llm_usage_tokens(const struct llm_usage *u)
{
    return u->input + u->output + u->cache_write + u->cache_read;
}
