/* SPDX-License-Identifier: Apache-2.0 */
/* A validating JSON scanner that builds nothing: one pass over the bytes, no allocation.
 * For paths that must refuse malformed JSON but need none of its values (webhook
 * deliveries that hold no command). */
#ifndef DIVERGE_COMMON_JSONSCAN_H
#define DIVERGE_COMMON_JSONSCAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/err.h"

#define JSONSCAN_MAX_DEPTH 512

/* E_OK when S[0..n) is exactly one RFC 8259 JSON value (surrounded by optional
 * whitespace) with valid UTF-8 strings, nesting at most JSONSCAN_MAX_DEPTH; else E_INVALID
 * with the byte offset in the message. */
int jsonscan_check(const char *s, size_t n, struct err *err);

/* Whether any byte of the 8 in W needs a look of its own in a JSON string: a control
 * character, '"', '\\' or a byte >= 0x80 (word-at-a-time tests, no branch per byte). The
 * scanner and the writer (common/jsonw.c) skip plain ASCII eight bytes at a time with it. */
static inline bool jsonscan_word_special(uint64_t w)
{
    const uint64_t ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL;
    uint64_t quote = w ^ (ones * '"'), bslash = w ^ (ones * '\\');
    uint64_t zero = ((quote - ones) & ~quote) | ((bslash - ones) & ~bslash);

    /* A byte < 0x20 borrows in w - 0x20..: its high bit shows (as does any high byte). */
    return ((zero | (w - ones * 0x20) | w) & highs) != 0;
}

#define JSONSCAN_PATH_MAX 256

/* A value to pick out: object keys joined by '.' ("comment.user.login"); values inside
 * arrays are never picked. */
struct jsonscan_path {
    const char *path;
};

/* Where a picked value is in the input (borrowed), or !present. */
struct jsonscan_value {
    bool present;      /* the path occurred (the last occurrence wins) */
    const char *start; /* its first byte */
    size_t len;        /* its bytes for a scalar; 0 for an object or array */
};

/* As jsonscan_check, and fills OUT[i] for PATHS[i] (NPATHS of each): everything a webhook
 * needs without building a tree. */
int jsonscan_extract(struct jsonscan_value *out, const char *s, size_t n,
                     const struct jsonscan_path *paths, size_t npaths, struct err *err);
/* A picked string, unescaped, as a new string (caller frees); NULL when not a string. */
char *jsonscan_string(const struct jsonscan_value *v);
/* A picked integer; E_INVALID when not an integer that fits. */
int jsonscan_int(int64_t *out, const struct jsonscan_value *v);
/* Whether a picked value is the literal null. */
static inline bool jsonscan_is_null(const struct jsonscan_value *v)
{
    return v->present && v->len == 4 && memcmp(v->start, "null", 4) == 0;
}

#endif
