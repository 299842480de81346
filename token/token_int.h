/* SPDX-License-Identifier: Apache-2.0 */
/* Helpers shared by the token/ sources only: the base64 codec (hex: common/secret.h). Nothing
 * outside token/ includes this header. */
#ifndef DIVERGE_TOKEN_TOKEN_INT_H
#define DIVERGE_TOKEN_TOKEN_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Encodes DATA[0..len) as unpadded URL-safe base64. *out is a new NUL-terminated string
 * the caller frees with free(). */
void token_b64_encode(char **out, const unsigned char *data, size_t len);

/* Decodes S[0..len): standard or URL-safe alphabet, padded or not. Rejects whitespace,
 * misplaced '=', an impossible length and non-zero trailing bits, so every byte string
 * has exactly one unpadded encoding per alphabet. *out (caller frees with free()) holds
 * *len_out bytes. Returns E_INVALID on malformed input. */
int token_b64_decode(unsigned char **out, size_t *len_out, const char *s, size_t len);

/* True when VALUE may follow "name = ": non-empty, no control characters, no leading or
 * trailing space. */
bool token_caveat_value_valid(const char *value);

/* True when LIST is a comma list of non-empty entries without whitespace or control
 * characters; with WILDCARD an entry may end in '*' (and only there). */
bool token_caveat_list_valid(const char *list, bool wildcard);

/* Parses a non-negative decimal integer (digits only, no sign) into *out; E_INVALID on
 * anything else or on overflow. */
int token_parse_count(int64_t *out, const char *s);

#endif
