/* SPDX-License-Identifier: Apache-2.0 */
/* Parsing of meter bodies: strict types, exact money, never a charge from a bad body. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/money.h"
#include "meter/meter.h"
#include "meter/meter_int.h"

/* The largest cost accepted in one call, in dollars: beyond any real LLM call and far
 * from overflowing the micro-dollar totals. */
#define METER_COST_MAX_USD 1e9
/* The largest token count accepted in one call. */
#define METER_TOKENS_MAX INT64_C(1000000000000)

/* Writes into BUF the shortest "%.Ne" form of COST that reads back as the same double:
 * the number as written (for up to 15 significant digits), e.g. 0.0225 -> "2.25e-02". */
static void shortest_decimal(char buf[64], double cost)
{
    int p;

    for (p = 1; p < 17; p++) {
        snprintf(buf, 64, "%.*e", p - 1, cost);
        if (strtod(buf, NULL) == cost) {
            break;
        }
    }
    snprintf(buf, 64, "%.*e", p - 1, cost);
}

/* The mantissa digits of BUF before E into DIGITS, without trailing zeros; returns how many. */
static int mantissa_digits(char digits[32], const char *buf, const char *e)
{
    int nd = 0;

    for (const char *c = buf; c < e; c++) {
        if (*c >= '0' && *c <= '9') {
            digits[nd++] = *c;
        }
    }
    while (nd > 1 && digits[nd - 1] == '0') {
        nd--;
    }
    return nd;
}

int meter_cost_from_double(int64_t *micros_out, double cost, struct err *err)
{
    char buf[64], digits[32];
    const char *e;
    int nd;
    long exp10;
    int64_t v = 0;

    *micros_out = 0;
    if (isnan(cost) || isinf(cost) || cost < 0) {
        return err_set(err, E_INVALID, "costUSD must be a non-negative number");
    }
    if (cost > METER_COST_MAX_USD) {
        return err_set(err, E_INVALID, "costUSD is too large");
    }
    if (cost == 0) {
        return E_OK;
    }
    /* The usual case without printf: a whole number of micro-dollars M whose decimal
     * M / 10^6 reads back as COST (division of two exact doubles rounds correctly, as
     * strtod does). Below 1e9 an ulp is under 1.2e-7, so no other decimal with at most
     * six places reads back as COST: the shortest form below is then M / 10^6 too. */
    v = llround(cost * 1e6);
    if ((double)v / 1e6 == cost) {
        *micros_out = v;
        return E_OK;
    }
    v = 0;
    shortest_decimal(buf, cost);
    e = strchr(buf, 'e');
    ASSERT(e != NULL);
    nd = mantissa_digits(digits, buf, e);
    /* value = digits * 10^(exponent - (nd - 1)); micro-dollars add 6 to the exponent. */
    exp10 = strtol(e + 1, NULL, 10) - (nd - 1) + 6;
    /* Finer than a micro-dollar (float arithmetic's 0.1 + 0.2, a price times tokens):
     * rounded, never to zero, as the runner rounds a usage line. Cannot fail: cost <= 1e9
     * dollars is at most 16 digits of micro-dollars. */
    (void)money_micros_of_digits(&v, digits, (size_t)nd, exp10);
    *micros_out = v;
    return E_OK;
}

/* Decodes one UTF-8 sequence at S[0..len) into *cp; returns its length, or 0 when it is
 * malformed (overlong, surrogate, past U+10FFFF, truncated). */
static size_t utf8_next(uint32_t *cp, const unsigned char *s, size_t len)
{
    size_t n;
    uint32_t c = s[0], min;

    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    if (c >= 0xc2 && c <= 0xdf) {
        n = 2, c &= 0x1f, min = 0x80;
    } else if (c >= 0xe0 && c <= 0xef) {
        n = 3, c &= 0x0f, min = 0x800;
    } else if (c >= 0xf0 && c <= 0xf4) {
        n = 4, c &= 0x07, min = 0x10000;
    } else {
        return 0;
    }
    if (len < n) {
        return 0;
    }
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80) {
            return 0;
        }
        c = (c << 6) | (s[i] & 0x3f);
    }
    if (c < min || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff)) {
        return 0;
    }
    *cp = c;
    return n;
}

static bool is_space(uint32_t c)
{
    return c == 0x20 || c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 ||
           c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000 || c == 0xfeff;
}

/* A requestId is 1..METER_REQUEST_ID_MAX bytes of valid UTF-8 without control characters
 * (C0, DEL, C1: no NUL either), and not only whitespace (SPEC §7 step 2: an empty id). */
static int check_request_id(const char *s, size_t len, struct err *err)
{
    bool blank = true;

    if (len > METER_REQUEST_ID_MAX) {
        return err_set(err, E_INVALID, "requestId is longer than %d bytes", METER_REQUEST_ID_MAX);
    }
    for (size_t i = 0; i < len;) {
        uint32_t c = 0;
        size_t n = utf8_next(&c, (const unsigned char *)s + i, len - i);
        if (n == 0) {
            return err_set(err, E_INVALID, "requestId is not valid UTF-8");
        }
        if (c < 0x20 || (c >= 0x7f && c <= 0x9f)) {
            return err_set(err, E_INVALID, "requestId holds a control character");
        }
        blank = blank && is_space(c);
        i += n;
    }
    if (blank) {
        return err_set(err, E_INVALID, "requestId is required (a non-empty string)");
    }
    return E_OK;
}

/* A cost given as a whole number of DOLLARS into micro-dollars; false when it is negative
 * or above METER_COST_MAX_USD. */
static bool whole_dollars(int64_t *out, int64_t dollars)
{
    if (dollars < 0 || dollars > (int64_t)METER_COST_MAX_USD) {
        return false;
    }
    *out = dollars * MONEY_MICROS_PER_USD;
    return true;
}

static int parse_cost(int64_t *out, const json_t *v, struct err *err)
{
    struct err perr = {0};

    if (json_is_integer(v)) {
        return whole_dollars(out, (int64_t)json_integer_value(v))
                   ? E_OK
                   : err_set(err, E_INVALID, "costUSD must be a non-negative number of dollars");
    }
    if (json_is_real(v)) {
        return meter_cost_from_double(out, json_real_value(v), err);
    }
    if (json_is_string(v)) {
        /* Also accepted: the exact decimal string, as AgentTask objects write money. */
        if (money_parse(out, NULL, json_string_value(v), &perr) != E_OK ||
            json_string_value(v)[0] == '+' || json_string_value(v)[0] == '$' ||
            *out > (int64_t)METER_COST_MAX_USD * MONEY_MICROS_PER_USD) {
            return err_set(err, E_INVALID, "costUSD: %s",
                           perr.msg[0] != '\0' ? perr.msg : "must be a plain decimal");
        }
        return E_OK;
    }
    return err_set(err, E_INVALID, "costUSD must be a non-negative number");
}

static int parse_count(int64_t *out, bool *has_out, const json_t *v, const char *name,
                       struct err *err)
{
    if (v == NULL || json_is_null(v)) {
        *out = 0;
        if (has_out != NULL) {
            *has_out = false;
        }
        return E_OK;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 0 ||
        json_integer_value(v) > METER_TOKENS_MAX) {
        return err_set(err, E_INVALID, "%s must be a non-negative integer", name);
    }
    *out = (int64_t)json_integer_value(v);
    if (has_out != NULL) {
        *has_out = true;
    }
    return E_OK;
}

/* BODY[0..len) as a JSON object (no duplicate keys), or NULL with ERR set (E_INVALID). */
static json_t *load_object(const char *body, size_t len, struct err *err)
{
    json_error_t jerr;
    json_t *j = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);

    if (j == NULL) {
        err_set(err, E_INVALID, "body is not valid JSON: %s", jerr.text);
    } else if (!json_is_object(j)) {
        err_set(err, E_INVALID, "body must be a JSON object");
        json_decref(j);
        j = NULL;
    }
    return j;
}

/* --- the plain body, read without a JSON tree ------------------------------------------ */

/* The bodies runners, the gateway and SDKs send, read in place: one object whose members are
 * only the five keys below, each at most once, with ASCII strings without escapes and
 * unsigned numbers. Anything else (another key, an escape, a byte outside printable ASCII in
 * a string, a sign, a string cost, a value out of range) is left to the general path
 * (meter_request_parse_json), which also words every refusal: this path only accepts, and
 * only what that one accepts, with the same values (tests/fuzz/fuzz_meter_body.c compares
 * the two on every input). */
enum plain_key { PK_ID, PK_MODEL, PK_ITERATION, PK_TOKENS, PK_COST, PK_COUNT };

struct plain {
    const char *p, *end;
};

static void plain_ws(struct plain *s)
{
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r')) {
        s->p++;
    }
}

/* Whether the next byte past whitespace is C (then taken). */
static bool plain_eat(struct plain *s, char c)
{
    plain_ws(s);
    if (s->p < s->end && *s->p == c) {
        s->p++;
        return true;
    }
    return false;
}

/* A string of printable ASCII without escapes: its bytes at *start, *len. */
static bool plain_string(const char **start, size_t *len, struct plain *s)
{
    const char *b;

    if (!plain_eat(s, '"')) {
        return false;
    }
    for (b = s->p; s->p < s->end && *s->p != '"'; s->p++) {
        unsigned char c = (unsigned char)*s->p;
        if (c < 0x20 || c > 0x7e || c == '\\') {
            return false;
        }
    }
    if (s->p == s->end) {
        return false;
    }
    *start = b;
    *len = (size_t)(s->p - b);
    s->p++;
    return true;
}

static bool plain_null(struct plain *s)
{
    plain_ws(s);
    if (s->end - s->p >= 4 && memcmp(s->p, "null", 4) == 0) {
        s->p += 4;
        return true;
    }
    return false;
}

/* Whether the next byte (no whitespace skipped) is one of SET; then it is taken. */
static bool plain_at(struct plain *s, const char *set)
{
    if (s->p < s->end && *s->p != '\0' && strchr(set, *s->p) != NULL) {
        s->p++;
        return true;
    }
    return false;
}

/* Takes the digits at S; whether there was at least one. */
static bool plain_digits(struct plain *s)
{
    const char *b = s->p;

    while (s->p < s->end && *s->p >= '0' && *s->p <= '9') {
        s->p++;
    }
    return s->p > b;
}

/* An unsigned JSON number: its text at *start, *len, and whether it is an integer (no
 * fraction, no exponent), as jansson tells them apart. */
static bool plain_number(const char **start, size_t *len, bool *integer, struct plain *s)
{
    const char *b;

    plain_ws(s);
    b = s->p;
    /* "0", or digits not starting with one (JSON has no leading zero) */
    if (!plain_at(s, "0") && !plain_digits(s)) {
        return false;
    }
    *integer = true;
    if (plain_at(s, ".")) {
        *integer = false;
        if (!plain_digits(s)) {
            return false;
        }
    }
    if (plain_at(s, "eE")) {
        *integer = false;
        (void)plain_at(s, "+-");
        if (!plain_digits(s)) {
            return false;
        }
    }
    *start = b;
    *len = (size_t)(s->p - b);
    return true;
}

/* An integer literal of at most 18 digits (no long long overflow) into *out. */
static bool plain_integer(int64_t *out, const char *text, size_t len)
{
    int64_t v = 0;

    if (len > 18) {
        return false;
    }
    for (size_t i = 0; i < len; i++) {
        v = v * 10 + (text[i] - '0');
    }
    *out = v;
    return true;
}

/* A count (iteration, tokensUsed): null or an integer within range; *HAS (may be NULL)
 * says which. */
static bool plain_count(int64_t *out, bool *has, struct plain *s)
{
    const char *text;
    size_t len;
    bool integer, given = !plain_null(s);

    *out = 0;
    if (given && (!plain_number(&text, &len, &integer, s) || !integer ||
                  !plain_integer(out, text, len) || *out > METER_TOKENS_MAX)) {
        return false;
    }
    if (has != NULL) {
        *has = given;
    }
    return true;
}

/* costUSD: null, an integer number of dollars, or a real read as jansson reads it (strtod
 * of the same text; ERANGE is its "real number overflow") and converted as parse_cost does. */
static bool plain_cost(int64_t *out, struct plain *s)
{
    char buf[64];
    const char *text;
    size_t len;
    bool integer;
    double d;

    if (plain_null(s)) {
        *out = 0;
        return true;
    }
    if (!plain_number(&text, &len, &integer, s)) {
        return false;
    }
    if (integer) {
        int64_t dollars;
        return plain_integer(&dollars, text, len) && whole_dollars(out, dollars);
    }
    if (len >= sizeof(buf)) {
        return false;
    }
    memcpy(buf, text, len);
    buf[len] = '\0';
    errno = 0;
    d = strtod(buf, NULL);
    return errno == 0 && meter_cost_from_double(out, d, NULL) == E_OK;
}

static enum plain_key plain_key_of(const char *k, size_t len)
{
    static const char *const names[PK_COUNT] = {"requestId", "model", "iteration", "tokensUsed",
                                                "costUSD"};

    for (int i = 0; i < PK_COUNT; i++) {
        if (strlen(names[i]) == len && memcmp(names[i], k, len) == 0) {
            return (enum plain_key)i;
        }
    }
    return PK_COUNT;
}

/* What a plain body said, pointing into it. */
struct plain_fields {
    const char *id, *model; /* NULL: not given (model: or null) */
    size_t id_len, model_len;
    int64_t iteration, tokens, cost;
    bool has_iteration;
    bool seen[PK_COUNT];
};

/* One member "key": value into F. */
static bool plain_member(struct plain_fields *f, struct plain *s)
{
    const char *k;
    size_t klen;
    enum plain_key key;

    if (!plain_string(&k, &klen, s) || (key = plain_key_of(k, klen)) == PK_COUNT || f->seen[key] ||
        !plain_eat(s, ':')) {
        return false;
    }
    f->seen[key] = true;
    switch (key) {
    case PK_ID:
        return plain_string(&f->id, &f->id_len, s);
    case PK_MODEL:
        return plain_null(s) || plain_string(&f->model, &f->model_len, s);
    case PK_ITERATION:
        return plain_count(&f->iteration, &f->has_iteration, s);
    case PK_TOKENS:
        return plain_count(&f->tokens, NULL, s);
    default:
        return plain_cost(&f->cost, s);
    }
}

bool meter_request_parse_plain(struct meter_request *out, const char *body, size_t len)
{
    struct plain s = {.p = body, .end = body + len};
    struct plain_fields f = {0};

    memset(out, 0, sizeof(*out));
    if (!plain_eat(&s, '{')) {
        return false;
    }
    do {
        if (!plain_member(&f, &s)) {
            return false;
        }
    } while (plain_eat(&s, ','));
    if (!plain_eat(&s, '}')) {
        return false;
    }
    plain_ws(&s);
    if (s.p != s.end || f.id == NULL || check_request_id(f.id, f.id_len, NULL) != E_OK) {
        return false;
    }
    out->request_id = xstrndup(f.id, f.id_len);
    out->model = f.model != NULL ? xstrndup(f.model, f.model_len) : NULL;
    out->has_iteration = f.has_iteration;
    out->iteration = f.iteration;
    out->tokens_used = f.tokens;
    out->cost_micros = f.cost;
    return true;
}

int meter_request_parse(struct meter_request *out, const char *body, size_t len, struct err *err)
{
    return meter_request_parse_plain(out, body, len)
               ? E_OK
               : meter_request_parse_json(out, body, len, err);
}

int meter_request_parse_json(struct meter_request *out, const char *body, size_t len,
                             struct err *err)
{
    json_t *j, *v;
    int rc = E_OK;

    memset(out, 0, sizeof(*out));
    j = load_object(body, len, err);
    if (j == NULL) {
        return E_INVALID;
    }
    v = json_object_get(j, "requestId");
    if (!json_is_string(v)) {
        rc = err_set(err, E_INVALID, "requestId is required (a non-empty string)");
        goto out;
    }
    rc = check_request_id(json_string_value(v), json_string_length(v), err);
    if (rc != E_OK) {
        goto out;
    }
    out->request_id = xstrdup(json_string_value(v));
    v = json_object_get(j, "model");
    if (v != NULL && !json_is_null(v)) {
        if (!json_is_string(v)) {
            rc = err_set(err, E_INVALID, "model must be a string");
            goto out;
        }
        out->model = xstrdup(json_string_value(v));
    }
    rc = parse_count(&out->iteration, &out->has_iteration, json_object_get(j, "iteration"),
                     "iteration", err);
    if (rc == E_OK) {
        rc = parse_count(&out->tokens_used, NULL, json_object_get(j, "tokensUsed"), "tokensUsed",
                         err);
    }
    if (rc == E_OK && (v = json_object_get(j, "costUSD")) != NULL && !json_is_null(v)) {
        rc = parse_cost(&out->cost_micros, v, err);
    }
out:
    json_decref(j);
    return rc;
}

void meter_request_cleanup(struct meter_request *r)
{
    free(r->request_id);
    free(r->model);
    memset(r, 0, sizeof(*r));
}

/* A completion message is shown on the PR: valid UTF-8 (jansson checked it), no control
 * character but newline and tab. */
static int check_message(const char *s, size_t len, struct err *err)
{
    if (len > METER_COMPLETE_MESSAGE_MAX) {
        return err_set(err, E_INVALID, "message is longer than %d bytes",
                       METER_COMPLETE_MESSAGE_MAX);
    }
    for (size_t i = 0; i < len;) {
        uint32_t c = 0;
        size_t n = utf8_next(&c, (const unsigned char *)s + i, len - i);
        if (n == 0) {
            return err_set(err, E_INVALID, "message is not valid UTF-8");
        }
        if ((c < 0x20 && c != '\n' && c != '\t') || (c >= 0x7f && c <= 0x9f)) {
            return err_set(err, E_INVALID, "message holds a control character");
        }
        i += n;
    }
    return E_OK;
}

int meter_completion_parse(struct meter_completion *out, const char *body, size_t len,
                           struct err *err)
{
    json_t *j, *v;
    const char *result;
    int rc = E_OK;

    memset(out, 0, sizeof(*out));
    j = load_object(body, len, err);
    if (j == NULL) {
        return E_INVALID;
    }
    result = json_string_value(json_object_get(j, "result"));
    if (result == NULL || (strcmp(result, "succeeded") != 0 && strcmp(result, "failed") != 0)) {
        rc = err_set(err, E_INVALID, "result must be \"succeeded\" or \"failed\"");
        goto out;
    }
    out->succeeded = strcmp(result, "succeeded") == 0;
    v = json_object_get(j, "message");
    if (v != NULL && !json_is_null(v) && !json_is_string(v)) {
        rc = err_set(err, E_INVALID, "message must be a string");
        goto out;
    }
    if (json_is_string(v)) {
        rc = check_message(json_string_value(v), json_string_length(v), err);
    }
    if (rc == E_OK) {
        out->message = xstrdup(json_is_string(v) ? json_string_value(v) : "");
    }
out:
    json_decref(j);
    return rc;
}

void meter_completion_cleanup(struct meter_completion *c)
{
    free(c->message);
    memset(c, 0, sizeof(*c));
}
