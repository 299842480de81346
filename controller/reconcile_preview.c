/* SPDX-License-Identifier: Apache-2.0 */
/* The linked preview Environment's side of a reconcile (SPEC §4): created, hibernated,
 * woken or released with the task's phase change in the same transaction, and its
 * `divergedev.com/sandbox-ip` kept to the sandbox's address (agent-sandbox pods get theirs
 * after the start). */
#include <stdlib.h>
#include <string.h>

#include "controller/controller_int.h"

static json_t *annotations_of(json_t *doc)
{
    json_t *md = json_object_get(doc, "metadata");
    json_t *ann = json_object_get(md, "annotations");

    if (!json_is_object(ann)) {
        ann = json_object();
        json_object_set_new(md, "annotations", ann);
    }
    return ann;
}

/* Whether a running task's Environment may need its sandbox address written (the
 * provider learns it after the start: agent-sandbox pods get their IP later). */
static bool preview_may_refresh(const struct reconcile *r)
{
    return r->action == CONTROLLER_NOTHING && r->phase == TASK_ACTIVE && r->c->sandboxes != NULL;
}

/* *IP_OUT: the sandbox's address (the provider's, else the server's loopback for sandboxes
 * on this host; NULL without sandboxes). For *ST KEEP (a refresh of the stored OLD) only
 * a changed address is written: then *ST becomes RUNNING; false: nothing to write. */
static bool preview_address(char **ip_out, enum controller_env_state *st, const struct reconcile *r,
                            const json_t *old)
{
    const char *was;

    *ip_out = r->c->sandboxes != NULL
                  ? sandbox_address(r->c->sandboxes, r->ns, r->name, CONTROLLER_SANDBOX_IP)
                  : NULL;
    if (*st != CONTROLLER_ENV_KEEP) {
        return true;
    }
    was = json_string_value(
        json_object_get(json_object_get(json_object_get(old, "metadata"), "annotations"),
                        CONTROLLER_ANN_SANDBOX_IP));
    if (*ip_out == NULL || (was != NULL && strcmp(was, *ip_out) == 0)) {
        free(*ip_out);
        *ip_out = NULL;
        return false;
    }
    *st = CONTROLLER_ENV_RUNNING;
    return true;
}

/* Creates or updates the task's linked preview Environment for R's outcome and, when it
 * runs, writes the task's output annotations and status.previewUrl (SPEC §4). */
int controller_apply_preview(struct reconcile *r, struct task_txn *tx, json_t *doc, struct err *err)
{
    enum controller_env_state st = controller_preview_state(r->action, r->fail_reason != NULL);
    json_t *old = NULL, *env, *ann;
    char *ip = NULL;
    int rc;

    if (r->preview_env == NULL || (st == CONTROLLER_ENV_KEEP && !preview_may_refresh(r))) {
        return E_OK;
    }
    rc = task_txn_env_get(&old, tx, r->ns, r->preview_env, err);
    if (rc != E_OK && rc != E_NOTFOUND) {
        return rc;
    }
    if (old == NULL && st != CONTROLLER_ENV_RUNNING) {
        return E_OK; /* never created: nothing to hibernate or release */
    }
    if (!preview_address(&ip, &st, r, old)) {
        json_decref(old);
        return E_OK;
    }
    env = controller_preview_env(doc, old, r->preview_env, r->preview_url, st, ip);
    free(ip);
    json_decref(old);
    rc = task_txn_env_put(tx, env, err);
    json_decref(env);
    if (rc == E_OK && st == CONTROLLER_ENV_RUNNING) {
        ann = annotations_of(doc);
        json_object_set_new(ann, CONTROLLER_ANN_PREVIEW_ENV, json_string(r->preview_env));
        json_object_set_new(ann, CONTROLLER_ANN_PREVIEW_URL, json_string(r->preview_url));
        json_object_set_new(json_object_get(doc, "status"), "previewUrl",
                            json_string(r->preview_url));
    }
    return rc;
}

/* Rewrites an Active task's Environment when its sandbox address changed (agent-sandbox
 * pods get their IP after the start): a transaction of its own, since a reconcile that
 * decides NOTHING applies nothing else. */
int controller_preview_refresh_txn(struct task_txn *tx, void *userdata)
{
    struct reconcile *r = userdata;
    struct task_view v;
    json_t *doc = NULL, *before;
    struct err err = {0};
    int rc = task_txn_get(&doc, tx, r->ns, r->name, &err);

    if (rc != E_OK) {
        return rc;
    }
    task_view_of(&v, doc);
    before = json_deep_copy(doc);
    rc = v.phase == TASK_ACTIVE ? controller_apply_preview(r, tx, doc, &err) : E_AGAIN;
    if (rc == E_OK && !json_equal(before, doc)) {
        rc = task_txn_put(tx, doc, &err);
    }
    json_decref(before);
    json_decref(doc);
    return rc;
}

/* Whether R (planned NOTHING) has a sandbox address its Environment does not carry yet;
 * checked on the read side first, so steady reconciles open no write transaction. */
bool controller_preview_address_changed(struct reconcile *r)
{
    json_t *env = NULL;
    char *ip;
    const char *was;
    bool changed;

    if (r->action != CONTROLLER_NOTHING || r->preview_env == NULL || !preview_may_refresh(r)) {
        return false;
    }
    ip = sandbox_address(r->c->sandboxes, r->ns, r->name, CONTROLLER_SANDBOX_IP);
    if (ip == NULL || task_store_env_get(&env, r->c->store, r->ns, r->preview_env, NULL) != E_OK) {
        free(ip);
        return false;
    }
    was = json_string_value(
        json_object_get(json_object_get(json_object_get(env, "metadata"), "annotations"),
                        CONTROLLER_ANN_SANDBOX_IP));
    changed = was == NULL || strcmp(was, ip) != 0;
    json_decref(env);
    free(ip);
    return changed;
}
