/* SPDX-License-Identifier: Apache-2.0 */
/* Push grants: the bot's proof, stored on a comment-made task, that its working branch is
 * a pull request's head and not the base branch of the repository the PR targets. An
 * HMAC-SHA256 under the server's root key over the task and push target, so whoever can
 * write the task (the task API, kubectl) can copy a grant but never make one for another
 * target. */
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "common/buf.h"
#include "token/token.h"

#define GRANT_PREFIX "v1."
#define GRANT_DOMAIN "diverge push grant v1" /* never a macaroon identifier's key */

/* Appends S with its length in front, so no two field lists give the same bytes. */
static void feed(struct buf *b, const char *s)
{
    unsigned char len[8];
    size_t n = strlen(s);

    for (int i = 0; i < 8; i++) {
        len[i] = (unsigned char)((uint64_t)n >> (56 - 8 * i));
    }
    (void)buf_append(b, len, sizeof(len));
    (void)buf_append(b, s, n);
}

/* The MAC of T under ROOT_KEY; false when a field is missing or OpenSSL failed. */
static bool grant_mac(unsigned char out[TOKEN_SIG_LEN],
                      const unsigned char root_key[TOKEN_ROOT_KEY_LEN],
                      const struct token_push_target *t)
{
    const char *fields[] = {GRANT_DOMAIN, t->ns,          t->name,       t->url,
                            t->working,   t->pr_base_url, t->pr_base_ref};
    unsigned int len = 0;
    struct buf msg;
    bool ok;

    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
        if (fields[i] == NULL) {
            return false;
        }
    }
    buf_init(&msg, 0);
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
        feed(&msg, fields[i]);
    }
    ok = HMAC(EVP_sha256(), root_key, TOKEN_ROOT_KEY_LEN, (const unsigned char *)msg.data, msg.len,
              out, &len) != NULL &&
         len == TOKEN_SIG_LEN;
    buf_cleanup(&msg);
    return ok;
}

bool token_push_grant(char out[TOKEN_PUSH_GRANT_LEN + 1],
                      const unsigned char root_key[TOKEN_ROOT_KEY_LEN],
                      const struct token_push_target *t)
{
    unsigned char mac[TOKEN_SIG_LEN];
    size_t at = strlen(GRANT_PREFIX);

    out[0] = '\0';
    if (!grant_mac(mac, root_key, t)) {
        return false;
    }
    memcpy(out, GRANT_PREFIX, at);
    for (size_t i = 0; i < sizeof(mac); i++) {
        snprintf(out + at + 2 * i, 3, "%02x", mac[i]);
    }
    OPENSSL_cleanse(mac, sizeof(mac));
    return true;
}

bool token_push_grant_ok(const char *grant, const unsigned char root_key[TOKEN_ROOT_KEY_LEN],
                         const struct token_push_target *t)
{
    char want[TOKEN_PUSH_GRANT_LEN + 1];
    bool ok;

    if (grant == NULL || strlen(grant) != TOKEN_PUSH_GRANT_LEN ||
        !token_push_grant(want, root_key, t)) {
        return false;
    }
    /* CRYPTO_memcmp: an early exit would tell how much of a forged grant was right. */
    ok = CRYPTO_memcmp(want, grant, TOKEN_PUSH_GRANT_LEN) == 0;
    OPENSSL_cleanse(want, sizeof(want));
    return ok;
}
