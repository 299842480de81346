/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests of store/: the AgentTask codec and validation, merge patch, and the task_store
 * contract on the SQLite backend (":memory:" and a file, for restart). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "store/store.h"
#include "tests/t_check.h"

static const char *const SPEC_EXAMPLE =
    "{\"apiVersion\":\"divergedev.com/v1alpha1\",\"kind\":\"AgentTask\","
    "\"metadata\":{\"name\":\"fix-checkout-latency\",\"namespace\":\"default\","
    "\"annotations\":{\"divergedev.com/preview-enabled\":\"true\"}},"
    "\"spec\":{\"objective\":\"Diagnose and fix N+1 query in /api/v1/checkout\",\"draftPR\":true,"
    "\"repository\":{\"url\":\"https://github.com/myorg/checkout-service\","
    "\"baseBranch\":\"main\",\"workingBranch\":\"fix/checkout-n-plus-1\"},"
    "\"maxIterations\":8,\"budgetUSD\":\"5.00\",\"budgetTokens\":200000,"
    "\"capabilities\":[\"claude-3-7-sonnet\",\"gemini-2.5-pro\"],\"allowedTools\":[\"git\",\"go\"],"
    "\"sandbox\":{\"provider\":\"agent-sandbox\",\"timeoutSeconds\":1800},\"suspended\":false}}";

static json_t *load(const char *s)
{
    json_t *j = json_loads(s, 0, NULL);
    ASSERT(j != NULL);
    return j;
}

static int normalize_str(json_t **out, const char *s, struct err *err)
{
    json_t *in = load(s);
    int rc = task_normalize_new(out, in, "default", err);
    json_decref(in);
    return rc;
}

TEST(codec_roundtrips_spec_example)
{
    json_t *in = load(SPEC_EXAMPLE), *out = NULL;
    struct err err = {0};

    CHECK_OK(task_normalize_new(&out, in, "default", &err));
    CHECK(json_equal(json_object_get(in, "spec"), json_object_get(out, "spec")));
    CHECK(json_equal(json_object_get(json_object_get(in, "metadata"), "annotations"),
                     json_object_get(json_object_get(out, "metadata"), "annotations")));
    CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(out, "status"), "phase")),
                 "Pending");
    /* And a full object with status validates and survives encode/decode unchanged. */
    char *text = json_dumps(out, JSON_COMPACT);
    json_t *again = load(text);
    CHECK_OK(task_validate(again, &err));
    CHECK(json_equal(again, out));
    free(text);
    json_decref(again);
    json_decref(in);
    json_decref(out);
}

TEST(defaults_and_money_canonical)
{
    json_t *out = NULL;
    struct err err = {0};

    CHECK_OK(normalize_str(&out,
                           "{\"metadata\":{\"name\":\"t1\"},\"spec\":{\"objective\":\"x\","
                           "\"budgetUSD\":\"5\"}}",
                           &err));
    json_t *spec = json_object_get(out, "spec");
    CHECK_EQ_STR(json_string_value(json_object_get(spec, "budgetUSD")), "5.00");
    json_t *repo = json_object_get(spec, "repository");
    CHECK_EQ_STR(json_string_value(json_object_get(repo, "baseBranch")), "main");
    CHECK_EQ_STR(json_string_value(json_object_get(repo, "workingBranch")), "agent/t1");
    json_decref(out);
}

TEST(validation_errors_name_the_field)
{
    static const struct {
        const char *body;
        const char *field;
    } cases[] = {
        {"{\"metadata\":{\"name\":\"Bad_Name\"},\"spec\":{\"objective\":\"x\"}}", "metadata.name"},
        {"{\"metadata\":{\"name\":\"a-\"},\"spec\":{\"objective\":\"x\"}}", "metadata.name"},
        {"{\"metadata\":{\"name\":\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"},"
         "\"spec\":{\"objective\":\"x\"}}",
         "metadata.name"},
        {"{\"metadata\":{\"name\":\"a\"},\"spec\":{}}", "spec.objective"},
        {"{\"metadata\":{\"name\":\"a\"}}", "spec"},
        {"{\"metadata\":{\"name\":\"a\"},\"spec\":{\"objective\":\"x\",\"budgetUSD\":\"1.0000001\"}}",
         "spec.budgetUSD"},
        {"{\"metadata\":{\"name\":\"a\"},\"spec\":{\"objective\":\"x\",\"budgetUSD\":1.5}}",
         "spec.budgetUSD"},
        {"{\"metadata\":{\"name\":\"a\"},\"spec\":{\"objective\":\"x\",\"budgetUSD\":\"-1\"}}",
         "spec.budgetUSD"},
        {"{\"metadata\":{\"name\":\"a\"},\"spec\":{\"objective\":\"x\",\"budgetTokens\":-1}}",
         "spec.budgetTokens"},
        {"{\"metadata\":{\"name\":\"a\"},\"spec\":{\"objective\":\"x\",\"maxIterations\":\"8\"}}",
         "spec.maxIterations"},
        {"{\"metadata\":{\"name\":\"a\"},\"spec\":{\"objective\":\"x\",\"budget\":\"8\"}}",
         "spec.budget"},
        {"{\"metadata\":{\"name\":\"a\"},\"spec\":{\"objective\":\"x\",\"capabilities\":[1]}}",
         "spec.capabilities[0]"},
        {"{\"metadata\":{\"name\":\"a\"},\"spec\":{\"objective\":\"x\",\"sandbox\":{\"provider\":\"vm\"}}}",
         "spec.sandbox.provider"},
        {"{\"metadata\":{\"name\":\"a\"},\"spec\":{\"objective\":\"x\",\"repository\":{\"url\":3}}}",
         "spec.repository.url"},
        {"{\"metadata\":{\"name\":\"a\",\"annotations\":{\"k\":1}},\"spec\":{\"objective\":\"x\"}}",
         "metadata.annotations[k]"},
        {"{\"metadata\":{\"name\":\"a\",\"namespace\":\"other\"},\"spec\":{\"objective\":\"x\"}}",
         "metadata.namespace"},
        {"{\"kind\":\"Pod\",\"metadata\":{\"name\":\"a\"},\"spec\":{\"objective\":\"x\"}}", "kind"},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        json_t *out = NULL;
        struct err err = {0};
        int rc = normalize_str(&out, cases[i].body, &err);
        if (rc != E_INVALID || strcmp(err.field, cases[i].field) != 0) {
            t_fail(__FILE__, __LINE__, "case %zu: rc=%d field=\"%s\" want \"%s\" (%s)", i, rc,
                   err.field, cases[i].field, err.msg);
        }
        json_decref(out);
    }
}

TEST(merge_patch_rfc7386)
{
    json_t *t = load("{\"a\":\"b\",\"c\":{\"d\":\"e\",\"f\":\"g\"}}");
    json_t *p = load("{\"a\":\"z\",\"c\":{\"f\":null}}");
    json_t *want = load("{\"a\":\"z\",\"c\":{\"d\":\"e\"}}");
    json_t *r = json_merge_patch(t, p);
    CHECK(json_equal(r, want));
    json_decref(r);
    json_decref(t);
    json_decref(p);
    json_decref(want);
}

static struct task_store *open_mem(void)
{
    struct task_store *st = NULL;
    struct err err = {0};
    ASSERT(task_store_sqlite_open(&st, ":memory:", clock_system(), &err) == E_OK);
    return st;
}

static json_t *new_task(const char *name)
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

static int apply_patch(json_t *doc, struct err *err, void *ud)
{
    struct patch_ud *p = ud;
    return task_apply_merge_patch(doc, p->patch, p->scope, err);
}

TEST(store_create_get_conflict)
{
    struct task_store *st = open_mem();
    json_t *t = new_task("a"), *stored = NULL, *got = NULL, *dup = NULL;
    struct err err = {0};

    CHECK_OK(task_store_create(&stored, st, t, &err));
    CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(stored, "metadata"),
                                                   "resourceVersion")),
                 "1");
    CHECK_EQ_INT(task_store_create(&dup, st, t, &err), E_CONFLICT);
    CHECK_OK(task_store_get(&got, st, "default", "a", &err));
    CHECK(json_equal(got, stored));
    CHECK_EQ_INT(task_store_get(&dup, st, "default", "zz", &err), E_NOTFOUND);
    json_decref(t);
    json_decref(stored);
    json_decref(got);
    task_store_close(st);
}

TEST(store_stale_patch_conflicts)
{
    struct task_store *st = open_mem();
    json_t *t = new_task("a"), *stored = NULL, *after = NULL;
    struct err err = {0};
    struct patch_ud p1 = {load("{\"metadata\":{\"resourceVersion\":\"1\"},\"spec\":{\"objective\":\"y\"}}"),
                          TASK_PATCH_MAIN};

    CHECK_OK(task_store_create(&stored, st, t, &err));
    CHECK_OK(task_store_mutate(&after, st, "default", "a", apply_patch, &p1, &err));
    CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(after, "spec"), "objective")), "y");
    CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(after, "metadata"), "generation")), 2);
    /* The same patch again carries the now stale resourceVersion "1". */
    CHECK_EQ_INT(task_store_mutate(NULL, st, "default", "a", apply_patch, &p1, &err), E_CONFLICT);
    json_decref(p1.patch);
    json_decref(t);
    json_decref(stored);
    json_decref(after);
    task_store_close(st);
}

TEST(status_scope_is_separate)
{
    struct task_store *st = open_mem();
    json_t *t = new_task("a"), *stored = NULL, *after = NULL;
    struct patch_ud main_p = {load("{\"status\":{\"phase\":\"Active\"}}"), TASK_PATCH_MAIN};
    struct patch_ud st_p = {load("{\"spec\":{\"objective\":\"z\"},\"status\":{\"phase\":\"Active\","
                                 "\"costUSD\":\"0.0675\"}}"),
                            TASK_PATCH_STATUS};
    struct patch_ud bad = {load("{\"status\":{\"phase\":\"Sleeping\"}}"), TASK_PATCH_STATUS};
    struct err err = {0};

    CHECK_OK(task_store_create(&stored, st, t, &err));
    CHECK_OK(task_store_mutate(&after, st, "default", "a", apply_patch, &main_p, &err));
    CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(after, "status"), "phase")),
                 "Pending");
    json_decref(after);
    CHECK_OK(task_store_mutate(&after, st, "default", "a", apply_patch, &st_p, &err));
    CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(after, "status"), "phase")),
                 "Active");
    CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(after, "spec"), "objective")),
                 "x");
    CHECK_EQ_INT(task_store_mutate(NULL, st, "default", "a", apply_patch, &bad, &err), E_INVALID);
    CHECK_EQ_STR(err.field, "status.phase");
    json_decref(main_p.patch);
    json_decref(st_p.patch);
    json_decref(bad.patch);
    json_decref(t);
    json_decref(stored);
    json_decref(after);
    task_store_close(st);
}

static int count_events(const struct task_event *ev, void *ud)
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

TEST(watch_feed_and_delete)
{
    struct task_store *st = open_mem();
    json_t *a = new_task("a"), *b = new_task("b"), *o = NULL, *items = NULL;
    int counts[3] = {0};
    int64_t last = 0, rv = 0;
    struct err err = {0};

    CHECK_OK(task_store_create(&o, st, a, &err));
    json_decref(o);
    CHECK_OK(task_store_create(&o, st, b, &err));
    json_decref(o);
    CHECK_OK(task_store_remove(NULL, st, "default", "a", 0, &err));
    CHECK_OK(task_store_watch(&last, st, NULL, 0, 100, count_events, counts, &err));
    CHECK_EQ_INT(counts[TASK_EVENT_ADDED], 2);
    CHECK_EQ_INT(counts[TASK_EVENT_DELETED], 1);
    CHECK_EQ_INT(last, 3);
    CHECK_OK(task_store_list(&items, &rv, st, "default", &err));
    CHECK_EQ_INT(json_array_size(items), 1);
    CHECK_EQ_INT(rv, 3);
    CHECK_EQ_INT(task_store_remove(NULL, st, "default", "b", 99, &err), E_CONFLICT);
    json_decref(items);
    json_decref(a);
    json_decref(b);
    task_store_close(st);
}

TEST(restart_keeps_everything)
{
    char path[] = "/tmp/diverge-store-XXXXXX";
    int fd = mkstemp(path);
    struct task_store *st = NULL;
    json_t *a = new_task("a"), *o = NULL;
    struct err err = {0};
    int64_t counts[TASK_PHASE_COUNT];

    ASSERT(fd >= 0);
    close(fd);
    CHECK_OK(task_store_sqlite_open(&st, path, clock_system(), &err));
    CHECK_OK(task_store_create(&o, st, a, &err));
    json_decref(o);
    task_store_close(st);
    CHECK_OK(task_store_sqlite_open(&st, path, clock_system(), &err));
    CHECK_OK(task_store_get(&o, st, "default", "a", &err));
    CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(o, "metadata"), "resourceVersion")),
                 "1");
    CHECK_OK(task_store_count_phases(counts, st, &err));
    CHECK_EQ_INT(counts[TASK_PENDING], 1);
    json_decref(o);
    json_decref(a);
    task_store_close(st);
    unlink(path);
    char *wal = xasprintf("%s-wal", path), *shm = xasprintf("%s-shm", path);
    unlink(wal);
    unlink(shm);
    free(wal);
    free(shm);
}

/* --- the read pool (issue 8): reads on their own connections, never behind the writer --- */

/* A store in a fresh file (the pool needs a file: ":memory:" reads on the writer). */
static struct task_store *open_file(char path[32])
{
    struct task_store *st = NULL;
    int fd;

    snprintf(path, 32, "/tmp/diverge-read-XXXXXX");
    fd = mkstemp(path);
    ASSERT(fd >= 0);
    close(fd);
    ASSERT(task_store_sqlite_open(&st, path, clock_system(), NULL) == E_OK);
    return st;
}

static void remove_file(const char *path)
{
    char *wal = xasprintf("%s-wal", path), *shm = xasprintf("%s-shm", path);

    unlink(path);
    unlink(wal);
    unlink(shm);
    free(wal);
    free(shm);
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
    char path[32];
    struct task_store *st = open_file(path);
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
    json_t *b;                /* created inside the held transaction */
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
    char path[32];
    struct task_store *st = open_file(path);
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
    char path[32];
    struct task_store *st = open_file(path);

    list_then_watch_race(st);
    task_store_close(st);
    remove_file(path);
    st = open_mem();
    list_then_watch_race(st);
    task_store_close(st);
}

struct txn_ud {
    int step;
};

static int txn_work(struct task_txn *tx, void *userdata)
{
    struct txn_ud *u = userdata;
    json_t *doc = NULL;
    bool seen = true;
    struct token_record rec;
    struct err err = {0};

    CHECK_OK(task_txn_get(&doc, tx, "default", "a", &err));
    json_t *again = NULL;
    CHECK_OK(task_txn_get(&again, tx, "default", "a", &err));
    CHECK(again == doc); /* the cached parse */
    json_decref(again);
    /* Job 1: charged and kept. */
    CHECK_OK(task_txn_savepoint(tx, &err));
    json_object_set_new(json_object_get(doc, "status"), "iteration", json_integer(1));
    CHECK_OK(task_txn_put(tx, doc, &err));
    CHECK_OK(task_txn_meter_claim(&seen, tx, "uid-1", "req-1", 10, 20, &err));
    CHECK(seen); /* fresh */
    CHECK_OK(task_txn_release(tx, &err));
    /* Job 2: undone. */
    CHECK_OK(task_txn_savepoint(tx, &err));
    json_object_set_new(json_object_get(doc, "status"), "iteration", json_integer(2));
    CHECK_OK(task_txn_put(tx, doc, &err));
    CHECK_OK(task_txn_meter_claim(&seen, tx, "uid-1", "req-2", 10, 20, &err));
    task_txn_rollback_savepoint(tx);
    CHECK_OK(task_txn_meter_claim(&seen, tx, "uid-1", "req-1", 1, 1, &err));
    CHECK(!seen); /* kept: a retry */
    CHECK_OK(task_txn_meter_claim(&seen, tx, "uid-1", "req-2", 1, 1, &err));
    CHECK(seen); /* rolled back: fresh again */
    /* Token index. */
    CHECK_EQ_INT(task_txn_token_current(&rec, tx, "default", "a", &err), E_NOTFOUND);
    CHECK_OK(task_txn_token_add(tx, "default", "a", 1, "id-1", "tok-1", &err));
    CHECK_OK(task_txn_token_current(&rec, tx, "default", "a", &err));
    CHECK(rec.active);
    CHECK_EQ_STR(rec.token_id, "id-1");
    free(rec.token);
    CHECK_OK(task_txn_token_revoke(tx, "default", "a", &err));
    CHECK_OK(task_txn_token_current(&rec, tx, "default", "a", &err));
    CHECK(!rec.active);
    free(rec.token);
    CHECK_OK(task_txn_token_add(tx, "default", "a", 2, "id-2", "tok-2", &err));
    json_decref(doc);
    u->step = 1;
    return E_OK;
}

TEST(txn_savepoints_events_tokens)
{
    struct task_store *st = open_mem();
    json_t *a = new_task("a"), *o = NULL;
    struct txn_ud u = {0};
    struct token_record rec;
    int counts[3] = {0};
    int64_t last = 0;
    struct err err = {0};

    CHECK_OK(task_store_create(&o, st, a, &err));
    json_decref(o);
    CHECK_OK(task_store_txn(st, txn_work, &u, &err));
    CHECK_EQ_INT(u.step, 1);
    CHECK_OK(task_store_get(&o, st, "default", "a", &err));
    CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(o, "status"), "iteration")), 1);
    CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(o, "metadata"), "resourceVersion")),
                 "2");
    json_decref(o);
    /* One ADDED, one MODIFIED: the rolled-back job left no event. */
    CHECK_OK(task_store_watch(&last, st, NULL, 0, 10, count_events, counts, &err));
    CHECK_EQ_INT(counts[TASK_EVENT_ADDED], 1);
    CHECK_EQ_INT(counts[TASK_EVENT_MODIFIED], 1);
    CHECK_EQ_INT(last, 2);
    CHECK_OK(task_store_token_current(&rec, st, "default", "a", &err));
    CHECK_EQ_INT(rec.generation, 2);
    CHECK(rec.active);
    free(rec.token);
    /* Deleting the task revokes its token. */
    CHECK_OK(task_store_remove(NULL, st, "default", "a", 0, &err));
    CHECK_OK(task_store_token_current(&rec, st, "default", "a", &err));
    CHECK(!rec.active);
    free(rec.token);
    json_decref(a);
    task_store_close(st);
}

static int txn_fail(struct task_txn *tx, void *userdata)
{
    json_t *doc = NULL;
    (void)userdata;
    ASSERT(task_txn_get(&doc, tx, "default", "a", NULL) == E_OK);
    json_object_set_new(json_object_get(doc, "spec"), "objective", json_string("lost"));
    ASSERT(task_txn_put(tx, doc, NULL) == E_OK);
    json_decref(doc);
    return E_INVALID;
}

TEST(txn_failure_rolls_back)
{
    struct task_store *st = open_mem();
    json_t *a = new_task("a"), *o = NULL;
    struct err err = {0};
    int counts[3] = {0};
    int64_t last = 0;

    CHECK_OK(task_store_create(&o, st, a, &err));
    json_decref(o);
    CHECK_EQ_INT(task_store_txn(st, txn_fail, NULL, &err), E_INVALID);
    CHECK_OK(task_store_get(&o, st, "default", "a", &err));
    CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(o, "spec"), "objective")), "x");
    json_decref(o);
    CHECK_OK(task_store_watch(&last, st, NULL, 0, 10, count_events, counts, &err));
    CHECK_EQ_INT(last, 1);
    json_t *b = new_task("b");
    CHECK_OK(task_store_create(&o, st, b, &err));
    CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(o, "metadata"), "resourceVersion")),
                 "2");
    json_decref(o);
    json_decref(b);
    json_decref(a);
    task_store_close(st);
}

static int claim_ids(struct task_txn *tx, void *userdata)
{
    int *fresh = userdata;
    bool f = false;
    ASSERT(task_txn_meter_claim(&f, tx, "uid-9", "r1", 1, 1, NULL) == E_OK);
    fresh[0] = f;
    ASSERT(task_txn_meter_claim(&f, tx, "uid-9", "r1", 1, 1, NULL) == E_OK);
    fresh[1] = f;
    ASSERT(task_txn_meter_claim(&f, tx, "uid-8", "r1", 1, 1, NULL) == E_OK);
    fresh[2] = f;
    return E_OK;
}

TEST(meter_ids_survive_restart)
{
    char path[] = "/tmp/diverge-meter-XXXXXX";
    int fd = mkstemp(path);
    struct task_store *st = NULL;
    int fresh[3] = {0};

    ASSERT(fd >= 0);
    close(fd);
    CHECK_OK(task_store_sqlite_open(&st, path, clock_system(), NULL));
    CHECK_OK(task_store_txn(st, claim_ids, fresh, NULL));
    CHECK(fresh[0] && !fresh[1] && fresh[2]);
    task_store_close(st);
    CHECK_OK(task_store_sqlite_open(&st, path, clock_system(), NULL));
    CHECK_OK(task_store_txn(st, claim_ids, fresh, NULL));
    CHECK(!fresh[0] && !fresh[1] && !fresh[2]); /* every id is remembered after a restart */
    task_store_close(st);
    unlink(path);
    char *wal = xasprintf("%s-wal", path), *shm = xasprintf("%s-shm", path);
    unlink(wal);
    unlink(shm);
    free(wal);
    free(shm);
}

/* ==== Bounded memory from a task token (security review finding 7). ==================== */

/* One past TASK_OBJECTIVE_MAX / TASK_GUIDANCE_MAX is 422 naming the field, on create and
 * after a patch; exactly at the limit is fine. */
static json_t *task_with(size_t objective_len, size_t guidance_len)
{
    json_t *t = json_pack("{s:{s:s}, s:{}}", "metadata", "name", "a", "spec");
    char *obj = xmalloc(objective_len + 1), *g = xmalloc(guidance_len + 1);

    memset(obj, 'o', objective_len);
    obj[objective_len] = '\0';
    memset(g, 'g', guidance_len);
    g[guidance_len] = '\0';
    json_object_set_new(json_object_get(t, "spec"), "objective", json_string(obj));
    if (guidance_len > 0) {
        json_object_set_new(json_object_get(t, "metadata"), "annotations",
                            json_pack("{s:s}", TASK_ANN_GUIDANCE, g));
    }
    free(obj);
    free(g);
    return t;
}

TEST(objective_and_guidance_caps)
{
    static const struct {
        size_t objective, guidance;
        const char *field; /* NULL = valid */
    } cases[] = {
        {TASK_OBJECTIVE_MAX, TASK_GUIDANCE_MAX, NULL},
        {TASK_OBJECTIVE_MAX + 1, 0, "spec.objective"},
        {1, TASK_GUIDANCE_MAX + 1, "metadata.annotations." TASK_ANN_GUIDANCE},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        json_t *in = task_with(cases[i].objective, cases[i].guidance), *out = NULL;
        struct err err = {0};
        int rc = task_normalize_new(&out, in, "default", &err);
        if (cases[i].field == NULL ? rc != E_OK
                                   : rc != E_INVALID || strcmp(err.field, cases[i].field) != 0) {
            t_fail(__FILE__, __LINE__, "case %zu: rc=%d field=\"%s\" (%s)", i, rc, err.field,
                   err.msg);
        }
        json_decref(in);
        json_decref(out);
    }
    /* A patch that grows the guidance past the cap is refused the same way. */
    {
        json_t *in = task_with(1, 0), *doc = NULL, *patch = task_with(1, TASK_GUIDANCE_MAX + 1);
        struct err err = {0};
        CHECK_OK(task_normalize_new(&doc, in, "default", &err));
        json_object_del(patch, "spec");
        CHECK_EQ_INT(task_apply_merge_patch(doc, patch, TASK_PATCH_MAIN, &err), E_INVALID);
        CHECK_EQ_STR(err.field, "metadata.annotations." TASK_ANN_GUIDANCE);
        json_decref(in);
        json_decref(doc);
        json_decref(patch);
    }
}

struct claim_many {
    int from, to;     /* ids "r<from>" .. "r<to - 1>" */
    const char *uid;
    int fresh;        /* out: how many were fresh */
};

static int claim_range(struct task_txn *tx, void *userdata)
{
    struct claim_many *c = userdata;
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

/* The in-memory index stays under STORE_METER_INDEX_IDS after many distinct ids, while
 * every duplicate, however old (long moved out of memory), is still found in SQLite and
 * never charged twice, also after a restart. */
TEST(meter_index_bounded_duplicates_never_recharged)
{
    char path[] = "/tmp/diverge-meterix-XXXXXX";
    int fd = mkstemp(path);
    struct task_store *st = NULL;
    struct task_store_mem mem;
    struct claim_many c = {.uid = "uid-b"};
    enum { N = 5 * STORE_METER_INDEX_IDS + 17 };

    ASSERT(fd >= 0);
    close(fd);
    CHECK_OK(task_store_sqlite_open(&st, path, clock_system(), NULL));
    c.from = 0, c.to = 10;
    CHECK_OK(task_store_txn(st, claim_range, &c, NULL));
    CHECK_EQ_INT(c.fresh, 10);
    task_store_sqlite_mem(&mem, st);
    CHECK_EQ_INT(mem.meter_index_ids, 10);
    /* One at a time, as the meter does, then many per transaction. */
    for (int i = 10; i < STORE_METER_INDEX_IDS + 10; i++) {
        c.from = i, c.to = i + 1;
        CHECK_OK(task_store_txn(st, claim_range, &c, NULL));
        CHECK_EQ_INT(c.fresh, 1);
        task_store_sqlite_mem(&mem, st);
        CHECK(mem.meter_index_ids < STORE_METER_INDEX_IDS);
    }
    c.from = STORE_METER_INDEX_IDS + 10, c.to = N;
    CHECK_OK(task_store_txn(st, claim_range, &c, NULL));
    CHECK_EQ_INT(c.fresh, N - STORE_METER_INDEX_IDS - 10);
    task_store_sqlite_mem(&mem, st);
    CHECK(mem.meter_index_ids < STORE_METER_INDEX_IDS);
    CHECK(mem.meter_index_bytes < STORE_METER_INDEX_BYTES);
    /* Every id again, the oldest first: none is fresh. */
    c.from = 0, c.to = N;
    CHECK_OK(task_store_txn(st, claim_range, &c, NULL));
    CHECK_EQ_INT(c.fresh, 0);
    /* The same ids for another task are its own. */
    c.uid = "uid-c", c.from = 0, c.to = 100;
    CHECK_OK(task_store_txn(st, claim_range, &c, NULL));
    CHECK_EQ_INT(c.fresh, 100);
    task_store_close(st);
    /* After a restart: still every one remembered. */
    CHECK_OK(task_store_sqlite_open(&st, path, clock_system(), NULL));
    c.uid = "uid-b", c.from = 0, c.to = N;
    CHECK_OK(task_store_txn(st, claim_range, &c, NULL));
    CHECK_EQ_INT(c.fresh, 0);
    task_store_sqlite_mem(&mem, st);
    CHECK(mem.meter_index_ids < STORE_METER_INDEX_IDS);
    task_store_close(st);
    unlink(path);
    char *wal = xasprintf("%s-wal", path), *shm = xasprintf("%s-shm", path);
    unlink(wal);
    unlink(shm);
    free(wal);
    free(shm);
}

/* Long ids fill the index by bytes before they fill it by count. */
#define METER_LONG_ID 256 /* bytes of each id, with its NUL */
enum { LONG_IDS = STORE_METER_INDEX_IDS - 100 };

static int claim_long(struct task_txn *tx, void *userdata)
{
    int *fresh = userdata;
    char id[METER_LONG_ID];

    *fresh = 0;
    for (int i = 0; i < LONG_IDS; i++) {
        bool f = false;
        memset(id, 'x', sizeof(id));
        snprintf(id + sizeof(id) - 8, 8, "%d", i);
        if (task_txn_meter_claim(&f, tx, "uid-l", id, 1, 1, NULL) != E_OK) {
            return E_FAIL;
        }
        *fresh += f;
    }
    return E_OK;
}

TEST(meter_index_bounded_by_bytes)
{
    struct task_store *st = open_mem();
    struct task_store_mem mem;
    int fresh = 0;

    /* Fewer ids than the count cap, but with their keys more bytes than the byte cap. */
    CHECK_OK(task_store_txn(st, claim_long, &fresh, NULL));
    CHECK_EQ_INT(fresh, LONG_IDS);
    task_store_sqlite_mem(&mem, st);
    CHECK(mem.meter_index_bytes < STORE_METER_INDEX_BYTES);
    CHECK(mem.meter_index_ids < (size_t)LONG_IDS);
    CHECK_OK(task_store_txn(st, claim_long, &fresh, NULL));
    CHECK_EQ_INT(fresh, 0);
    task_store_close(st);
}

static int put_n(struct task_txn *tx, void *userdata)
{
    int *n = userdata;
    json_t *doc = NULL;

    if (task_txn_get(&doc, tx, "default", "big", NULL) != E_OK) {
        return E_FAIL;
    }
    for (int i = 0; i < *n; i++) {
        json_object_set_new(json_object_get(doc, "status"), "iteration", json_integer(i));
        if (task_txn_put(tx, doc, NULL) != E_OK) {
            json_decref(doc);
            return E_FAIL;
        }
    }
    json_decref(doc);
    return E_OK;
}

static int count_only(const struct task_event *ev, void *ud)
{
    (void)ev;
    (*(int *)ud)++;
    return 0;
}

/* The event ring keeps at most STORE_EVENT_RING_BYTES of JSON: with 1 MiB tasks the oldest
 * events go, a watcher behind them gets E_AGAIN (410), a recent one still gets its feed. */
TEST(event_ring_bounded_by_bytes)
{
    struct task_store *st = open_mem();
    struct task_store_mem mem;
    size_t big = 1u << 20;
    int n = (int)(STORE_EVENT_RING_BYTES / big) + 8, got = 0;
    char *label = xmalloc(big + 1);
    json_t *t = new_task("big"), *o = NULL;
    int64_t last = 0;
    struct err err = {0};

    memset(label, 'x', big);
    label[big] = '\0';
    json_object_set_new(json_object_get(t, "metadata"), "labels",
                        json_pack("{s:s}", "pad", label));
    free(label);
    CHECK_OK(task_store_create(&o, st, t, &err));
    json_decref(o);
    CHECK_OK(task_store_txn(st, put_n, &n, &err));
    task_store_sqlite_mem(&mem, st);
    CHECK(mem.event_bytes <= STORE_EVENT_RING_BYTES);
    CHECK(mem.event_bytes > STORE_EVENT_RING_BYTES - 2 * big);
    CHECK(mem.events < (size_t)n && mem.events > 0);
    /* From the start: too old. */
    CHECK_EQ_INT(task_store_watch(&last, st, NULL, 0, 10, count_only, &got, &err), E_AGAIN);
    CHECK_EQ_INT(got, 0);
    /* From the newest few: the feed. */
    CHECK_OK(task_store_watch(&last, st, NULL, n + 1 - 5, 10, count_only, &got, &err));
    CHECK_EQ_INT(got, 5);
    CHECK_EQ_INT(last, n + 1);
    json_decref(t);
    task_store_close(st);
}

T_MAIN
