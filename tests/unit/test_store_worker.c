/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests of the one background-worker shape (store_worker): a queue worker drains the
 * inbox and wakes for new entries; a feed worker resyncs first, then applies the newest
 * state of each changed task that it wants; stopping joins the thread. */
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "store/store.h"
#include "tests/t_check.h"
#include "tests/unit/store_fixture.h"

/* How long a test waits for the worker before calling it stuck (a liveness bound, not a
 * latency threshold: the worker normally answers within milliseconds). */
#define WAIT_LIMIT_S 20

struct seen {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int resyncs;         /* feed: resync calls */
    int listed;          /* feed: tasks seen by the first resync */
    int steps_done;      /* queue: entries marked done */
    char applied[8][64]; /* feed: "name=objective" in apply order */
    int n_applied;
    struct task_store *st;
};

static void seen_init(struct seen *s, struct task_store *st)
{
    memset(s, 0, sizeof(*s));
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->st = st;
}

static void seen_cleanup(struct seen *s)
{
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
}

/* Waits until PRED(S) holds; false after WAIT_LIMIT_S. */
static bool wait_for(struct seen *s, bool (*pred)(const struct seen *))
{
    struct timespec until;
    bool ok;

    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += WAIT_LIMIT_S;
    pthread_mutex_lock(&s->mu);
    while (!(ok = pred(s))) {
        if (pthread_cond_timedwait(&s->cv, &s->mu, &until) != 0) {
            ok = pred(s);
            break;
        }
    }
    pthread_mutex_unlock(&s->mu);
    return ok;
}

/* --- queue worker ------------------------------------------------------------------ */

static int mark_done(struct task_txn *tx, void *ud)
{
    return task_txn_inbox_done(tx, *(int64_t *)ud, NULL);
}

static int64_t drain_step(void *userdata)
{
    struct seen *s = userdata;
    struct inbox_entry e;
    int64_t wait = -1;

    if (task_store_inbox_next(&e, &wait, s->st, NULL) != E_OK) {
        return wait;
    }
    ASSERT(task_store_txn(s->st, mark_done, &e.id, NULL) == E_OK);
    inbox_entry_cleanup(&e);
    pthread_mutex_lock(&s->mu);
    s->steps_done++;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

static void add_entry(struct task_store *st, int n)
{
    struct inbox_entry e;
    char delivery[32], comment[32];
    bool dup = true;

    memset(&e, 0, sizeof(e));
    snprintf(e.provider, sizeof(e.provider), "github");
    snprintf(delivery, sizeof(delivery), "d%d", n);
    snprintf(comment, sizeof(comment), "c%d", n);
    e.delivery_id = delivery;
    e.comment_id = comment;
    e.project = (char *)(uintptr_t) "octo/repo";
    e.number = 7;
    e.author = (char *)(uintptr_t) "alice";
    e.body = (char *)(uintptr_t) "/diverge help";
    ASSERT(task_store_inbox_add(&dup, st, &e, NULL) == E_OK && !dup);
}

static bool three_done(const struct seen *s)
{
    return s->steps_done >= 3;
}

static bool four_done(const struct seen *s)
{
    return s->steps_done >= 4;
}

static const struct store_worker_config drain = {
    .name = "test-drain", .wake = STORE_WORKER_INBOX, .step = drain_step};

TEST(queue_worker_drains_then_wakes_for_new_entries)
{
    struct task_store *st = open_mem();
    struct store_worker *w = NULL;
    struct seen s;
    int64_t depth = -1;

    seen_init(&s, st);
    for (int i = 0; i < 3; i++) {
        add_entry(st, i);
    }
    CHECK_OK(store_worker_start(&w, st, &drain, &s, NULL));
    CHECK(wait_for(&s, three_done));
    add_entry(st, 3); /* added while the worker sleeps */
    CHECK(wait_for(&s, four_done));
    CHECK(!store_worker_stopping(w));
    store_worker_stop(w);
    CHECK_OK(task_store_inbox_depth(&depth, st, NULL));
    CHECK_EQ_INT(depth, 0);
    CHECK_EQ_INT(s.steps_done, 4);
    store_worker_stop(NULL); /* no-op */
    seen_cleanup(&s);
    task_store_close(st);
}

/* --- feed worker ------------------------------------------------------------------- */

static int64_t count_resync(void *userdata)
{
    struct seen *s = userdata;
    json_t *items = NULL;
    int64_t rv = 0;

    ASSERT(task_store_list(&items, &rv, s->st, NULL, NULL) == E_OK);
    pthread_mutex_lock(&s->mu);
    if (s->resyncs++ == 0) {
        s->listed = (int)json_array_size(items);
    }
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    json_decref(items);
    return rv;
}

static bool not_skipped(const struct task_event *ev, void *userdata)
{
    (void)userdata;
    return strcmp(ev->name, "skip") != 0;
}

static void record(const struct task_event *ev, void *userdata)
{
    struct seen *s = userdata;
    json_t *doc = json_loads(ev->json, 0, NULL);
    const char *objective =
        json_string_value(json_object_get(json_object_get(doc, "spec"), "objective"));

    pthread_mutex_lock(&s->mu);
    if (s->n_applied < 8) {
        snprintf(s->applied[s->n_applied++], sizeof(s->applied[0]), "%s=%s", ev->name,
                 objective != NULL ? objective : "?");
    }
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    json_decref(doc);
}

static const struct store_worker_config follow = {.name = "test-feed",
                                                  .wake = STORE_WORKER_FEED,
                                                  .resync = count_resync,
                                                  .wants = not_skipped,
                                                  .apply = record};

static void create(struct task_store *st, const char *name)
{
    json_t *in = NULL, *norm = NULL, *out = NULL;
    char *text =
        xasprintf("{\"metadata\":{\"name\":\"%s\"},\"spec\":{\"objective\":\"x1\"}}", name);

    in = json_loads(text, 0, NULL);
    ASSERT(task_normalize_new(&norm, in, "default", NULL) == E_OK);
    ASSERT(task_store_create(&out, st, norm, NULL) == E_OK);
    json_decref(out);
    json_decref(norm);
    json_decref(in);
    free(text);
}

static int set_objective(json_t *doc, struct err *err, void *userdata)
{
    (void)err;
    json_object_set_new(json_object_get(doc, "spec"), "objective", json_string(userdata));
    return E_OK;
}

static bool resynced(const struct seen *s)
{
    return s->resyncs >= 1;
}

static bool has(const struct seen *s, const char *what)
{
    for (int i = 0; i < s->n_applied; i++) {
        if (strcmp(s->applied[i], what) == 0) {
            return true;
        }
    }
    return false;
}

static bool saw_a3_and_b(const struct seen *s)
{
    return has(s, "a=x3") && has(s, "b=x1");
}

TEST(feed_worker_resyncs_then_applies_newest_wanted_state)
{
    struct task_store *st = open_mem();
    struct store_worker *w = NULL;
    char x2[] = "x2", x3[] = "x3";
    struct seen s;

    seen_init(&s, st);
    create(st, "a"); /* before the start: seen by the resync, not by apply */
    CHECK_OK(store_worker_start(&w, st, &follow, &s, NULL));
    CHECK(wait_for(&s, resynced));
    CHECK_EQ_INT(s.listed, 1);
    CHECK_OK(task_store_mutate(NULL, st, "default", "a", set_objective, x2, NULL));
    CHECK_OK(task_store_mutate(NULL, st, "default", "a", set_objective, x3, NULL));
    create(st, "skip");
    create(st, "b");
    CHECK(wait_for(&s, saw_a3_and_b));
    store_worker_stop(w);
    pthread_mutex_lock(&s.mu);
    CHECK(!has(&s, "skip=x1"));
    /* The newest state of a came after any older one it was given. */
    for (int i = 0; i < s.n_applied; i++) {
        if (strcmp(s.applied[i], "a=x3") == 0) {
            for (int j = i + 1; j < s.n_applied; j++) {
                CHECK(strncmp(s.applied[j], "a=", 2) != 0);
            }
        }
    }
    pthread_mutex_unlock(&s.mu);
    seen_cleanup(&s);
    task_store_close(st);
}

/* --- one batch of many changes ----------------------------------------------------- */

#define BATCH_TASKS 60

/* What the gated feed saw: the first apply (of "gate") waits until released, so every
 * change made meanwhile reaches the worker as one batch. */
struct gated {
    struct seen s;
    bool gate_seen, released;
    int applies[BATCH_TASKS]; /* applies of t<i> after the gate */
    int last_objective[BATCH_TASKS];
    int order[BATCH_TASKS]; /* the task applied k-th after the gate */
    int n_order;
};

static int task_index(const char *name)
{
    return name[0] == 't' ? (int)strtol(name + 1, NULL, 10) : -1;
}

static void gated_apply(const struct task_event *ev, void *userdata)
{
    struct gated *g = userdata;
    json_t *doc = json_loads(ev->json, 0, NULL);
    const char *objective =
        json_string_value(json_object_get(json_object_get(doc, "spec"), "objective"));
    int i = task_index(ev->name);

    pthread_mutex_lock(&g->s.mu);
    if (strcmp(ev->name, "gate") == 0 && !g->gate_seen) {
        g->gate_seen = true;
        pthread_cond_broadcast(&g->s.cv);
        while (!g->released) {
            pthread_cond_wait(&g->s.cv, &g->s.mu);
        }
    } else if (g->gate_seen && i >= 0 && i < BATCH_TASKS) {
        g->applies[i]++;
        g->last_objective[i] = objective != NULL ? (int)strtol(objective + 1, NULL, 10) : -1;
        g->order[g->n_order++ % BATCH_TASKS] = i;
        pthread_cond_broadcast(&g->s.cv);
    }
    pthread_mutex_unlock(&g->s.mu);
    json_decref(doc);
}

static bool gate_seen(const struct seen *s)
{
    return ((const struct gated *)(const void *)s)->gate_seen;
}

static bool all_applied(const struct seen *s)
{
    const struct gated *g = (const struct gated *)(const void *)s;

    for (int i = 0; i < BATCH_TASKS; i++) {
        if (g->applies[i] == 0) {
            return false;
        }
    }
    return true;
}

static const struct store_worker_config gated_feed = {
    .name = "test-gated", .wake = STORE_WORKER_FEED, .resync = count_resync, .apply = gated_apply};

/* BATCH_TASKS tasks changed three times each, interleaved, while the feed is held: the
 * worker applies each once, its newest state, in the order of the tasks' last changes. */
TEST(feed_worker_applies_each_task_of_a_big_batch_once_newest_last)
{
    struct task_store *st = open_mem();
    struct store_worker *w = NULL;
    struct gated g;
    char objectives[3][4] = {"x1", "x2", "x3"};
    char name[16];

    memset(&g, 0, sizeof(g));
    seen_init(&g.s, st);
    CHECK_OK(store_worker_start(&w, st, &gated_feed, &g, NULL));
    CHECK(wait_for(&g.s, resynced));
    create(st, "gate");
    CHECK(wait_for(&g.s, gate_seen));
    for (int i = 0; i < BATCH_TASKS; i++) {
        snprintf(name, sizeof(name), "t%d", i);
        create(st, name); /* objective x1 */
    }
    for (int round = 1; round < 3; round++) {
        /* The last round goes backwards: the newest changes come in reverse order. */
        for (int k = 0; k < BATCH_TASKS; k++) {
            int i = round == 2 ? BATCH_TASKS - 1 - k : k;
            snprintf(name, sizeof(name), "t%d", i);
            CHECK_OK(task_store_mutate(NULL, st, "default", name, set_objective, objectives[round],
                                       NULL));
        }
    }
    pthread_mutex_lock(&g.s.mu);
    g.released = true;
    pthread_cond_broadcast(&g.s.cv);
    pthread_mutex_unlock(&g.s.mu);
    CHECK(wait_for(&g.s, all_applied));
    store_worker_stop(w);
    for (int i = 0; i < BATCH_TASKS; i++) {
        CHECK_EQ_INT(g.applies[i], 1);
        CHECK_EQ_INT(g.last_objective[i], 3);
        CHECK_EQ_INT(g.order[i], BATCH_TASKS - 1 - i);
    }
    seen_cleanup(&g.s);
    task_store_close(st);
}

T_MAIN
