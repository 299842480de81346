/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests of store/'s read pool (issue 8): reads on their own connections, never behind
 * the writer, and a list followed by a watch that misses no concurrent create. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "store/store.h"
#include "tests/t_check.h"
#include "tests/unit/store_fixture.h"

/* --- the read pool (issue 8): reads on their own connections, never behind the writer --- */

static void remove_file(const char *path)
{
    store_unlink_db(path);
}

static const char *objective_of(const json_t *o)
{
    return json_string_value(json_object_get(json_object_get(o, "spec"), "objective"));
}

/* Collects the names of a text list. */
static int collect_names(const char *json, size_t len, void *userdata)
{
    json_t *obj = json_loadb(json, len, 0, NULL), *names = userdata;

    ASSERT(obj != NULL);
    json_array_append(names, json_object_get(json_object_get(obj, "metadata"), "name"));
    json_decref(obj);
    return E_OK;
}

static int create_in_txn(struct task_txn *tx, void *userdata)
{
    return task_txn_create(NULL, tx, userdata, NULL);
}

TEST(read_pool_sees_every_committed_write)
{
    char path[STORE_FILE_PATH_MAX];
    struct task_store *st = open_sqlite_file(path);
    json_t *a = new_task("a"), *b = new_task("b"), *o = NULL, *names = json_array();
    struct err err = {0};
    int64_t rv = 0;

    CHECK_OK(task_store_create(&o, st, a, &err));
    json_decref(o);
    /* Write, then read, many times over: a read never answers from an older snapshot. */
    for (int i = 0; i < 50; i++) {
        char obj[32];
        json_t *p;
        struct patch_ud ud = {.scope = TASK_PATCH_MAIN};
        snprintf(obj, sizeof(obj), "v%d", i);
        p = json_pack("{s:{s:s}}", "spec", "objective", obj);
        ud.patch = p;
        CHECK_OK(task_store_mutate(NULL, st, "default", "a", apply_patch, &ud, &err));
        json_decref(p);
        CHECK_OK(task_store_get(&o, st, "default", "a", &err));
        CHECK_EQ_STR(objective_of(o), obj);
        json_decref(o);
        json_array_clear(names);
        CHECK_OK(task_store_list_text(&rv, st, "default", collect_names, names, &err));
        CHECK_EQ_INT(rv, i + 2);
        CHECK_EQ_INT(json_array_size(names), 1);
    }
    CHECK_OK(task_store_txn(st, create_in_txn, b, &err));
    CHECK_OK(task_store_get(&o, st, "default", "b", &err));
    json_decref(o);
    CHECK_OK(task_store_remove(NULL, st, "default", "a", 0, &err));
    CHECK_EQ_INT(task_store_get(&o, st, "default", "a", &err), E_NOTFOUND);
    json_array_clear(names);
    CHECK_OK(task_store_list_text(&rv, st, NULL, collect_names, names, &err));
    CHECK_EQ_INT(rv, 53);
    CHECK_EQ_INT(json_array_size(names), 1);
    CHECK_EQ_STR(json_string_value(json_array_get(names, 0)), "b");
    CHECK_EQ_INT(task_store_env_get(&o, st, "default", "nope", &err), E_NOTFOUND);
    CHECK_EQ_STR(err.msg, "environments \"nope\" not found");
    json_decref(names);
    json_decref(a);
    json_decref(b);
    task_store_close(st);
    remove_file(path);
}

/* A reader thread runs while the test holds a write transaction open. */
struct held_txn {
    struct task_store *st;
    json_t *b; /* created inside the held transaction */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool txn_open;            /* the writer holds its transaction */
    bool read_done;           /* the reader finished */
    bool done_while_open;     /* ... while the transaction was still open */
    int get_a, get_b, list_n; /* what the reader saw */
    int64_t list_rv;
};

static void *reader_main(void *arg)
{
    struct held_txn *h = arg;
    json_t *o = NULL, *names = json_array();
    int64_t counts[TASK_PHASE_COUNT];
    struct err err = {0};

    pthread_mutex_lock(&h->mu);
    while (!h->txn_open) {
        pthread_cond_wait(&h->cv, &h->mu);
    }
    pthread_mutex_unlock(&h->mu);
    h->get_a = task_store_get(&o, h->st, "default", "a", &err);
    json_decref(o);
    o = NULL;
    h->get_b = task_store_get(&o, h->st, "default", "b", &err);
    json_decref(o);
    h->list_n = task_store_list_text(&h->list_rv, h->st, NULL, collect_names, names, &err) == E_OK
                    ? (int)json_array_size(names)
                    : -1;
    CHECK_OK(task_store_count_phases(counts, h->st, &err));
    json_decref(names);
    pthread_mutex_lock(&h->mu);
    h->read_done = true;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

static int hold_txn(struct task_txn *tx, void *userdata)
{
    struct held_txn *h = userdata;
    struct timespec guard;
    int rc = task_txn_create(NULL, tx, h->b, NULL);

    /* Wait for the reader with the transaction (and, before the pool, the store's only
     * connection) held. The deadline only keeps the old code from hanging the suite. */
    clock_gettime(CLOCK_REALTIME, &guard);
    guard.tv_sec += 30;
    pthread_mutex_lock(&h->mu);
    h->txn_open = true;
    pthread_cond_broadcast(&h->cv);
    while (!h->read_done) {
        if (pthread_cond_timedwait(&h->cv, &h->mu, &guard) != 0) {
            break;
        }
    }
    h->done_while_open = h->read_done;
    pthread_mutex_unlock(&h->mu);
    return rc;
}

TEST(read_does_not_wait_for_an_open_write_txn)
{
    char path[STORE_FILE_PATH_MAX];
    struct task_store *st = open_sqlite_file(path);
    json_t *a = new_task("a"), *o = NULL, *names = json_array();
    struct held_txn h = {.st = st, .b = new_task("b")};
    struct err err = {0};
    pthread_t t;
    int64_t rv = 0;

    pthread_mutex_init(&h.mu, NULL);
    pthread_cond_init(&h.cv, NULL);
    CHECK_OK(task_store_create(&o, st, a, &err));
    json_decref(o);
    ASSERT(pthread_create(&t, NULL, reader_main, &h) == 0);
    CHECK_OK(task_store_txn(st, hold_txn, &h, &err));
    pthread_join(t, NULL);
    CHECK(h.done_while_open);
    /* The reader saw the last commit, not the open transaction. */
    CHECK_EQ_INT(h.get_a, E_OK);
    CHECK_EQ_INT(h.get_b, E_NOTFOUND);
    CHECK_EQ_INT(h.list_n, 1);
    CHECK_EQ_INT(h.list_rv, 1);
    /* Once committed, the next read sees it. */
    CHECK_OK(task_store_get(&o, st, "default", "b", &err));
    json_decref(o);
    CHECK_OK(task_store_list_text(&rv, st, NULL, collect_names, names, &err));
    CHECK_EQ_INT(json_array_size(names), 2);
    CHECK_EQ_INT(rv, 2);
    pthread_mutex_destroy(&h.mu);
    pthread_cond_destroy(&h.cv);
    json_decref(names);
    json_decref(h.b);
    json_decref(a);
    task_store_close(st);
    remove_file(path);
}

#define RACE_TASKS 300

static void *create_many(void *arg)
{
    struct task_store *st = arg;

    for (int i = 0; i < RACE_TASKS; i++) {
        char name[16];
        json_t *t, *o = NULL;
        snprintf(name, sizeof(name), "t%d", i);
        t = new_task(name);
        CHECK_OK(task_store_create(&o, st, t, NULL));
        json_decref(o);
        json_decref(t);
    }
    return NULL;
}

static int count_added(const struct task_event *ev, void *userdata)
{
    json_t *seen = userdata;

    if (ev->type == TASK_EVENT_ADDED) {
        json_t *n = json_object_get(seen, ev->name);
        json_object_set_new(seen, ev->name, json_integer(json_integer_value(n) + 1));
    }
    return 0;
}

static int count_listed(const char *json, size_t len, void *userdata)
{
    json_t *obj = json_loadb(json, len, 0, NULL);
    struct task_event ev = {.type = TASK_EVENT_ADDED};

    ASSERT(obj != NULL);
    ev.name = json_string_value(json_object_get(json_object_get(obj, "metadata"), "name"));
    count_added(&ev, userdata);
    json_decref(obj);
    return E_OK;
}

/* A list and the events after its resourceVersion hold every task exactly once, however
 * the list falls among concurrent writes (for the pool and for ":memory:"). */
static void list_then_watch_race(struct task_store *st)
{
    json_t *seen = json_object();
    const char *k;
    json_t *v;
    pthread_t t;
    int64_t rv = 0, last = 0;
    struct err err = {0};

    ASSERT(pthread_create(&t, NULL, create_many, st) == 0);
    CHECK_OK(task_store_list_text(&rv, st, "default", count_listed, seen, &err));
    pthread_join(t, NULL);
    while (rv < RACE_TASKS) {
        CHECK_OK(task_store_watch(&last, st, "default", rv, 1000, count_added, seen, &err));
        ASSERT(last > rv);
        rv = last;
    }
    CHECK_EQ_INT(json_object_size(seen), RACE_TASKS);
    json_object_foreach(seen, k, v)
    {
        CHECK_EQ_INT(json_integer_value(v), 1);
    }
    json_decref(seen);
}

TEST(list_and_watch_agree_under_concurrent_creates)
{
    char path[STORE_FILE_PATH_MAX];
    struct task_store *st = open_sqlite_file(path);

    list_then_watch_race(st);
    task_store_close(st);
    remove_file(path);
    st = open_mem();
    list_then_watch_race(st);
    task_store_close(st);
}

T_MAIN
