/* SPDX-License-Identifier: Apache-2.0 */
/* SpendQuotas through the task store (SPEC §15): the transaction operations routed to the
 * backend, and the API's create, read, change and delete, each one transaction, so a
 * change never interleaves with a meter charge of the same namespace. */
#include <stdlib.h>
#include <string.h>

#include "store/quota.h"
#include "store/store_backend.h"

int task_txn_quota_list(json_t **items_out, struct task_txn *tx, const char *ns, struct err *err)
{
    return tx->st->xops->txn_quota_list(items_out, tx, ns, err);
}

int task_txn_quota_put(struct task_txn *tx, json_t *q, struct err *err)
{
    return tx->st->xops->txn_quota_put(tx, q, err);
}

int task_txn_quota_delete(struct task_txn *tx, const char *ns, const char *name, struct err *err)
{
    return tx->st->xops->txn_quota_delete(tx, ns, name, err);
}

/* The quota NAME of the array ITEMS (borrowed), or NULL. */
static json_t *find_named(const json_t *items, const char *name)
{
    json_t *q;
    size_t i;

    json_array_foreach(items, i, q)
    {
        const char *n = json_string_value(json_object_get(json_object_get(q, "metadata"), "name"));
        if (n != NULL && strcmp(n, name) == 0) {
            return q;
        }
    }
    return NULL;
}

static int64_t rv_of(const json_t *q)
{
    const char *rv =
        json_string_value(json_object_get(json_object_get(q, "metadata"), "resourceVersion"));

    return rv != NULL ? strtoll(rv, NULL, 10) : 0;
}

struct quota_op {
    const char *ns, *name; /* the quota (name NULL: a list) */
    const json_t *obj;     /* create: the normalized object */
    quota_mutate_fn fn;    /* mutate */
    void *userdata;        /* fn's */
    int64_t expect_rv;     /* delete's precondition, 0 none */
    json_t *out;           /* out: the object or the list */
    struct err *err;       /* out */
};

/* Runs FN in a transaction and hands op->out over only when it committed. */
static int run(json_t **out, struct task_store *st, task_txn_fn fn, struct quota_op *op,
               struct err *err)
{
    int rc = task_store_txn(st, fn, op, err);

    if (rc != E_OK) {
        json_decref(op->out);
        return rc;
    }
    if (out != NULL) {
        *out = op->out;
    } else {
        json_decref(op->out);
    }
    return E_OK;
}

/* A rerun transaction (the kube backend reruns on a conflict) starts from nothing. */
static void op_reset(struct quota_op *op)
{
    json_decref(op->out);
    op->out = NULL;
}

static int list_fn(struct task_txn *tx, void *userdata)
{
    struct quota_op *op = userdata;
    int64_t now = clock_now_ms(task_txn_clock(tx));
    json_t *q;
    size_t i;
    int rc;

    op_reset(op);
    rc = task_txn_quota_list(&op->out, tx, op->ns, op->err);

    if (rc != E_OK) {
        return rc;
    }
    json_array_foreach(op->out, i, q)
    {
        (void)quota_roll(q, now); /* shown as the meter will count it; written at its charge */
    }
    return E_OK; /* nothing written */
}

int task_store_quota_list(json_t **items_out, struct task_store *st, const char *ns,
                          struct err *err)
{
    struct quota_op op = {.ns = ns, .err = err};

    *items_out = NULL;
    return run(items_out, st, list_fn, &op, err);
}

int task_store_quota_get(json_t **out, struct task_store *st, const char *ns, const char *name,
                         struct err *err)
{
    json_t *items = NULL, *q;
    int rc = task_store_quota_list(&items, st, ns, err);

    *out = NULL;
    if (rc != E_OK) {
        return rc;
    }
    q = find_named(items, name);
    if (q == NULL) {
        json_decref(items);
        return err_set(err, E_NOTFOUND, "spendquotas \"%s\" not found", name);
    }
    *out = json_incref(q);
    json_decref(items);
    return E_OK;
}

static int create_fn(struct task_txn *tx, void *userdata)
{
    struct quota_op *op = userdata;
    json_t *items = NULL, *q;
    int rc;

    op_reset(op);
    rc = task_txn_quota_list(&items, tx, op->ns, op->err);
    if (rc != E_OK) {
        return rc;
    }
    if (find_named(items, op->name) != NULL) {
        rc = err_set(op->err, E_CONFLICT, "spendquotas \"%s\" already exists", op->name);
    } else if (json_array_size(items) >= QUOTA_PER_NAMESPACE_MAX) {
        rc = err_set_field(op->err, E_INVALID, "metadata.name",
                           "namespace %s holds %d spendquotas already", op->ns,
                           QUOTA_PER_NAMESPACE_MAX);
    } else {
        q = json_deep_copy(op->obj);
        rc = task_txn_quota_put(tx, q, op->err);
        op->out = rc == E_OK ? q : NULL;
        if (rc != E_OK) {
            json_decref(q);
        }
    }
    json_decref(items);
    return rc;
}

int task_store_quota_create(json_t **out, struct task_store *st, const json_t *obj, struct err *err)
{
    const json_t *md = json_object_get(obj, "metadata");
    struct quota_op op = {.ns = json_string_value(json_object_get(md, "namespace")),
                          .name = json_string_value(json_object_get(md, "name")),
                          .obj = obj,
                          .err = err};

    *out = NULL;
    if (op.ns == NULL || op.name == NULL) {
        return err_set(err, E_INVALID, "spendquota without metadata.namespace/name");
    }
    return run(out, st, create_fn, &op, err);
}

/* The quota OP names, read in TX: a new reference in *out, or E_NOTFOUND. */
static int read_one(json_t **out, struct task_txn *tx, struct quota_op *op)
{
    json_t *items = NULL, *q;
    int rc = task_txn_quota_list(&items, tx, op->ns, op->err);

    *out = NULL;
    if (rc != E_OK) {
        return rc;
    }
    q = find_named(items, op->name);
    if (q == NULL) {
        json_decref(items);
        return err_set(op->err, E_NOTFOUND, "spendquotas \"%s\" not found", op->name);
    }
    *out = json_incref(q);
    json_decref(items);
    return E_OK;
}

static int mutate_fn(struct task_txn *tx, void *userdata)
{
    struct quota_op *op = userdata;
    json_t *q = NULL;
    int rc;

    op_reset(op);
    rc = read_one(&q, tx, op);

    if (rc == E_OK) {
        (void)quota_roll(q, clock_now_ms(task_txn_clock(tx)));
        rc = op->fn(q, op->err, op->userdata);
    }
    if (rc == E_OK) {
        rc = quota_validate(q, op->err);
    }
    if (rc == E_OK) {
        rc = task_txn_quota_put(tx, q, op->err);
    }
    if (rc == E_OK) {
        op->out = q;
    } else {
        json_decref(q);
    }
    return rc;
}

int task_store_quota_mutate(json_t **out, struct task_store *st, const char *ns, const char *name,
                            quota_mutate_fn fn, void *userdata, struct err *err)
{
    struct quota_op op = {.ns = ns, .name = name, .fn = fn, .userdata = userdata, .err = err};

    *out = NULL;
    return run(out, st, mutate_fn, &op, err);
}

static int delete_fn(struct task_txn *tx, void *userdata)
{
    struct quota_op *op = userdata;
    json_t *q = NULL;
    int rc;

    op_reset(op);
    rc = read_one(&q, tx, op);

    if (rc == E_OK && op->expect_rv > 0 && rv_of(q) != op->expect_rv) {
        rc =
            err_set(op->err, E_CONFLICT,
                    "spendquotas \"%s\": the object has been modified (resourceVersion)", op->name);
    }
    if (rc == E_OK) {
        rc = task_txn_quota_delete(tx, op->ns, op->name, op->err);
    }
    if (rc == E_OK) {
        op->out = q;
    } else {
        json_decref(q);
    }
    return rc;
}

int task_store_quota_delete(json_t **last_out, struct task_store *st, const char *ns,
                            const char *name, int64_t expect_rv, struct err *err)
{
    struct quota_op op = {.ns = ns, .name = name, .expect_rv = expect_rv, .err = err};

    *last_out = NULL;
    return run(last_out, st, delete_fn, &op, err);
}
