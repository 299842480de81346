/* SPDX-License-Identifier: Apache-2.0 */
/* The meter's request-id Bloom filter (store_sqlite_idf.h). */
#include "store/sqlite/store_sqlite_idf.h"

#include "common/hash.h"
#include "common/err.h"

#define IDF_WORDS (SQLST_IDF_BITS / 64)

/* splitmix64's finalizer: spreads FNV-1a's bits over the whole word. */
static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= UINT64_C(0xbf58476d1ce4e5b9);
    x ^= x >> 27;
    x *= UINT64_C(0x94d049bb133111eb);
    return x ^ (x >> 31);
}

uint64_t sqlst_idf_hash(const char *uid, size_t nuid, const char *id, size_t nid)
{
    uint64_t h = hash_fnv1a(HASH_FNV1A_INIT, uid, nuid);

    h = hash_fnv1a(h, "\n", 1);
    return mix64(hash_fnv1a(h, id, nid));
}

uint64_t *sqlst_idf_new(void)
{
    return xcalloc(IDF_WORDS, sizeof(uint64_t));
}

/* The I-th bit of hash H (double hashing: two 32-bit halves, the step odd). */
static uint64_t idf_bit(uint64_t h, unsigned i)
{
    uint64_t a = h & 0xffffffffu, b = (h >> 32) | 1u;

    return (a + i * b + (uint64_t)i * i * 0x9e3779b9u) & (SQLST_IDF_BITS - 1);
}

void sqlst_idf_add(uint64_t *f, uint64_t h)
{
    for (unsigned i = 0; i < SQLST_IDF_PROBES; i++) {
        uint64_t bit = idf_bit(h, i);
        f[bit / 64] |= UINT64_C(1) << (bit % 64);
    }
}

bool sqlst_idf_maybe(const uint64_t *f, uint64_t h)
{
    for (unsigned i = 0; i < SQLST_IDF_PROBES; i++) {
        uint64_t bit = idf_bit(h, i);
        if ((f[bit / 64] & (UINT64_C(1) << (bit % 64))) == 0) {
            return false;
        }
    }
    return true;
}

void sqlst_idf_merge(uint64_t *dst, const uint64_t *src)
{
    for (size_t i = 0; i < IDF_WORDS; i++) {
        dst[i] |= src[i];
    }
}
