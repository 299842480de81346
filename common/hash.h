/* SPDX-License-Identifier: Apache-2.0 */
/* FNV-1a (64-bit): the one non-cryptographic hash of the project, for cache slots, short
 * name suffixes and change detection. Never for anything an attacker must not forge. */
#ifndef DIVERGE_COMMON_HASH_H
#define DIVERGE_COMMON_HASH_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

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

/* The hash of the pair A, B under SEED (A's NUL between them: "a", "bc" and "ab", "c"
 * differ): keys of names users choose, such as a task's namespace and name. */
static inline uint64_t hash_fnv1a_pair(uint64_t seed, const char *a, const char *b)
{
    uint64_t h = hash_fnv1a(HASH_FNV1A_INIT ^ seed, a, strlen(a) + 1);
    return hash_fnv1a(h, b, strlen(b));
}

/* A seed for hash_fnv1a_pair that users cannot know (so they cannot fill one bucket with
 * names of their choosing): random, else SALT's address and the monotonic clock. */
static inline uint64_t hash_seed(const void *salt)
{
    uint64_t seed = 0;
    struct timespec ts;

    if (getrandom(&seed, sizeof(seed), 0) == (ssize_t)sizeof(seed) && seed != 0) {
        return seed;
    }
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ((uint64_t)(uintptr_t)salt ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30)) | 1;
}

#endif
