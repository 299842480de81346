/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests of store/store_env.c (Environments written inside task transactions, deleted
 * with their owner task) and of the local PR threads (store_local.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/store.h"
#include "tests/t_check.h"
#include "tests/unit/store_fixture.h"

struct env_ud {
    const char *name, *owner_uid, *note;
};

static int put_env(struct task_txn *tx, void *userdata)
{
    struct env_ud *u = userdata;
    json_t *env = json_pack("{s:s, s:s, s:{s:s, s:s, s:[{s:s, s:s}], s:{s:s}}}", "apiVersion",
                            TASK_API_VERSION, "kind", TASK_ENV_KIND, "metadata", "name", u->name,
                            "namespace", "default", "ownerReferences", "kind", "AgentTask", "uid",
                            u->owner_uid, "annotations", "note", u->note);
    int rc = task_txn_env_put(tx, env, NULL);

    json_decref(env);
    return rc;
}

static int put_env_then_fail(struct task_txn *tx, void *userdata)
{
    int rc = put_env(tx, userdata);
    return rc == E_OK ? E_FAIL : rc;
}

static const char *field(const json_t *obj, const char *a, const char *b)
{
    return json_string_value(json_object_get(json_object_get(obj, a), b));
}

TEST(env_put_get_update_rollback)
{
    struct task_store *st = open_mem();
    struct env_ud u = {"agent-preview-a", "uid-a", "one"};
    json_t *e1 = NULL, *e2 = NULL, *items = NULL;
    struct err err = {0};

    CHECK_OK(task_store_txn(st, put_env, &u, &err));
    CHECK_OK(task_store_env_get(&e1, st, "default", "agent-preview-a", &err));
    if (!store_is_kube()) {
        CHECK_EQ_STR(field(e1, "metadata", "resourceVersion"), "1");
    } else {
        store_backend_note("first Environment rv is 1", "the API server's counter");
    }
    CHECK(field(e1, "metadata", "uid") != NULL);
    CHECK(field(e1, "metadata", "creationTimestamp") != NULL);
    u.note = "two";
    CHECK_OK(task_store_txn(st, put_env, &u, &err));
    CHECK_OK(task_store_env_get(&e2, st, "default", "agent-preview-a", &err));
    if (!store_is_kube()) {
        CHECK_EQ_STR(field(e2, "metadata", "resourceVersion"), "2");
    }
    CHECK(strcmp(field(e2, "metadata", "resourceVersion"),
                 field(e1, "metadata", "resourceVersion")) != 0);
    CHECK_EQ_STR(field(e2, "metadata", "uid"), field(e1, "metadata", "uid"));
    CHECK_EQ_STR(field(e2, "metadata", "creationTimestamp"),
                 field(e1, "metadata", "creationTimestamp"));
    CHECK_EQ_STR(json_string_value(json_object_get(
                     json_object_get(json_object_get(e2, "metadata"), "annotations"), "note")),
                 "two");
    char *rv2 = xstrdup(field(e2, "metadata", "resourceVersion"));
    json_decref(e2);
    e2 = NULL;
    /* A transaction that fails leaves the Environment as it was. */
    u.note = "three";
    CHECK(task_store_txn(st, put_env_then_fail, &u, &err) != E_OK);
    CHECK_OK(task_store_env_get(&e2, st, "default", "agent-preview-a", &err));
    CHECK_EQ_STR(field(e2, "metadata", "resourceVersion"), rv2);
    free(rv2);
    CHECK_OK(task_store_env_list(&items, st, "default", &err));
    CHECK_EQ_INT(json_array_size(items), 1);
    json_decref(items);
    json_decref(e1);
    json_decref(e2);
    task_store_close(st);
}

/* Deleting a task deletes the Environments it owns (by uid), and no other. */
TEST(env_deleted_with_owner_task)
{
    struct task_store *st = open_mem();
    json_t *t = new_task("a"), *stored = NULL, *e = NULL, *other = NULL;
    struct err err = {0};

    CHECK_OK(task_store_create(&stored, st, t, &err));
    struct env_ud mine = {"agent-preview-a", field(stored, "metadata", "uid"), "x"};
    struct env_ud theirs = {"agent-preview-b", "someone-else", "y"};
    CHECK_OK(task_store_txn(st, put_env, &mine, &err));
    CHECK_OK(task_store_txn(st, put_env, &theirs, &err));
    CHECK_OK(task_store_remove(NULL, st, "default", "a", 0, &err));
    CHECK_EQ_INT(task_store_env_get(&e, st, "default", "agent-preview-a", &err), E_NOTFOUND);
    CHECK_OK(task_store_env_get(&other, st, "default", "agent-preview-b", &err));
    json_decref(e);
    json_decref(other);
    json_decref(stored);
    json_decref(t);
    task_store_close(st);
}

static int delete_env(struct task_txn *tx, void *userdata)
{
    return task_txn_env_delete(tx, "default", userdata, NULL);
}

TEST(env_delete)
{
    struct task_store *st = open_mem();
    struct env_ud u = {"agent-preview-c", "uid-c", "z"};
    json_t *e = NULL;
    struct err err = {0};
    char name[] = "agent-preview-c";

    CHECK_OK(task_store_txn(st, put_env, &u, &err));
    CHECK_OK(task_store_txn(st, delete_env, name, &err));
    CHECK_OK(task_store_txn(st, delete_env, name, &err)); /* absent: fine */
    CHECK_EQ_INT(task_store_env_get(&e, st, "default", "agent-preview-c", &err), E_NOTFOUND);
    task_store_close(st);
}

/* A local PR is a new thread numbered after the project's last; the same marker finds it
 * again instead of opening a second. */
TEST(local_open_pull_numbers_and_dedups)
{
    struct task_store *st = open_mem();
    struct err err = {0};
    int64_t id = 0, n1 = 0, n2 = 0, n3 = 0;
    bool existed = true;
    json_t *thread = NULL;

    if (store_is_kube()) {
        /* The `local` SCM keeps its threads in the embedded store only. */
        store_backend_note("local SCM threads", "refused with E_INVALID on the kubernetes store");
        CHECK_EQ_INT(task_store_local_add(&id, st, "local/repo", 4, "alice", "hello", &err),
                     E_INVALID);
        CHECK(strstr(err.msg, "local scm") != NULL);
        CHECK_EQ_INT(task_store_local_thread(&thread, st, "local/repo", 5, &err), E_INVALID);
        task_store_close(st);
        return;
    }
    CHECK_OK(task_store_local_add(&id, st, "local/repo", 4, "alice", "hello", &err));
    CHECK_OK(task_store_local_open_pull(&n1, &existed, st, "local/repo", "<!-- k1 -->", "diverge",
                                        "PR one <!-- k1 -->", &err));
    CHECK_EQ_INT(n1, 5);
    CHECK(!existed);
    CHECK_OK(task_store_local_open_pull(&n2, &existed, st, "local/repo", "<!-- k1 -->", "diverge",
                                        "PR one again <!-- k1 -->", &err));
    CHECK_EQ_INT(n2, 5);
    CHECK(existed);
    CHECK_OK(task_store_local_open_pull(&n3, &existed, st, "local/other", "<!-- k1 -->", "diverge",
                                        "PR <!-- k1 -->", &err));
    CHECK_EQ_INT(n3, 1); /* per project */
    CHECK(!existed);
    CHECK_OK(task_store_local_thread(&thread, st, "local/repo", 5, &err));
    CHECK_EQ_INT(json_array_size(thread), 1);
    CHECK_EQ_STR(json_string_value(json_object_get(json_array_get(thread, 0), "author")),
                 "diverge");
    CHECK_EQ_STR(json_string_value(json_object_get(json_array_get(thread, 0), "body")),
                 "PR one <!-- k1 -->");
    json_decref(thread);
    task_store_close(st);
}

T_MAIN
