/* SPDX-License-Identifier: Apache-2.0 */
/* A Bloom filter of meter request ids (store_sqlite_meter.c): a fixed 4 MiB of bits, so
 * memory stays bounded however many ids are ever charged. An id added is always found
 * again (no false negatives); an id never added is reported "maybe" with a probability
 * that grows with the ids held (about 5e-5 at a million, 2 % at four million), and a
 * "maybe" only costs the lookup the filter saves otherwise. */
#ifndef DIVERGE_STORE_SQLITE_IDF_H
#define DIVERGE_STORE_SQLITE_IDF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SQLST_IDF_BITS (UINT64_C(1) << 25) /* 4 MiB */
#define SQLST_IDF_PROBES 5                 /* bits set per id */

/* The hash of the pair (UID[0..nuid), ID[0..nid)); the same pair always hashes the same. */
uint64_t sqlst_idf_hash(const char *uid, size_t nuid, const char *id, size_t nid);
/* A new, empty filter (pages untouched until set); free() it. */
uint64_t *sqlst_idf_new(void);
void sqlst_idf_add(uint64_t *f, uint64_t h);
/* False: the id of hash H was never added to F. */
bool sqlst_idf_maybe(const uint64_t *f, uint64_t h);
/* Adds every id of SRC to DST. */
void sqlst_idf_merge(uint64_t *dst, const uint64_t *src);

#endif
