/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests of scm/github credentials: app JWTs checked with OpenSSL against keys the
 * openssl tool generates, key-file errors, PAT and config precedence. The installation-token
 * exchange is in test_github_auth_exchange.c. */
#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "scm/github/github_auth.h"
#include "tests/t_check.h"
#include "tests/unit/github_auth_fixture.h"

/* ---- an independent JWT reader ---- */

static size_t b64url_decode(unsigned char *out, const char *s, size_t n)
{
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    unsigned v = 0, bits = 0;
    size_t len = 0;

    for (size_t i = 0; i < n; i++) {
        const char *p = strchr(abc, s[i]);
        CHECK(p != NULL && s[i] != '\0');
        v = v << 6 | (unsigned)(p != NULL ? p - abc : 0);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[len++] = (unsigned char)(v >> bits & 0xff);
        }
    }
    return len;
}

static json_t *part_json(const char *s, size_t n)
{
    unsigned char raw[512];

    CHECK(n < 600);
    return n < 600 ? json_loadb((const char *)raw, b64url_decode(raw, s, n), 0, NULL) : NULL;
}

/* Checks JWT's form, claims at NOW_S and RS256 signature under the key in pub.pem. */
static void check_jwt(const char *jwt, int64_t now_s)
{
    const char *d1 = strchr(jwt, '.'), *d2 = d1 != NULL ? strchr(d1 + 1, '.') : NULL;
    char *pub = fixture("pub.pem");
    FILE *f = fopen(pub, "r");
    EVP_PKEY *key = f != NULL ? PEM_read_PUBKEY(f, NULL, NULL, NULL) : NULL;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    unsigned char sig[1024];
    json_t *h, *c;
    size_t sig_len;

    CHECK(d2 != NULL && strchr(d2 + 1, '.') == NULL && key != NULL && ctx != NULL);
    if (d2 == NULL || key == NULL || ctx == NULL) {
        goto out;
    }
    h = part_json(jwt, (size_t)(d1 - jwt));
    c = part_json(d1 + 1, (size_t)(d2 - d1 - 1));
    CHECK_EQ_STR(json_string_value(json_object_get(h, "alg")), "RS256");
    CHECK_EQ_STR(json_string_value(json_object_get(h, "typ")), "JWT");
    CHECK_EQ_INT(json_integer_value(json_object_get(c, "iat")), now_s - 60);
    CHECK_EQ_INT(json_integer_value(json_object_get(c, "exp")), now_s + 540);
    CHECK_EQ_STR(json_string_value(json_object_get(c, "iss")), APP_ID);
    CHECK_EQ_INT(json_object_size(c), 3);
    json_decref(h);
    json_decref(c);
    sig_len = b64url_decode(sig, d2 + 1, strlen(d2 + 1) < 1300 ? strlen(d2 + 1) : 0);
    CHECK_EQ_INT(sig_len, 256);
    CHECK(EVP_DigestVerifyInit(ctx, NULL, EVP_sha256(), NULL, key) == 1);
    CHECK(EVP_DigestVerify(ctx, sig, sig_len, (const unsigned char *)jwt, (size_t)(d2 - jwt)) == 1);
    /* The same signature over a changed message must not verify. */
    CHECK(EVP_DigestVerifyInit(ctx, NULL, EVP_sha256(), NULL, key) == 1);
    CHECK(EVP_DigestVerify(ctx, sig, sig_len, (const unsigned char *)jwt, (size_t)(d2 - jwt) - 1) !=
          1);
out:
    EVP_MD_CTX_free(ctx);
    EVP_PKEY_free(key);
    if (f != NULL) {
        fclose(f);
    }
    free(pub);
}

/* ---- JWTs and keys ---- */

TEST(jwt_pkcs8_and_pkcs1)
{
    const char *keys[] = {"key8.pem", "key1.pem"};
    int64_t now = T0 + 999;
    struct clock c = {fake_now, &now};
    struct err err = {0};

    for (size_t i = 0; i < ARRAY_LEN(keys); i++) {
        struct github_auth *a = NULL;
        char *jwt = NULL, *hdr = NULL, *want = NULL;
        CHECK_OK(new_app(&a, NULL, keys[i], &c, &err));
        CHECK_OK(github_auth_app_jwt(&jwt, a, &err));
        if (jwt != NULL) {
            check_jwt(jwt, T0 / 1000);
            /* RS256 is deterministic, so installation 0 gives the same JWT. */
            CHECK_OK(github_auth_header(&hdr, a, 0, &err));
            want = xasprintf("Bearer %s", jwt);
            CHECK_EQ_STR(hdr, want);
        }
        now += 3600 * 1000;
        free(jwt);
        CHECK_OK(github_auth_app_jwt(&jwt, a, &err));
        if (jwt != NULL) {
            check_jwt(jwt, T0 / 1000 + 3600);
        }
        free(jwt);
        free(hdr);
        free(want);
        github_auth_free(a);
        now = T0 + 999;
    }
}

TEST(bad_key_files)
{
    const char *invalid[] = {"bad.pem", "empty.pem", "ec.pem", "small.pem", "enc.pem", "pub.pem"};
    int64_t now = T0;
    struct clock c = {fake_now, &now};
    struct github_auth *a = NULL;
    struct err err = {0};
    char *key = fixture("key8.pem");

    for (size_t i = 0; i < ARRAY_LEN(invalid); i++) {
        CHECK_EQ_INT(new_app(&a, NULL, invalid[i], &c, &err), E_INVALID);
        CHECK(a == NULL);
    }
    /* Missing file: E_NOTFOUND; a file that cannot be read (a directory): E_FAIL. */
    CHECK_EQ_INT(new_app(&a, NULL, "missing.pem", &c, &err), E_NOTFOUND);
    CHECK_EQ_INT(github_auth_new_app(&a, NULL, APP_ID, g_dir, &c, &err), E_FAIL);
    CHECK_EQ_INT(github_auth_new_app(&a, NULL, "12 34", key, &c, &err), E_INVALID);
    CHECK_EQ_INT(github_auth_new_app(&a, NULL, "", key, &c, &err), E_INVALID);
    CHECK_EQ_INT(github_auth_new_app(&a, "ftp://x", APP_ID, key, &c, &err), E_INVALID);
    CHECK(a == NULL);
    free(key);
}

TEST(pat_header)
{
    struct github_auth *a = NULL;
    struct err err = {0};
    char *hdr = NULL;

    CHECK_OK(github_auth_new_token(&a, "ghp_abc123", &err));
    CHECK_OK(github_auth_header(&hdr, a, 42, &err));
    CHECK_EQ_STR(hdr, "Bearer ghp_abc123");
    free(hdr);
    CHECK_OK(github_auth_header(&hdr, a, 0, &err));
    CHECK_EQ_STR(hdr, "Bearer ghp_abc123");
    free(hdr);
    CHECK_EQ_INT(github_auth_app_jwt(&hdr, a, &err), E_INVALID);
    github_auth_invalidate(a, 42);
    github_auth_free(a);
    github_auth_free(NULL);
    CHECK_EQ_INT(github_auth_new_token(&a, "", &err), E_INVALID);
    CHECK_EQ_INT(github_auth_new_token(&a, "ghp_a\r\nX-Evil: 1", &err), E_INVALID);
    CHECK(a == NULL);
}

/* Header of the source from_config picks; "app" for an app, NULL on error. */
static char *picked(const char *app_id, const char *key_file, int want_rc)
{
    int64_t now = T0;
    struct clock c = {fake_now, &now};
    struct github_auth *a = NULL;
    struct err err = {0};
    char *hdr = NULL;

    CHECK_EQ_INT(github_auth_from_config(&a, NULL, app_id, key_file, &c, &err), want_rc);
    if (a != NULL && github_auth_app_jwt(&hdr, a, &err) == E_OK) {
        free(hdr);
        hdr = xstrdup("app");
    } else if (a != NULL) {
        CHECK_OK(github_auth_header(&hdr, a, 7, &err));
    }
    github_auth_free(a);
    return hdr;
}

#define CHECK_PICKED(id_, key_, rc_, want_)                                                        \
    do {                                                                                           \
        char *got_ = picked((id_), (key_), (rc_));                                                 \
        CHECK_EQ_STR(got_ != NULL ? got_ : "(none)", (want_));                                     \
        free(got_);                                                                                \
    } while (0)

TEST(from_config_precedence)
{
    char *key = fixture("key8.pem");

    unsetenv("DIVERGE_GITHUB_APP_ID");
    unsetenv("DIVERGE_GITHUB_APP_KEY_FILE");
    unsetenv("DIVERGE_NOTIFIER_TOKEN");
    unsetenv("GITHUB_TOKEN");
    CHECK_PICKED(NULL, NULL, E_NOTFOUND, "(none)");
    setenv("GITHUB_TOKEN", "gh_tok", 1);
    CHECK_PICKED(NULL, NULL, E_OK, "Bearer gh_tok");
    setenv("DIVERGE_NOTIFIER_TOKEN", "", 1); /* empty counts as unset */
    CHECK_PICKED(NULL, NULL, E_OK, "Bearer gh_tok");
    setenv("DIVERGE_NOTIFIER_TOKEN", "notifier_tok", 1);
    CHECK_PICKED(NULL, NULL, E_OK, "Bearer notifier_tok");
    CHECK_PICKED(APP_ID, key, E_OK, "app");
    CHECK_PICKED(APP_ID, NULL, E_INVALID, "(none)");
    CHECK_PICKED(NULL, key, E_INVALID, "(none)");
    /* Each flag falls back to its environment variable. */
    setenv("DIVERGE_GITHUB_APP_KEY_FILE", key, 1);
    CHECK_PICKED(APP_ID, NULL, E_OK, "app");
    setenv("DIVERGE_GITHUB_APP_ID", APP_ID, 1);
    CHECK_PICKED(NULL, NULL, E_OK, "app");
    CHECK_PICKED("", "", E_OK, "app");
    CHECK_PICKED(NULL, "/nonexistent/key.pem", E_NOTFOUND, "(none)");
    unsetenv("DIVERGE_GITHUB_APP_ID");
    unsetenv("DIVERGE_GITHUB_APP_KEY_FILE");
    unsetenv("DIVERGE_NOTIFIER_TOKEN");
    unsetenv("GITHUB_TOKEN");
    free(key);
}

T_MAIN
