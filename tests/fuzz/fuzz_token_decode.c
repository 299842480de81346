/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer harness for token decoding, the network-facing parser: arbitrary bytes go
 * through token_decode() (inputs starting with the V2 version byte are base64-encoded
 * first, so the fuzzer can work on the binary structure directly). Whatever decodes must
 * re-encode to a canonical string that decodes to the same token; its caveats are then
 * re-signed with a known key so the caveat language is exercised too. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "token/token.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Standard padded base64 of DATA: the decoder must take this alphabet too. */
static char *b64(const uint8_t *data, size_t size)
{
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *out = malloc(size / 3 * 4 + 5), *o = out;

    if (out == NULL) {
        abort();
    }
    for (size_t i = 0; i < size; i += 3) {
        unsigned v = (unsigned)data[i] << 16 | (i + 1 < size ? (unsigned)data[i + 1] << 8 : 0) |
                     (i + 2 < size ? data[i + 2] : 0);
        *o++ = abc[v >> 18 & 63];
        *o++ = abc[v >> 12 & 63];
        *o++ = i + 1 < size ? abc[v >> 6 & 63] : '=';
        *o++ = i + 2 < size ? abc[v & 63] : '=';
    }
    *o = '\0';
    return out;
}

/* Mints a token with T's identifier and caveats under KEY and verifies it against CTX:
 * the signature now holds, so every caveat is parsed and applied. */
static void resign_and_verify(const struct token *t, const unsigned char *key,
                              const struct token_context *ctx)
{
    struct token *fresh = NULL;
    struct token_grant g;

    if (token_mint(&fresh, key, token_location(t), token_identifier(t), NULL) != 0) {
        abort(); /* a decoded identifier and location are always mintable */
    }
    for (size_t i = 0; i < token_caveat_count(t); i++) {
        if (token_add_caveat(fresh, token_caveat(t, i), NULL) != 0) {
            abort();
        }
    }
    if (token_verify(&g, fresh, key, ctx, NULL) == 0 && g.model_allowed &&
        !token_models_allow(fresh, ctx->model)) {
        abort(); /* the two model checks must agree */
    }
    token_free(fresh);
}

static void check_same(const struct token *a, const struct token *b)
{
    if (token_caveat_count(a) != token_caveat_count(b) ||
        strcmp(token_identifier(a), token_identifier(b)) != 0) {
        abort();
    }
    for (size_t i = 0; i < token_caveat_count(a); i++) {
        if (strcmp(token_caveat(a, i), token_caveat(b, i)) != 0) {
            abort();
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const unsigned char key[TOKEN_ROOT_KEY_LEN] = {0};
    static FILE *devnull;
    const struct token_context ctx = {
        .task = "task-123",
        .ns = "ns",
        .repo = "acme/api",
        .branch = "main",
        .model = "claude-3",
        .now_ms = 0,
    };
    struct token *t = NULL, *again = NULL;
    struct token_grant g;
    char *s = NULL, *text = NULL;
    int rc;

    if (devnull == NULL) {
        devnull = fopen("/dev/null", "w");
    }
    if (size > 0 && data[0] == 2) {
        text = b64(data, size);
        rc = token_decode(&t, text, strlen(text), NULL);
    } else {
        rc = token_decode(&t, (const char *)data, size, NULL);
    }
    free(text);
    if (rc != 0) {
        if (t != NULL) {
            abort();
        }
        return 0;
    }
    token_encode(&s, t);
    if (token_decode(&again, s, strlen(s), NULL) != 0) {
        abort();
    }
    check_same(t, again);
    (void)token_verify(&g, t, key, &ctx, NULL);
    resign_and_verify(t, key, &ctx);
    (void)token_models_allow(t, "claude-3");
    (void)token_tools_allow(t, "git");
    if (devnull != NULL) {
        token_print(devnull, t);
    }
    free(s);
    token_free(t);
    token_free(again);
    return 0;
}
