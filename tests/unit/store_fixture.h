/* SPDX-License-Identifier: Apache-2.0 */
/* Fixtures shared by the store/ unit tests (test_store*.c): parsing a literal, a normalised
 * task and a fresh store. Every helper is static inline: each test binary uses some of them.
 * The store contract tests run on both backends: with DIVERGE_TEST_STORE=kubernetes (the
 * unit.test_store*_kube entries of ctest) open_mem() gives a Kubernetes store over its own
 * tests/fakes/fake_kube.py, else a SQLite store on ":memory:". A guarantee only one backend
 * gives is checked per backend via store_is_kube(), never skipped silently. */
#ifndef DIVERGE_TESTS_UNIT_STORE_FIXTURE_H
#define DIVERGE_TESTS_UNIT_STORE_FIXTURE_H

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/err.h"
#include "store/store.h"
#include "tests/t_check.h"
#include "tests/unit/kube_fixture.h"

static inline json_t *load(const char *s)
{
    json_t *j = json_loads(s, 0, NULL);
    ASSERT(j != NULL);
    return j;
}

static inline int normalize_str(json_t **out, const char *s, struct err *err)
{
    json_t *in = load(s);
    int rc = task_normalize_new(out, in, "default", err);
    json_decref(in);
    return rc;
}

/* A SQLite store in a fresh file, named into PATH (the read pool and the copy kept in
 * memory need a file: ":memory:" reads on the writer). Remove it with store_unlink_db. */
#define STORE_FILE_PATH_MAX 40
static inline struct task_store *open_sqlite_file(char path[STORE_FILE_PATH_MAX])
{
    struct task_store *st = NULL;
    int fd;

    snprintf(path, STORE_FILE_PATH_MAX, "/tmp/diverge-store-XXXXXX");
    fd = mkstemp(path);
    ASSERT(fd >= 0);
    close(fd);
    ASSERT(task_store_sqlite_open(&st, path, clock_system(), NULL) == E_OK);
    return st;
}

/* Removes the SQLite store file PATH and the files beside it (WAL, shared memory, the
 * meter's archive and its own). */
static inline void store_unlink_db(const char *path)
{
    static const char *const sfx[] = {"", "-wal", "-shm", "-meter", "-meter-wal", "-meter-shm"};

    for (size_t i = 0; i < sizeof(sfx) / sizeof(sfx[0]); i++) {
        char *f = xasprintf("%s%s", path, sfx[i]);
        unlink(f);
        free(f);
    }
}

/* Claims meter request ids "r<from>".."r<to - 1>" of UID in one transaction (a
 * task_store_txn callback with a struct store_claims); FRESH: how many were new. */
struct store_claims {
    const char *uid;
    int from, to;
    int fresh; /* out */
};

static inline int store_claim_range(struct task_txn *tx, void *userdata)
{
    struct store_claims *c = userdata;
    char id[32];

    c->fresh = 0;
    for (int i = c->from; i < c->to; i++) {
        bool f = false;
        snprintf(id, sizeof(id), "r%d", i);
        if (task_txn_meter_claim(&f, tx, c->uid, id, 1, 1, NULL) != E_OK) {
            return E_FAIL;
        }
        c->fresh += f;
    }
    return E_OK;
}

/* Whether the tests run against the Kubernetes backend. */
static inline bool store_is_kube(void)
{
    const char *v = getenv("DIVERGE_TEST_STORE");
    return v != NULL && strcmp(v, "kubernetes") == 0;
}

/* Says on stderr that CHECK does not apply to this backend, and why (visible in ctest -V). */
static inline void store_backend_note(const char *check, const char *why)
{
    fprintf(stderr, "note: %s backend: %s: %s\n", store_is_kube() ? "kubernetes" : "sqlite", check,
            why);
}

#define STORE_FAKES_MAX 64
static pid_t g_store_fakes[STORE_FAKES_MAX];
static int g_store_nfakes;

static inline void store_fakes_stop(void)
{
    for (int i = 0; i < g_store_nfakes; i++) {
        struct fake_kube f = {.pid = g_store_fakes[i]};
        fake_kube_stop(&f);
    }
    g_store_nfakes = 0;
}

/* A fresh, empty store of the backend under test, on CLOCK. */
static inline struct task_store *open_mem_clock(const struct clock *clock)
{
    struct task_store *st = NULL;
    struct err err = {0};

    if (store_is_kube()) {
        struct fake_kube f;
        ASSERT(g_store_nfakes < STORE_FAKES_MAX);
        fake_kube_start(&f, NULL);
        if (g_store_nfakes == 0) {
            atexit(store_fakes_stop);
        }
        g_store_fakes[g_store_nfakes++] = f.pid;
        if (task_store_kube_open(&st, fake_kube_client(&f, NULL), "diverge-system", clock, &err) !=
            E_OK) {
            fprintf(stderr, "kube store: %s\n", err.msg);
            ASSERT(0);
        }
        return st;
    }
    ASSERT(task_store_sqlite_open(&st, ":memory:", clock, &err) == E_OK);
    return st;
}

/* A fresh, empty store of the backend under test. */
static inline struct task_store *open_mem(void)
{
    return open_mem_clock(clock_system());
}

static inline json_t *new_task(const char *name)
{
    json_t *out = NULL;
    char *s = xasprintf("{\"metadata\":{\"name\":\"%s\"},\"spec\":{\"objective\":\"x\"}}", name);
    ASSERT(normalize_str(&out, s, NULL) == E_OK);
    free(s);
    return out;
}

/* metadata.resourceVersion of O as a number. */
static inline int64_t obj_rv(const json_t *o)
{
    const char *rv =
        json_string_value(json_object_get(json_object_get(o, "metadata"), "resourceVersion"));
    return rv != NULL ? strtoll(rv, NULL, 10) : 0;
}

/* The feed's resourceVersion now (0 on a fresh SQLite store). */
static inline int64_t feed_rv(struct task_store *st)
{
    json_t *items = NULL;
    int64_t rv = 0;
    ASSERT(task_store_list(&items, &rv, st, NULL, NULL) == E_OK);
    json_decref(items);
    return rv;
}

struct patch_ud {
    json_t *patch;
    enum task_patch_scope scope;
};

static inline int apply_patch(json_t *doc, struct err *err, void *ud)
{
    struct patch_ud *p = ud;
    return task_apply_merge_patch(doc, p->patch, p->scope, err);
}

/* A watch callback counting events by type into the int array UD. */
static inline int count_events(const struct task_event *ev, void *ud)
{
    int *n = ud;
    json_t *obj = json_loads(ev->json, 0, NULL);
    CHECK(obj != NULL);
    CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(obj, "metadata"), "name")),
                 ev->name);
    json_decref(obj);
    n[ev->type]++;
    return 0;
}

#endif
