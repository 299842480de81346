/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests of token/: the SPEC reference vector, V2 encoding edge cases (built by hand
 * here, independently of the module's encoder) and signatures. The caveat language,
 * minting and the root key file are in test_token_caveats.c. */
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

T_MAIN
