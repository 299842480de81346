/* SPDX-License-Identifier: Apache-2.0 */
/* A validating JSON scanner that builds nothing: one pass over the bytes, no allocation.
 * For paths that must refuse malformed JSON but need none of its values (webhook
 * deliveries that hold no command). */
#ifndef DIVERGE_COMMON_JSONSCAN_H
#define DIVERGE_COMMON_JSONSCAN_H

#include <stddef.h>

#include "common/err.h"

#define JSONSCAN_MAX_DEPTH 512

/* E_OK when S[0..n) is exactly one RFC 8259 JSON value (surrounded by optional
 * whitespace) with valid UTF-8 strings, nesting at most JSONSCAN_MAX_DEPTH; else E_INVALID
 * with the byte offset in the message. */
int jsonscan_check(const char *s, size_t n, struct err *err);

#endif
