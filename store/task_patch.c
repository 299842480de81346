/* SPDX-License-Identifier: Apache-2.0 */
/* RFC 7386 merge patch of AgentTasks, scoped like the Kubernetes main resource and its
 * /status subresource, and the typed read view of a normalized object. */
#include <stdlib.h>
#include <string.h>

#include "common/money.h"
#include "store/store.h"

json_t *json_merge_patch(json_t *target, json_t *patch)
{
    const char *key;
    json_t *v;

    if (!json_is_object(patch)) {
        return json_deep_copy(patch);
    }
    if (!json_is_object(target)) {
        target = json_object();
    } else {
        json_incref(target);
    }
    json_object_foreach(patch, key, v)
    {
        if (json_is_null(v)) {
            json_object_del(target, key);
        } else {
            json_t *cur = json_object_get(target, key);
            json_t *merged = json_merge_patch(cur, v);
            json_object_set_new(target, key, merged);
        }
    }
    return target;
}

/* Merges PATCH into DOC[KEY] (creating it), keeping DOC the owner. */
static void merge_member(json_t *doc, const char *key, json_t *patch)
{
    json_t *cur = json_object_get(doc, key);
    json_t *merged;

    if (json_is_null(patch)) {
        json_object_del(doc, key);
        return;
    }
    merged = json_merge_patch(cur, patch);
    json_object_set_new(doc, key, merged);
}

static int check_identity(const json_t *doc, const json_t *pmd, struct err *err)
{
    const json_t *dmd = json_object_get(doc, "metadata");
    static const char *const fixed[] = {"name", "namespace"};
    const json_t *rv;

    for (size_t i = 0; i < ARRAY_LEN(fixed); i++) {
        const json_t *p = json_object_get(pmd, fixed[i]);
        if (p != NULL && !json_equal(p, json_object_get(dmd, fixed[i]))) {
            char path[64];
            snprintf(path, sizeof(path), "metadata.%s", fixed[i]);
            return err_set_field(err, E_INVALID, path, "%s: cannot be changed", path);
        }
    }
    rv = json_object_get(pmd, "resourceVersion");
    if (rv != NULL && !json_is_null(rv) &&
        !json_equal(rv, json_object_get(dmd, "resourceVersion"))) {
        return err_set(err, E_CONFLICT,
                       "the object has been modified; please apply your changes to the latest "
                       "version and try again");
    }
    return E_OK;
}

int task_apply_merge_patch(json_t *doc, json_t *patch, enum task_patch_scope scope, struct err *err)
{
    json_t *pmd;
    json_t *dmd = json_object_get(doc, "metadata");
    static const char *const md_keys[] = {"labels", "annotations"};
    int rc;

    if (!json_is_object(patch)) {
        return err_set_field(err, E_INVALID, "", "a merge patch must be a JSON object");
    }
    pmd = json_object_get(patch, "metadata");
    if (pmd != NULL && !json_is_object(pmd) && !json_is_null(pmd)) {
        return err_set_field(err, E_INVALID, "metadata", "metadata: must be an object");
    }
    if (json_is_object(pmd)) {
        rc = check_identity(doc, pmd, err);
        if (rc != E_OK) {
            return rc;
        }
    }
    if (scope == TASK_PATCH_MAIN) {
        for (size_t i = 0; json_is_object(pmd) && i < ARRAY_LEN(md_keys); i++) {
            json_t *p = json_object_get(pmd, md_keys[i]);
            if (p != NULL) {
                merge_member(dmd, md_keys[i], p);
            }
        }
        if (json_object_get(patch, "spec") != NULL) {
            merge_member(doc, "spec", json_object_get(patch, "spec"));
            task_sync_effective_limits(doc);
        }
    } else if (json_object_get(patch, "status") != NULL) {
        merge_member(doc, "status", json_object_get(patch, "status"));
    }
    return task_validate(doc, err);
}

enum task_phase task_phase_of(const json_t *status)
{
    const json_t *phase_name = json_object_get(status, "phase");
    enum task_phase phase = TASK_PENDING;

    if (json_is_string(phase_name)) {
        (void)task_phase_parse(&phase, json_string_value(phase_name));
    }
    return phase;
}

void task_view_spend_of(struct task_view *v, const json_t *obj)
{
    const json_t *spec = json_object_get(obj, "spec");
    const json_t *status = json_object_get(obj, "status");

    memset(v, 0, sizeof(*v));
    v->budget_usd = task_json_money(spec, "budgetUSD");
    v->budget_tokens = task_json_int(spec, "budgetTokens");
    v->max_iterations = task_json_int(spec, "maxIterations");
    v->phase = task_phase_of(status);
    v->iteration = task_json_int(status, "iteration");
    v->tokens_consumed = task_json_int(status, "tokensConsumed");
    v->cost_usd = task_json_money(status, "costUSD");
}

void task_view_of(struct task_view *v, const json_t *obj)
{
    const json_t *md = json_object_get(obj, "metadata");
    const json_t *spec = json_object_get(obj, "spec");
    const json_t *status = json_object_get(obj, "status");
    const json_t *rv = json_object_get(md, "resourceVersion");

    task_view_spend_of(v, obj);
    v->name = json_string_value(json_object_get(md, "name"));
    v->ns = json_string_value(json_object_get(md, "namespace"));
    v->resource_version = json_is_string(rv) ? strtoll(json_string_value(rv), NULL, 10) : 0;
    v->objective = json_string_value(json_object_get(spec, "objective"));
    v->suspended = json_is_true(json_object_get(spec, "suspended"));
    v->run = task_json_int(spec, "run") > 0 ? task_json_int(spec, "run") : 1;
    v->status_run = task_json_int(status, "run") > 0 ? task_json_int(status, "run") : 1;
    v->queue_position = task_json_int(status, "queuePosition");
}

bool task_rerun_due(const struct task_view *v)
{
    return (v->phase == TASK_COMPLETED || v->phase == TASK_FAILED) && v->run > v->status_run;
}

void task_set_phase(json_t *obj, enum task_phase phase, const char *reason, const char *message)
{
    json_t *status = json_object_get(obj, "status");

    if (status == NULL) {
        status = json_object();
        json_object_set_new(obj, "status", status);
    }
    json_object_set_new(status, "phase", json_string(task_phase_name(phase)));
    json_object_set_new(status, "reason", json_string(reason != NULL ? reason : ""));
    json_object_set_new(status, "message", json_string(message != NULL ? message : ""));
    json_object_del(status, "queuePosition"); /* a task that moves on no longer waits */
    if (phase == TASK_COMPLETED || phase == TASK_FAILED) {
        struct task_forecast none = {.present = false};
        task_forecast_store(status, &none);
    }
}
