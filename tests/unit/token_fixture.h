/* SPDX-License-Identifier: Apache-2.0 */
/* Fixtures shared by the token/ unit tests (test_token*.c): the SPEC reference token and its
 * key, and tokens minted for that key with a fixed verification context. */
#ifndef DIVERGE_TESTS_UNIT_TOKEN_FIXTURE_H
#define DIVERGE_TESTS_UNIT_TOKEN_FIXTURE_H

#include <stddef.h>
#include <stdint.h>

#include "tests/t_check.h"
#include "token/token.h"

static const char REF_TOKEN[] =
    "AgEHZGl2ZXJnZQIIdGFzay0xMjMAAhJ0YXNrX2lkID0gdGFzay0xMjMAAhNtYXhfY29zdF91c2QgPSA1LjAwAAAGINK"
    "-JhAmYkGspdMojx9f3ildDI80uEXIHF3q5jq8itwQ";
static const char REF_SIG[] = "d2be2610266241aca5d3288f1f5fde295d0c8f34b845c81c5deae63abc8adc10";
#define T0 INT64_C(1764410400000) /* 2025-11-29T10:00:00Z */

static inline void ref_key(unsigned char key[TOKEN_ROOT_KEY_LEN])
{
    for (int i = 0; i < TOKEN_ROOT_KEY_LEN; i++) {
        key[i] = (unsigned char)i;
    }
}

/* A token for the reference key with the caveats CAVS; caller frees. */
static inline struct token *make(const char *const *cavs, size_t n)
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

static inline char *encode(const struct token *t)
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

#endif
