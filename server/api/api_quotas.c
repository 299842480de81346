/* SPDX-License-Identifier: Apache-2.0 */
/* The SpendQuota API (SPEC §15) at /apis/divergedev.com/v1alpha1/.../spendquotas, as the
 * AgentTask API: create, get, list, merge-patch, update, delete, and the /status
 * subresource, the one place where status may change through the API (the meter writes
 * it otherwise). kubectl gets Table answers with the quota's columns. */
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/money.h"
#include "server/api/api_int.h"
#include "store/quota.h"

#define PARAM_NS 0
#define PARAM_NAME 1

static void log_change(const char *what, const json_t *q)
{
    const json_t *md = json_object_get(q, "metadata");

    log_kv(LOG_INFO, "spendquota_changed", "change", what, "namespace",
           json_string_value(json_object_get(md, "namespace")), "name",
           json_string_value(json_object_get(md, "name")), NULL);
}

/* --- Table (kubectl get) -------------------------------------------------------------- */

static json_t *column(const char *name, const char *type, const char *desc)
{
    return json_pack("{s:s, s:s, s:s, s:s, s:i}", "name", name, "type", type, "format",
                     strcmp(name, "Name") == 0 ? "name" : "", "description", desc, "priority", 0);
}

static json_t *table_new(const struct kube_view *v)
{
    json_t *cols = json_array();

    json_array_append_new(cols, column("Name", "string", "the quota's name"));
    json_array_append_new(cols, column("USD", "string", "status.usedUSD / spec.monthlyUSD"));
    json_array_append_new(cols,
                          column("Tokens", "string", "status.usedTokens / spec.monthlyTokens"));
    json_array_append_new(cols, column("Max-Running", "string", "spec.maxRunningTasks"));
    json_array_append_new(cols, column("Period", "string", "status.periodStart (UTC month)"));
    json_array_append_new(cols, column("Age", "date", "time since metadata.creationTimestamp"));
    return json_pack("{s:s, s:s, s:{s:s}, s:o, s:[]}", "kind", "Table", "apiVersion",
                     strcmp(v->table_version, "v1") == 0 ? "meta.k8s.io/v1" : "meta.k8s.io/v1beta1",
                     "metadata", "resourceVersion", "", "columnDefinitions", cols, "rows");
}

/* "used / limit", or "used" without a limit. */
static void used_of(char *out, size_t n, const char *used, bool has, const char *limit)
{
    snprintf(out, n, has ? "%s / %s" : "%s", used, limit);
}

static json_t *table_row(const struct kube_view *v, const json_t *q, int64_t now_ms)
{
    struct quota_view qv;
    char uu[MONEY_STR_MAX], lu[MONEY_STR_MAX], usd[2 * MONEY_STR_MAX + 4];
    char ut[24], lt[24], tok[52], run[24] = "-", age[KUBE_AGE_MAX] = "<unknown>";
    const json_t *md = json_object_get(q, "metadata");
    const char *ps =
        json_string_value(json_object_get(json_object_get(q, "status"), "periodStart"));
    const char *ts = json_string_value(json_object_get(md, "creationTimestamp"));
    int64_t created = 0;
    json_t *row;

    quota_view_of(&qv, q);
    money_format(uu, qv.used_usd);
    money_format(lu, qv.monthly_usd);
    used_of(usd, sizeof(usd), uu, qv.has_usd, lu);
    snprintf(ut, sizeof(ut), "%lld", (long long)qv.used_tokens);
    snprintf(lt, sizeof(lt), "%lld", (long long)qv.monthly_tokens);
    used_of(tok, sizeof(tok), ut, qv.has_tokens, lt);
    if (qv.has_running) {
        snprintf(run, sizeof(run), "%lld", (long long)qv.max_running);
    }
    if (ts != NULL && clock_parse_rfc3339(&created, ts) == E_OK) {
        kube_age(age, (now_ms - created) / 1000);
    }
    row = json_pack("{s:[s, s, s, s, s, s]}", "cells", qv.name != NULL ? qv.name : "", usd, tok,
                    run, ps != NULL ? ps : "", age);
    if (row != NULL && v->include == KUBE_INCLUDE_OBJECT) {
        json_object_set_new(row, "object", json_deep_copy(q));
    } else if (row != NULL && v->include == KUBE_INCLUDE_METADATA) {
        json_object_set_new(row, "object",
                            json_pack("{s:s, s:s, s:O}", "kind", "PartialObjectMetadata",
                                      "apiVersion", "meta.k8s.io/v1", "metadata", md));
    }
    return row;
}

static bool matches(const struct kube_view *v, const json_t *q)
{
    const json_t *md = json_object_get(q, "metadata");

    return kube_view_match(v, json_string_value(json_object_get(md, "namespace")),
                           json_string_value(json_object_get(md, "name")));
}

/* Answers ITEMS (taken) as a SpendQuotaList or, for kubectl, a Table. */
static int send_items(struct request *r, const struct kube_view *v, json_t *items)
{
    int64_t now = clock_now_ms(clock_system());
    json_t *t, *kept = json_array(), *q;
    size_t i;

    json_array_foreach(items, i, q)
    {
        if (matches(v, q)) {
            json_array_append(kept, q);
        }
    }
    json_decref(items);
    if (!v->table) {
        return http_send_json(r, 200,
                              json_pack("{s:s, s:s, s:{s:s}, s:o}", "apiVersion", TASK_API_VERSION,
                                        "kind", "SpendQuotaList", "metadata", "resourceVersion",
                                        "0", "items", kept));
    }
    t = table_new(v);
    json_array_foreach(kept, i, q)
    {
        json_t *row = table_row(v, q, now);
        if (row != NULL) {
            json_array_append_new(json_object_get(t, "rows"), row);
        }
    }
    json_decref(kept);
    return http_send_json(r, 200, t);
}

static int list(struct request *r, const char *ns)
{
    struct kube_view view;
    json_t *items = NULL;
    struct err err = {0};
    int ret;

    if (kube_view_init(&view, r, &ret) != E_OK) {
        return ret;
    }
    if (view.nlabels > 0) {
        kube_view_cleanup(&view);
        return http_send_error(r, 400, NULL, NULL, "labelSelector: not supported on spendquotas");
    }
    if (task_store_quota_list(&items, r->srv->store, ns, &err) != E_OK) {
        ret = http_send_err(r, &err);
    } else {
        ret = send_items(r, &view, items);
    }
    kube_view_cleanup(&view);
    return ret;
}

int api_quota_list(struct request *r)
{
    return list(r, r->params[PARAM_NS]);
}

int api_quota_list_all(struct request *r)
{
    return list(r, NULL);
}

int api_quota_get(struct request *r)
{
    struct kube_view view;
    json_t *q = NULL;
    struct err err = {0};
    int ret;

    if (kube_view_init(&view, r, &ret) != E_OK) {
        return ret;
    }
    if (task_store_quota_get(&q, r->srv->store, r->params[PARAM_NS], r->params[PARAM_NAME], &err) !=
        E_OK) {
        ret = http_send_err(r, &err);
    } else if (view.table) {
        ret = send_items(r, &view, json_pack("[o]", q));
    } else {
        ret = http_send_json(r, 200, q);
    }
    kube_view_cleanup(&view);
    return ret;
}

int api_quota_create(struct request *r)
{
    json_t *body, *obj = NULL, *stored = NULL;
    struct err err = {0};
    int ret;

    body = http_body_json(r, &ret);
    if (body == NULL) {
        return ret;
    }
    if (quota_normalize_new(&obj, body, r->params[PARAM_NS], clock_now_ms(clock_system()), &err) !=
            E_OK ||
        task_store_quota_create(&stored, r->srv->store, obj, &err) != E_OK) {
        ret = http_send_err(r, &err);
    } else {
        log_change("created", stored);
        controller_queue_poke(r->srv->controller); /* its maxRunningTasks applies now */
        ret = http_send_json(r, 201, stored);
    }
    json_decref(body);
    json_decref(obj);
    return ret;
}

/* --- patch and update ------------------------------------------------------------------ */

enum scope {
    SCOPE_MAIN,   /* metadata (labels, annotations) and spec */
    SCOPE_STATUS, /* the /status subresource */
};

struct change {
    json_t *body; /* the merge patch, or the replacement object */
    enum scope scope;
    bool replace; /* PUT: the scope's part is replaced, not merged */
};

static int check_rv(const json_t *q, const json_t *body, struct err *err)
{
    const char *want =
        json_string_value(json_object_get(json_object_get(body, "metadata"), "resourceVersion"));
    const char *have =
        json_string_value(json_object_get(json_object_get(q, "metadata"), "resourceVersion"));

    if (want != NULL && (have == NULL || strcmp(want, have) != 0)) {
        return err_set(err, E_CONFLICT,
                       "the object has been modified; please apply your changes to the latest "
                       "version and try again");
    }
    return E_OK;
}

/* The part of Q under KEY with BODY's merged in (or, REPLACE, instead). */
static void merge_part(json_t *q, json_t *body, const char *key, bool replace)
{
    json_t *src = json_object_get(body, key), *cur = json_object_get(q, key);

    if (src == NULL && !replace) {
        return;
    }
    if (replace || !json_is_object(cur) || !json_is_object(src)) {
        json_object_set_new(q, key, json_is_object(src) ? json_deep_copy(src) : json_object());
        return;
    }
    json_object_set_new(q, key, json_merge_patch(cur, src));
}

static int apply_change(json_t *q, struct err *err, void *userdata)
{
    struct change *c = userdata;
    json_t *bmd = json_object_get(c->body, "metadata");
    const char *name = json_string_value(json_object_get(bmd, "name"));
    const char *cur = json_string_value(json_object_get(json_object_get(q, "metadata"), "name"));
    json_t *md = json_object_get(q, "metadata");
    int rc = check_rv(q, c->body, err);

    if (rc != E_OK) {
        return rc;
    }
    if (name != NULL && cur != NULL && strcmp(name, cur) != 0) {
        return err_set_field(err, E_INVALID, "metadata.name", "metadata.name: cannot change");
    }
    if (c->scope == SCOPE_STATUS) {
        merge_part(q, c->body, "status", c->replace);
        return quota_validate_status(json_object_get(q, "status"), err);
    }
    merge_part(md, bmd, "labels", c->replace);
    merge_part(md, bmd, "annotations", c->replace);
    merge_part(q, c->body, "spec", c->replace);
    return E_OK;
}

static int change(struct request *r, enum scope scope, bool replace)
{
    const char *ct = http_header(r, MHD_HTTP_HEADER_CONTENT_TYPE);
    struct change c = {.scope = scope, .replace = replace};
    json_t *stored = NULL;
    struct err err = {0};
    int ret;

    if (!replace && (ct == NULL || strncmp(ct, "application/merge-patch+json", 28) != 0)) {
        return http_send_error(r, 415, NULL, NULL,
                               "PATCH needs Content-Type application/merge-patch+json (JSON "
                               "patch and strategic merge patch are not supported)");
    }
    c.body = http_body_json(r, &ret);
    if (c.body == NULL) {
        return ret;
    }
    if (!json_is_object(c.body) || (json_object_get(c.body, "metadata") != NULL &&
                                    !json_is_object(json_object_get(c.body, "metadata")))) {
        ret = http_send_error(r, 400, NULL, NULL, "the body must be a JSON object");
    } else if (task_store_quota_mutate(&stored, r->srv->store, r->params[PARAM_NS],
                                       r->params[PARAM_NAME], apply_change, &c, &err) != E_OK) {
        ret = http_send_err(r, &err);
    } else {
        log_change(scope == SCOPE_STATUS ? "status changed" : "changed", stored);
        if (scope == SCOPE_MAIN) {
            controller_queue_poke(r->srv->controller); /* a raised cap starts tasks now */
        }
        ret = http_send_json(r, 200, stored);
    }
    json_decref(c.body);
    return ret;
}

int api_quota_patch(struct request *r)
{
    return change(r, SCOPE_MAIN, false);
}

int api_quota_put(struct request *r)
{
    return change(r, SCOPE_MAIN, true);
}

int api_quota_status_patch(struct request *r)
{
    return change(r, SCOPE_STATUS, false);
}

int api_quota_status_put(struct request *r)
{
    return change(r, SCOPE_STATUS, true);
}

int api_quota_delete(struct request *r)
{
    json_t *last = NULL;
    int64_t expect = 0;
    struct err err = {0};
    int ret;

    if (r->body.len > 0) {
        json_t *opts = http_body_json(r, &ret);
        const json_t *rv;
        if (opts == NULL) {
            return ret;
        }
        rv = json_object_get(json_object_get(opts, "preconditions"), "resourceVersion");
        if (json_is_string(rv)) {
            expect = strtoll(json_string_value(rv), NULL, 10);
        }
        json_decref(opts);
    }
    if (task_store_quota_delete(&last, r->srv->store, r->params[PARAM_NS], r->params[PARAM_NAME],
                                expect, &err) != E_OK) {
        return http_send_err(r, &err);
    }
    log_change("deleted", last);
    controller_queue_poke(r->srv->controller); /* its cap no longer holds tasks back */
    return http_send_json(r, 200, last);
}
