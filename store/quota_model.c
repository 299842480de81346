/* SPDX-License-Identifier: Apache-2.0 */
/* The SpendQuota model (SPEC §15), pure: validation into the normalized form (money as
 * canonical decimal strings), the UTC calendar month of a period, and the headroom a
 * namespace's quotas leave. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/money.h"
#include "common/clock.h"
#include "store/quota.h"

/* --- validation ---------------------------------------------------------------------- */

static int check_money_str(json_t *parent, const char *key, const char *path, struct err *err)
{
    const json_t *v = json_object_get(parent, key);
    const char *s = json_string_value(v);
    char canon[MONEY_STR_MAX];
    struct err perr = {0};
    int64_t micros;

    if (s == NULL || s[0] < '0' || s[0] > '9') {
        return err_set_field(err, E_INVALID, path,
                             "%s: must be a decimal string of dollars like \"100.00\"", path);
    }
    if (money_parse(&micros, NULL, s, &perr) != E_OK || micros < 0) {
        return err_set_field(err, E_INVALID, path, "%s: %s", path, perr.msg);
    }
    money_format(canon, micros);
    json_object_set_new(parent, key, json_string(canon));
    return E_OK;
}

static int check_count(const json_t *parent, const char *key, const char *path, struct err *err)
{
    const json_t *v = json_object_get(parent, key);

    if (!json_is_integer(v) || json_integer_value(v) < 0) {
        return err_set_field(err, E_INVALID, path, "%s: must be a non-negative integer", path);
    }
    return E_OK;
}

static int check_spec(json_t *spec, struct err *err)
{
    const char *key;
    json_t *v;
    void *tmp;
    char path[128];
    int rc = E_OK;

    if (!json_is_object(spec)) {
        return err_set_field(err, E_INVALID, "spec", "spec: must be an object");
    }
    json_object_foreach_safe(spec, tmp, key, v)
    {
        snprintf(path, sizeof(path), "spec.%.100s", key);
        if (json_is_null(v)) {
            json_object_del(spec, key); /* null means "not set" (merge patch deletes it) */
        } else if (strcmp(key, "monthlyUSD") == 0) {
            rc = check_money_str(spec, key, path, err);
        } else if (strcmp(key, "monthlyTokens") == 0 || strcmp(key, "maxRunningTasks") == 0) {
            rc = check_count(spec, key, path, err);
        } else {
            rc = err_set_field(err, E_INVALID, path, "%s: unknown field", path);
        }
        if (rc != E_OK) {
            return rc;
        }
    }
    return E_OK;
}

static int check_string_map(json_t *m, const char *path, struct err *err)
{
    const char *key;
    json_t *v;

    if (m == NULL) {
        return E_OK;
    }
    if (!json_is_object(m)) {
        return err_set_field(err, E_INVALID, path, "%s: must be an object of strings", path);
    }
    json_object_foreach(m, key, v)
    {
        if (!json_is_string(v)) {
            return err_set_field(err, E_INVALID, path, "%s: values must be strings", path);
        }
    }
    return E_OK;
}

static int check_metadata(json_t *md, struct err *err)
{
    const json_t *name = json_object_get(md, "name");
    const json_t *ns = json_object_get(md, "namespace");

    if (!json_is_object(md)) {
        return err_set_field(err, E_INVALID, "metadata", "metadata: must be an object");
    }
    if (!json_is_string(name) || !task_name_valid(json_string_value(name))) {
        return err_set_field(err, E_INVALID, "metadata.name",
                             "metadata.name: must be a DNS label ([a-z0-9]([-a-z0-9]*[a-z0-9])?, "
                             "at most 63 characters)");
    }
    if (!json_is_string(ns) || !task_name_valid(json_string_value(ns))) {
        return err_set_field(err, E_INVALID, "metadata.namespace",
                             "metadata.namespace: must be a DNS label");
    }
    if (check_string_map(json_object_get(md, "labels"), "metadata.labels", err) != E_OK ||
        check_string_map(json_object_get(md, "annotations"), "metadata.annotations", err) != E_OK) {
        return E_INVALID;
    }
    return E_OK;
}

static json_t *zero_status(int64_t now_ms)
{
    char start[CLOCK_RFC3339_MAX];

    clock_rfc3339(start, clock_month_start(now_ms));
    return json_pack("{s:s, s:i, s:s}", "usedUSD", "0.00", "usedTokens", 0, "periodStart", start);
}

int quota_normalize_new(json_t **out, const json_t *obj, const char *ns, int64_t now_ms,
                        struct err *err)
{
    const json_t *spec;
    json_t *doc, *md = NULL;
    int rc;

    *out = NULL;
    if (!json_is_object(obj)) {
        return err_set_field(err, E_INVALID, "", "the body must be a SpendQuota object");
    }
    rc = task_check_type_fields(obj, QUOTA_KIND, err);
    if (rc == E_OK) {
        rc = task_copy_metadata(&md, json_object_get(obj, "metadata"), ns, err);
    }
    if (rc != E_OK) {
        return rc;
    }
    spec = json_object_get(obj, "spec");
    doc = json_pack("{s:s, s:s, s:o, s:o, s:o}", "apiVersion", TASK_API_VERSION, "kind", QUOTA_KIND,
                    "metadata", md, "spec", spec != NULL ? json_deep_copy(spec) : json_object(),
                    "status", zero_status(now_ms));
    rc = quota_validate(doc, err);
    if (rc != E_OK) {
        json_decref(doc);
        return rc;
    }
    *out = doc;
    return E_OK;
}

int quota_validate(json_t *q, struct err *err)
{
    int rc = check_metadata(json_object_get(q, "metadata"), err);

    return rc == E_OK ? check_spec(json_object_get(q, "spec"), err) : rc;
}

int quota_validate_status(json_t *status, struct err *err)
{
    const char *key, *ps;
    json_t *v;
    int64_t ms;
    int rc = E_OK;

    if (!json_is_object(status)) {
        return err_set_field(err, E_INVALID, "status", "status: must be an object");
    }
    json_object_foreach(status, key, v)
    {
        if (strcmp(key, "usedUSD") == 0) {
            rc = check_money_str(status, key, "status.usedUSD", err);
        } else if (strcmp(key, "usedTokens") == 0) {
            rc = check_count(status, key, "status.usedTokens", err);
        } else if (strcmp(key, "periodStart") == 0) {
            ps = json_string_value(v);
            if (ps == NULL || clock_parse_rfc3339(&ms, ps) != E_OK) {
                rc = err_set_field(err, E_INVALID, "status.periodStart",
                                   "status.periodStart: must be an RFC 3339 time");
            }
        } else {
            rc = err_set_field(err, E_INVALID, "status", "status.%.64s: unknown field", key);
        }
        if (rc != E_OK) {
            return rc;
        }
    }
    return E_OK;
}

/* --- the view, the period, the charge -------------------------------------------------- */

void quota_view_of(struct quota_view *v, const json_t *q)
{
    const json_t *md = json_object_get(q, "metadata");
    const json_t *spec = json_object_get(q, "spec");
    const json_t *status = json_object_get(q, "status");
    const char *s;

    memset(v, 0, sizeof(*v));
    v->name = json_string_value(json_object_get(md, "name"));
    v->ns = json_string_value(json_object_get(md, "namespace"));
    s = json_string_value(json_object_get(spec, "monthlyUSD"));
    v->has_usd = s != NULL && money_parse(&v->monthly_usd, NULL, s, NULL) == E_OK;
    v->has_tokens = json_is_integer(json_object_get(spec, "monthlyTokens"));
    v->monthly_tokens = json_integer_value(json_object_get(spec, "monthlyTokens"));
    v->has_running = json_is_integer(json_object_get(spec, "maxRunningTasks"));
    v->max_running = json_integer_value(json_object_get(spec, "maxRunningTasks"));
    s = json_string_value(json_object_get(status, "usedUSD"));
    if (s == NULL || money_parse(&v->used_usd, NULL, s, NULL) != E_OK) {
        v->used_usd = 0;
    }
    v->used_tokens = json_integer_value(json_object_get(status, "usedTokens"));
    s = json_string_value(json_object_get(status, "periodStart"));
    if (s == NULL || clock_parse_rfc3339(&v->period_start_ms, s) != E_OK) {
        v->period_start_ms = 0;
    }
}

bool quota_roll(json_t *q, int64_t now_ms)
{
    struct quota_view v;
    json_t *status;

    quota_view_of(&v, q);
    if (v.period_start_ms != 0 && now_ms < clock_next_month(v.period_start_ms)) {
        return false;
    }
    status = zero_status(now_ms);
    json_object_set_new(q, "status", status);
    return true;
}

static int64_t add_sat(int64_t a, int64_t b)
{
    return a > INT64_MAX - b ? INT64_MAX : a + b;
}

void quota_add(json_t *q, int64_t tokens, int64_t cost_micros)
{
    json_t *status = json_object_get(q, "status");
    struct quota_view v;
    char usd[MONEY_STR_MAX];

    quota_view_of(&v, q);
    money_format(usd, add_sat(v.used_usd, cost_micros));
    json_object_set_new(status, "usedUSD", json_string(usd));
    json_object_set_new(status, "usedTokens", json_integer(add_sat(v.used_tokens, tokens)));
}

void quota_room_of(struct quota_room *out, const json_t *quotas)
{
    const json_t *q;
    size_t i;

    memset(out, 0, sizeof(*out));
    json_array_foreach(quotas, i, q)
    {
        struct quota_view v;
        quota_view_of(&v, q);
        if (v.has_usd && (!out->has_usd || v.monthly_usd - v.used_usd < out->usd_left)) {
            out->has_usd = true;
            out->usd_left = v.monthly_usd - v.used_usd;
            out->usd_name = v.name;
        }
        if (v.has_tokens &&
            (!out->has_tokens || v.monthly_tokens - v.used_tokens < out->tokens_left)) {
            out->has_tokens = true;
            out->tokens_left = v.monthly_tokens - v.used_tokens;
            out->tokens_name = v.name;
        }
    }
}

const json_t *quota_used_up(const json_t *quotas)
{
    const json_t *q;
    size_t i;

    json_array_foreach(quotas, i, q)
    {
        struct quota_view v;
        quota_view_of(&v, q);
        if ((v.has_usd && v.used_usd >= v.monthly_usd) ||
            (v.has_tokens && v.used_tokens >= v.monthly_tokens)) {
            return q;
        }
    }
    return NULL;
}
