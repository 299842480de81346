/* SPDX-License-Identifier: Apache-2.0 */
/* FNV-1a (64-bit): the one non-cryptographic hash of the project, for cache slots, short
 * name suffixes and change detection. Never for anything an attacker must not forge. */
#ifndef DIVERGE_COMMON_HASH_H
#define DIVERGE_COMMON_HASH_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define HASH_FNV1A_INIT UINT64_C(0xcbf29ce484222325)

/* Continues the hash H over DATA[0..n) (start with HASH_FNV1A_INIT). */
static inline uint64_t hash_fnv1a(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = data;

    for (size_t i = 0; i < n; i++) {
        h = (h ^ p[i]) * UINT64_C(0x100000001b3);
    }
    return h;
}

/* The hash of the string S. */
static inline uint64_t hash_fnv1a_str(const char *s)
{
    return hash_fnv1a(HASH_FNV1A_INIT, s, strlen(s));
}

#endif
