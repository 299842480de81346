/* SPDX-License-Identifier: Apache-2.0 */
/* Fixtures shared by the store/ unit tests (test_store*.c): parsing a literal, a normalised
 * task and a SQLite store on ":memory:". Every helper is static inline: each test binary
 * uses some of them. */
#ifndef DIVERGE_TESTS_UNIT_STORE_FIXTURE_H
#define DIVERGE_TESTS_UNIT_STORE_FIXTURE_H

#include <jansson.h>
#include <stdlib.h>

#include "common/clock.h"
#include "common/err.h"
#include "store/store.h"
#include "tests/t_check.h"

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

static inline struct task_store *open_mem(void)
{
    struct task_store *st = NULL;
    struct err err = {0};
    ASSERT(task_store_sqlite_open(&st, ":memory:", clock_system(), &err) == E_OK);
    return st;
}

static inline json_t *new_task(const char *name)
{
    json_t *out = NULL;
    char *s = xasprintf("{\"metadata\":{\"name\":\"%s\"},\"spec\":{\"objective\":\"x\"}}", name);
    ASSERT(normalize_str(&out, s, NULL) == E_OK);
    free(s);
    return out;
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
