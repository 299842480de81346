/* SPDX-License-Identifier: Apache-2.0 */
/* What kubectl asks of the task API beyond plain objects (SPEC §11, KUBECTL-PROTOCOL.md):
 * meta.k8s.io Table answers (Accept: ...;as=Table;g=meta.k8s.io;v=v1) with the printer
 * columns Name, Phase, Cost, Iteration, Age, fieldSelector on metadata.name and
 * metadata.namespace, and equality-based labelSelector, for list, get and watch. The objects, their
 * store and validation are api_tasks.c's; this file only changes how they are shown and which are
 * shown. */
#include <microhttpd.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/clock.h"
#include "server/api/api_int.h"

#define ACCEPT_MAX 4096 /* bytes of an Accept header we look at */

/* --- Accept and fieldSelector (untrusted text: fuzzed) ----------------------------- */

/* The next ';'-separated piece of [S, S+N) from *I, blanks trimmed: [*start, *start+len). */
static size_t next_piece(const char *s, size_t n, size_t *i, size_t *start)
{
    size_t len;

    while (*i < n && (s[*i] == ' ' || s[*i] == '\t')) {
        (*i)++;
    }
    *start = *i;
    while (*i < n && s[*i] != ';') {
        (*i)++;
    }
    len = *i - *start;
    while (len > 0 && (s[*start + len - 1] == ' ' || s[*start + len - 1] == '\t')) {
        len--;
    }
    (*i)++; /* past the ';' */
    return len;
}

static bool piece_is(const char *s, size_t len, const char *want)
{
    return len == strlen(want) && strncmp(s, want, len) == 0;
}

/* Whether the media range [S, S+N) ("application/json;as=Table;v=v1;g=meta.k8s.io")
 * asks for a Table of a version we serve; *version_out is set when it does. */
static bool range_is_table(const char *s, size_t n, const char **version_out)
{
    bool table = false, group = false;
    const char *version = NULL;
    size_t i = 0, start, len = next_piece(s, n, &i, &start);

    if (len != 16 || strncasecmp(s + start, "application/json", 16) != 0) {
        return false;
    }
    while (i < n) {
        len = next_piece(s, n, &i, &start);
        if (piece_is(s + start, len, "as=Table")) {
            table = true;
        } else if (piece_is(s + start, len, "g=meta.k8s.io")) {
            group = true;
        } else if (piece_is(s + start, len, "v=v1")) {
            version = "v1";
        } else if (piece_is(s + start, len, "v=v1beta1")) {
            version = "v1beta1";
        }
    }
    if (table && group && version != NULL) {
        *version_out = version;
        return true;
    }
    return false;
}

bool kube_accept_table(const char *accept, const char **version_out)
{
    size_t n = accept != NULL ? strnlen(accept, ACCEPT_MAX) : 0, i = 0;

    *version_out = NULL;
    while (i < n) {
        size_t start = i;
        while (i < n && accept[i] != ',') {
            i++;
        }
        if (range_is_table(accept + start, i - start, version_out)) {
            return true;
        }
        i++;
    }
    return false;
}

/* One "key=value" (or "key==value") term [S, S+N) of a field selector. */
static int selector_term(struct kube_view *v, const char *s, size_t n, struct err *err)
{
    const char *eq = memchr(s, '=', n);
    size_t klen, voff;
    char **slot;

    if (eq == NULL || memchr(s, '!', n) != NULL) {
        return err_set(
            err, E_INVALID,
            "fieldSelector: only metadata.name=X and metadata.namespace=X are supported");
    }
    klen = (size_t)(eq - s);
    voff = klen + 1 + (klen + 1 < n && s[klen + 1] == '=' ? 1 : 0);
    if (klen == 13 && strncmp(s, "metadata.name", 13) == 0) {
        slot = &v->name;
    } else if (klen == 18 && strncmp(s, "metadata.namespace", 18) == 0) {
        slot = &v->ns;
    } else {
        return err_set(
            err, E_INVALID,
            "fieldSelector: only metadata.name=X and metadata.namespace=X are supported");
    }
    free(*slot);
    *slot = xmalloc(n - voff + 1);
    memcpy(*slot, s + voff, n - voff);
    (*slot)[n - voff] = '\0';
    return E_OK;
}

int kube_field_selector_parse(struct kube_view *v, const char *sel, struct err *err)
{
    size_t n = strlen(sel), i = 0;

    while (i < n) {
        size_t start = i;
        while (i < n && sel[i] != ',') {
            i++;
        }
        if (i > start && selector_term(v, sel + start, i - start, err) != E_OK) {
            return E_INVALID;
        }
        i++;
    }
    return E_OK;
}

static char *dup_n(const char *s, size_t n)
{
    char *d = xmalloc(n + 1);

    memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

/* One term [S, S+N) of a label selector, blanks trimmed by the caller. */
static int label_term(struct kube_view *v, const char *s, size_t n, struct err *err)
{
    struct kube_label_term *t;
    const char *eq = memchr(s, '=', n);
    size_t klen;

    if (v->nlabels >= KUBE_LABEL_TERMS_MAX) {
        return err_set(err, E_INVALID, "labelSelector: more than %d terms", KUBE_LABEL_TERMS_MAX);
    }
    if (memchr(s, '(', n) != NULL || memchr(s, ' ', n) != NULL) {
        return err_set(err, E_INVALID,
                       "labelSelector: only key=value, key!=value, key and !key are supported");
    }
    t = &v->labels[v->nlabels];
    memset(t, 0, sizeof(*t));
    if (eq == NULL) { /* "key" or "!key" */
        t->negate = s[0] == '!';
        t->key = dup_n(s + t->negate, n - t->negate);
    } else {
        klen = (size_t)(eq - s);
        t->negate = klen > 0 && s[klen - 1] == '!';
        t->key = dup_n(s, klen - t->negate);
        klen += 1 + (klen + 1 < n && s[klen + 1] == '=' ? 1 : 0);
        t->value = dup_n(s + klen, n - klen);
    }
    v->nlabels++;
    if (t->key[0] == '\0' || strchr(t->key, '!') != NULL ||
        (t->value != NULL && strpbrk(t->value, "=!") != NULL)) {
        return err_set(err, E_INVALID, "labelSelector: a term is malformed");
    }
    return E_OK;
}

int kube_label_selector_parse(struct kube_view *v, const char *sel, struct err *err)
{
    size_t n = strlen(sel), i = 0;

    while (i < n) {
        size_t start, end;
        while (i < n && sel[i] == ' ') {
            i++;
        }
        start = i;
        while (i < n && sel[i] != ',') {
            i++;
        }
        end = i;
        while (end > start && sel[end - 1] == ' ') {
            end--;
        }
        if (end > start && label_term(v, sel + start, end - start, err) != E_OK) {
            return E_INVALID;
        }
        i++;
    }
    return E_OK;
}

static bool labels_match(const struct kube_view *v, const json_t *labels)
{
    for (int i = 0; i < v->nlabels; i++) {
        const struct kube_label_term *t = &v->labels[i];
        const char *have = json_string_value(json_object_get(labels, t->key));
        bool hit = t->value == NULL ? have != NULL : have != NULL && strcmp(have, t->value) == 0;
        if (hit == t->negate) {
            return false;
        }
    }
    return true;
}

/* --- the view of a request --------------------------------------------------------- */

int kube_view_init(struct kube_view *v, struct request *r, int *mhd_ret)
{
    const char *sel = http_query(r, "fieldSelector");
    const char *lsel = http_query(r, "labelSelector");
    const char *inc = http_query(r, "includeObject");
    struct err err = {0};

    memset(v, 0, sizeof(*v));
    v->table = kube_accept_table(http_header(r, MHD_HTTP_HEADER_ACCEPT), &v->table_version);
    v->include = inc != NULL && strcmp(inc, "Object") == 0 ? KUBE_INCLUDE_OBJECT
                 : inc != NULL && strcmp(inc, "None") == 0 ? KUBE_INCLUDE_NONE
                                                           : KUBE_INCLUDE_METADATA;
    if ((sel != NULL && kube_field_selector_parse(v, sel, &err) != E_OK) ||
        (lsel != NULL && kube_label_selector_parse(v, lsel, &err) != E_OK)) {
        kube_view_cleanup(v);
        *mhd_ret = http_send_error(r, 400, NULL, NULL, "%s", err.msg);
        return E_INVALID;
    }
    return E_OK;
}

void kube_view_cleanup(struct kube_view *v)
{
    free(v->ns);
    free(v->name);
    v->ns = NULL;
    v->name = NULL;
    for (int i = 0; i < v->nlabels; i++) {
        free(v->labels[i].key);
        free(v->labels[i].value);
    }
    v->nlabels = 0;
}

bool kube_view_plain(const struct kube_view *v)
{
    return !v->table && v->ns == NULL && v->name == NULL && v->nlabels == 0;
}

bool kube_view_match(const struct kube_view *v, const char *ns, const char *name)
{
    return (v->ns == NULL || (ns != NULL && strcmp(v->ns, ns) == 0)) &&
           (v->name == NULL || (name != NULL && strcmp(v->name, name) == 0));
}

static bool obj_match(const struct kube_view *v, const json_t *obj)
{
    const json_t *md = json_object_get(obj, "metadata");

    return kube_view_match(v, json_string_value(json_object_get(md, "namespace")),
                           json_string_value(json_object_get(md, "name"))) &&
           labels_match(v, json_object_get(md, "labels"));
}

/* --- Table ------------------------------------------------------------------------- */

/* kube_age from two days on. */
static void age_days(char out[KUBE_AGE_MAX], int64_t h)
{
    int64_t d = h / 24, y = d / 365;

    if (h < 24 * 8 && h % 24 != 0) {
        snprintf(out, KUBE_AGE_MAX, "%lldd%lldh", (long long)d, (long long)(h % 24));
    } else if (d < 365 * 2) {
        snprintf(out, KUBE_AGE_MAX, "%lldd", (long long)d);
    } else if (y < 8 && d % 365 != 0) {
        snprintf(out, KUBE_AGE_MAX, "%lldy%lldd", (long long)y, (long long)(d % 365));
    } else {
        snprintf(out, KUBE_AGE_MAX, "%lldy", (long long)y);
    }
}

void kube_age(char out[KUBE_AGE_MAX], int64_t s)
{
    int64_t m = s / 60, h = s / 3600;

    /* kubectl's duration.HumanDuration, step by step. */
    if (s < -1) {
        snprintf(out, KUBE_AGE_MAX, "<invalid>");
    } else if (s < 120) {
        snprintf(out, KUBE_AGE_MAX, "%llds", (long long)(s < 0 ? 0 : s));
    } else if (m < 10 && s % 60 != 0) {
        snprintf(out, KUBE_AGE_MAX, "%lldm%llds", (long long)m, (long long)(s % 60));
    } else if (m < 180) {
        snprintf(out, KUBE_AGE_MAX, "%lldm", (long long)m);
    } else if (h < 8 && m % 60 != 0) {
        snprintf(out, KUBE_AGE_MAX, "%lldh%lldm", (long long)h, (long long)(m % 60));
    } else if (h < 48) {
        snprintf(out, KUBE_AGE_MAX, "%lldh", (long long)h);
    } else {
        age_days(out, h);
    }
}

static json_t *table_new(const struct kube_view *v, const char *rv, bool columns)
{
    json_t *t =
        json_pack("{s:s, s:s, s:{s:s}, s:[]}", "kind", "Table", "apiVersion",
                  strcmp(v->table_version, "v1") == 0 ? "meta.k8s.io/v1" : "meta.k8s.io/v1beta1",
                  "metadata", "resourceVersion", rv, "rows");
    if (columns && t != NULL) {
        json_object_set_new(
            t, "columnDefinitions",
            json_pack("[{s:s, s:s, s:s, s:s, s:i}, {s:s, s:s, s:s, s:s, s:i},"
                      " {s:s, s:s, s:s, s:s, s:i}, {s:s, s:s, s:s, s:s, s:i},"
                      " {s:s, s:s, s:s, s:s, s:i}]",
                      "name", "Name", "type", "string", "format", "name", "description",
                      "the task's name", "priority", 0, "name", "Phase", "type", "string", "format",
                      "", "description", "status.phase", "priority", 0, "name", "Cost", "type",
                      "string", "format", "", "description", "status.costUSD (USD)", "priority", 0,
                      "name", "Iteration", "type", "integer", "format", "", "description",
                      "status.iteration", "priority", 0, "name", "Age", "type", "date", "format",
                      "", "description", "time since metadata.creationTimestamp", "priority", 0));
    }
    return t;
}

static const char *str_at(const json_t *obj, const char *part, const char *key)
{
    const char *s = json_string_value(json_object_get(json_object_get(obj, part), key));
    return s != NULL ? s : "";
}

/* The row of OBJ: the printer columns and, as the include mode says, its metadata. */
static json_t *table_row(const struct kube_view *v, const json_t *obj, int64_t now_ms)
{
    const json_t *md = json_object_get(obj, "metadata");
    const json_t *it = json_object_get(json_object_get(obj, "status"), "iteration");
    int64_t created = 0;
    char age[KUBE_AGE_MAX] = "<unknown>";
    json_t *row;

    if (clock_parse_rfc3339(&created, str_at(obj, "metadata", "creationTimestamp")) == E_OK) {
        kube_age(age, (now_ms - created) / 1000);
    }
    row = json_pack("{s:[s, s, s, I, s]}", "cells", str_at(obj, "metadata", "name"),
                    str_at(obj, "status", "phase"), str_at(obj, "status", "costUSD"),
                    (json_int_t)(json_is_integer(it) ? json_integer_value(it) : 0), age);
    if (row == NULL || v->include == KUBE_INCLUDE_NONE) {
        return row;
    }
    if (v->include == KUBE_INCLUDE_OBJECT) {
        json_object_set_new(row, "object", json_deep_copy(obj));
    } else {
        json_object_set_new(row, "object",
                            json_pack("{s:s, s:s, s:O}", "kind", "PartialObjectMetadata",
                                      "apiVersion", "meta.k8s.io/v1", "metadata", md));
    }
    return row;
}

static void table_add(json_t *t, const struct kube_view *v, const json_t *obj)
{
    json_t *row = table_row(v, obj, clock_now_ms(clock_system()));

    if (row != NULL) {
        json_array_append_new(json_object_get(t, "rows"), row);
    }
}

int kube_send_object(struct request *r, const struct kube_view *v, json_t *obj)
{
    json_t *t;

    if (!v->table) {
        return http_send_json(r, 200, obj);
    }
    t = table_new(v, str_at(obj, "metadata", "resourceVersion"), true);
    if (t != NULL) {
        table_add(t, v, obj);
    }
    json_decref(obj);
    return http_send_json(r, 200, t);
}

/* --- list and watch lines ---------------------------------------------------------- */

struct kube_list {
    const struct kube_view *v;
    json_t *items; /* matching objects (plain list) */
    json_t *table; /* or the Table being built */
};

static int list_item(const char *json, size_t len, void *userdata)
{
    struct kube_list *l = userdata;
    json_t *obj = json_loadb(json, len, 0, NULL);

    if (obj != NULL && obj_match(l->v, obj)) {
        if (l->table != NULL) {
            table_add(l->table, l->v, obj);
        } else {
            json_array_append(l->items, obj);
        }
    }
    json_decref(obj);
    return E_OK;
}

int kube_send_list(struct request *r, const struct kube_view *v, const char *ns)
{
    struct kube_list l = {.v = v, .items = json_array(), .table = NULL};
    struct err err = {0};
    int64_t rv = 0;
    char rvs[24];

    if (v->table) {
        l.table = table_new(v, "", true);
    }
    if (task_store_list_text(&rv, r->srv->store, ns, list_item, &l, &err) != E_OK) {
        json_decref(l.items);
        json_decref(l.table);
        return http_send_err(r, &err);
    }
    snprintf(rvs, sizeof(rvs), "%lld", (long long)rv);
    if (l.table != NULL) {
        json_decref(l.items);
        json_object_set_new(json_object_get(l.table, "metadata"), "resourceVersion",
                            json_string(rvs));
        return http_send_json(r, 200, l.table);
    }
    return http_send_json(r, 200,
                          json_pack("{s:s, s:s, s:{s:s}, s:o}", "apiVersion", TASK_API_VERSION,
                                    "kind", "AgentTaskList", "metadata", "resourceVersion", rvs,
                                    "items", l.items));
}

void kube_watch_line(struct buf *out, const struct kube_view *v, const char *type, const char *json,
                     size_t len)
{
    json_t *obj = json_loadb(json, len, 0, NULL), *ev, *t;
    char *text;

    if (obj == NULL || !obj_match(v, obj)) {
        json_decref(obj);
        return;
    }
    if (v->table) {
        /* One row, no column definitions: kubectl has them from the list. */
        t = table_new(v, str_at(obj, "metadata", "resourceVersion"), false);
        if (t != NULL) {
            table_add(t, v, obj);
        }
        json_decref(obj);
        obj = t;
    }
    ev = obj != NULL ? json_pack("{s:s, s:o}", "type", type, "object", obj) : NULL;
    text = ev != NULL ? json_dumps(ev, JSON_COMPACT) : NULL;
    if (text != NULL) {
        (void)buf_puts(out, text);
        (void)buf_puts(out, "\n");
    }
    free(text);
    json_decref(ev);
}
