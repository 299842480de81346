/* SPDX-License-Identifier: Apache-2.0 */
/* The AgentTask API at Kubernetes-style paths (SPEC §3): create, get, list, watch,
 * merge-patch, update, delete, and the /status subresource. Validation lives in store/;
 * this file maps requests onto it. */
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "server/api/api_int.h"

#define PARAM_NS 0
#define PARAM_NAME 1

static void log_change(const char *what, const json_t *obj)
{
    const json_t *md = json_object_get(obj, "metadata");
    const json_t *status = json_object_get(obj, "status");

    log_kv(LOG_INFO, "task_changed", "change", what, "namespace",
           json_string_value(json_object_get(md, "namespace")), "name",
           json_string_value(json_object_get(md, "name")), "resourceVersion",
           json_string_value(json_object_get(md, "resourceVersion")), "phase",
           json_string_value(json_object_get(status, "phase")), NULL);
}

/* True when S is a non-empty decimal number that fits in int64. */
static bool atoll_ok(const char *s)
{
    size_t n = strlen(s);

    if (n == 0 || n > 18) {
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') {
            return false;
        }
    }
    return true;
}

/* --- watch ----------------------------------------------------------------------- */

struct watch {
    struct server *srv;    /* borrowed */
    char *ns;              /* owned; NULL: every namespace */
    int64_t rv;            /* last resourceVersion sent */
    int64_t deadline_ms;   /* end of the stream (timeoutSeconds), 0 = none */
    struct buf pending;    /* lines not yet written */
    size_t off;            /* bytes of pending already written */
    bool ending;           /* send what is pending, then end */
    struct kube_view view; /* Table lines and fieldSelector (api_kube.c) */
};

static void watch_line(struct watch *w, const char *type, json_t *obj)
{
    json_t *ev = json_pack("{s:s, s:O}", "type", type, "object", obj);
    char *text = json_dumps(ev, JSON_COMPACT);

    (void)buf_puts(&w->pending, text);
    (void)buf_puts(&w->pending, "\n");
    free(text);
    json_decref(ev);
}

static int watch_event(const struct task_event *ev, void *userdata)
{
    struct watch *w = userdata;

    if (!kube_view_plain(&w->view)) {
        if (kube_view_match(&w->view, ev->ns, ev->name)) {
            kube_watch_line(&w->pending, &w->view, task_event_name(ev->type), ev->json,
                            strlen(ev->json));
        }
        return 0;
    }
    /* The stored text is already the object's JSON: no re-encoding. */
    (void)buf_printf(&w->pending, "{\"type\":\"%s\",\"object\":", task_event_name(ev->type));
    (void)buf_puts(&w->pending, ev->json);
    (void)buf_puts(&w->pending, "}\n");
    return 0;
}

/* One object of the initial list, as a synthetic ADDED event. */
static int watch_added(const char *json, size_t len, void *userdata)
{
    struct watch *w = userdata;

    if (!kube_view_plain(&w->view)) {
        kube_watch_line(&w->pending, &w->view, "ADDED", json, len);
        return E_OK;
    }
    (void)buf_puts(&w->pending, "{\"type\":\"ADDED\",\"object\":");
    (void)buf_append(&w->pending, json, len);
    (void)buf_puts(&w->pending, "}\n");
    return E_OK;
}

static long watch_read(void *cls, uint64_t pos, char *out, size_t max)
{
    struct watch *w = cls;
    struct err err = {0};
    size_t n;

    (void)pos;
    while (w->off >= w->pending.len) {
        int64_t last = w->rv;
        buf_cleanup(&w->pending);
        w->off = 0;
        if (w->ending || atomic_load(&w->srv->shutting_down) ||
            (w->deadline_ms != 0 && clock_now_ms(clock_system()) >= w->deadline_ms)) {
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        if (task_store_watch(&last, w->srv->store, w->ns, w->rv, 1000, watch_event, w, &err) !=
            E_OK) {
            json_t *st = json_pack("{s:s, s:s, s:s, s:s, s:i}", "kind", "Status", "apiVersion",
                                   "v1", "status", "Failure", "reason", "Expired", "code", 410);
            json_object_set_new(st, "message", json_string(err.msg));
            watch_line(w, "ERROR", st);
            json_decref(st);
            w->ending = true;
        }
        w->rv = last;
    }
    n = w->pending.len - w->off;
    if (n > max) {
        n = max;
    }
    memcpy(out, w->pending.data + w->off, n);
    w->off += n;
    return (long)n;
}

static void watch_free(void *cls)
{
    struct watch *w = cls;

    buf_cleanup(&w->pending);
    kube_view_cleanup(&w->view);
    free(w->ns);
    free(w);
}

/* Takes VIEW's contents. */
static int start_watch(struct request *r, const char *ns, struct kube_view *view)
{
    struct watch *w = xcalloc(1, sizeof(*w));
    const char *rvq = http_query(r, "resourceVersion");
    const char *tq = http_query(r, "timeoutSeconds");
    struct err err = {0};

    w->srv = r->srv;
    w->view = *view;
    memset(view, 0, sizeof(*view));
    w->ns = ns != NULL ? xstrdup(ns) : NULL;
    buf_init(&w->pending, 0);
    if (tq != NULL && atoll_ok(tq)) {
        w->deadline_ms = clock_now_ms(clock_system()) + strtoll(tq, NULL, 10) * 1000;
    }
    if (rvq == NULL || rvq[0] == '\0' || strcmp(rvq, "0") == 0) {
        /* Kubernetes semantics: the current state as synthetic ADDED events first. The
         * list and w->rv come from one snapshot: streaming resumes right after it. */
        if (task_store_list_text(&w->rv, r->srv->store, ns, watch_added, w, &err) != E_OK) {
            watch_free(w);
            return http_send_err(r, &err);
        }
    } else if (atoll_ok(rvq)) {
        w->rv = strtoll(rvq, NULL, 10);
    } else {
        watch_free(w);
        return http_send_error(r, 400, NULL, NULL, "resourceVersion %s is not a number", rvq);
    }
    return http_send_stream(r, 200, "application/json", watch_read, w, watch_free);
}

/* --- list, create, get ----------------------------------------------------------- */

/* An AgentTaskList written from the stored JSON text of its items (no parse, no
 * re-encoding: a list of 10,000 tasks is mostly a copy). */
struct list_text {
    struct buf out;
    const int64_t *rv; /* the list's resourceVersion: set before the first item */
    size_t n;          /* items so far */
};

static void list_text_head(struct list_text *l)
{
    (void)buf_printf(&l->out,
                     "{\"apiVersion\":\"%s\",\"kind\":\"AgentTaskList\",\"metadata\":"
                     "{\"resourceVersion\":\"%lld\"},\"items\":[",
                     TASK_API_VERSION, (long long)*l->rv);
}

static int list_text_item(const char *json, size_t len, void *userdata)
{
    struct list_text *l = userdata;

    if (l->n++ == 0) {
        list_text_head(l);
    } else {
        (void)buf_puts(&l->out, ",");
    }
    return buf_append(&l->out, json, len);
}

static int list_ns(struct request *r, const char *ns)
{
    int64_t rv = 0;
    struct list_text l = {.rv = &rv, .n = 0};
    struct kube_view view;
    struct err err = {0};
    int ret;

    if (kube_view_init(&view, r, &ret) != E_OK) {
        return ret;
    }
    if (http_query_true(r, "watch")) {
        return start_watch(r, ns, &view);
    }
    if (!kube_view_plain(&view)) {
        /* kubectl: a Table, or a fieldSelector (delete --wait). */
        ret = kube_send_list(r, &view, ns);
        kube_view_cleanup(&view);
        return ret;
    }
    http_body_init(&l.out);
    if (task_store_list_text(&rv, r->srv->store, ns, list_text_item, &l, &err) != E_OK) {
        buf_cleanup(&l.out);
        return http_send_err(r, &err);
    }
    if (l.n == 0) {
        list_text_head(&l);
    }
    (void)buf_puts(&l.out, "]}\n");
    return http_send_body(r, 200, "application/json", &l.out);
}

int api_task_list(struct request *r)
{
    return list_ns(r, r->params[PARAM_NS]);
}

int api_task_list_all(struct request *r)
{
    return list_ns(r, NULL);
}

int api_task_repo_check(const char *data_dir, const json_t *doc, struct err *err)
{
    const json_t *repo = json_object_get(json_object_get(doc, "spec"), "repository");

    if (controller_url_in_data_dir(data_dir, json_string_value(json_object_get(repo, "url")))) {
        return err_set_field(err, E_INVALID, "spec.repository.url",
                             "spec.repository.url: a file:// repository inside the server's "
                             "data directory is refused");
    }
    return E_OK;
}

int api_task_create(struct request *r)
{
    json_t *body, *obj = NULL, *stored = NULL;
    struct err err = {0};
    int ret;

    body = http_body_json(r, &ret);
    if (body == NULL) {
        return ret;
    }
    if (task_normalize_new(&obj, body, r->params[PARAM_NS], &err) != E_OK ||
        api_task_repo_check(r->srv->cfg.data_dir, obj, &err) != E_OK ||
        task_store_create(&stored, r->srv->store, obj, &err) != E_OK) {
        ret = http_send_err(r, &err);
        goto out;
    }
    log_change("created", stored);
    ret = http_send_json(r, 201, stored);
out:
    json_decref(body);
    json_decref(obj);
    return ret;
}

static int get_and_send(struct request *r)
{
    json_t *obj = NULL;
    struct err err = {0};

    if (task_store_get(&obj, r->srv->store, r->params[PARAM_NS], r->params[PARAM_NAME], &err) !=
        E_OK) {
        return http_send_err(r, &err);
    }
    return http_send_json(r, 200, obj);
}

/* Copies the stored text of a task, newline-terminated as http_send_json's (the reader
 * connection goes back to the pool before anything is sent). */
static int copy_stored(const char *json, size_t len, void *userdata)
{
    char **text = userdata;

    *text = xmalloc(len + 2);
    memcpy(*text, json, len);
    memcpy(*text + len, "\n", 2);
    return E_OK;
}

/* GET of one task as JSON, without parsing and re-encoding it: the store's text, as the
 * list sends each item. */
static int get_text_and_send(struct request *r)
{
    char *text = NULL;
    struct err err = {0};

    if (task_store_get_text(r->srv->store, r->params[PARAM_NS], r->params[PARAM_NAME], copy_stored,
                            &text, &err) != E_OK) {
        return http_send_err(r, &err);
    }
    return http_send_text_take(r, 200, "application/json", text, strlen(text));
}

int api_task_get(struct request *r)
{
    struct kube_view view;
    json_t *obj = NULL;
    struct err err = {0};
    int ret;

    if (kube_view_init(&view, r, &ret) != E_OK) {
        return ret;
    }
    if (!view.table) {
        ret = get_text_and_send(r);
    } else if (task_store_get(&obj, r->srv->store, r->params[PARAM_NS], r->params[PARAM_NAME],
                              &err) != E_OK) {
        ret = http_send_err(r, &err);
    } else {
        ret = kube_send_object(r, &view, obj); /* a one-row Table for `kubectl get NAME` */
    }
    kube_view_cleanup(&view);
    return ret;
}

int api_task_status_get(struct request *r)
{
    return get_and_send(r);
}

/* --- patch and update ------------------------------------------------------------ */

struct patch_args {
    json_t *patch;
    enum task_patch_scope scope;
    const char *data_dir; /* the server's */
    struct task_store *store;
    const char *ns, *name;
    json_t *stored; /* out: the task as stored */
    struct err *err;
};

static int apply_patch(json_t *doc, struct err *err, void *userdata)
{
    struct patch_args *a = userdata;
    int rc = task_apply_merge_patch(doc, a->patch, a->scope, err);

    return rc == E_OK ? api_task_repo_check(a->data_dir, doc, err) : rc;
}

static int mutate_patch(void *userdata)
{
    struct patch_args *a = userdata;

    return task_store_mutate(&a->stored, a->store, a->ns, a->name, apply_patch, a, a->err);
}

/* Whether PATCH (of SCOPE) asks to suspend the task: its sandbox is then frozen before
 * the change is committed (controller_suspend_change). */
static bool suspends(const json_t *patch, enum task_patch_scope scope)
{
    return scope == TASK_PATCH_MAIN &&
           json_is_true(json_object_get(json_object_get(patch, "spec"), "suspended"));
}

static int patch(struct request *r, enum task_patch_scope scope)
{
    const char *ct = http_header(r, MHD_HTTP_HEADER_CONTENT_TYPE);
    struct err err = {0};
    struct patch_args a = {.patch = NULL,
                           .scope = scope,
                           .data_dir = r->srv->cfg.data_dir,
                           .store = r->srv->store,
                           .ns = r->params[PARAM_NS],
                           .name = r->params[PARAM_NAME],
                           .err = &err};
    int ret, rc;

    if (ct == NULL || strncmp(ct, "application/merge-patch+json", 28) != 0) {
        /* The header is request bytes: not echoed. */
        return http_send_error(r, 415, NULL, NULL,
                               "PATCH needs Content-Type application/merge-patch+json (JSON "
                               "patch and strategic merge patch are not supported)");
    }
    a.patch = http_body_json(r, &ret);
    if (a.patch == NULL) {
        return ret;
    }
    if (!json_is_object(a.patch)) {
        ret = http_send_error(r, 400, NULL, NULL, "a merge patch must be a JSON object");
        goto out;
    }
    rc = suspends(a.patch, scope)
             ? controller_suspend_change(r->srv->controller, a.ns, a.name, mutate_patch, &a)
             : mutate_patch(&a);
    if (rc != E_OK) {
        ret = http_send_err(r, &err);
        goto out;
    }
    log_change(scope == TASK_PATCH_STATUS ? "status patched" : "patched", a.stored);
    ret = http_send_json(r, 200, a.stored);
out:
    json_decref(a.patch);
    return ret;
}

int api_task_patch(struct request *r)
{
    return patch(r, TASK_PATCH_MAIN);
}

int api_task_status_patch(struct request *r)
{
    return patch(r, TASK_PATCH_STATUS);
}

/* PUT: a full replacement of the scope's part, expressed as a merge patch that first
 * removes every field of the scope and then sets the body's. */
static json_t *replacement_patch(json_t *body, enum task_patch_scope scope)
{
    json_t *md = json_object_get(body, "metadata");
    json_t *p = json_object();
    json_t *pmd = json_object();
    const json_t *rv = json_object_get(md, "resourceVersion");

    if (rv != NULL) {
        json_object_set_new(pmd, "resourceVersion", json_deep_copy(rv));
    }
    json_object_set_new(pmd, "name", json_deep_copy(json_object_get(md, "name")));
    if (scope == TASK_PATCH_MAIN) {
        json_t *labels = json_object_get(md, "labels");
        json_t *ann = json_object_get(md, "annotations");
        json_object_set_new(pmd, "labels", labels != NULL ? json_deep_copy(labels) : json_null());
        json_object_set_new(pmd, "annotations", ann != NULL ? json_deep_copy(ann) : json_null());
    }
    json_object_set_new(p, "metadata", pmd);
    return p;
}

struct put_args {
    json_t *body;
    enum task_patch_scope scope;
    const char *data_dir; /* the server's */
};

static int apply_put(json_t *doc, struct err *err, void *userdata)
{
    struct put_args *a = userdata;
    json_t *p = replacement_patch(a->body, a->scope);
    const char *part = a->scope == TASK_PATCH_MAIN ? "spec" : "status";
    json_t *src = json_object_get(a->body, part);
    int rc;

    if (!json_is_object(src)) {
        json_decref(p);
        return err_set_field(err, E_INVALID, part, "%s: required", part);
    }
    /* Replace, not merge: drop the current part first. */
    json_object_set_new(doc, part, json_object());
    json_object_set_new(p, part, json_deep_copy(src));
    rc = task_apply_merge_patch(doc, p, a->scope, err);
    json_decref(p);
    return rc == E_OK ? api_task_repo_check(a->data_dir, doc, err) : rc;
}

static int put(struct request *r, enum task_patch_scope scope)
{
    struct put_args a = {.body = NULL, .scope = scope, .data_dir = r->srv->cfg.data_dir};
    json_t *stored = NULL, *md;
    struct err err = {0};
    int ret;

    a.body = http_body_json(r, &ret);
    if (a.body == NULL) {
        return ret;
    }
    md = json_object_get(a.body, "metadata");
    if (!json_is_object(md) || !json_is_string(json_object_get(md, "name"))) {
        ret = http_send_error(r, 422, NULL, NULL, "metadata.name: required");
        goto out;
    }
    if (task_store_mutate(&stored, r->srv->store, r->params[PARAM_NS], r->params[PARAM_NAME],
                          apply_put, &a, &err) != E_OK) {
        ret = http_send_err(r, &err);
        goto out;
    }
    log_change("updated", stored);
    ret = http_send_json(r, 200, stored);
out:
    json_decref(a.body);
    return ret;
}

int api_task_put(struct request *r)
{
    return put(r, TASK_PATCH_MAIN);
}

int api_task_status_put(struct request *r)
{
    return put(r, TASK_PATCH_STATUS);
}

/* --- delete ---------------------------------------------------------------------- */

/* After a delete the store could not write (E_FAIL in ERR; typically "database or disk is
 * full", as a runaway sandbox leaves the data dir's filesystem): the task's sandbox is
 * stopped and its files removed, which frees the space it took, and the delete is tried
 * once more. The files go only when the task is there and matches the precondition EXPECT
 * (0: none): what the caller asked for anyway. */
static int remove_freeing_space(json_t **last, struct request *r, int64_t expect, struct err *err)
{
    const char *ns = r->params[PARAM_NS], *name = r->params[PARAM_NAME];
    json_t *obj = NULL;
    const char *rv;
    char first[ERR_MSG_MAX];
    int rc;

    if (r->srv->controller == NULL || task_store_get(&obj, r->srv->store, ns, name, NULL) != E_OK) {
        return err->code;
    }
    rv = json_string_value(json_object_get(json_object_get(obj, "metadata"), "resourceVersion"));
    rc = expect != 0 && (rv == NULL || strtoll(rv, NULL, 10) != expect) ? E_CONFLICT : E_OK;
    json_decref(obj);
    if (rc != E_OK) {
        return err->code; /* the first answer stands */
    }
    snprintf(first, sizeof(first), "%s", err->msg);
    log_kv(LOG_WARN, "delete_frees_space", "namespace", ns, "name", name, "error", first, NULL);
    controller_release_task(r->srv->controller, ns, name);
    memset(err, 0, sizeof(*err));
    rc = task_store_remove(last, r->srv->store, ns, name, expect, err);
    if (rc == E_FAIL) {
        rc = err_set(err, E_FAIL,
                     "the task's sandbox was stopped and its files removed, but the database "
                     "could not record the deletion (%s): free space on the data dir's "
                     "filesystem, then delete it again",
                     first);
    }
    return rc;
}

int api_task_delete(struct request *r)
{
    json_t *opts = NULL, *last = NULL;
    int64_t expect = 0;
    struct err err = {0};
    int ret;

    if (r->body.len > 0) {
        /* Optional DeleteOptions with preconditions.resourceVersion. */
        const json_t *rv;
        opts = http_body_json(r, &ret);
        if (opts == NULL) {
            return ret;
        }
        rv = json_object_get(json_object_get(opts, "preconditions"), "resourceVersion");
        if (json_is_string(rv)) {
            expect = strtoll(json_string_value(rv), NULL, 10);
        }
        json_decref(opts);
    }
    if (task_store_remove(&last, r->srv->store, r->params[PARAM_NS], r->params[PARAM_NAME], expect,
                          &err) != E_OK &&
        (err.code != E_FAIL || remove_freeing_space(&last, r, expect, &err) != E_OK)) {
        return http_send_err(r, &err);
    }
    log_change("deleted", last);
    return http_send_json(r, 200, last);
}

/* --- environments (read side) ---------------------------------------------------- */

int api_env_list(struct request *r)
{
    json_t *items = NULL;
    struct err err = {0};

    if (task_store_env_list(&items, r->srv->store, r->params[PARAM_NS], &err) != E_OK) {
        return http_send_err(r, &err);
    }
    return http_send_json(r, 200,
                          json_pack("{s:s, s:s, s:o}", "apiVersion", TASK_API_VERSION, "kind",
                                    "EnvironmentList", "items", items));
}

int api_env_get(struct request *r)
{
    json_t *obj = NULL;
    struct err err = {0};

    if (task_store_env_get(&obj, r->srv->store, r->params[PARAM_NS], r->params[PARAM_NAME], &err) !=
        E_OK) {
        return http_send_err(r, &err);
    }
    return http_send_json(r, 200, obj);
}

/* --- discovery (enough for kubectl, see KUBECTL-PROTOCOL.md) ------------------------ */

int api_discovery_api(struct request *r)
{
    return http_send_json(r, 200, json_pack("{s:s, s:[]}", "kind", "APIVersions", "versions"));
}

int api_discovery_apis(struct request *r)
{
    return http_send_json(r, 200,
                          json_pack("{s:s, s:s, s:[{s:s, s:[{s:s, s:s}], s:{s:s, s:s}}]}", "kind",
                                    "APIGroupList", "apiVersion", "v1", "groups", "name",
                                    "divergedev.com", "versions", "groupVersion", TASK_API_VERSION,
                                    "version", "v1alpha1", "preferredVersion", "groupVersion",
                                    TASK_API_VERSION, "version", "v1alpha1"));
}

int api_discovery_group(struct request *r)
{
    return http_send_json(
        r, 200,
        json_pack("{s:s, s:s, s:s, s:[{s:s, s:s, s:b, s:s, s:[s,s,s,s,s,s,s], s:[s], s:[s,s]},"
                  " {s:s, s:s, s:b, s:s, s:[s,s,s]},"
                  " {s:s, s:s, s:b, s:s, s:[s,s,s,s,s,s], s:[s]},"
                  " {s:s, s:s, s:b, s:s, s:[s,s,s]}]}",
                  "kind", "APIResourceList", "apiVersion", "v1", "groupVersion", TASK_API_VERSION,
                  "resources", "name", "agenttasks", "singularName", "agenttask", "namespaced", 1,
                  "kind", "AgentTask", "verbs", "create", "delete", "get", "list", "patch",
                  "update", "watch", "shortNames", "at", "categories", "all", "diverge", "name",
                  "agenttasks/status", "singularName", "", "namespaced", 1, "kind", "AgentTask",
                  "verbs", "get", "patch", "update", "name", "spendquotas", "singularName",
                  "spendquota", "namespaced", 1, "kind", "SpendQuota", "verbs", "create", "delete",
                  "get", "list", "patch", "update", "shortNames", "sq", "name",
                  "spendquotas/status", "singularName", "", "namespaced", 1, "kind", "SpendQuota",
                  "verbs", "get", "patch", "update"));
}
