/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests of token/: the caveat language (each caveat satisfied or not, failing closed,
 * limits and attenuation, models and tools), minting, printing and the root key file. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/clock.h"
#include "tests/t_check.h"
#include "tests/unit/token_fixture.h"
#include "token/token.h"

/* ---- the caveat language ---- */

/* Verifies a token with the single caveat CAV against CTX. */
static int check1(struct token_grant *g, const char *cav, const struct token_context *ctx)
{
    unsigned char key[TOKEN_ROOT_KEY_LEN];
    struct token *t = make(&cav, 1);
    int rc;

    ref_key(key);
    rc = token_verify(g, t, key, ctx, NULL);
    token_free(t);
    return rc;
}

TEST(each_caveat_satisfied_or_not)
{
    static const struct {
        const char *cav;
        int want;
    } cases[] = {
        /* clang-format off */
        {"task_id = task-1", E_OK},       {"task_id = task-2", E_DENIED},
        {"task_id = task-", E_DENIED},    {"namespace = ns", E_OK},
        {"namespace = other", E_DENIED},  {"repo = acme/api", E_OK},
        {"repo = acme/web", E_DENIED},    {"branch = main", E_OK},
        {"branch = dev", E_DENIED},       {"tools = git,go", E_OK},
        {"models = claude-*", E_OK},      {"models = gpt-4o", E_OK}, /* 403 via grant */
        {"max_cost_usd = 5.00", E_OK},    {"max_tokens = 1000000", E_OK},
        {"max_tokens = 0", E_OK},         {"expires = 2025-11-29T10:00:01Z", E_OK},
        {"expires = 2025-11-29T10:00:00Z", E_DENIED}, /* now == expiry: expired */
        {"expires = 2025-11-29T09:00:00Z", E_DENIED},
        /* unknown or malformed: fail closed */
        {"color = blue", E_DENIED},       {"task_id=task-1", E_DENIED},
        {"task_id =task-1", E_DENIED},    {"task_id =  task-1", E_DENIED},
        {"task_id = task-1 ", E_DENIED},  {"task_id = ", E_DENIED},
        {"TASK_ID = task-1", E_DENIED},   {"task_id = task-1\x01", E_DENIED},
        {"tools = git,,go", E_DENIED},    {"tools = git go", E_DENIED},
        {"tools = ,git", E_DENIED},       {"tools = git*", E_DENIED},
        {"models = *claude", E_DENIED},   {"models = a*b", E_DENIED},
        {"max_cost_usd = abc", E_DENIED}, {"max_cost_usd = $5", E_DENIED},
        {"max_cost_usd = +5", E_DENIED},  {"max_cost_usd = -1", E_DENIED},
        {"max_cost_usd = 1.0000001", E_DENIED},
        {"max_tokens = -1", E_DENIED},    {"max_tokens = 1e3", E_DENIED},
        {"max_tokens = +5", E_DENIED},    {"max_tokens = 99999999999999999999", E_DENIED},
        {"expires = tomorrow", E_DENIED}, {"expires = 2025-13-01T00:00:00Z", E_DENIED},
        /* clang-format on */
    };
    struct token_grant g;

    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        int rc = check1(&g, cases[i].cav, &CTX);
        if (rc != cases[i].want) {
            t_fail(__FILE__, __LINE__, "\"%s\" = %d, want %d", cases[i].cav, rc, cases[i].want);
        }
    }
}

TEST(missing_context_fails_closed)
{
    static const char *const cavs[] = {"task_id = task-1", "namespace = ns", "repo = acme/api",
                                       "branch = main"};
    struct token_context empty = {.now_ms = T0};
    struct token_grant g;

    for (size_t i = 0; i < ARRAY_LEN(cavs); i++) {
        CHECK_EQ_INT(check1(&g, cavs[i], &empty), E_DENIED);
    }
}

TEST(limits_and_attenuation)
{
    const char *cavs[] = {"task_id = task-1", "max_cost_usd = 5.00", "max_tokens = 1000",
                          "expires = 2025-11-29T12:00:00Z"};
    unsigned char key[TOKEN_ROOT_KEY_LEN];
    struct token *t = make(cavs, 4), *d = NULL;
    struct token_grant g;
    char *s;

    ref_key(key);
    CHECK_OK(token_verify(&g, t, key, &CTX, NULL));
    CHECK(g.has_max_cost && g.max_cost_micros == 5000000);
    CHECK(g.has_max_tokens && g.max_tokens == 1000);
    CHECK(g.has_expires && g.expires_ms == T0 + 2 * 3600 * 1000);
    CHECK(!g.models_restricted && g.model_allowed);

    /* A holder narrows without the key; the wider repeat does not widen anything. */
    CHECK_OK(token_add_caveat(t, "max_cost_usd = 1.00", NULL));
    CHECK_OK(token_add_caveat(t, "max_cost_usd = 3.00", NULL));
    CHECK_OK(token_add_caveat(t, "max_tokens = 10", NULL));
    CHECK_OK(token_add_caveat(t, "expires = 2025-11-29T11:00:00Z", NULL));
    s = encode(t);
    CHECK_OK(token_decode(&d, s, strlen(s), NULL));
    CHECK_OK(token_verify(&g, d, key, &CTX, NULL));
    CHECK_EQ_INT(g.max_cost_micros, 1000000);
    CHECK_EQ_INT(g.max_tokens, 10);
    CHECK_EQ_INT(g.expires_ms, T0 + 3600 * 1000);

    /* Every repeat applies: a second task_id for another task denies. */
    CHECK_OK(token_add_caveat(d, "task_id = task-2", NULL));
    CHECK_EQ_INT(token_verify(&g, d, key, &CTX, NULL), E_DENIED);
    free(s);
    token_free(t);
    token_free(d);
}

TEST(models_caveats)
{
    const char *cavs[] = {"models = claude-*,gpt-4o", "models = claude-3-7-sonnet,gpt-4o"};
    unsigned char key[TOKEN_ROOT_KEY_LEN];
    struct token *t = make(cavs, 2), *none = make(NULL, 0);
    struct token_context ctx = CTX;
    struct token_grant g;

    ref_key(key);
    CHECK_OK(token_verify(&g, t, key, &ctx, NULL));
    CHECK(g.models_restricted && g.model_allowed);
    ctx.model = "claude-opus-4"; /* matches the first caveat only */
    CHECK_OK(token_verify(&g, t, key, &ctx, NULL));
    CHECK(g.models_restricted && !g.model_allowed);
    ctx.model = NULL;
    CHECK_OK(token_verify(&g, t, key, &ctx, NULL));
    CHECK(!g.model_allowed);
    CHECK_OK(token_verify(&g, none, key, &ctx, NULL));
    CHECK(!g.models_restricted && g.model_allowed);

    CHECK(token_models_allow(t, "gpt-4o"));
    CHECK(token_models_allow(t, "claude-3-7-sonnet"));
    CHECK(!token_models_allow(t, "claude-opus-4"));
    CHECK(!token_models_allow(t, NULL));
    CHECK(token_models_allow(none, NULL));

    CHECK(token_model_match("claude-*", "claude-3"));
    CHECK(token_model_match("claude-*", "claude-"));
    CHECK(!token_model_match("claude-*", "claude"));
    CHECK(token_model_match("a,*", "anything"));
    CHECK(!token_model_match("gpt-4o", "gpt-4o-mini"));
    CHECK(!token_model_match("gpt-4o", ""));
    token_free(t);
    token_free(none);
}

TEST(tools_caveats)
{
    const char *cavs[] = {"tools = git,go,make", "tools = go,git"};
    struct token *t = make(cavs, 2);

    CHECK(token_tools_allow(t, "git"));
    CHECK(token_tools_allow(t, "go"));
    CHECK(!token_tools_allow(t, "make"));
    CHECK(!token_tools_allow(t, "gi"));
    CHECK(!token_tools_allow(t, NULL));
    token_free(t);
}

/* ---- minting, printing, the root key ---- */

TEST(mint_task_caveats_in_order)
{
    static const char *const tools[] = {"git", "go"};
    static const char *const models[] = {"claude-*", "gemini-2.5-pro"};
    struct token_mint_opts o = TOKEN_MINT_OPTS_DEFAULTS;
    static const char *const want[] = {
        "task_id = task-1",    "namespace = ns",       "repo = acme/api",
        "branch = main",       "tools = git,go",       "models = claude-*,gemini-2.5-pro",
        "max_cost_usd = 5.00", "max_tokens = 1000000", "expires = 2025-11-29T10:30:00Z"};
    unsigned char key[TOKEN_ROOT_KEY_LEN];
    char *s = NULL, *id = NULL, *s2 = NULL, *id2 = NULL;
    struct token *t = NULL;
    struct token_grant g;

    ref_key(key);
    o.task = "task-1", o.ns = "ns", o.generation = 7, o.repo = "acme/api", o.branch = "main";
    o.tools = tools, o.n_tools = 2, o.models = models, o.n_models = 2;
    o.max_cost_micros = 5000000, o.max_tokens = 1000000, o.expires_ms = T0 + 1800 * 1000;
    CHECK_OK(token_mint_task(&s, &id, key, &o, NULL));
    CHECK_OK(token_mint_task(&s2, &id2, key, &o, NULL));
    CHECK(id != NULL && strncmp(id, "ns/task-1/7/", 12) == 0 && strlen(id) == 12 + 32);
    CHECK(id2 != NULL && strcmp(id, id2) != 0);
    CHECK_OK(token_decode(&t, s, strlen(s), NULL));
    if (t != NULL) {
        CHECK_EQ_STR(token_location(t), "diverge");
        CHECK_EQ_STR(token_identifier(t), id);
        CHECK_EQ_INT(token_caveat_count(t), ARRAY_LEN(want));
        for (size_t i = 0; i < ARRAY_LEN(want) && i < token_caveat_count(t); i++) {
            CHECK_EQ_STR(token_caveat(t, i), want[i]);
        }
        CHECK_OK(token_verify(&g, t, key, &CTX, NULL));
        CHECK(g.model_allowed && g.max_cost_micros == 5000000);
    }
    free(s), free(id), free(s2), free(id2);
    token_free(t);
}

TEST(mint_task_omits_and_rejects)
{
    static const char *const comma[] = {"git,go"};
    static const char *const blank[] = {"git", ""};
    struct token_mint_opts o = TOKEN_MINT_OPTS_DEFAULTS;
    unsigned char key[TOKEN_ROOT_KEY_LEN];
    char *s = NULL, *id = NULL;
    struct token *t = NULL;

    ref_key(key);
    o.task = "solo", o.ns = "", o.repo = "";
    CHECK_OK(token_mint_task(&s, &id, key, &o, NULL));
    CHECK(id != NULL && strncmp(id, "solo/0/", 7) == 0);
    CHECK_OK(token_decode(&t, s ? s : "", s ? strlen(s) : 0, NULL));
    CHECK(t != NULL && token_caveat_count(t) == 1);
    token_free(t);
    free(s), free(id);

    o.tools = comma, o.n_tools = 1;
    CHECK_EQ_INT(token_mint_task(&s, NULL, key, &o, NULL), E_INVALID);
    o.tools = blank, o.n_tools = 2;
    CHECK_EQ_INT(token_mint_task(&s, NULL, key, &o, NULL), E_INVALID);
    o.n_tools = 0, o.repo = "acme/api\n";
    CHECK_EQ_INT(token_mint_task(&s, NULL, key, &o, NULL), E_INVALID);
    o.repo = NULL, o.task = NULL;
    CHECK_EQ_INT(token_mint_task(&s, NULL, key, &o, NULL), E_INVALID);
    CHECK(s == NULL);
}

static const char PRINTED[] =
    "location: diverge\n"
    "identifier: task-123\n"
    "caveat: task_id = task-123\n"
    "caveat: max_cost_usd = 5.00\n"
    "fingerprint: sha256:24db987f668df9a0 (a hash of the signature, not the signature)\n"
    "location: diverge\n";

/* The reference signature in base64: on its own (standard, URL-safe) and as it sits
 * inside REF_TOKEN. */
static const char *const REF_SIG_B64[] = {
    "0r4mECZiQayl0yiPH1/eKV0MjzS4RcgcXermOryK3BA",
    "0r4mECZiQayl0yiPH1_eKV0MjzS4RcgcXermOryK3BA",
    "JhAmYkGspdMojx9f3ildDI80uEXIHF3q5jq8itwQ",
};

TEST(print_shows_no_secret)
{
    struct token *t = NULL;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);

    CHECK_OK(token_decode(&t, REF_TOKEN, strlen(REF_TOKEN), NULL));
    if (t != NULL && f != NULL) {
        token_print(f, t);
        CHECK_OK(token_add_caveat(t, "repo = a\\b\x7f", NULL));
        token_print(f, t);
        fclose(f);
        f = NULL;
        CHECK(strncmp(text, PRINTED, strlen(PRINTED)) == 0);
        CHECK(strstr(text, "caveat: max_cost_usd = 5.00\ncaveat: repo = a\\x5cb\\x7f\n") != NULL);
        /* Neither the signature's hex nor its base64 (the inspect output must not rebuild
         * a working token, security review finding 8). */
        CHECK(strstr(text, REF_SIG) == NULL);
        CHECK(strstr(text, "signature:") == NULL);
        for (size_t i = 0; i < ARRAY_LEN(REF_SIG_B64); i++) {
            CHECK(strstr(text, REF_SIG_B64[i]) == NULL);
        }
    }
    if (f != NULL) {
        fclose(f);
    }
    free(text);
    token_free(t);
}

TEST(root_key_file)
{
    char dir[] = "/tmp/test_token.XXXXXX", path[64], bad[80];
    unsigned char k1[TOKEN_ROOT_KEY_LEN], k2[TOKEN_ROOT_KEY_LEN], ref[TOKEN_ROOT_KEY_LEN];
    struct stat st;
    FILE *f;

    CHECK(mkdtemp(dir) != NULL);
    snprintf(path, sizeof(path), "%s/root-key", dir);
    CHECK_OK(token_root_key_load_or_create(k1, path, NULL));
    CHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == 0600 && st.st_size == 65);
    CHECK_OK(token_root_key_load_or_create(k2, path, NULL));
    CHECK(memcmp(k1, k2, sizeof(k1)) == 0);

    snprintf(bad, sizeof(bad), "%s/bad", dir);
    f = fopen(bad, "w");
    if (f != NULL) {
        fputs("000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\n", f);
        fclose(f);
    }
    CHECK(chmod(bad, 0600) == 0); /* secret files with group or other bits are refused */
    CHECK_OK(token_root_key_load_or_create(k2, bad, NULL));
    ref_key(ref);
    CHECK(memcmp(k2, ref, sizeof(ref)) == 0);
    f = fopen(bad, "w");
    if (f != NULL) {
        fputs("0001020304\n", f);
        fclose(f);
    }
    CHECK_EQ_INT(token_root_key_load_or_create(k2, bad, NULL), E_INVALID);
    CHECK_EQ_INT(token_root_key_parse(k2, "zz", NULL), E_INVALID);
    snprintf(bad, sizeof(bad), "%s/no/such/dir/key", dir);
    CHECK_EQ_INT(token_root_key_load_or_create(k2, bad, NULL), E_FAIL);
    unlink(path);
    snprintf(bad, sizeof(bad), "%s/bad", dir);
    unlink(bad);
    rmdir(dir);
}

T_MAIN
