/* SPDX-License-Identifier: Apache-2.0 */
/* The Kubernetes validating admission webhook for AgentTasks (SPEC §3, §11):
 * POST /api/v1/admission/validate takes an AdmissionReview v1 and answers whether the
 * CREATE or UPDATE may go ahead, with the task API's own validation (store/: a CREATE is
 * checked as a POST of the object, an UPDATE as a PUT of it over the old object, so what
 * the task API refuses on update, such as renaming, is refused here too). A denial is a
 * 422 status whose message names every invalid field. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "server/api/api_int.h"

#define REVIEW_API_VERSION "admission.k8s.io/v1"
#define TASK_GROUP "divergedev.com"
#define ADMISSION_ERRORS_MAX 16 /* invalid fields named in one denial */

/* One AdmissionReview request, borrowed from the parsed body. */
struct review {
    const char *uid;
    const char *operation; /* CREATE, UPDATE, DELETE, CONNECT */
    const char *ns;        /* request.namespace, else the object's, else "default" */
    const char *sub;       /* request.subResource; "" for the main resource */
    const json_t *object;
    const json_t *old;
    const char *data_dir; /* the server's: repositories inside it are refused */
};

/* Removes the member at the field path PATH ("spec.budgetUSD", "metadata.annotations.
 * divergedev.com/guidance", "spec.capabilities[2]") from DOC; a path into a list or map
 * removes the whole list or map. Keys may hold dots: the first prefix that names a
 * member wins. False when nothing was removed. */
static bool remove_path(json_t *doc, const char *path)
{
    json_t *cur = doc;
    const char *rem = path;

    while (json_is_object(cur) && *rem != '\0') {
        size_t n = 0;
        bool moved = false;

        for (;;) {
            char key[256];
            size_t end = n + strcspn(rem + n, ".[");
            if (end >= sizeof(key)) {
                return false;
            }
            memcpy(key, rem, end);
            key[end] = '\0';
            if (json_object_get(cur, key) != NULL) {
                json_t *next = json_object_get(cur, key);
                if (rem[end] != '.' || !json_is_object(next)) {
                    return json_object_del(cur, key) == 0;
                }
                cur = next;
                rem += end + 1;
                moved = true;
                break;
            }
            if (rem[end] != '.') {
                return false;
            }
            n = end + 1;
        }
        if (!moved) {
            return false;
        }
    }
    return false;
}

/* Checks the CREATE of OBJ in R's namespace as the task API's POST does. */
static int check_create(const struct review *r, const json_t *obj, struct err *err)
{
    json_t *out = NULL;
    int rc = task_normalize_new(&out, obj, r->ns, err);

    if (rc == E_OK) {
        rc = api_task_repo_check(r->data_dir, out, err);
    }
    json_decref(out);
    return rc;
}

/* Checks the UPDATE of R->old to OBJ as the task API's PUT (of the main resource or of
 * /status) does: everything of the scope is replaced, then the result is validated. */
static int check_update(const struct review *r, const json_t *obj, struct err *err)
{
    bool status = strcmp(r->sub, "status") == 0;
    const char *part = status ? "status" : "spec";
    const json_t *md = json_object_get(obj, "metadata");
    const json_t *src = json_object_get(obj, part);
    json_t *doc = NULL, *patch, *pmd;
    int rc;

    /* The stored form of the old object: what the task API would hold. */
    if (task_normalize_new(&doc, r->old, r->ns, NULL) != E_OK) {
        return check_create(r, obj, err); /* nothing sound to compare with */
    }
    if (json_is_object(json_object_get(r->old, "status"))) {
        json_object_set_new(doc, "status", json_deep_copy(json_object_get(r->old, "status")));
    }
    if (!json_is_object(md)) {
        json_decref(doc);
        return err_set_field(err, E_INVALID, "metadata", "metadata: required");
    }
    if (!json_is_object(src)) {
        json_decref(doc);
        return err_set_field(err, E_INVALID, part, "%s: required", part);
    }
    pmd = json_object();
    if (json_object_get(md, "name") != NULL) {
        json_object_set_new(pmd, "name", json_deep_copy(json_object_get(md, "name")));
    }
    if (json_object_get(md, "namespace") != NULL) {
        json_object_set_new(pmd, "namespace", json_deep_copy(json_object_get(md, "namespace")));
    }
    if (!status) {
        const json_t *l = json_object_get(md, "labels"), *a = json_object_get(md, "annotations");
        json_object_set_new(pmd, "labels", l != NULL ? json_deep_copy(l) : json_null());
        json_object_set_new(pmd, "annotations", a != NULL ? json_deep_copy(a) : json_null());
    }
    patch = json_pack("{s:o, s:O}", "metadata", pmd, part, src);
    json_object_set_new(doc, part, json_object()); /* replace, not merge */
    rc = task_apply_merge_patch(doc, patch, status ? TASK_PATCH_STATUS : TASK_PATCH_MAIN, err);
    if (rc == E_OK) {
        rc = api_task_repo_check(r->data_dir, doc, err);
    }
    json_decref(patch);
    json_decref(doc);
    return rc;
}

/* Required fields and a valid stand-in for each: after reporting one of them, the search
 * for further invalid fields goes on with the stand-in in its place (removing it would
 * only report it again). */
static const struct {
    const char *parent; /* "" for the top level */
    const char *key;
    const char *field; /* parent.key */
    const char *value; /* JSON of the stand-in */
} g_stand_ins[] = {
    {"", "metadata", "metadata", "{}"}, {"metadata", "name", "metadata.name", "\"x\""},
    {"", "spec", "spec", "{}"},         {"spec", "objective", "spec.objective", "\"x\""},
    {"", "status", "status", "{}"},     {"status", "phase", "status.phase", "\"Pending\""},
};

/* Puts the stand-in of FIELD into DOC; false when FIELD has none or it cannot go in. */
static bool stand_in(json_t *doc, const char *field)
{
    for (size_t i = 0; i < ARRAY_LEN(g_stand_ins); i++) {
        json_t *parent =
            g_stand_ins[i].parent[0] != '\0' ? json_object_get(doc, g_stand_ins[i].parent) : doc;
        if (strcmp(g_stand_ins[i].field, field) != 0 || !json_is_object(parent)) {
            continue;
        }
        return json_object_set_new(parent, g_stand_ins[i].key,
                                   json_loads(g_stand_ins[i].value, JSON_DECODE_ANY, NULL)) == 0;
    }
    return false;
}

/* Runs CHECK over a copy of R->object, taking out each invalid field it reports (or
 * putting a stand-in in place of a required one) and running again, so that the causes
 * name every invalid field (up to ADMISSION_ERRORS_MAX). */
static bool has_cause(const json_t *causes, const char *field)
{
    const json_t *c;
    size_t i;

    json_array_foreach(causes, i, c)
    {
        if (strcmp(json_string_value(json_object_get(c, "field")), field) == 0) {
            return true;
        }
    }
    return false;
}

static json_t *collect_causes(const struct review *r,
                              int (*check)(const struct review *, const json_t *, struct err *))
{
    json_t *copy = json_deep_copy(r->object), *causes = json_array();
    char stood[sizeof(((struct err *)NULL)->field)] = "";

    /* Each round either records a new cause or puts a stand-in in for the last one. */
    for (int i = 0; i < 2 * ADMISSION_ERRORS_MAX; i++) {
        struct err err = {0};

        if (json_array_size(causes) >= ADMISSION_ERRORS_MAX || check(r, copy, &err) == E_OK) {
            break;
        }
        if (has_cause(causes, err.field)) {
            /* Taking it out did not help: a required field, or one that must stay. */
            if (strcmp(stood, err.field) == 0 || !stand_in(copy, err.field)) {
                break;
            }
            snprintf(stood, sizeof(stood), "%s", err.field);
            continue;
        }
        json_array_append_new(causes, json_pack("{s:s, s:s, s:s}", "reason", "FieldValueInvalid",
                                                "message", err.msg, "field", err.field));
        if (err.code != E_INVALID || err.field[0] == '\0') {
            break;
        }
        if (!remove_path(copy, err.field)) {
            if (!stand_in(copy, err.field)) {
                break;
            }
            snprintf(stood, sizeof(stood), "%s", err.field);
        }
    }
    json_decref(copy);
    return causes;
}

static json_t *denial(const struct review *r, json_t *causes)
{
    const char *name =
        json_string_value(json_object_get(json_object_get(r->object, "metadata"), "name"));
    json_t *details, *c;
    struct buf msg;
    size_t i;

    buf_init(&msg, 0);
    if (name != NULL && task_name_valid(name)) {
        buf_printf(&msg, "AgentTask.%s \"%s\" is invalid: ", TASK_GROUP, name);
    } else {
        buf_printf(&msg, "AgentTask.%s is invalid: ", TASK_GROUP);
        name = "";
    }
    json_array_foreach(causes, i, c)
    {
        buf_printf(&msg, "%s%s", i > 0 ? "; " : "",
                   json_string_value(json_object_get(c, "message")));
    }
    details = json_pack("{s:s, s:s, s:s, s:o}", "name", name, "group", TASK_GROUP, "kind",
                        "agenttasks", "causes", causes);
    c = json_pack("{s:s, s:b, s:{s:s, s:s, s:s, s:i, s:o}}", "uid", r->uid, "allowed", 0, "status",
                  "status", "Failure", "message", msg.data, "reason", "Invalid", "code", 422,
                  "details", details);
    buf_cleanup(&msg);
    return c;
}

/* Whether BODY is a JSON object whose string member KEY equals WANT. */
static bool member_is(const json_t *body, const char *key, const char *want)
{
    const json_t *v = json_object_get(body, key);

    return json_is_string(v) && strcmp(json_string_value(v), want) == 0;
}

/* The namespace under review: request.namespace, else the object's, else "default". */
static const char *review_namespace(const json_t *req, const json_t *object)
{
    const json_t *ns = json_object_get(req, "namespace");
    const char *name =
        json_is_string(ns) && json_string_length(ns) > 0 ? json_string_value(ns) : NULL;

    if (name == NULL) {
        name = json_string_value(json_object_get(json_object_get(object, "metadata"), "namespace"));
    }
    return name == NULL || name[0] == '\0' ? "default" : name;
}

/* Reads the review; NULL when fine, else the reason it is malformed. */
static const char *parse_review(struct review *out, const json_t *body)
{
    const json_t *req = json_object_get(body, "request");
    const json_t *sub = json_object_get(req, "subResource");

    memset(out, 0, sizeof(*out));
    if (!json_is_object(body) || !member_is(body, "apiVersion", REVIEW_API_VERSION) ||
        !member_is(body, "kind", "AdmissionReview")) {
        return "expected an AdmissionReview of apiVersion " REVIEW_API_VERSION;
    }
    if (!json_is_object(req)) {
        return "request: required";
    }
    out->uid = json_string_value(json_object_get(req, "uid"));
    out->operation = json_string_value(json_object_get(req, "operation"));
    if (out->uid == NULL || out->uid[0] == '\0') {
        return "request.uid: required";
    }
    if (out->operation == NULL) {
        return "request.operation: required";
    }
    out->object = json_object_get(req, "object");
    out->old = json_object_get(req, "oldObject");
    out->sub = json_is_string(sub) ? json_string_value(sub) : "";
    out->ns = review_namespace(req, out->object);
    return NULL;
}

/* True when the review is about an AgentTask (request.kind, else the object's kind). */
static bool is_agenttask(const json_t *body)
{
    const json_t *kind = json_object_get(json_object_get(body, "request"), "kind");

    return json_is_object(kind) && json_is_string(json_object_get(kind, "group")) &&
           strcmp(json_string_value(json_object_get(kind, "group")), TASK_GROUP) == 0 &&
           json_is_string(json_object_get(kind, "kind")) &&
           strcmp(json_string_value(json_object_get(kind, "kind")), TASK_KIND) == 0;
}

static json_t *review_of(json_t *response)
{
    return json_pack("{s:s, s:s, s:o}", "apiVersion", REVIEW_API_VERSION, "kind", "AdmissionReview",
                     "response", response);
}

/* For a CREATE or UPDATE of an AgentTask: NULL when the objects it needs are there, else
 * what is missing. */
static const char *check_objects(const struct review *rv, bool update)
{
    if (!json_is_object(rv->object)) {
        return "request.object: required for CREATE and UPDATE";
    }
    if (update && !json_is_object(rv->old)) {
        return "request.oldObject: required for UPDATE";
    }
    return NULL;
}

/* The reasons to deny a CREATE or UPDATE of an AgentTask (a JSON array, maybe empty). */
static json_t *causes_of(const struct review *rv, bool create)
{
    if (!task_name_valid(rv->ns)) {
        return json_pack("[{s:s, s:s, s:s}]", "reason", "FieldValueInvalid", "message",
                         "metadata.namespace: must be a DNS label", "field", "metadata.namespace");
    }
    return collect_causes(rv, create ? check_create : check_update);
}

int api_admission_validate(struct request *r)
{
    struct review rv;
    const char *bad;
    json_t *body, *causes = NULL, *resp;
    bool create, update, task;
    int ret;

    body = http_body_json(r, &ret);
    if (body == NULL) {
        return ret;
    }
    bad = parse_review(&rv, body);
    rv.data_dir = r->srv->cfg.data_dir;
    create = bad == NULL && strcmp(rv.operation, "CREATE") == 0;
    update = bad == NULL && strcmp(rv.operation, "UPDATE") == 0;
    task = bad == NULL && is_agenttask(body) && (create || update);
    if (task) {
        bad = check_objects(&rv, update);
    }
    if (bad != NULL) {
        ret = http_send_error(r, 400, NULL, NULL, "malformed AdmissionReview: %s", bad);
        json_decref(body);
        return ret;
    }
    if (task) {
        causes = causes_of(&rv, create);
    }
    if (causes != NULL && json_array_size(causes) > 0) {
        resp = denial(&rv, causes);
        log_kv(LOG_INFO, "admission_denied", "operation", create ? "CREATE" : "UPDATE", NULL);
    } else {
        json_decref(causes);
        resp = json_pack("{s:s, s:b}", "uid", rv.uid, "allowed", 1);
    }
    ret = http_send_json(r, 200, review_of(resp));
    json_decref(body);
    return ret;
}
