/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests of the durable inbox and outbox: deduplication, order per PR, retries,
 * coalescing, and exactly-once marking inside a transaction. */
#include <stdlib.h>

#include "store/store.h"
#include "tests/t_check.h"
#include "tests/unit/store_fixture.h"

static struct inbox_entry entry(const char *delivery, int64_t number, const char *comment)
{
    struct inbox_entry e;
    memset(&e, 0, sizeof(e));
    snprintf(e.provider, sizeof(e.provider), "github");
    e.delivery_id = (char *)(uintptr_t)delivery;
    e.project = (char *)(uintptr_t) "octo/repo";
    e.number = number;
    e.comment_id = (char *)(uintptr_t)comment;
    e.author = (char *)(uintptr_t) "alice";
    e.body = (char *)(uintptr_t) "/diverge help";
    return e;
}

TEST(inbox_dedup_by_delivery_and_comment)
{
    struct task_store *st = open_mem();
    struct inbox_entry e = entry("d1", 7, "c1");
    bool dup = true;
    int64_t depth;

    CHECK_OK(task_store_inbox_add(&dup, st, &e, NULL));
    CHECK(!dup);
    CHECK_OK(task_store_inbox_add(&dup, st, &e, NULL));
    CHECK(dup);
    e = entry("d2", 7, "c1"); /* redelivery with a new id, same comment */
    CHECK_OK(task_store_inbox_add(&dup, st, &e, NULL));
    CHECK(dup);
    e = entry("d1", 8, "c9"); /* same delivery id */
    CHECK_OK(task_store_inbox_add(&dup, st, &e, NULL));
    CHECK(dup);
    CHECK_OK(task_store_inbox_depth(&depth, st, NULL));
    CHECK_EQ_INT(depth, 1);
    task_store_close(st);
}

static int mark_done(struct task_txn *tx, void *ud)
{
    return task_txn_inbox_done(tx, *(int64_t *)ud, NULL);
}

TEST(inbox_order_per_pr_and_retry)
{
    struct task_store *st = open_mem();
    struct inbox_entry a = entry("d1", 7, "c1"), b = entry("d2", 7, "c2"), c = entry("d3", 8, "c3");
    struct inbox_entry got;
    bool dup;
    int64_t wait, id_a;

    CHECK_OK(task_store_inbox_add(&dup, st, &a, NULL));
    CHECK_OK(task_store_inbox_add(&dup, st, &b, NULL));
    CHECK_OK(task_store_inbox_add(&dup, st, &c, NULL));
    CHECK_OK(task_store_inbox_next(&got, &wait, st, NULL));
    CHECK_EQ_STR(got.comment_id, "c1");
    id_a = got.id;
    inbox_entry_cleanup(&got);
    /* c1 fails transiently: PR 7 waits (c2 may not overtake it), PR 8 goes on. */
    CHECK_OK(task_store_inbox_retry(st, id_a, 60000, false, "github unreachable", NULL));
    CHECK_OK(task_store_inbox_next(&got, &wait, st, NULL));
    CHECK_EQ_STR(got.comment_id, "c3");
    int64_t id_c = got.id;
    inbox_entry_cleanup(&got);
    CHECK_OK(task_store_txn(st, mark_done, &id_c, NULL));
    CHECK_EQ_INT(task_store_inbox_next(&got, &wait, st, NULL), E_NOTFOUND);
    CHECK(wait > 50000 && wait <= 60000);
    /* Giving up on c1 unblocks c2. */
    CHECK_OK(task_store_inbox_retry(st, id_a, 0, true, "gave up", NULL));
    CHECK_OK(task_store_inbox_next(&got, &wait, st, NULL));
    CHECK_EQ_STR(got.comment_id, "c2");
    CHECK_EQ_INT(got.attempts, 0);
    inbox_entry_cleanup(&got);
    task_store_close(st);
}

static int64_t manual_now(void *ud)
{
    return *(int64_t *)ud;
}

/* Applied entries are kept so that redeliveries stay duplicates: on SQLite for good, on
 * Kubernetes (one ConfigMap each) for KST_INBOX_KEEP_MS (7 days), then collected. */
TEST(done_inbox_entries_kept_then_collected)
{
    int64_t now = clock_now_ms(clock_system());
    struct clock manual = {.now_ms = manual_now, .userdata = &now};
    struct task_store *st = open_mem_clock(&manual);
    struct inbox_entry e = entry("d1", 7, "c1"), got;
    bool dup = false;
    int64_t wait, id;

    CHECK_OK(task_store_inbox_add(&dup, st, &e, NULL));
    CHECK_OK(task_store_inbox_next(&got, &wait, st, NULL));
    id = got.id;
    inbox_entry_cleanup(&got);
    CHECK_OK(task_store_txn(st, mark_done, &id, NULL));
    now += 24LL * 3600 * 1000; /* a day later: a redelivery is still a duplicate */
    CHECK_EQ_INT(task_store_inbox_next(&got, &wait, st, NULL), E_NOTFOUND);
    CHECK_OK(task_store_inbox_add(&dup, st, &e, NULL));
    CHECK(dup);
    now += 7LL * 24 * 3600 * 1000; /* eight days later */
    CHECK_EQ_INT(task_store_inbox_next(&got, &wait, st, NULL), E_NOTFOUND);
    if (store_is_kube()) {
        store_backend_note("applied inbox entries kept for good", "collected after 7 days");
        for (int i = 0; i < 1000; i++) { /* until the cache saw the deletion */
            CHECK_OK(task_store_inbox_add(&dup, st, &e, NULL));
            if (!dup) {
                break;
            }
            fixture_sleep_ms(10);
        }
        CHECK(!dup);
    } else {
        CHECK_OK(task_store_inbox_add(&dup, st, &e, NULL));
        CHECK(dup);
    }
    task_store_close(st);
}

struct rerun_ud {
    struct task_store *st;
    int runs;
};

static int bump(json_t *doc, struct err *err, void *ud)
{
    (void)err;
    (void)ud;
    json_object_set_new(json_object_get(doc, "status"), "iteration", json_integer(7));
    return E_OK;
}

/* Adds a reply and changes task "r"; on its first run another writer changes "r" first, so
 * the Kubernetes commit is stale (409) and the function runs again. */
static int reply_and_put(struct task_txn *tx, void *ud)
{
    struct rerun_ud *u = ud;
    struct outbox_entry e;
    json_t *doc = NULL;
    int rc;

    memset(&e, 0, sizeof(e));
    snprintf(e.provider, sizeof(e.provider), "github");
    snprintf(e.kind, sizeof(e.kind), "comment");
    e.project = (char *)(uintptr_t) "octo/repo";
    e.number = 7;
    e.body = (char *)(uintptr_t) "done";
    rc = task_txn_get(&doc, tx, "default", "r", NULL);
    if (rc == E_OK) {
        rc = task_txn_outbox_add(NULL, tx, &e, NULL);
    }
    if (rc == E_OK && u->runs++ == 0) {
        rc = task_store_mutate(NULL, u->st, "default", "r", bump, NULL, NULL);
    }
    if (rc == E_OK) {
        json_object_set_new(json_object_get(doc, "spec"), "objective", json_string("y"));
        rc = task_txn_put(tx, doc, NULL);
    }
    json_decref(doc);
    return rc;
}

/* A transaction whose task write was stale runs again; what it queued is written once. */
TEST(rerun_transaction_queues_once)
{
    struct task_store *st = open_mem();
    struct rerun_ud u = {.st = st};
    json_t *t = new_task("r"), *o = NULL;
    int64_t depth = 0;

    if (!store_is_kube()) {
        /* one writer at a time: a SQLite transaction never runs twice (and a write from
         * inside it would wait for itself) */
        store_backend_note("rerun transaction", "no reruns on sqlite");
        json_decref(t);
        task_store_close(st);
        return;
    }
    CHECK_OK(task_store_create(&o, st, t, NULL));
    json_decref(o);
    CHECK_OK(task_store_txn(st, reply_and_put, &u, NULL));
    CHECK_EQ_INT(u.runs, 2);
    CHECK_OK(task_store_outbox_depth(&depth, st, NULL));
    CHECK_EQ_INT(depth, 1);
    CHECK_OK(task_store_get(&o, st, "default", "r", NULL));
    CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(o, "spec"), "objective")), "y");
    CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(o, "status"), "iteration")), 7);
    json_decref(o);
    json_decref(t);
    task_store_close(st);
}

struct out_ud {
    const char *key;
    const char *body;
    int64_t id;
};

static int add_out(struct task_txn *tx, void *ud)
{
    struct out_ud *u = ud;
    struct outbox_entry e;
    memset(&e, 0, sizeof(e));
    snprintf(e.provider, sizeof(e.provider), "github");
    snprintf(e.kind, sizeof(e.kind), "edit");
    e.project = (char *)(uintptr_t) "octo/repo";
    e.number = 7;
    e.target = (char *)(uintptr_t) "55";
    e.body = (char *)(uintptr_t)u->body;
    e.coalesce_key = (char *)(uintptr_t)u->key;
    return task_txn_outbox_add(&u->id, tx, &e, NULL);
}

TEST(outbox_coalesces_pending_edits)
{
    struct task_store *st = open_mem();
    struct out_ud u1 = {"sticky/default/t", "v1", 0}, u2 = {"sticky/default/t", "v2", 0};
    struct out_ud u3 = {NULL, "reply", 0};
    struct outbox_entry got;
    int64_t wait, depth;
    char *result = NULL, state[16];

    CHECK_OK(task_store_txn(st, add_out, &u1, NULL));
    CHECK_OK(task_store_txn(st, add_out, &u2, NULL));
    CHECK_EQ_INT(u1.id, u2.id); /* the newer body replaced the pending one */
    CHECK_OK(task_store_txn(st, add_out, &u3, NULL));
    CHECK_OK(task_store_outbox_depth(&depth, st, NULL));
    CHECK_EQ_INT(depth, 2);
    CHECK_OK(task_store_outbox_next(&got, &wait, st, NULL));
    CHECK_EQ_STR(got.body, "v2");
    CHECK_OK(task_store_outbox_done(st, got.id, "12345", NULL));
    CHECK_OK(task_store_outbox_result(&result, state, st, got.id, NULL));
    CHECK_EQ_STR(state, "done");
    CHECK_EQ_STR(result, "12345");
    free(result);
    outbox_entry_cleanup(&got);
    /* Once sent, a new edit is a new entry. */
    CHECK_OK(task_store_txn(st, add_out, &u1, NULL));
    CHECK(u1.id != u2.id);
    task_store_close(st);
}

struct reply_ud {
    int64_t inbox_id;
};

/* What a bot step does for one inbox entry: a reaction, a reply, the entry marked done. */
static int reply_and_done(struct task_txn *tx, void *ud)
{
    const struct reply_ud *u = ud;
    struct outbox_entry e;
    int rc;

    memset(&e, 0, sizeof(e));
    snprintf(e.provider, sizeof(e.provider), "github");
    snprintf(e.kind, sizeof(e.kind), "react");
    e.project = (char *)(uintptr_t) "octo/repo";
    e.number = 7;
    e.target = (char *)(uintptr_t) "c1";
    e.body = (char *)(uintptr_t) "+1";
    rc = task_txn_outbox_add(NULL, tx, &e, NULL);
    snprintf(e.kind, sizeof(e.kind), "comment");
    e.target = NULL;
    e.body = (char *)(uintptr_t) "status: running";
    if (rc == E_OK) {
        rc = task_txn_outbox_add(NULL, tx, &e, NULL);
    }
    return rc == E_OK ? task_txn_inbox_done(tx, u->inbox_id, NULL) : rc;
}

/* The next leader runs the same inbox entry again when the last one died after queueing
 * its replies but before the entry's done mark: the replies are queued once, and a reply
 * already sent is not sent again. */
TEST(inbox_rerun_after_handover_queues_replies_once)
{
    struct task_store *st = open_mem();
    struct inbox_entry a = entry("d1", 7, "c1"), got;
    struct outbox_entry o;
    struct reply_ud u;
    int64_t wait, depth = 0;
    bool dup;

    if (!store_is_kube()) {
        /* the replies and the done mark commit together: no rerun after a crash */
        store_backend_note("inbox rerun", "atomic on sqlite");
        task_store_close(st);
        return;
    }
    CHECK_OK(task_store_inbox_add(&dup, st, &a, NULL));
    CHECK_OK(task_store_inbox_next(&got, &wait, st, NULL));
    u.inbox_id = got.id;
    inbox_entry_cleanup(&got);
    CHECK_OK(task_store_txn(st, reply_and_done, &u, NULL));
    CHECK_OK(task_store_outbox_depth(&depth, st, NULL));
    CHECK_EQ_INT(depth, 2);
    /* as if the done mark had not been written: the entry is due again */
    CHECK_OK(task_store_inbox_retry(st, u.inbox_id, 0, false, "handover", NULL));
    CHECK_OK(task_store_inbox_next(&got, &wait, st, NULL));
    CHECK_EQ_INT(got.id, u.inbox_id);
    inbox_entry_cleanup(&got);
    CHECK_OK(task_store_txn(st, reply_and_done, &u, NULL));
    CHECK_OK(task_store_outbox_depth(&depth, st, NULL));
    CHECK_EQ_INT(depth, 2);
    /* both replies sent; a third run queues nothing new */
    for (int i = 0; i < 2; i++) {
        CHECK_OK(task_store_outbox_next(&o, &wait, st, NULL));
        CHECK_OK(task_store_outbox_done(st, o.id, "1", NULL));
        outbox_entry_cleanup(&o);
    }
    CHECK_OK(task_store_inbox_retry(st, u.inbox_id, 0, false, "handover", NULL));
    CHECK_OK(task_store_txn(st, reply_and_done, &u, NULL));
    CHECK_OK(task_store_outbox_depth(&depth, st, NULL));
    CHECK_EQ_INT(depth, 0);
    CHECK(task_store_outbox_next(&o, &wait, st, NULL) == E_NOTFOUND);
    outbox_entry_cleanup(&o);
    task_store_close(st);
}

/* A bot step that raises the task's budget (not idempotent) and replies. */
static int bump_and_reply(struct task_txn *tx, void *ud)
{
    json_t *doc = NULL, *spec;
    int rc = task_txn_get(&doc, tx, "default", "b", NULL);

    if (rc != E_OK) {
        return rc;
    }
    spec = json_object_get(doc, "spec");
    json_object_set_new(
        spec, "budgetTokens",
        json_integer(json_integer_value(json_object_get(spec, "budgetTokens")) + 1000));
    rc = task_txn_put(tx, doc, NULL);
    json_decref(doc);
    return rc == E_OK ? reply_and_done(tx, ud) : rc;
}

static json_int_t budget_tokens(struct task_store *st)
{
    json_t *o = NULL;
    json_int_t n;

    CHECK_OK(task_store_get(&o, st, "default", "b", NULL));
    n = json_integer_value(json_object_get(json_object_get(o, "spec"), "budgetTokens"));
    json_decref(o);
    return n;
}

/* The next leader reruns an inbox entry whose step was written (task and replies) but not
 * marked done: the task change is recognised as applied, not made twice; another entry's
 * step still changes the task. */
TEST(inbox_rerun_after_handover_changes_task_once)
{
    struct task_store *st = open_mem();
    struct inbox_entry a = entry("d1", 7, "c1"), b = entry("d2", 7, "c2"), got;
    struct reply_ud u, v;
    json_t *t = new_task("b"), *o = NULL;
    int64_t wait, depth = 0;
    json_int_t before;
    bool dup;

    if (!store_is_kube()) {
        store_backend_note("inbox rerun", "atomic on sqlite");
        json_decref(t);
        task_store_close(st);
        return;
    }
    CHECK_OK(task_store_create(&o, st, t, NULL));
    json_decref(o);
    before = budget_tokens(st);
    CHECK_OK(task_store_inbox_add(&dup, st, &a, NULL));
    CHECK_OK(task_store_inbox_add(&dup, st, &b, NULL));
    CHECK_OK(task_store_inbox_next(&got, &wait, st, NULL));
    u.inbox_id = got.id;
    inbox_entry_cleanup(&got);
    CHECK_OK(task_store_txn(st, bump_and_reply, &u, NULL));
    CHECK_EQ_INT(budget_tokens(st), before + 1000);
    CHECK_OK(task_store_inbox_retry(st, u.inbox_id, 0, false, "handover", NULL));
    CHECK_OK(task_store_txn(st, bump_and_reply, &u, NULL));
    CHECK_EQ_INT(budget_tokens(st), before + 1000);
    CHECK_OK(task_store_outbox_depth(&depth, st, NULL));
    CHECK_EQ_INT(depth, 2);
    CHECK_OK(task_store_inbox_next(&got, &wait, st, NULL)); /* the second comment */
    CHECK(got.id != u.inbox_id);
    v.inbox_id = got.id;
    inbox_entry_cleanup(&got);
    CHECK_OK(task_store_txn(st, bump_and_reply, &v, NULL));
    CHECK_EQ_INT(budget_tokens(st), before + 2000);
    CHECK_OK(task_store_outbox_depth(&depth, st, NULL));
    CHECK_EQ_INT(depth, 4);
    json_decref(t);
    task_store_close(st);
}

T_MAIN
