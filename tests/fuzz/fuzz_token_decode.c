/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer harness for token decoding, the network-facing parser: arbitrary bytes go
 * through token_decode(); whatever decodes must re-encode to a canonical string that
 * decodes to the same token, and verification and printing must not crash. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "token/token.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

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
        .task = "task-123", .ns = "ns", .repo = "acme/api", .branch = "main",
        .model = "claude-3", .now_ms = 0,
    };
    struct token *t = NULL, *again = NULL;
    struct token_grant g;
    char *s = NULL;

    if (devnull == NULL) {
        devnull = fopen("/dev/null", "w");
    }
    if (token_decode(&t, (const char *)data, size, NULL) != 0) {
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
