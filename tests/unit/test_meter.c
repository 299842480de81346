/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests of meter/: body parsing (every malformed variant), exact cost conversion, and
 * the decision table of SPEC §7. */
#include <math.h>
#include <stdlib.h>

#include "meter/meter_int.h"
#include "tests/t_check.h"

TEST(cost_from_double_is_exact)
{
    static const struct {
        double in;
        int64_t want;
        int rc;
    } cases[] = {
        {0.0225, 22500, E_OK},
        {0.0675, 67500, E_OK},
        {1.5, 1500000, E_OK},
        {0.000001, 1, E_OK},
        {0, 0, E_OK},
        {12345.678901, 12345678901, E_OK},
        {0.1, 100000, E_OK},
        {0.3, 300000, E_OK},
        {1e-7, 1, E_OK},
        {0.0000015, 2, E_OK},
        {1e-300, 1, E_OK},
        {0.1 + 0.2, 300000, E_OK},
        {1500 * 0.000015, 22500, E_OK},
        {0.0000004, 1, E_OK},
        {-0.01, 0, E_INVALID},
        {1e300, 0, E_INVALID},
        {5.00, 5000000, E_OK},
        {999999999.999999, 999999999999999, E_OK},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        int64_t v = -1;
        int rc = meter_cost_from_double(&v, cases[i].in, NULL);
        if (rc != cases[i].rc || (rc == E_OK && v != cases[i].want)) {
            t_fail(__FILE__, __LINE__, "case %zu (%.17g): rc=%d v=%lld want rc=%d v=%lld", i,
                   cases[i].in, rc, (long long)v, cases[i].rc, (long long)cases[i].want);
        }
    }
    int64_t v;
    CHECK_EQ_INT(meter_cost_from_double(&v, NAN, NULL), E_INVALID);
    CHECK_EQ_INT(meter_cost_from_double(&v, INFINITY, NULL), E_INVALID);
}

/* Every whole number of micro-dollars, written as a double, reads back exactly (spread over
 * the whole accepted range), and the doubles just above and below each (more than six
 * decimals) round to it. */
TEST(cost_from_double_every_micro_amount)
{
    int64_t m = 1;

    for (int i = 0; i < 200000; i++) {
        int64_t v = -1;
        double d = (double)m / 1e6, up = nextafter(d, INFINITY);
        if (meter_cost_from_double(&v, d, NULL) != E_OK || v != m) {
            t_fail(__FILE__, __LINE__, "%lld micro-dollars (%.17g) read back as %lld", (long long)m,
                   d, (long long)v);
            return;
        }
        if (up <= 1e9 && (meter_cost_from_double(&v, up, NULL) != E_OK || v != m)) {
            t_fail(__FILE__, __LINE__, "%.17g read as %lld, not %lld", up, (long long)v,
                   (long long)m);
            return;
        }
        if (meter_cost_from_double(&v, nextafter(d, 0), NULL) != E_OK || v != m) {
            t_fail(__FILE__, __LINE__, "just below %lld read as %lld", (long long)m, (long long)v);
            return;
        }
        m = i < 100000 ? m + 1 : m + m / 5000 + 7; /* every small amount, then sparser ones */
        if (m > INT64_C(1000000000000000)) {
            m = m % INT64_C(1000000000000000) + 1;
        }
    }
}

TEST(parse_good_bodies)
{
    struct meter_request r;
    const char *b = "{\"requestId\":\"fix-1\",\"iteration\":1,\"model\":\"claude-3-7-sonnet\","
                    "\"tokensUsed\":1500,\"costUSD\":0.0225}";
    CHECK_OK(meter_request_parse(&r, b, strlen(b), NULL));
    CHECK_EQ_STR(r.request_id, "fix-1");
    CHECK_EQ_STR(r.model, "claude-3-7-sonnet");
    CHECK(r.has_iteration);
    CHECK_EQ_INT(r.iteration, 1);
    CHECK_EQ_INT(r.tokens_used, 1500);
    CHECK_EQ_INT(r.cost_micros, 22500);
    meter_request_cleanup(&r);
    b = "{\"requestId\":\"x\",\"costUSD\":\"0.0675\"}";
    CHECK_OK(meter_request_parse(&r, b, strlen(b), NULL));
    CHECK_EQ_INT(r.cost_micros, 67500);
    CHECK(r.model == NULL && !r.has_iteration && r.tokens_used == 0);
    meter_request_cleanup(&r);
    b = "{\"requestId\":\"x\",\"costUSD\":2,\"extra\":[1]}";
    CHECK_OK(meter_request_parse(&r, b, strlen(b), NULL));
    CHECK_EQ_INT(r.cost_micros, 2000000);
    meter_request_cleanup(&r);
}

TEST(parse_bad_bodies)
{
    static const char *const bad[] = {
        "",
        "not json",
        "[1,2]",
        "\"str\"",
        "{}",
        "{\"requestId\":\"\"}",
        "{\"requestId\":7}",
        "{\"requestId\":null}",
        "{\"requestId\":\"a\",\"tokensUsed\":-1}",
        "{\"requestId\":\"a\",\"tokensUsed\":1.5}",
        "{\"requestId\":\"a\",\"tokensUsed\":\"12\"}",
        "{\"requestId\":\"a\",\"tokensUsed\":99999999999999999999}",
        "{\"requestId\":\"a\",\"costUSD\":-0.5}",
        "{\"requestId\":\"a\",\"costUSD\":\"abc\"}",
        "{\"requestId\":\"a\",\"costUSD\":\"-1\"}",
        "{\"requestId\":\"a\",\"costUSD\":true}",
        "{\"requestId\":\"a\",\"costUSD\":1e400}",
        "{\"requestId\":\"a\",\"costUSD\":1e300}",
        "{\"requestId\":\"a\",\"costUSD\":NaN}",
        "{\"requestId\":\"a\",\"iteration\":-2}",
        "{\"requestId\":\"a\",\"model\":5}",
        "{\"requestId\":\"a\",\"requestId\":\"b\"}",
        "{\"requestId\":\"\xff\xfe\"}",
    };
    for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
        struct meter_request r;
        struct err err = {0};
        int rc = meter_request_parse(&r, bad[i], strlen(bad[i]), &err);
        if (rc != E_INVALID) {
            t_fail(__FILE__, __LINE__, "body %zu %s: rc=%d", i, bad[i], rc);
        }
        CHECK(err.msg[0] != '\0');
        meter_request_cleanup(&r);
    }
    /* requestId over the cap */
    char *big = xmalloc(600);
    memset(big, 'a', 600);
    char *body = xasprintf("{\"requestId\":\"%.*s\"}", 300, big);
    struct meter_request r;
    CHECK_EQ_INT(meter_request_parse(&r, body, strlen(body), NULL), E_INVALID);
    meter_request_cleanup(&r);
    free(big);
    free(body);
}

/* The plain reader (the bodies runners and SDKs send, read without jansson) takes the usual
 * shapes, gives each the values the general path gives, and leaves every other body to it. */
TEST(plain_reader_matches_jansson)
{
    static const char *const taken[] = {
        "{\"requestId\":\"fix-1\",\"iteration\":1,\"model\":\"claude-3-7-sonnet\","
        "\"tokensUsed\":1500,\"costUSD\":0.0225}",
        /* as the runner's jansson writes it: spaces, 17 significant digits */
        "{\"requestId\": \"t-u120\", \"iteration\": 3, \"model\": \"m\", \"tokensUsed\": 15, "
        "\"costUSD\": 0.022499999999999999}",
        " {\"costUSD\":2,\"tokensUsed\":0,\"model\":null,\"iteration\":null,\"requestId\":\" "
        "a\"}\n",
        "{\"requestId\":\"x\",\"costUSD\":999999999.999999,\"tokensUsed\":1000000000000}",
        "{\"requestId\":\"x\",\"costUSD\":2.5e-3}",
        "{\"requestId\":\"x\",\"costUSD\":0E0,\"tokensUsed\":0}",
        "{\"requestId\":\"x\",\"costUSD\":1000000000}",
        "{\"requestId\":\"x\",\"costUSD\":null}",
        "{\"requestId\":\"x\",\"costUSD\":0.0000001}", /* finer: rounded */
        "{\"requestId\":\"x\",\"costUSD\":0.30000000000000004}",
    };
    static const char *const left[] = {
        "{\"requestId\":\"x\",\"costUSD\":\"0.0675\"}",       /* a string cost */
        "{\"requestId\":\"x\",\"costUSD\":2,\"extra\":[1]}",  /* another key */
        "{\"requestId\":\"\\u0078\"}",                        /* an escape */
        "{\"requestId\":\"caf\xc3\xa9\"}",                    /* not ASCII */
        "{\"requestId\":\"x\",\"tokensUsed\":-0}",            /* a sign */
        "{\"requestId\":\"x\",\"tokensUsed\":01}",            /* not JSON */
        "{\"requestId\":\"x\",\"costUSD\":1000000000.5}",     /* too large */
        "{\"requestId\":\"x\",\"costUSD\":1e400}",            /* overflow */
        "{\"requestId\":\"x\",\"tokensUsed\":1000000000001}", /* too many */
        "{\"requestId\":\"x\",\"tokensUsed\":1.0}",           /* a real count */
        "{\"requestId\":\"x\",\"requestId\":\"y\"}",          /* a duplicate */
        "{\"requestId\":\"   \"}",                            /* blank */
        "{\"requestId\":\"x\"} x",                            /* trailing bytes */
        "{\"requestId\":\"x\",}",                             /* a trailing comma */
        "{\"requestId\":\"x\"",                               /* cut short */
        "{\"model\":\"m\"}",                                  /* no id */
        "{\"requestId\":\"x\",\"costUSD\":nul}",
    };
    for (size_t i = 0; i < ARRAY_LEN(taken); i++) {
        struct meter_request a, b;
        CHECK(meter_request_parse_plain(&a, taken[i], strlen(taken[i])));
        CHECK_OK(meter_request_parse_json(&b, taken[i], strlen(taken[i]), NULL));
        CHECK_EQ_STR(a.request_id, b.request_id);
        CHECK((a.model == NULL) == (b.model == NULL));
        if (a.model != NULL) {
            CHECK_EQ_STR(a.model, b.model);
        }
        CHECK(a.has_iteration == b.has_iteration);
        CHECK_EQ_INT(a.iteration, b.iteration);
        CHECK_EQ_INT(a.tokens_used, b.tokens_used);
        CHECK_EQ_INT(a.cost_micros, b.cost_micros);
        meter_request_cleanup(&a);
        meter_request_cleanup(&b);
    }
    for (size_t i = 0; i < ARRAY_LEN(left); i++) {
        struct meter_request a;
        if (meter_request_parse_plain(&a, left[i], strlen(left[i]))) {
            t_fail(__FILE__, __LINE__, "body %zu %s: taken by the plain reader", i, left[i]);
        }
        CHECK(a.request_id == NULL && a.model == NULL);
        meter_request_cleanup(&a);
    }
}

/* An Active task with $5 / 200000 tokens in the spec, nothing spent, and a token whose
 * caveats allow $1 / 1000 tokens. */
static struct meter_state base_state(void)
{
    struct meter_state st;
    memset(&st, 0, sizeof(st));
    st.task_found = st.token_current = st.caveats_ok = st.body_ok = st.model_ok = true;
    st.phase = TASK_ACTIVE;
    st.spec_budget_usd = 5000000;
    st.spec_budget_tokens = 200000;
    st.grant.has_max_cost = true;
    st.grant.max_cost_micros = 1000000;
    st.grant.has_max_tokens = true;
    st.grant.max_tokens = 1000;
    return st;
}

static struct meter_request req_of(int64_t tokens, int64_t cost, int64_t iteration)
{
    struct meter_request r;
    memset(&r, 0, sizeof(r));
    r.request_id = (char *)(uintptr_t) "r";
    r.tokens_used = tokens;
    r.cost_micros = cost;
    r.has_iteration = iteration >= 0;
    r.iteration = iteration;
    return r;
}

TEST(decision_table)
{
    struct meter_decision d;
    struct meter_state st;
    struct meter_request r = req_of(1500, 22500, 1);

    /* 401s, in order */
    st = base_state();
    st.task_found = false;
    meter_decide(&d, &st, &r);
    CHECK_EQ_INT(d.status, 401);
    st = base_state();
    st.token_current = false;
    meter_decide(&d, &st, &r);
    CHECK_EQ_INT(d.status, 401);
    CHECK_EQ_STR(d.reason, "token revoked");
    st = base_state();
    st.caveats_ok = false;
    meter_decide(&d, &st, &r);
    CHECK_EQ_INT(d.status, 401);
    for (int p = 0; p < TASK_PHASE_COUNT; p++) {
        st = base_state();
        st.phase = (enum task_phase)p;
        meter_decide(&d, &st, &r);
        CHECK_EQ_INT(d.status, p == TASK_ACTIVE ? 200 : 401);
    }
    /* 401 beats 400 beats 403 */
    st = base_state();
    st.token_current = false;
    st.body_ok = false;
    st.model_ok = false;
    meter_decide(&d, &st, NULL);
    CHECK_EQ_INT(d.status, 401);
    st = base_state();
    st.body_ok = false;
    st.model_ok = false;
    meter_decide(&d, &st, NULL);
    CHECK_EQ_INT(d.status, 400);
    st = base_state();
    st.model_ok = false;
    st.seen = true;
    meter_decide(&d, &st, &r);
    CHECK_EQ_INT(d.status, 403);
    /* idempotent retry: nothing added */
    st = base_state();
    st.seen = true;
    st.tokens_consumed = 10;
    st.cost_micros = 20;
    meter_decide(&d, &st, &r);
    CHECK_EQ_INT(d.outcome, METER_DUPLICATE);
    CHECK_EQ_INT(d.total_tokens, 10);
    CHECK_EQ_INT(d.total_cost_micros, 20);
    /* charge */
    st = base_state();
    meter_decide(&d, &st, &r);
    CHECK_EQ_INT(d.outcome, METER_ALLOWED);
    CHECK_EQ_INT(d.total_tokens, 1500);
    CHECK_EQ_INT(d.total_cost_micros, 22500);
    CHECK_EQ_INT(d.iteration, 1);
}

TEST(effective_budgets)
{
    struct meter_decision d;
    struct meter_state st = base_state();
    struct meter_request r;

    /* Spec positive replaces the caveat: a $1 caveat with spec $5 stops at $5. */
    r = req_of(0, 5000000, -1);
    meter_decide(&d, &st, &r);
    CHECK_EQ_INT(d.status, 200); /* equal to the budget is allowed */
    CHECK_EQ_INT(d.budget_usd, 5000000);
    st.cost_micros = 5000000;
    r = req_of(0, 1, -1);
    meter_decide(&d, &st, &r);
    CHECK_EQ_INT(d.status, 429); /* one micro-dollar over */
    CHECK_EQ_STR(d.reason, "budget exceeded");
    CHECK_EQ_INT(d.outcome, METER_OVER_BUDGET);
    CHECK_EQ_INT(d.total_cost_micros, 5000001);
    /* No spec budget: the caveat applies (smallest already folded into the grant). */
    st = base_state();
    st.spec_budget_usd = 0;
    r = req_of(0, 1000001, -1);
    meter_decide(&d, &st, &r);
    CHECK_EQ_INT(d.status, 429);
    r = req_of(0, 1000000, -1);
    meter_decide(&d, &st, &r);
    CHECK_EQ_INT(d.status, 200);
    /* Tokens: spec 200000 replaces the 1000 caveat; without spec, the caveat. */
    st = base_state();
    r = req_of(200000, 0, -1);
    meter_decide(&d, &st, &r);
    CHECK_EQ_INT(d.status, 200);
    r = req_of(200001, 0, -1);
    meter_decide(&d, &st, &r);
    CHECK_EQ_INT(d.status, 429);
    st.spec_budget_tokens = 0;
    r = req_of(1001, 0, -1);
    meter_decide(&d, &st, &r);
    CHECK_EQ_INT(d.status, 429);
    /* No budget at all: unlimited. */
    st = base_state();
    st.spec_budget_usd = st.spec_budget_tokens = 0;
    st.grant.has_max_cost = st.grant.has_max_tokens = false;
    r = req_of(INT64_C(1000000000), INT64_C(1000000000000), -1);
    meter_decide(&d, &st, &r);
    CHECK_EQ_INT(d.status, 200);
}

TEST(iterations)
{
    struct meter_decision d;
    struct meter_state st = base_state();
    struct meter_request r;

    st.max_iterations = 8;
    r = req_of(1, 1, 8);
    meter_decide(&d, &st, &r);
    CHECK_EQ_INT(d.status, 200);
    r = req_of(1, 1, 9);
    meter_decide(&d, &st, &r);
    CHECK_EQ_INT(d.status, 429);
    CHECK_EQ_STR(d.reason, "max iterations exceeded");
    CHECK_EQ_INT(d.outcome, METER_OVER_ITERATIONS);
    /* Both at once: budget wins. */
    r = req_of(1, 5000001, 9);
    meter_decide(&d, &st, &r);
    CHECK_EQ_STR(d.reason, "budget exceeded");
    /* No maxIterations: no limit. */
    st.max_iterations = 0;
    r = req_of(1, 1, 1000);
    meter_decide(&d, &st, &r);
    CHECK_EQ_INT(d.status, 200);
    /* Without "iteration", the task's iteration stays. */
    st.iteration = 3;
    r = req_of(1, 1, -1);
    meter_decide(&d, &st, &r);
    CHECK_EQ_INT(d.iteration, 3);
}

/* Security review 2026-12-01 finding 11: a lower iteration is charged but never lowers
 * status.iteration, so resetting the counter cannot stretch maxIterations. */
TEST(iteration_never_goes_back)
{
    struct meter_decision d;
    struct meter_state st = base_state();
    struct meter_request r;

    st.max_iterations = 3;
    st.iteration = 3;
    st.tokens_consumed = 10;
    st.cost_micros = 100;
    r = req_of(5, 50, 1);
    meter_decide(&d, &st, &r);
    CHECK_EQ_INT(d.status, 200);
    CHECK_EQ_INT(d.outcome, METER_ALLOWED);
    CHECK_EQ_INT(d.iteration, 3);
    CHECK_EQ_INT(d.total_tokens, 15); /* still charged */
    CHECK_EQ_INT(d.total_cost_micros, 150);
    /* The next iteration after the maximum is over the limit, whatever came between. */
    r = req_of(1, 1, 4);
    meter_decide(&d, &st, &r);
    CHECK_EQ_INT(d.status, 429);
    CHECK_EQ_STR(d.reason, "max iterations exceeded");
    CHECK_EQ_INT(d.iteration, 4);
}

/* SPEC §7 step 2: an empty or all-whitespace requestId is like a missing one; ids are
 * capped at METER_REQUEST_ID_MAX bytes of UTF-8 without control characters. */
TEST(request_id_rules)
{
    static const char *const bad[] = {
        "{\"requestId\":\"\"}",
        "{\"requestId\":\" \"}",
        "{\"requestId\":\"   \"}",
        "{\"requestId\":\"\\t\"}",
        "{\"requestId\":\" \\n \"}",
        "{\"requestId\":\"\\u00a0\\u3000\"}", /* Unicode spaces only */
        "{\"requestId\":\"a\\u0000b\"}",      /* NUL inside */
        "{\"requestId\":\"a\\u0001\"}",       /* C0 control */
        "{\"requestId\":\"a\\u001b[2J\"}",    /* terminal escape */
        "{\"requestId\":\"a\\u007f\"}",       /* DEL */
        "{\"requestId\":\"a\\u0085\"}",       /* C1 control (NEL) */
        "{\"requestId\":\"a\\r\\nb\"}",
        "{\"requestId\":\"\xc3\"}",         /* truncated UTF-8 */
        "{\"requestId\":\"\xed\xa0\x80\"}", /* surrogate */
    };
    static const char *const good[] = {
        "{\"requestId\":\" a \"}",
        "{\"requestId\":\"caf\xc3\xa9-1\"}",
        "{\"requestId\":\"\\u00e9\\ud83d\\ude00\"}",
    };
    struct meter_request r;
    struct err err = {0};
    char id[METER_REQUEST_ID_MAX + 2], *body;

    for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
        int rc = meter_request_parse(&r, bad[i], strlen(bad[i]), &err);
        if (rc != E_INVALID || r.request_id != NULL) {
            t_fail(__FILE__, __LINE__, "bad id %zu: rc=%d", i, rc);
        }
        meter_request_cleanup(&r);
    }
    for (size_t i = 0; i < ARRAY_LEN(good); i++) {
        int rc = meter_request_parse(&r, good[i], strlen(good[i]), &err);
        if (rc != E_OK) {
            t_fail(__FILE__, __LINE__, "good id %zu: rc=%d %s", i, rc, err.msg);
        }
        meter_request_cleanup(&r);
    }
    /* Exactly at the cap is accepted; one byte past it (also when the last character is
     * multi-byte) is refused. */
    memset(id, 'a', sizeof(id));
    id[METER_REQUEST_ID_MAX] = '\0';
    body = xasprintf("{\"requestId\":\"%s\"}", id);
    CHECK_OK(meter_request_parse(&r, body, strlen(body), NULL));
    CHECK_EQ_INT(strlen(r.request_id != NULL ? r.request_id : ""), METER_REQUEST_ID_MAX);
    meter_request_cleanup(&r);
    free(body);
    id[METER_REQUEST_ID_MAX] = 'a';
    id[METER_REQUEST_ID_MAX + 1] = '\0';
    body = xasprintf("{\"requestId\":\"%s\"}", id);
    CHECK_EQ_INT(meter_request_parse(&r, body, strlen(body), NULL), E_INVALID);
    meter_request_cleanup(&r);
    free(body);
    id[METER_REQUEST_ID_MAX - 1] = '\0';
    body = xasprintf("{\"requestId\":\"%s\\u00e9\"}", id); /* 255 + 2 bytes */
    CHECK_EQ_INT(meter_request_parse(&r, body, strlen(body), NULL), E_INVALID);
    meter_request_cleanup(&r);
    free(body);
}

/* SPEC §7 step 5, §8: max_cost_usd / max_tokens are budgets, never a 401. A positive spec
 * budget replaces them; otherwise the smallest caveat is the budget and crossing it is
 * 429 "budget exceeded". */
TEST(budget_caveats_are_budgets)
{
    struct meter_decision d;
    struct meter_state st = base_state();
    struct meter_request r;

    /* A $0.10 caveat on a $5.00 task: $0.11 and $5.00 are fine, past $5.00 is 429. */
    st.grant.max_cost_micros = 100000;
    r = req_of(0, 110000, -1);
    meter_decide(&d, &st, &r);
    CHECK_EQ_INT(d.status, 200);
    CHECK_EQ_INT(d.budget_usd, 5000000);
    st.cost_micros = 4999999;
    r = req_of(0, 1, -1);
    meter_decide(&d, &st, &r);
    CHECK_EQ_INT(d.status, 200);
    st.cost_micros = 5000000;
    meter_decide(&d, &st, &r);
    CHECK_EQ_INT(d.status, 429);
    CHECK_EQ_INT(d.outcome, METER_OVER_BUDGET);
    /* Spec zero: the caveat is the budget, crossing it is 429, never 401. */
    st = base_state();
    st.spec_budget_usd = 0;
    st.grant.max_cost_micros = 100000;
    st.cost_micros = 100000;
    r = req_of(0, 1, -1);
    meter_decide(&d, &st, &r);
    CHECK_EQ_INT(d.status, 429);
    CHECK_EQ_STR(d.reason, "budget exceeded");
    CHECK(d.has_budget_usd && d.budget_usd == 100000);
    /* A zero caveat with no spec budget: any spend is over. */
    st.grant.max_cost_micros = 0;
    st.cost_micros = 0;
    meter_decide(&d, &st, &r);
    CHECK_EQ_INT(d.status, 429);
    r = req_of(0, 0, -1);
    meter_decide(&d, &st, &r);
    CHECK_EQ_INT(d.status, 200);
    /* Tokens alike: a 10-token caveat on a 200000-token task. */
    st = base_state();
    st.grant.max_tokens = 10;
    r = req_of(200000, 0, -1);
    meter_decide(&d, &st, &r);
    CHECK_EQ_INT(d.status, 200);
    st.spec_budget_tokens = 0;
    r = req_of(11, 0, -1);
    meter_decide(&d, &st, &r);
    CHECK_EQ_INT(d.status, 429);
    CHECK_EQ_STR(d.reason, "budget exceeded");
}

/* The verified-token cache hands back the caveat budgets (smallest of repeats) on a miss
 * and on every hit, and never refuses a token for its budget caveats. */
TEST(token_cache_carries_budgets)
{
    unsigned char key[TOKEN_ROOT_KEY_LEN] = {0};
    struct token_mint_opts o = TOKEN_MINT_OPTS_DEFAULTS;
    struct token_context ctx = {.task = "t", .ns = "default", .now_ms = 1};
    struct token_cache c;
    struct verified_token *vt = NULL;
    struct token_grant g;
    struct token *t = NULL;
    char *text = NULL, *narrowed = NULL;

    o.task = "t", o.ns = "default", o.max_cost_micros = 5000000, o.max_tokens = 1000;
    CHECK_OK(token_mint_task(&text, NULL, key, &o, NULL));
    CHECK_OK(token_decode(&t, text != NULL ? text : "", text != NULL ? strlen(text) : 0, NULL));
    if (t == NULL) {
        free(text);
        return;
    }
    CHECK_OK(token_add_caveat(t, "max_cost_usd = 0.10", NULL));
    CHECK_OK(token_add_caveat(t, "max_cost_usd = 0.50", NULL));
    CHECK_OK(token_add_caveat(t, "max_tokens = 7", NULL));
    token_encode(&narrowed, t);
    token_cache_init(&c);
    CHECK_OK(token_cache_get(&vt, &c, narrowed, key, NULL));
    for (int round = 0; vt != NULL && round < 2; round++) { /* miss, then hit */
        memset(&g, 0, sizeof(g));
        CHECK_OK(token_cache_check(&g, vt, &ctx));
        CHECK(g.has_max_cost && g.max_cost_micros == 100000);
        CHECK(g.has_max_tokens && g.max_tokens == 7);
    }
    if (vt != NULL) {
        token_cache_release(&c, vt);
    }
    token_cache_cleanup(&c);
    token_free(t);
    free(text);
    free(narrowed);
}

/* 64 tasks' tokens in use at once all stay verified: a second call with each finds the
 * same cache entry (no token evicts another over a hash collision, no HMAC run again). */
TEST(token_cache_keeps_every_task_token)
{
    unsigned char key[TOKEN_ROOT_KEY_LEN] = {0};
    struct token_cache c;
    char *text[64] = {0};
    struct verified_token *first[64] = {0};

    token_cache_init(&c);
    for (size_t i = 0; i < ARRAY_LEN(text); i++) {
        struct token_mint_opts o = TOKEN_MINT_OPTS_DEFAULTS;
        char name[16];
        snprintf(name, sizeof(name), "m%zu", i);
        o.task = name, o.ns = "bench";
        CHECK_OK(token_mint_task(&text[i], NULL, key, &o, NULL));
        CHECK_OK(token_cache_get(&first[i], &c, text[i] != NULL ? text[i] : "", key, NULL));
        if (first[i] != NULL) {
            CHECK_EQ_STR(first[i]->name, name);
            token_cache_release(&c, first[i]);
        }
    }
    for (size_t i = 0; i < ARRAY_LEN(text); i++) {
        struct verified_token *again = NULL;
        CHECK_OK(token_cache_get(&again, &c, text[i] != NULL ? text[i] : "", key, NULL));
        CHECK(again != NULL && again == first[i]);
        if (again != NULL) {
            token_cache_release(&c, again);
        }
        free(text[i]);
    }
    token_cache_cleanup(&c);
}

TEST(completion_bodies)
{
    static const char *const bad[] = {
        "",
        "not json",
        "[]",
        "{}",
        "{\"result\":\"done\"}",
        "{\"result\":\"Succeeded\"}",
        "{\"result\":true}",
        "{\"result\":null}",
        "{\"result\":\"failed\",\"result\":\"succeeded\"}",
        "{\"result\":\"failed\",\"message\":5}",
        "{\"result\":\"failed\",\"message\":\"a\\u0007b\"}",
        "{\"result\":\"failed\",\"message\":\"a\\u009bb\"}",
        "{\"result\":\"failed\",\"message\":\"a\\u0000b\"}",
        "{\"result\":\"failed\",\"message\":\"\xff\"}",
    };
    struct meter_completion c;
    const char *ok;
    char *long_msg, *body;

    for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
        struct err err = {0};
        int rc = meter_completion_parse(&c, bad[i], strlen(bad[i]), &err);
        if (rc != E_INVALID) {
            t_fail(__FILE__, __LINE__, "body %zu %s: rc=%d", i, bad[i], rc);
        }
        CHECK(err.msg[0] != '\0');
        meter_completion_cleanup(&c);
    }
    ok = "{\"result\":\"succeeded\"}";
    CHECK_OK(meter_completion_parse(&c, ok, strlen(ok), NULL));
    CHECK(c.succeeded && strcmp(c.message, "") == 0);
    meter_completion_cleanup(&c);
    ok = "{\"result\":\"failed\",\"message\":\"line 1\\n\\tline 2 \xc3\xa9\",\"extra\":1}";
    CHECK_OK(meter_completion_parse(&c, ok, strlen(ok), NULL));
    CHECK(!c.succeeded && strcmp(c.message, "line 1\n\tline 2 \xc3\xa9") == 0);
    meter_completion_cleanup(&c);
    long_msg = xmalloc(METER_COMPLETE_MESSAGE_MAX + 2);
    memset(long_msg, 'm', METER_COMPLETE_MESSAGE_MAX + 1);
    long_msg[METER_COMPLETE_MESSAGE_MAX + 1] = '\0';
    body = xasprintf("{\"result\":\"failed\",\"message\":\"%s\"}", long_msg);
    CHECK_EQ_INT(meter_completion_parse(&c, body, strlen(body), NULL), E_INVALID);
    meter_completion_cleanup(&c);
    free(body);
    long_msg[METER_COMPLETE_MESSAGE_MAX] = '\0';
    body = xasprintf("{\"result\":\"failed\",\"message\":\"%s\"}", long_msg);
    CHECK_OK(meter_completion_parse(&c, body, strlen(body), NULL));
    CHECK(strlen(c.message) == METER_COMPLETE_MESSAGE_MAX);
    meter_completion_cleanup(&c);
    free(body);
    free(long_msg);
}

T_MAIN
