/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests of store/: the AgentTask codec and validation, merge patch, and the task_store
 * contract on the SQLite backend (":memory:" and a file, for restart). The read pool is in
 * test_store_read.c, transactions and the bounded indexes in test_store_txn.c. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "store/store.h"
#include "tests/t_check.h"
#include "tests/unit/store_fixture.h"

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

/* spec.runner and spec.sandbox.network/allowedHosts (SPEC section 10, from agent.yaml):
 * accepted in their documented shapes, anything else is 422 naming the field. */
TEST(runner_and_network_fields)
{
    json_t *out = NULL;
    struct err err = {0};

    CHECK_OK(
        normalize_str(&out,
                      "{\"metadata\":{\"name\":\"t\"},\"spec\":{\"objective\":\"x\","
                      "\"runner\":{\"command\":\"make fix\",\"verifyCommand\":\"make test\"},"
                      "\"sandbox\":{\"network\":\"proxy\",\"allowedHosts\":"
                      "[\"api.anthropic.com\",\"*.pypi.org:443\",\"127.0.0.1:9\",\"[::1]:8\"]}}}",
                      &err));
    json_decref(out);
    static const char *const bad[][2] = {
        {"\"sandbox\":{\"network\":\"host\"}", "spec.sandbox.network"},
        {"\"sandbox\":{\"allowedHosts\":\"a.com\"}", "spec.sandbox.allowedHosts"},
        {"\"sandbox\":{\"allowedHosts\":[\"a b\"]}", "spec.sandbox.allowedHosts[0]"},
        {"\"sandbox\":{\"allowedHosts\":[\"\"]}", "spec.sandbox.allowedHosts[0]"},
        {"\"sandbox\":{\"allowedHosts\":[\"a/b\"]}", "spec.sandbox.allowedHosts[0]"},
        {"\"runner\":{\"command\":7}", "spec.runner.command"},
        {"\"runner\":{\"shell\":\"sh\"}", "spec.runner.shell"},
        {"\"runner\":{\"verifyCommand\":[]}", "spec.runner.verifyCommand"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char doc[512];
        struct err e = {0};
        snprintf(doc, sizeof(doc),
                 "{\"metadata\":{\"name\":\"t\"},\"spec\":{\"objective\":\"x\",%s}}", bad[i][0]);
        CHECK_EQ_INT(normalize_str(&out, doc, &e), E_INVALID);
        CHECK_EQ_STR(e.field, bad[i][1]);
    }
}

/* The stored metadata keeps one key order (name, namespace, labels, annotations) whatever
 * order the client sent: stored documents and API answers stay byte-stable. */
TEST(normalize_metadata_key_order)
{
    json_t *out = NULL;
    char *s;

    CHECK_OK(normalize_str(&out,
                           "{\"metadata\":{\"annotations\":{\"a\":\"b\"},\"labels\":{\"l\":\"m\"},"
                           "\"name\":\"t\"},\"spec\":{\"objective\":\"x\"}}",
                           NULL));
    s = json_dumps(json_object_get(out, "metadata"), JSON_COMPACT);
    CHECK_EQ_STR(s, "{\"name\":\"t\",\"namespace\":\"default\",\"labels\":{\"l\":\"m\"},"
                    "\"annotations\":{\"a\":\"b\"}}");
    free(s);
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
        {"{\"metadata\":{\"name\":"
         "\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"},"
         "\"spec\":{\"objective\":\"x\"}}",
         "metadata.name"},
        {"{\"metadata\":{\"name\":\"a\"},\"spec\":{}}", "spec.objective"},
        {"{\"metadata\":{\"name\":\"a\"}}", "spec"},
        {"{\"metadata\":{\"name\":\"a\"},\"spec\":{\"objective\":\"x\",\"budgetUSD\":\"1.0000001\"}"
         "}",
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
        {"{\"metadata\":{\"name\":\"a\"},\"spec\":{\"objective\":\"x\",\"sandbox\":{\"provider\":"
         "\"vm\"}}}",
         "spec.sandbox.provider"},
        {"{\"metadata\":{\"name\":\"a\"},\"spec\":{\"objective\":\"x\",\"repository\":{\"url\":3}}"
         "}",
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

TEST(store_create_get_conflict)
{
    struct task_store *st = open_mem();
    json_t *t = new_task("a"), *stored = NULL, *got = NULL, *dup = NULL;
    struct err err = {0};

    CHECK_OK(task_store_create(&stored, st, t, &err));
    if (store_is_kube()) {
        /* the API server's counter: create and its status write are two versions */
        store_backend_note("resourceVersion of the first task is 1", "the API server's counter");
        CHECK(json_string_value(
                  json_object_get(json_object_get(stored, "metadata"), "resourceVersion")) != NULL);
    } else {
        CHECK_EQ_STR(json_string_value(
                         json_object_get(json_object_get(stored, "metadata"), "resourceVersion")),
                     "1");
    }
    CHECK_EQ_INT(task_store_create(&dup, st, t, &err), E_CONFLICT);
    CHECK_OK(task_store_get(&got, st, "default", "a", &err));
    CHECK(json_equal(got, stored));
    CHECK_EQ_INT(task_store_get(&dup, st, "default", "zz", &err), E_NOTFOUND);
    json_decref(t);
    json_decref(stored);
    json_decref(got);
    task_store_close(st);
}

static int keep_text(const char *json, size_t len, void *userdata)
{
    json_t **out = userdata;

    CHECK_EQ_INT((int)strlen(json), (int)len);
    *out = json_loadb(json, len, 0, NULL);
    return E_OK;
}

/* The text GET (no parse) answers the same object as the parsed one, and E_NOTFOUND. */
TEST(store_get_text_is_the_stored_task)
{
    struct task_store *st = open_mem();
    json_t *t = new_task("a"), *stored = NULL, *got = NULL;
    struct err err = {0};

    CHECK_OK(task_store_create(&stored, st, t, &err));
    json_decref(stored);
    stored = NULL;
    CHECK_OK(task_store_get(&stored, st, "default", "a", &err));
    CHECK_OK(task_store_get_text(st, "default", "a", keep_text, &got, &err));
    CHECK(got != NULL && json_equal(got, stored));
    CHECK_EQ_INT(task_store_get_text(st, "default", "zz", keep_text, &got, &err), E_NOTFOUND);
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
    struct patch_ud p1 = {load("{\"spec\":{\"objective\":\"y\"}}"), TASK_PATCH_MAIN};

    CHECK_OK(task_store_create(&stored, st, t, &err));
    /* the resourceVersion the task was created with (SQLite: "1") */
    json_object_set_new(
        p1.patch, "metadata",
        json_pack("{s:O}", "resourceVersion",
                  json_object_get(json_object_get(stored, "metadata"), "resourceVersion")));
    CHECK_OK(task_store_mutate(&after, st, "default", "a", apply_patch, &p1, &err));
    CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(after, "spec"), "objective")),
                 "y");
    CHECK_EQ_INT(
        json_integer_value(json_object_get(json_object_get(after, "metadata"), "generation")), 2);
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

TEST(watch_feed_and_delete)
{
    struct task_store *st = open_mem();
    json_t *a = new_task("a"), *b = new_task("b"), *o = NULL, *items = NULL;
    int counts[3] = {0};
    int64_t last = 0, rv = 0, since = 0;
    struct err err = {0};

    CHECK_OK(task_store_list(&items, &since, st, NULL, &err)); /* SQLite: 0 */
    json_decref(items);
    items = NULL;
    CHECK_OK(task_store_create(&o, st, a, &err));
    json_decref(o);
    CHECK_OK(task_store_create(&o, st, b, &err));
    json_decref(o);
    CHECK_OK(task_store_remove(NULL, st, "default", "a", 0, &err));
    CHECK_OK(task_store_watch(&last, st, NULL, since, 100, count_events, counts, &err));
    CHECK_EQ_INT(counts[TASK_EVENT_ADDED], 2);
    CHECK_EQ_INT(counts[TASK_EVENT_DELETED], 1);
    CHECK_OK(task_store_list(&items, &rv, st, "default", &err));
    CHECK_EQ_INT(json_array_size(items), 1);
    CHECK_EQ_INT(rv, last);
    if (store_is_kube()) {
        /* each create is two versions (object, then its status: a MODIFIED event) */
        store_backend_note("feed rv 3 after three changes", "rv is the API server's counter");
        CHECK_EQ_INT(counts[TASK_EVENT_MODIFIED], 2);
    } else {
        CHECK_EQ_INT(last, 3);
    }
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
    CHECK_EQ_STR(
        json_string_value(json_object_get(json_object_get(o, "metadata"), "resourceVersion")), "1");
    CHECK_OK(task_store_count_phases(counts, st, &err));
    CHECK_EQ_INT(counts[TASK_PENDING], 1);
    json_decref(o);
    json_decref(a);
    task_store_close(st);
    store_unlink_db(path);
}

T_MAIN
