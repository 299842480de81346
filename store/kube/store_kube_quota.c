/* SPDX-License-Identifier: Apache-2.0 */
/* SpendQuotas in the Kubernetes backend (SPEC §15): custom resources
 * divergedev.com/v1alpha1 spendquotas, read fresh by a transaction and written at its
 * commit before the tasks, each write guarded by the resourceVersion the transaction read
 * (a stale one reruns the transaction, which reads again). */
#include <stdlib.h>
#include <string.h>

#include "store/kube/store_kube_int.h"

static char *key_of(const json_t *q)
{
    const json_t *md = json_object_get(q, "metadata");

    return xasprintf("%s/%s", json_string_value(json_object_get(md, "namespace")),
                     json_string_value(json_object_get(md, "name")));
}

static int name_cmp(const void *a, const void *b)
{
    char *ka = key_of(*(json_t *const *)a), *kb = key_of(*(json_t *const *)b);
    int c = strcmp(ka, kb);

    free(ka);
    free(kb);
    return c;
}

/* ITEMS as this transaction sees them: QUOTAS' puts and deletes over the stored ones. */
static json_t *overlay(json_t *items, json_t *quotas, json_t *orig, const char *ns)
{
    json_t *out = json_array(), *q, *seen = json_object(), **v;
    const char *key;
    size_t i, n;

    json_array_foreach(items, i, q)
    {
        char *k = key_of(q);
        json_t *put = json_object_get(quotas, k);
        if (json_object_get(orig, k) == NULL) {
            json_object_set_new(orig, k, json_deep_copy(q));
        }
        if (put == NULL) {
            json_array_append_new(out, json_deep_copy(q));
        } else if (!json_is_null(put)) {
            json_array_append_new(out, json_deep_copy(put));
        }
        json_object_set_new(seen, k, json_true());
        free(k);
    }
    json_object_foreach(quotas, key, q)
    {
        size_t nl = ns != NULL ? strlen(ns) : 0;
        if (!json_is_null(q) && json_object_get(seen, key) == NULL &&
            (ns == NULL || (strncmp(key, ns, nl) == 0 && key[nl] == '/'))) {
            json_array_append_new(out, json_deep_copy(q));
        }
    }
    json_decref(seen);
    /* namespace, name order, as the embedded store lists them */
    n = json_array_size(out);
    v = xcalloc(n + 1, sizeof(*v));
    for (i = 0; i < n; i++) {
        v[i] = json_incref(json_array_get(out, i));
    }
    qsort(v, n, sizeof(*v), name_cmp);
    json_array_clear(out);
    for (i = 0; i < n; i++) {
        json_array_append_new(out, v[i]);
    }
    free(v);
    return out;
}

int kst_quota_list(json_t **items_out, struct kube_store *s, json_t *quotas, json_t *orig,
                   const char *ns, struct err *err)
{
    char rv[KUBE_RV_MAX];
    json_t *items = NULL;
    int rc = kube_list(&items, rv, s->c, &KUBE_SPENDQUOTAS, ns, NULL, err);

    *items_out = NULL;
    if (rc != E_OK) {
        return rc;
    }
    *items_out = overlay(items, quotas, orig, ns);
    json_decref(items);
    return E_OK;
}

/* Writes Q (ORIG: as read, NULL when new) in NS: the object, then its status. */
static int write_one(struct kube_store *s, const char *ns, json_t *q, const json_t *orig,
                     struct err *err)
{
    json_t *main = NULL, *res = NULL, *body = json_deep_copy(q);
    int rc;

    json_object_del(body, "status");
    if (orig == NULL) {
        json_object_del(json_object_get(body, "metadata"), "resourceVersion");
        rc = kube_create(&main, s->c, &KUBE_SPENDQUOTAS, ns, body, err);
    } else if (!json_equal(json_object_get(q, "spec"), json_object_get(orig, "spec")) ||
               !json_equal(json_object_get(q, "metadata"), json_object_get(orig, "metadata"))) {
        json_object_set(json_object_get(body, "metadata"), "resourceVersion",
                        json_object_get(json_object_get(orig, "metadata"), "resourceVersion"));
        rc = kube_replace(&main, s->c, &KUBE_SPENDQUOTAS, ns, body, err);
    } else {
        main = json_deep_copy(orig);
        rc = E_OK;
    }
    json_decref(body);
    if (rc == E_OK && !json_equal(json_object_get(q, "status"), json_object_get(main, "status"))) {
        json_object_set(main, "status", json_object_get(q, "status"));
        rc = kube_update_status(&res, s->c, &KUBE_SPENDQUOTAS, ns, main, err);
        if (rc == E_OK) {
            json_object_set(q, "metadata", json_object_get(res, "metadata"));
        }
    } else if (rc == E_OK) {
        json_object_set(q, "metadata", json_object_get(main, "metadata"));
    }
    json_decref(main);
    json_decref(res);
    return rc;
}

int kst_quota_commit(struct kube_store *s, json_t *quotas, json_t *orig, struct err *err)
{
    const char *key;
    json_t *q;

    json_object_foreach(quotas, key, q)
    {
        const char *slash = strchr(key, '/');
        char ns[64];
        int rc;
        snprintf(ns, sizeof(ns), "%.*s", slash != NULL ? (int)(slash - key) : 0, key);
        if (json_is_null(q)) {
            rc = kube_delete(s->c, &KUBE_SPENDQUOTAS, ns, slash != NULL ? slash + 1 : key, NULL,
                             err);
            rc = rc == E_NOTFOUND ? E_OK : rc;
        } else {
            rc = write_one(s, ns, q, json_object_get(orig, key), err);
        }
        if (rc != E_OK) {
            return rc;
        }
        /* written: a rerun of this transaction reads it again */
        json_object_del(orig, key);
    }
    return E_OK;
}
