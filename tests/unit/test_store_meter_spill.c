/* SPDX-License-Identifier: Apache-2.0 */
/* The meter's request-id index at its spill boundary (SQLite file store): a generation of
 * ids sealed at half of STORE_METER_INDEX_IDS moves to the archive file off the commit
 * path, and every id on either side of the boundary stays exactly-once while it moves,
 * after it has left memory, and after a restart. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "store/store.h"
#include "tests/t_check.h"
#include "tests/unit/store_fixture.h"

enum { HALF = STORE_METER_INDEX_IDS / 2 };

/* How many of "r<from>".."r<to - 1>" of UID a transaction finds fresh. */
static int fresh_of(struct task_store *st, const char *uid, int from, int to)
{
    struct store_claims c = {.uid = uid, .from = from, .to = to};

    CHECK_OK(task_store_txn(st, store_claim_range, &c, NULL));
    return c.fresh;
}

static int nothing(struct task_txn *tx, void *userdata)
{
    (void)tx, (void)userdata;
    return E_OK;
}

/* Runs empty write transactions until the sealed generation has left memory (the archiver
 * stored it and a transaction dropped it from meter_log), at most 60 s. */
static bool wait_sealed_gone(struct task_store *st, size_t want_ids)
{
    struct task_store_mem mem;
    time_t end = time(NULL) + 60;

    do {
        CHECK_OK(task_store_txn(st, nothing, NULL, NULL));
        task_store_sqlite_mem(&mem, st);
        if (mem.meter_index_ids == want_ids) {
            return true;
        }
        nanosleep(&(struct timespec){.tv_nsec = 2000000}, NULL);
    } while (time(NULL) < end);
    return false;
}

TEST(meter_spill_boundary_exactly_once)
{
    if (store_is_kube()) {
        store_backend_note("the meter spill",
                           "a sqlite file test; runs in unit.test_store_meter_spill");
        return;
    }
    char path[] = "/tmp/diverge-spill-XXXXXX";
    int fd = mkstemp(path);
    char *arc = xasprintf("%s-meter", path);
    struct task_store *st = NULL;
    struct task_store_mem mem;

    ASSERT(fd >= 0);
    close(fd);
    CHECK_OK(task_store_sqlite_open(&st, path, clock_system(), NULL));
    for (int i = 0; i < HALF - 1; i += 64) {
        int to = i + 64 < HALF - 1 ? i + 64 : HALF - 1;
        CHECK_EQ_INT(fresh_of(st, "uid-s", i, to), to - i);
    }
    task_store_sqlite_mem(&mem, st);
    CHECK_EQ_INT(mem.meter_index_ids, HALF - 1);
    /* The id that fills the generation seals it; the archiver starts after this commit. */
    CHECK_EQ_INT(fresh_of(st, "uid-s", HALF - 1, HALF), 1);
    /* Right away, while it may still be moving: the last id before the seal, the first of
     * the log, and the first of the next generation charged once each. */
    CHECK_EQ_INT(fresh_of(st, "uid-s", HALF - 1, HALF), 0);
    CHECK_EQ_INT(fresh_of(st, "uid-s", 0, 1), 0);
    CHECK_EQ_INT(fresh_of(st, "uid-s", HALF, HALF + 1), 1);
    CHECK_EQ_INT(fresh_of(st, "uid-s", HALF - 2, HALF + 1), 0);
    /* Once it is out of memory, from the archive file alone. */
    CHECK(wait_sealed_gone(st, 1));
    CHECK(access(arc, F_OK) == 0);
    CHECK_EQ_INT(fresh_of(st, "uid-s", 0, HALF + 1), 0);
    CHECK_EQ_INT(fresh_of(st, "uid-t", HALF - 1, HALF + 1), 2); /* another task's own */
    task_store_close(st);
    /* After a restart: every one still remembered; the next id is new. */
    CHECK_OK(task_store_sqlite_open(&st, path, clock_system(), NULL));
    CHECK_EQ_INT(fresh_of(st, "uid-s", 0, HALF + 1), 0);
    CHECK_EQ_INT(fresh_of(st, "uid-s", HALF + 1, HALF + 2), 1);
    task_store_close(st);
    store_unlink_db(path);
    free(arc);
}

/* Runs empty write transactions until the id filter is in use, at most 60 s. */
static bool wait_filter_ready(struct task_store *st)
{
    struct task_store_mem mem;
    time_t end = time(NULL) + 60;

    do {
        CHECK_OK(task_store_txn(st, nothing, NULL, NULL));
        task_store_sqlite_mem(&mem, st);
        if (mem.meter_filter_ready) {
            return true;
        }
        nanosleep(&(struct timespec){.tv_nsec = 2000000}, NULL);
    } while (time(NULL) < end);
    return false;
}

static uint64_t lookups_of(struct task_store *st)
{
    struct task_store_mem mem;

    task_store_sqlite_mem(&mem, st);
    return mem.meter_lookups;
}

/* Claims like store_claim_range, then fails: the whole transaction rolls back. */
static int claim_then_fail(struct task_txn *tx, void *userdata)
{
    CHECK_OK(store_claim_range(tx, userdata));
    return E_FAIL;
}

/* The filter in front of the archive's lookups: a fresh id it never saw is charged without
 * a lookup; an archived id is still found (a lookup), before and after a restart, before
 * the filter is in use and after; the ids of a rolled-back transaction are fresh again. */
TEST(meter_filter_skips_lookups_never_recharges)
{
    if (store_is_kube()) {
        store_backend_note("the meter id filter", "a sqlite file test");
        return;
    }
    char path[] = "/tmp/diverge-idf-XXXXXX";
    int fd = mkstemp(path);
    struct task_store *st = NULL;
    struct store_claims c = {.uid = "uid-f", .from = HALF + 100, .to = HALF + 110};
    uint64_t before;

    ASSERT(fd >= 0);
    close(fd);
    CHECK_OK(task_store_sqlite_open(&st, path, clock_system(), NULL));
    CHECK(wait_filter_ready(st));
    /* A generation sealed and archived, out of memory: ids 0..HALF in the archive. */
    CHECK_EQ_INT(fresh_of(st, "uid-f", 0, HALF), HALF);
    CHECK(wait_sealed_gone(st, 0));
    before = lookups_of(st);
    CHECK_EQ_INT(fresh_of(st, "uid-f", HALF, HALF + 50), 50);
    CHECK_EQ_INT(fresh_of(st, "uid-g", 0, 50), 50); /* another task's same ids */
    CHECK(lookups_of(st) == before);                /* none looked up */
    CHECK_EQ_INT(fresh_of(st, "uid-f", 0, HALF + 50), 0);
    CHECK(lookups_of(st) >= before + HALF); /* each archived one looked up */
    /* A batch that charged ten ids and rolled back: they are fresh again (looked up). */
    CHECK(task_store_txn(st, claim_then_fail, &c, NULL) == E_FAIL);
    CHECK_EQ_INT(c.fresh, 10);
    CHECK_EQ_INT(fresh_of(st, "uid-f", HALF + 100, HALF + 110), 10);
    CHECK_EQ_INT(fresh_of(st, "uid-f", HALF + 100, HALF + 110), 0);
    task_store_close(st);
    /* Restart between a charge and its retry: retried at once (the filter may not be in
     * use yet), then once it is; every one found, the next ids fresh. */
    CHECK_OK(task_store_sqlite_open(&st, path, clock_system(), NULL));
    CHECK_EQ_INT(fresh_of(st, "uid-f", 0, 1), 0);
    CHECK(wait_filter_ready(st));
    CHECK_EQ_INT(fresh_of(st, "uid-f", 0, HALF + 50), 0);
    CHECK_EQ_INT(fresh_of(st, "uid-f", HALF + 100, HALF + 110), 0);
    CHECK_EQ_INT(fresh_of(st, "uid-g", 0, 50), 0);
    before = lookups_of(st);
    CHECK_EQ_INT(fresh_of(st, "uid-f", HALF + 200, HALF + 250), 50);
    CHECK(lookups_of(st) == before);
    task_store_close(st);
    store_unlink_db(path);
}

/* A whole generation and more in ONE transaction: the first sealed generation cannot go to
 * the archiver before the commit, so the writer moves it itself; none is charged twice. */
TEST(meter_spill_twice_in_one_transaction)
{
    if (store_is_kube()) {
        store_backend_note("the meter spill",
                           "a sqlite file test; runs in unit.test_store_meter_spill");
        return;
    }
    char path[] = "/tmp/diverge-spill-XXXXXX";
    int fd = mkstemp(path);
    struct task_store *st = NULL;
    struct task_store_mem mem;

    ASSERT(fd >= 0);
    close(fd);
    CHECK_OK(task_store_sqlite_open(&st, path, clock_system(), NULL));
    CHECK_EQ_INT(fresh_of(st, "uid-u", 0, 2 * HALF + 10), 2 * HALF + 10);
    task_store_sqlite_mem(&mem, st);
    CHECK(mem.meter_index_ids < STORE_METER_INDEX_IDS);
    CHECK_EQ_INT(fresh_of(st, "uid-u", 0, 2 * HALF + 11), 1);
    task_store_close(st);
    CHECK_OK(task_store_sqlite_open(&st, path, clock_system(), NULL));
    CHECK_EQ_INT(fresh_of(st, "uid-u", 0, 2 * HALF + 12), 1);
    task_store_close(st);
    /* The writer's own move (main.meter_requests) is in the filter's scan too. */
    CHECK_OK(task_store_sqlite_open(&st, path, clock_system(), NULL));
    CHECK(wait_filter_ready(st));
    CHECK_EQ_INT(fresh_of(st, "uid-u", 0, 2 * HALF + 12), 0);
    CHECK_EQ_INT(fresh_of(st, "uid-u", 2 * HALF + 12, 2 * HALF + 13), 1);
    task_store_close(st);
    store_unlink_db(path);
}

T_MAIN
