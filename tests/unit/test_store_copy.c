/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests of the SQLite store's tasks in memory (store/sqlite/store_sqlite_mem.c): GET
 * and list answered from a copy of every task's committed text give what the database
 * gives, in its order, with its resourceVersion; a copy past its limit goes off and the
 * database answers; no read sees part of a transaction. SQLite only (a file store): the
 * Kubernetes backend answers from its informer's cache. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "store/store.h"
#include "tests/t_check.h"
#include "tests/unit/store_fixture.h"

static json_t *task_in(const char *ns, const char *name)
{
    json_t *t = new_task(name);

    json_object_set_new(json_object_get(t, "metadata"), "namespace", json_string(ns));
    return t;
}

static void create_in(struct task_store *st, const char *ns, const char *name)
{
    json_t *t = task_in(ns, name), *made = NULL;

    CHECK_OK(task_store_create(&made, st, t, NULL));
    json_decref(made);
    json_decref(t);
}

static int append_text(const char *json, size_t len, void *userdata)
{
    json_array_append_new(userdata, json_stringn(json, len));
    return E_OK;
}

static int by_text(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Every task's text as the store lists them: all, then per namespace, then one GET each
 * (and a GET of a task that is not there), with the resourceVersion of the full list. */
static json_t *everything(struct task_store *st, int64_t *rv_out)
{
    static const char *const nss[] = {"a", "default", "zz", "nobody"};
    json_t *out = json_array(), *all = json_array(), *o = NULL;
    struct err err = {0};
    size_t i;

    CHECK_OK(task_store_list_text(rv_out, st, NULL, append_text, all, &err));
    json_array_append(out, all);
    for (i = 0; i < ARRAY_LEN(nss); i++) {
        json_t *part = json_array();
        int64_t rv = 0;
        CHECK_OK(task_store_list_text(&rv, st, nss[i], append_text, part, &err));
        CHECK_EQ_INT(rv, *rv_out);
        json_array_append_new(out, part);
    }
    for (i = 0; i < json_array_size(all); i++) {
        json_t *t = json_loads(json_string_value(json_array_get(all, i)), 0, NULL), *md;
        ASSERT(t != NULL);
        md = json_object_get(t, "metadata");
        CHECK_OK(task_store_get(&o, st, json_string_value(json_object_get(md, "namespace")),
                                json_string_value(json_object_get(md, "name")), &err));
        CHECK(json_equal(o, t));
        json_decref(o);
        json_decref(t);
    }
    CHECK_EQ_INT(task_store_get(&o, st, "default", "not-there", &err), E_NOTFOUND);
    CHECK_EQ_STR(err.msg, "agenttasks \"not-there\" not found");
    json_decref(all);
    return out;
}

/* In one transaction: task ARGS[0]'s objective set, task ARGS[1] created. */
struct txn_args {
    const char *ns, *change, *objective;
    json_t *create;
};

static int change_and_create(struct task_txn *tx, void *userdata)
{
    struct txn_args *a = userdata;
    json_t *doc = NULL;
    int rc = task_txn_get(&doc, tx, a->ns, a->change, NULL);

    if (rc == E_OK) {
        json_object_set_new(json_object_get(doc, "spec"), "objective", json_string(a->objective));
        rc = task_txn_put(tx, doc, NULL);
    }
    json_decref(doc);
    return rc != E_OK ? rc : task_txn_create(NULL, tx, a->create, NULL);
}

static void set_phase(struct task_store *st, const char *ns, const char *name, const char *phase)
{
    json_t *p = json_pack("{s:{s:s}}", "status", "phase", phase);
    struct patch_ud ud = {.patch = p, .scope = TASK_PATCH_STATUS};

    CHECK_OK(task_store_mutate(NULL, st, ns, name, apply_patch, &ud, NULL));
    json_decref(p);
}

/* The texts of the tasks not finished (task_store_list_live), sorted (it gives no order). */
static json_t *live_texts(struct task_store *st)
{
    json_t *out = json_array(), *sorted = json_array();
    const char **v;
    size_t n;

    CHECK_OK(task_store_list_live(st, append_text, out, NULL));
    n = json_array_size(out);
    v = xcalloc(n + 1, sizeof(*v));
    for (size_t i = 0; i < n; i++) {
        v[i] = json_string_value(json_array_get(out, i));
    }
    qsort(v, n, sizeof(*v), by_text);
    for (size_t i = 0; i < n; i++) {
        json_array_append_new(sorted, json_string(v[i]));
    }
    free(v);
    json_decref(out);
    return sorted;
}

/* ST answers as SEEN (everything) and LIVE (live_texts) at resourceVersion RV. */
static void same_as(struct task_store *st, const json_t *seen, const json_t *live, int64_t rv)
{
    int64_t rv2 = 0;
    json_t *again = everything(st, &rv2), *live_again = live_texts(st);

    CHECK_EQ_INT(rv2, rv);
    CHECK(json_equal(again, seen));
    CHECK(json_equal(live_again, live));
    json_decref(again);
    json_decref(live_again);
}

static void set_objective(struct task_store *st, const char *ns, const char *name, const char *obj)
{
    json_t *p = json_pack("{s:{s:s}}", "spec", "objective", obj);
    struct patch_ud ud = {.patch = p, .scope = TASK_PATCH_MAIN};

    CHECK_OK(task_store_mutate(NULL, st, ns, name, apply_patch, &ud, NULL));
    json_decref(p);
}

TEST(copy_answers_as_the_database_does)
{
    static const char *const nss[] = {"zz", "default", "a"};
    char path[STORE_FILE_PATH_MAX], name[32];
    struct task_store *st = open_sqlite_file(path);
    struct task_store_mem mem;
    json_t *seen, *live;
    int64_t rv = 0;
    unsigned seed = 7;
    int n = 0;

    /* 900 names in a scrambled order over three namespaces (chunks of 256 split), some
     * changed, some deleted, some in transactions with another change. */
    for (int i = 0; i < 900; i++) {
        int k = (i * 367) % 900;
        snprintf(name, sizeof(name), "t%03d-%d", k, k % 7);
        create_in(st, nss[k % 3], name);
        n++;
    }
    for (int i = 0; i < 300; i++) {
        int k = (int)(rand_r(&seed) % 900);
        char obj[32];
        snprintf(name, sizeof(name), "t%03d-%d", k, k % 7);
        snprintf(obj, sizeof(obj), "changed %d", i);
        set_objective(st, nss[k % 3], name, obj);
    }
    for (int k = 1; k < 900; k += 10) { /* finished: not listed as live */
        snprintf(name, sizeof(name), "t%03d-%d", k, k % 7);
        set_phase(st, nss[k % 3], name, k % 20 == 1 ? "Completed" : "Failed");
    }
    for (int k = 0; k < 900; k += 4) {
        snprintf(name, sizeof(name), "t%03d-%d", k, k % 7);
        CHECK_OK(task_store_remove(NULL, st, nss[k % 3], name, 0, NULL));
        n--;
    }
    for (int i = 0; i < 20; i++) {
        char made[32];
        struct txn_args a = {.ns = "a", .change = "t002-2", .objective = "in a transaction"};
        snprintf(made, sizeof(made), "x%02d", 19 - i);
        a.create = task_in("a", made);
        CHECK_OK(task_store_txn(st, change_and_create, &a, NULL));
        json_decref(a.create);
        n++;
    }
    task_store_sqlite_mem(&mem, st);
    CHECK(mem.task_copy_on);
    CHECK_EQ_INT(mem.task_copies, n);
    seen = everything(st, &rv);
    CHECK_EQ_INT(json_array_size(json_array_get(seen, 0)), n);
    CHECK_EQ_INT(json_array_size(json_array_get(seen, 4)), 0); /* namespace "nobody" */
    live = live_texts(st);
    CHECK_EQ_INT(json_array_size(live), n - 90);

    /* The same from the database: the copy off. */
    task_store_sqlite_copy_limit(st, 0);
    task_store_sqlite_mem(&mem, st);
    CHECK(!mem.task_copy_on);
    CHECK_EQ_INT(mem.task_copies, 0);
    same_as(st, seen, live, rv);

    /* And from a copy loaded at open. */
    task_store_close(st);
    ASSERT(task_store_sqlite_open(&st, path, clock_system(), NULL) == E_OK);
    task_store_sqlite_mem(&mem, st);
    CHECK(mem.task_copy_on);
    CHECK_EQ_INT(mem.task_copies, n);
    same_as(st, seen, live, rv);
    json_decref(live);
    json_decref(seen);
    task_store_close(st);
    store_unlink_db(path);
}

TEST(copy_past_its_limit_goes_off_and_the_database_answers)
{
    char path[STORE_FILE_PATH_MAX], name[32];
    struct task_store *st = open_sqlite_file(path);
    struct task_store_mem mem;
    json_t *items = NULL, *o = NULL;
    int64_t rv = 0;
    int i, off_at = -1;

    for (i = 0; i < 10; i++) {
        snprintf(name, sizeof(name), "t%d", i);
        create_in(st, "default", name);
    }
    task_store_sqlite_mem(&mem, st);
    CHECK(mem.task_copy_on && mem.task_copies == 10 && mem.task_copy_bytes > 0);
    /* Room for about five more: the copy goes off on the write past it, for good. */
    task_store_sqlite_copy_limit(st, mem.task_copy_bytes + mem.task_copy_bytes / 2);
    for (; i < 20; i++) {
        snprintf(name, sizeof(name), "t%d", i);
        create_in(st, "default", name);
        task_store_sqlite_mem(&mem, st);
        if (i == 10) {
            CHECK(mem.task_copy_on);
        }
        off_at = !mem.task_copy_on && off_at < 0 ? i : off_at;
        CHECK(mem.task_copy_on == (off_at < 0));
    }
    CHECK(off_at > 10 && off_at < 19);
    task_store_sqlite_mem(&mem, st);
    CHECK_EQ_INT(mem.task_copies, 0);
    CHECK_EQ_INT(mem.task_copy_bytes, 0);
    set_objective(st, "default", "t3", "after the copy went off");
    CHECK_OK(task_store_list(&items, &rv, st, "default", NULL));
    CHECK_EQ_INT(json_array_size(items), 20);
    CHECK_EQ_INT(rv, 21);
    json_decref(items);
    CHECK_OK(task_store_get(&o, st, "default", "t3", NULL));
    CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(o, "spec"), "objective")),
                 "after the copy went off");
    json_decref(o);
    task_store_close(st);
    store_unlink_db(path);
}

/* Two tasks changed together, over and over, while readers list and GET them. */
struct pair_run {
    struct task_store *st;
    int rounds;
    int done; /* atomic: the writer finished */
};

static int change_both(struct task_txn *tx, void *userdata)
{
    const char *objective = userdata;
    static const char *const names[] = {"p", "q"};

    for (size_t i = 0; i < ARRAY_LEN(names); i++) {
        json_t *doc = NULL;
        int rc = task_txn_get(&doc, tx, "default", names[i], NULL);
        if (rc == E_OK) {
            json_object_set_new(json_object_get(doc, "spec"), "objective", json_string(objective));
            rc = task_txn_put(tx, doc, NULL);
        }
        json_decref(doc);
        if (rc != E_OK) {
            return rc;
        }
    }
    return E_OK;
}

static void *pair_writer(void *arg)
{
    struct pair_run *r = arg;

    for (int i = 0; i < r->rounds; i++) {
        char obj[32];
        snprintf(obj, sizeof(obj), "round %d", i);
        CHECK_OK(task_store_txn(r->st, change_both, obj, NULL));
    }
    __atomic_store_n(&r->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

static void *pair_reader(void *arg)
{
    struct pair_run *r = arg;
    int64_t last_rv = 0;

    while (!__atomic_load_n(&r->done, __ATOMIC_ACQUIRE)) {
        json_t *items = NULL, *o = NULL;
        int64_t rv = 0, q_rv;
        CHECK_OK(task_store_list(&items, &rv, r->st, "default", NULL));
        CHECK_EQ_INT(json_array_size(items), 2);
        CHECK(rv >= last_rv);
        last_rv = rv;
        CHECK_EQ_STR(json_string_value(json_object_get(
                         json_object_get(json_array_get(items, 0), "metadata"), "name")),
                     "p");
        /* One transaction changed both: never one without the other. */
        CHECK_EQ_STR(json_string_value(json_object_get(
                         json_object_get(json_array_get(items, 0), "spec"), "objective")),
                     json_string_value(json_object_get(
                         json_object_get(json_array_get(items, 1), "spec"), "objective")));
        q_rv = obj_rv(json_array_get(items, 1));
        json_decref(items);
        /* A GET after a list sees q at least as new as the list did. */
        CHECK_OK(task_store_get(&o, r->st, "default", "q", NULL));
        CHECK(obj_rv(o) >= q_rv);
        json_decref(o);
    }
    return NULL;
}

TEST(no_read_sees_part_of_a_transaction)
{
    char path[STORE_FILE_PATH_MAX];
    struct task_store *st = open_sqlite_file(path);
    struct pair_run r = {.st = st, .rounds = 300};
    pthread_t w, rd[2];

    create_in(st, "default", "p");
    create_in(st, "default", "q");
    for (size_t i = 0; i < ARRAY_LEN(rd); i++) {
        ASSERT(pthread_create(&rd[i], NULL, pair_reader, &r) == 0);
    }
    ASSERT(pthread_create(&w, NULL, pair_writer, &r) == 0);
    pthread_join(w, NULL);
    for (size_t i = 0; i < ARRAY_LEN(rd); i++) {
        pthread_join(rd[i], NULL);
    }
    task_store_close(st);
    store_unlink_db(path);
}

T_MAIN
