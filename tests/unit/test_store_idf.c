/* SPDX-License-Identifier: Apache-2.0 */
/* The meter's request-id Bloom filter (store/sqlite/store_sqlite_idf.h): every id added is
 * found again (no false negative, the property the meter's exactly-once rests on); ids
 * never added are mostly reported absent; a merge keeps both sides' ids. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/sqlite/store_sqlite_idf.h"
#include "tests/t_check.h"

static uint64_t hash_of(const char *uid, int i)
{
    char id[32];

    snprintf(id, sizeof(id), "t1-%d", i);
    return sqlst_idf_hash(uid, strlen(uid), id, strlen(id));
}

TEST(idf_never_a_false_negative)
{
    uint64_t *f = sqlst_idf_new();
    int maybe = 0;

    for (int i = 0; i < 200000; i++) {
        sqlst_idf_add(f, hash_of("uid-a", i));
    }
    for (int i = 0; i < 200000; i++) {
        CHECK(sqlst_idf_maybe(f, hash_of("uid-a", i)));
    }
    /* Other ids, and the same ids of another task: at 200,000 ids held, about 1e-8 each. */
    for (int i = 200000; i < 300000; i++) {
        maybe += sqlst_idf_maybe(f, hash_of("uid-a", i));
        maybe += sqlst_idf_maybe(f, hash_of("uid-b", i - 200000));
    }
    CHECK(maybe < 10);
    free(f);
}

TEST(idf_pair_boundary_and_lengths_count)
{
    uint64_t *f = sqlst_idf_new();

    sqlst_idf_add(f, sqlst_idf_hash("ab", 2, "c", 1));
    CHECK(sqlst_idf_maybe(f, sqlst_idf_hash("ab", 2, "c", 1)));
    CHECK(!sqlst_idf_maybe(f, sqlst_idf_hash("a", 1, "bc", 2)));
    CHECK(!sqlst_idf_maybe(f, sqlst_idf_hash("ab", 2, "c\0", 2)));
    CHECK(!sqlst_idf_maybe(f, sqlst_idf_hash("", 0, "", 0)));
    free(f);
}

TEST(idf_merge_keeps_both)
{
    uint64_t *a = sqlst_idf_new(), *b = sqlst_idf_new();

    for (int i = 0; i < 1000; i++) {
        sqlst_idf_add(i % 2 == 0 ? a : b, hash_of("uid-m", i));
    }
    sqlst_idf_merge(a, b);
    for (int i = 0; i < 1000; i++) {
        CHECK(sqlst_idf_maybe(a, hash_of("uid-m", i)));
    }
    free(a);
    free(b);
}

T_MAIN
