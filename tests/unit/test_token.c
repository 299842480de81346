/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests of token/: the SPEC reference vector, V2 encoding edge cases (built by hand
 * here, independently of the module's encoder), the caveat language, minting and the
 * root key file. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/clock.h"
#include "tests/t_check.h"
#include "token/token.h"

static const char REF_TOKEN[] =
    "AgEHZGl2ZXJnZQIIdGFzay0xMjMAAhJ0YXNrX2lkID0gdGFzay0xMjMAAhNtYXhfY29zdF91c2QgPSA1LjAwAAAGINK"
    "-JhAmYkGspdMojx9f3ildDI80uEXIHF3q5jq8itwQ";
static const char REF_SIG[] = "d2be2610266241aca5d3288f1f5fde295d0c8f34b845c81c5deae63abc8adc10";
#define T0 INT64_C(1764410400000) /* 2025-11-29T10:00:00Z */

static void ref_key(unsigned char key[TOKEN_ROOT_KEY_LEN])
{
    for (int i = 0; i < TOKEN_ROOT_KEY_LEN; i++) {
        key[i] = (unsigned char)i;
    }
}

static void sig_hex(char out[2 * TOKEN_SIG_LEN + 1], const struct token *t)
{
    unsigned char sig[TOKEN_SIG_LEN];

    token_signature(sig, t);
    for (int i = 0; i < TOKEN_SIG_LEN; i++) {
        snprintf(out + 2 * i, 3, "%02x", sig[i]);
    }
}

/* ---- an independent V2 writer, for hand-made and tampered tokens ---- */

static char *b64(const unsigned char *d, size_t n, bool url, bool pad)
{
    const char *abc = url ? "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
                          : "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    struct buf b;

    buf_init(&b, 0);
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = (unsigned)d[i] << 16 | (i + 1 < n ? (unsigned)d[i + 1] << 8 : 0) |
                     (i + 2 < n ? d[i + 2] : 0);
        size_t chars = n - i >= 3 ? 4 : n - i + 1;
        for (size_t k = 0; k < 4; k++) {
            char c = k < chars ? abc[v >> (18 - 6 * k) & 63] : '=';
            if (k < chars || pad) {
                CHECK_OK(buf_append(&b, &c, 1));
            }
        }
    }
    return buf_take(&b);
}

static void put_field(struct buf *b, unsigned char type, const char *data, size_t len)
{
    unsigned char hdr[2] = {type, (unsigned char)len};

    CHECK(len < 128);
    CHECK_OK(buf_append(b, hdr, type == 0 ? 1 : 2));
    if (type != 0) {
        CHECK_OK(buf_append(b, data, len));
    }
}

/* V2 bytes of location "diverge", ID, the NUL-separated caveat list CAVS, signature SIG. */
static void raw_v2(struct buf *b, const char *id, const char *const *cavs, size_t n,
                   const unsigned char sig[TOKEN_SIG_LEN])
{
    buf_init(b, 0);
    CHECK_OK(buf_append(b, "\x02", 1));
    put_field(b, 1, "diverge", 7);
    put_field(b, 2, id, strlen(id));
    put_field(b, 0, NULL, 0);
    for (size_t i = 0; i < n; i++) {
        put_field(b, 2, cavs[i], strlen(cavs[i]));
        put_field(b, 0, NULL, 0);
    }
    put_field(b, 0, NULL, 0);
    put_field(b, 6, (const char *)sig, TOKEN_SIG_LEN);
}

static int decode_bytes(struct token **out, const void *bin, size_t len)
{
    char *s = b64(bin, len, true, false);
    int rc = token_decode(out, s, strlen(s), NULL);

    free(s);
    return rc;
}

static int verify_str(struct token_grant *g, const char *s, const struct token_context *ctx)
{
    unsigned char key[TOKEN_ROOT_KEY_LEN];

    ref_key(key);
    return token_verify_string(g, NULL, s, key, ctx, NULL);
}

/* ---- reference vector and encoding ---- */

TEST(reference_vector)
{
    unsigned char key[TOKEN_ROOT_KEY_LEN];
    struct token *t = NULL, *d = NULL;
    char hex[2 * TOKEN_SIG_LEN + 1], *s = NULL;

    ref_key(key);
    CHECK_OK(token_mint(&t, key, "diverge", "task-123", NULL));
    CHECK_OK(token_add_caveat(t, "task_id = task-123", NULL));
    CHECK_OK(token_add_caveat(t, "max_cost_usd = 5.00", NULL));
    sig_hex(hex, t);
    CHECK_EQ_STR(hex, REF_SIG);
    token_encode(&s, t);
    CHECK_EQ_STR(s, REF_TOKEN);

    CHECK_OK(token_decode(&d, REF_TOKEN, strlen(REF_TOKEN), NULL));
    CHECK(d != NULL);
    if (d != NULL) {
        CHECK_EQ_STR(token_location(d), "diverge");
        CHECK_EQ_STR(token_identifier(d), "task-123");
        CHECK_EQ_INT(token_caveat_count(d), 2);
        CHECK_EQ_STR(token_caveat(d, 1), "max_cost_usd = 5.00");
        sig_hex(hex, d);
        CHECK_EQ_STR(hex, REF_SIG);
        CHECK_OK(token_verify_signature(d, key, NULL));
    }
    free(s);
    token_free(t);
    token_free(d);
}

/* Every spelling of the token with id ID decodes and re-encodes to the canonical one. */
static void check_spellings(const char *id, const unsigned char sig[TOKEN_SIG_LEN])
{
    const char *cavs[] = {"task_id = task-123", "max_cost_usd = 5.00"};
    char *canon = NULL;
    struct buf bin;

    raw_v2(&bin, id, cavs, 2, sig);
    canon = b64((const unsigned char *)bin.data, bin.len, true, false);
    for (int i = 0; i < 4; i++) {
        char *s = b64((const unsigned char *)bin.data, bin.len, i & 1, i & 2), *again = NULL;
        struct token *t = NULL;
        CHECK_OK(token_decode(&t, s, strlen(s), NULL));
        if (t != NULL) {
            token_encode(&again, t);
            CHECK_EQ_STR(again, canon);
        }
        free(again);
        free(s);
        token_free(t);
    }
    free(canon);
    buf_cleanup(&bin);
}

TEST(base64_variants_accepted)
{
    unsigned char sig[TOKEN_SIG_LEN];
    struct token *ref = NULL;
    struct buf bin;
    char *std = NULL, *pad = NULL;
    const char *cavs[] = {"task_id = task-123", "max_cost_usd = 5.00"};

    CHECK_OK(token_decode(&ref, REF_TOKEN, strlen(REF_TOKEN), NULL));
    if (ref == NULL) {
        return;
    }
    token_signature(sig, ref);
    check_spellings("task-123", sig);   /* the reference: '-' vs '+', no padding */
    check_spellings("task-1234", sig);  /* one byte more: "==" */
    check_spellings("task-12345", sig); /* two bytes more: "=" */
    /* Make sure the spellings really differ. */
    raw_v2(&bin, "task-123", cavs, 2, sig);
    std = b64((const unsigned char *)bin.data, bin.len, false, true);
    CHECK(strchr(std, '+') != NULL && strcmp(std, REF_TOKEN) != 0);
    buf_cleanup(&bin);
    raw_v2(&bin, "task-1234", cavs, 2, sig);
    pad = b64((const unsigned char *)bin.data, bin.len, true, true);
    CHECK(strstr(pad, "==") != NULL);
    free(std);
    free(pad);
    buf_cleanup(&bin);
    token_free(ref);
}

TEST(malformed_base64_rejected)
{
    /* AgE: 2 bytes, fine base64 but a truncated token; AgF: non-zero spare bits */
    static const char *const bad[] = {
        "", "A", "AgE", "AgE=", "AgE==", "Ag==E", "Ag E", "Ag\n", "Ag.x", "AgF", "====",
    };
    struct token *t = NULL;
    char with_ws[sizeof(REF_TOKEN) + 1];

    for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
        int rc = token_decode(&t, bad[i], strlen(bad[i]), NULL);
        if (rc != E_INVALID || t != NULL) {
            t_fail(__FILE__, __LINE__, "decode(\"%s\") = %d, want E_INVALID", bad[i], rc);
        }
    }
    snprintf(with_ws, sizeof(with_ws), "%s\n", REF_TOKEN);
    CHECK_EQ_INT(token_decode(&t, with_ws, strlen(with_ws), NULL), E_INVALID);
    /* One more character changes the length class: never silently ignored. */
    snprintf(with_ws, sizeof(with_ws), "%sA", REF_TOKEN);
    CHECK_EQ_INT(token_decode(&t, with_ws, strlen(with_ws), NULL), E_INVALID);
}

TEST(truncated_inputs_rejected)
{
    struct token *ref = NULL, *t = NULL;
    const char *cavs[] = {"task_id = task-123", "max_cost_usd = 5.00"};
    unsigned char sig[TOKEN_SIG_LEN];
    struct buf bin;

    CHECK_OK(token_decode(&ref, REF_TOKEN, strlen(REF_TOKEN), NULL));
    if (ref == NULL) {
        return;
    }
    token_signature(sig, ref);
    raw_v2(&bin, "task-123", cavs, 2, sig);
    CHECK_OK(decode_bytes(&t, bin.data, bin.len));
    token_free(t);
    for (size_t n = 0; n < bin.len; n++) {
        t = NULL;
        if (decode_bytes(&t, bin.data, n) != E_INVALID || t != NULL) {
            t_fail(__FILE__, __LINE__, "prefix of %zu bytes accepted", n);
        }
        token_free(t);
    }
    for (size_t n = 0; n < strlen(REF_TOKEN); n++) {
        t = NULL;
        if (token_decode(&t, REF_TOKEN, n, NULL) == E_OK || t != NULL) {
            t_fail(__FILE__, __LINE__, "prefix of %zu chars accepted", n);
        }
        token_free(t);
    }
    buf_cleanup(&bin);
    token_free(ref);
}

/* Decodes hand-made binary BIN[0..len) and expects CODE. */
static void expect_binary(const char *what, const void *bin, size_t len, int code, int line)
{
    struct token *t = NULL;
    int rc = decode_bytes(&t, bin, len);

    if (rc != code || (code != E_OK) != (t == NULL)) {
        t_fail(__FILE__, line, "%s: decode = %d, want %d", what, rc, code);
    }
    token_free(t);
}

TEST(binary_structure_rejected)
{
    static const unsigned char sig[TOKEN_SIG_LEN] = {1};
    static const char *const one[] = {"task_id = x"};
    struct buf b;

    raw_v2(&b, "id", one, 1, sig);
    expect_binary("well formed", b.data, b.len, E_OK, __LINE__);
    CHECK_OK(buf_append(&b, "\0", 1));
    expect_binary("trailing zero byte", b.data, b.len, E_INVALID, __LINE__);
    b.data[0] = 1;
    expect_binary("version 1", b.data, b.len - 1, E_INVALID, __LINE__);
    buf_cleanup(&b);

    /* Hand-written variants of: 02 | 01 "L" | 02 "id" | 00 | caveats 00 | 06 sig. */
    /* clang-format off */
#define SIG32 "\x06\x20" "0123456789abcdef0123456789abcdef"
    static const struct {
        const char *what;
        const char *bin;
        size_t len;
    } cases[] = {
#define C(w_, s_) {w_, s_, sizeof(s_) - 1}
        C("minimal, no location", "\x02\x02\x02id\x00\x00" SIG32),
        C("third-party caveat (vid)", "\x02\x02\x02id\x00\x02\x01" "c\x04\x01v\x00\x00" SIG32),
        C("caveat location", "\x02\x02\x02id\x00\x01\x01l\x02\x01" "c\x00\x00" SIG32),
        C("short signature", "\x02\x02\x02id\x00\x00\x06\x1f" "0123456789abcdef0123456789abcde"),
        C("no identifier", "\x02\x01\x01L\x00\x00" SIG32),
        C("empty identifier", "\x02\x02\x00\x00\x00" SIG32),
        C("empty caveat", "\x02\x02\x02id\x00\x02\x00\x00\x00" SIG32),
        C("NUL in caveat", "\x02\x02\x02id\x00\x02\x03" "a\x00" "b\x00\x00" SIG32),
        C("non-minimal varint", "\x02\x02\x82\x00id\x00\x00" SIG32),
        C("unknown header field", "\x02\x02\x02id\x03\x01x\x00\x00" SIG32),
        C("length past end", "\x02\x02\x7fid"),
        C("signature missing", "\x02\x02\x02id\x00\x00"),
        C("two signatures", "\x02\x02\x02id\x00\x00" SIG32 SIG32),
#undef C
    };
#undef SIG32
    /* clang-format on */
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        expect_binary(cases[i].what, cases[i].bin, cases[i].len, i == 0 ? E_OK : E_INVALID,
                      __LINE__);
    }
}

TEST(size_caps)
{
    unsigned char key[TOKEN_ROOT_KEY_LEN];
    struct token *t = NULL;
    char *huge = xcalloc(TOKEN_ENCODED_MAX + 2, 1);

    memset(huge, 'A', TOKEN_ENCODED_MAX + 1);
    CHECK_EQ_INT(token_decode(&t, huge, strlen(huge), NULL), E_TOOBIG);
    free(huge);
    ref_key(key);
    CHECK_OK(token_mint(&t, key, TOKEN_LOCATION, "id", NULL));
    for (int i = 0; i < TOKEN_CAVEATS_MAX; i++) {
        CHECK_OK(token_add_caveat(t, "max_tokens = 5", NULL));
    }
    CHECK_EQ_INT(token_add_caveat(t, "max_tokens = 5", NULL), E_TOOBIG);
    CHECK_EQ_INT(token_add_caveat(t, "", NULL), E_INVALID);
    token_free(t);
    CHECK_EQ_INT(token_mint(&t, key, TOKEN_LOCATION, "", NULL), E_INVALID);
}

/* ---- signatures ---- */

/* A token for the reference key with the caveats CAVS; caller frees. */
static struct token *make(const char *const *cavs, size_t n)
{
    unsigned char key[TOKEN_ROOT_KEY_LEN];
    struct token *t = NULL;

    ref_key(key);
    CHECK_OK(token_mint(&t, key, TOKEN_LOCATION, "ns/task-1/1/00", NULL));
    for (size_t i = 0; t != NULL && i < n; i++) {
        CHECK_OK(token_add_caveat(t, cavs[i], NULL));
    }
    return t;
}

static char *encode(const struct token *t)
{
    char *s = NULL;

    token_encode(&s, t);
    return s;
}

static const struct token_context CTX = {
    .task = "task-1",
    .ns = "ns",
    .repo = "acme/api",
    .branch = "main",
    .model = "claude-3-7-sonnet",
    .now_ms = T0,
};

TEST(round_trip_and_wrong_key)
{
    const char *cavs[] = {"task_id = task-1", "max_tokens = 100"};
    struct token *t = make(cavs, 2), *d = NULL;
    unsigned char key[TOKEN_ROOT_KEY_LEN];
    struct token_grant g;
    char *s = encode(t), *again = NULL, *id = NULL;

    ref_key(key);
    CHECK_OK(token_decode(&d, s, strlen(s), NULL));
    if (d != NULL) {
        token_encode(&again, d);
        CHECK_EQ_STR(again, s);
        CHECK_OK(token_verify(&g, d, key, &CTX, NULL));
        CHECK(g.has_max_tokens && g.max_tokens == 100 && !g.has_max_cost);
        key[31] ^= 1;
        CHECK_EQ_INT(token_verify(&g, d, key, &CTX, NULL), E_DENIED);
        CHECK_EQ_INT(token_verify_signature(d, key, NULL), E_DENIED);
        CHECK(!g.has_max_tokens); /* nothing leaks out of a failed verification */
        /* The caveat half alone ignores the signature (the caller checked it already). */
        CHECK_OK(token_check_caveats(&g, d, &CTX, NULL));
        CHECK(g.has_max_tokens && g.max_tokens == 100);
        key[31] ^= 1;
    }
    CHECK_OK(token_verify_string(&g, &id, s, key, &CTX, NULL));
    CHECK_EQ_STR(id, "ns/task-1/1/00");
    free(id);
    CHECK_EQ_INT(token_verify_string(&g, &id, "AgE", key, &CTX, NULL), E_DENIED);
    CHECK(id == NULL);
    free(again);
    free(s);
    token_free(t);
    token_free(d);
}

TEST(tampered_and_dropped_caveats_denied)
{
    const char *cavs[] = {"task_id = task-1", "max_cost_usd = 1.00", "max_tokens = 100"};
    const char *tampered[] = {"task_id = task-1", "max_cost_usd = 9.00", "max_tokens = 100"};
    const char *reordered[] = {"max_cost_usd = 1.00", "task_id = task-1", "max_tokens = 100"};
    struct token *t = make(cavs, 3);
    unsigned char sig[TOKEN_SIG_LEN];
    struct token_grant g;
    struct buf b;
    char *s;

    token_signature(sig, t);
    raw_v2(&b, "ns/task-1/1/00", cavs, 3, sig);
    s = b64((const unsigned char *)b.data, b.len, true, false);
    CHECK_OK(verify_str(&g, s, &CTX)); /* the hand-made copy is genuine */
    free(s);
    buf_cleanup(&b);
    for (int k = 0; k < 5; k++) {
        const char *const *c = k == 0 ? tampered : k == 3 ? reordered : cavs;
        size_t n = k == 1 ? 2 : k == 2 ? 0 : 3; /* 1: last dropped, 2: all dropped */
        const char *id = k == 4 ? "ns/task-2/1/00" : "ns/task-1/1/00";
        raw_v2(&b, id, c, n, sig);
        s = b64((const unsigned char *)b.data, b.len, true, false);
        if (verify_str(&g, s, &CTX) != E_DENIED) {
            t_fail(__FILE__, __LINE__, "forgery %d accepted", k);
        }
        free(s);
        buf_cleanup(&b);
    }
    token_free(t);
}

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
