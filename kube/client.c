/* SPDX-License-Identifier: Apache-2.0 */
/* The resource calls: URL building from a resource type, namespace and name (all checked
 * against the Kubernetes name rules, so nothing from outside shapes a path), one request
 * per call, and the answer checked to be a JSON object before anyone reads it. */
#include "kube/kube_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/httpc.h"

const struct kube_resource KUBE_AGENTTASKS = {"divergedev.com", "v1alpha1", "agenttasks",
                                              "AgentTask"};
const struct kube_resource KUBE_ENVIRONMENTS = {"divergedev.com", "v1alpha1", "environments",
                                                "Environment"};
const struct kube_resource KUBE_SPENDQUOTAS = {"divergedev.com", "v1alpha1", "spendquotas",
                                               "SpendQuota"};
const struct kube_resource KUBE_SECRETS = {"", "v1", "secrets", "Secret"};
const struct kube_resource KUBE_CONFIGMAPS = {"", "v1", "configmaps", "ConfigMap"};
const struct kube_resource KUBE_EVENTS = {"events.k8s.io", "v1", "events", "Event"};
const struct kube_resource KUBE_LEASES = {"coordination.k8s.io", "v1", "leases", "Lease"};
const struct kube_resource KUBE_SANDBOXCLAIMS = {"extensions.agents.x-k8s.io", "v1beta1",
                                                 "sandboxclaims", "SandboxClaim"};
const struct kube_resource KUBE_SANDBOXES = {"agents.x-k8s.io", "v1beta1", "sandboxes", "Sandbox"};

struct kube_client {
    struct kube_config *cfg; /* owned */
};

#define CALL_TIMEOUT_MS 30000L

/* Whether CH may stand at position I of N in a name: [a-z0-9] anywhere, '-' (and '.' with
 * DOTS) only inside. */
static bool name_char_ok(char ch, size_t i, size_t n, bool dots)
{
    bool inside = i > 0 && i + 1 < n;

    if ((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9')) {
        return true;
    }
    return inside && (ch == '-' || (dots && ch == '.'));
}

static bool name_chars_ok(const char *s, size_t max, bool dots)
{
    size_t n = s != NULL ? strlen(s) : 0;

    if (n == 0 || n > max) {
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        if (!name_char_ok(s[i], i, n, dots)) {
            return false;
        }
    }
    return true;
}

bool kube_name_ok(const char *s)
{
    return name_chars_ok(s, 63, false);
}

bool kube_object_name_ok(const char *s)
{
    return name_chars_ok(s, 253, true);
}

int kube_client_new(struct kube_client **out, struct kube_config *cfg, struct err *err)
{
    *out = NULL;
    if (cfg == NULL || cfg->server == NULL) {
        kube_config_free(cfg);
        return err_set(err, E_INVALID, "kubernetes client: no server configured");
    }
    *out = xcalloc(1, sizeof(**out));
    (*out)->cfg = cfg;
    return E_OK;
}

void kube_client_free(struct kube_client *c)
{
    if (c != NULL) {
        kube_config_free(c->cfg);
        free(c);
    }
}

struct kube_config *kube_client_config(struct kube_client *c)
{
    return c->cfg;
}

int kube_url(char **out, struct kube_client *c, const struct kube_resource *res, const char *ns,
             const char *name, const char *sub, struct err *err)
{
    struct buf b;

    *out = NULL;
    if (ns != NULL && !kube_name_ok(ns)) {
        return err_set(err, E_INVALID, "%s: namespace is not a dns label", res->plural);
    }
    if (name != NULL && !kube_object_name_ok(name)) {
        return err_set(err, E_INVALID, "%s: name is not a dns subdomain", res->plural);
    }
    buf_init(&b, 0);
    (void)buf_puts(&b, c->cfg->server);
    if (res->group[0] == '\0') {
        (void)buf_printf(&b, "/api/%s", res->version);
    } else {
        (void)buf_printf(&b, "/apis/%s/%s", res->group, res->version);
    }
    if (ns != NULL) {
        (void)buf_printf(&b, "/namespaces/%s", ns);
    }
    (void)buf_printf(&b, "/%s", res->plural);
    if (name != NULL) {
        (void)buf_printf(&b, "/%s", name);
    }
    if (sub != NULL) {
        (void)buf_printf(&b, "/%s", sub);
    }
    *out = buf_take(&b);
    return E_OK;
}

int kube_call(json_t **out, struct kube_client *c, const char *method, const char *url,
              const char *ctype, const json_t *body, long timeout_ms, const char *what,
              struct err *err)
{
    struct kube_http_req req = {.method = method, .url = url, .timeout_ms = timeout_ms};
    struct buf resp;
    char *text = NULL;
    long status = 0;
    int rc;

    if (out != NULL) {
        *out = NULL;
    }
    if (body != NULL) {
        text = json_dumps(body, JSON_COMPACT);
        if (text == NULL) {
            return err_set(err, E_INVALID, "%s: cannot encode the request", what);
        }
        req.body = text;
        req.body_len = strlen(text);
        req.content_type = ctype;
    }
    buf_init(&resp, KUBE_BODY_MAX);
    rc = kube_http_do(&status, &resp, c->cfg, &req, err);
    if (rc == E_OK && (status < 200 || status > 299)) {
        rc = kube_status_error(status, &resp, what, err);
    } else if (rc == E_OK && out != NULL) {
        rc = kube_parse_object(out, resp.data != NULL ? resp.data : "", resp.len, err);
    }
    free(text);
    buf_cleanup(&resp);
    return rc;
}

static int call(json_t **out, struct kube_client *c, const char *method, const char *url,
                const char *ctype, const json_t *body, const char *what, struct err *err)
{
    return kube_call(out, c, method, url, ctype, body, CALL_TIMEOUT_MS, what, err);
}

static char *what_of(const char *verb, const struct kube_resource *res)
{
    return xasprintf("%s %s", verb, res->plural);
}

int kube_get(json_t **out, struct kube_client *c, const struct kube_resource *res, const char *ns,
             const char *name, struct err *err)
{
    char *url = NULL, *what = what_of("get", res);
    int rc = kube_url(&url, c, res, ns, name, NULL, err);

    *out = NULL;
    if (rc == E_OK) {
        rc = call(out, c, "GET", url, NULL, NULL, what, err);
    }
    free(url);
    free(what);
    return rc;
}

int kube_list(json_t **items_out, char rv_out[KUBE_RV_MAX], struct kube_client *c,
              const struct kube_resource *res, const char *ns, const char *label_selector,
              struct err *err)
{
    char *url = NULL, *full = NULL, *what = what_of("list", res), *sel = NULL;
    json_t *list = NULL, *items;
    const char *rv;
    int rc = kube_url(&url, c, res, ns, NULL, NULL, err);

    *items_out = NULL;
    rv_out[0] = '\0';
    if (rc != E_OK) {
        goto out;
    }
    sel = label_selector != NULL ? httpc_escape(label_selector) : NULL;
    full = sel != NULL ? xasprintf("%s?labelSelector=%s", url, sel) : xstrdup(url);
    rc = call(&list, c, "GET", full, NULL, NULL, what, err);
    if (rc != E_OK) {
        goto out;
    }
    items = json_object_get(list, "items");
    rv = json_string_value(json_object_get(json_object_get(list, "metadata"), "resourceVersion"));
    if (!(items == NULL || json_is_array(items) || json_is_null(items)) || !kube_rv_ok(rv)) {
        rc = err_set(err, E_FAIL, "%s: malformed list (items or metadata.resourceVersion)", what);
        goto out;
    }
    snprintf(rv_out, KUBE_RV_MAX, "%s", rv);
    *items_out = json_is_array(items) ? json_incref(items) : json_array();
out:
    json_decref(list);
    free(sel);
    free(full);
    free(url);
    free(what);
    return rc;
}

int kube_create(json_t **out, struct kube_client *c, const struct kube_resource *res,
                const char *ns, const json_t *obj, struct err *err)
{
    char *url = NULL, *what = what_of("create", res);
    int rc = kube_url(&url, c, res, ns, NULL, NULL, err);

    *out = NULL;
    if (rc == E_OK) {
        rc = call(out, c, "POST", url, "application/json", obj, what, err);
    }
    free(url);
    free(what);
    return rc;
}

int kube_merge_patch(json_t **out, struct kube_client *c, const struct kube_resource *res,
                     const char *ns, const char *name, const json_t *patch, struct err *err)
{
    char *url = NULL, *what = what_of("patch", res);
    int rc = kube_url(&url, c, res, ns, name, NULL, err);

    *out = NULL;
    if (rc == E_OK) {
        rc = call(out, c, "PATCH", url, "application/merge-patch+json", patch, what, err);
    }
    free(url);
    free(what);
    return rc;
}

static int put(json_t **out, struct kube_client *c, const struct kube_resource *res, const char *ns,
               const json_t *obj, const char *sub, const char *verb, struct err *err)
{
    const char *name = json_string_value(json_object_get(json_object_get(obj, "metadata"), "name"));
    char *url = NULL, *what = what_of(verb, res);
    int rc;

    *out = NULL;
    if (name == NULL) {
        rc = err_set(err, E_INVALID, "%s: the object has no metadata.name", what);
    } else {
        rc = kube_url(&url, c, res, ns, name, sub, err);
    }
    if (rc == E_OK) {
        rc = call(out, c, "PUT", url, "application/json", obj, what, err);
    }
    free(url);
    free(what);
    return rc;
}

int kube_replace(json_t **out, struct kube_client *c, const struct kube_resource *res,
                 const char *ns, const json_t *obj, struct err *err)
{
    return put(out, c, res, ns, obj, NULL, "replace", err);
}

int kube_update_status(json_t **out, struct kube_client *c, const struct kube_resource *res,
                       const char *ns, const json_t *obj, struct err *err)
{
    return put(out, c, res, ns, obj, "status", "update status of", err);
}

int kube_delete(struct kube_client *c, const struct kube_resource *res, const char *ns,
                const char *name, const char *expect_rv, struct err *err)
{
    char *url = NULL, *what = what_of("delete", res);
    json_t *opts = json_pack("{s:s}", "propagationPolicy", "Background");
    int rc = kube_url(&url, c, res, ns, name, NULL, err);

    if (rc == E_OK && expect_rv != NULL) {
        if (!kube_rv_ok(expect_rv)) {
            rc = err_set(err, E_INVALID, "%s: bad resourceVersion precondition", what);
        } else {
            json_object_set_new(opts, "preconditions",
                                json_pack("{s:s}", "resourceVersion", expect_rv));
        }
    }
    if (rc == E_OK) {
        rc = call(NULL, c, "DELETE", url, "application/json", opts, what, err);
    }
    json_decref(opts);
    free(url);
    free(what);
    return rc;
}

bool kube_rv_ok(const char *rv)
{
    size_t n = rv != NULL ? strlen(rv) : 0;

    if (n == 0 || n >= KUBE_RV_MAX) {
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        if (rv[i] <= 0x20 || rv[i] >= 0x7f || rv[i] == '&' || rv[i] == '#' || rv[i] == '%') {
            return false;
        }
    }
    return true;
}
