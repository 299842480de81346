/* SPDX-License-Identifier: Apache-2.0 */
/* The reconcile loop. Every decision is taken and written inside one store transaction
 * (token index + task status together); the token file is written after the commit and
 * rewritten on every start, so a crash between the two only delays the file. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "common/secret.h"
#include "controller/controller_int.h"

#define WAITING_PREFIX "sandbox provider"

enum controller_action controller_decide(const struct task_view *v, bool token_active,
                                         bool can_run, bool waiting_noted)
{
    switch (v->phase) {
    case TASK_PENDING:
        if (v->suspended) {
            return CONTROLLER_PAUSE;
        }
        if (!can_run) {
            return waiting_noted ? CONTROLLER_NOTHING : CONTROLLER_WAIT;
        }
        return CONTROLLER_ACTIVATE;
    case TASK_PROVISIONING:
    case TASK_ACTIVE:
        if (v->suspended) {
            return CONTROLLER_PAUSE;
        }
        /* Active without a usable token (e.g. restored from a backup): mint one. */
        return token_active || !can_run ? CONTROLLER_NOTHING : CONTROLLER_ACTIVATE;
    case TASK_PAUSING:
        return CONTROLLER_PAUSE;
    case TASK_PAUSED:
        if (!v->suspended) {
            return can_run ? CONTROLLER_ACTIVATE : CONTROLLER_NOTHING;
        }
        return token_active ? CONTROLLER_PAUSE : CONTROLLER_NOTHING;
    case TASK_COMPLETED:
    case TASK_FAILED:
    case TASK_PHASE_COUNT:
        break;
    }
    return token_active ? CONTROLLER_REVOKE : CONTROLLER_NOTHING;
}

char *controller_token_path(const struct controller *c, const char *ns, const char *name)
{
    return xasprintf("%s/tokens/%s/%s/token", c->data_dir, ns, name);
}

static int mkdirs(const char *path)
{
    char *p = xstrdup(path);
    int rc = 0;

    for (char *s = p + 1; *s != '\0' && rc == 0; s++) {
        if (*s == '/') {
            *s = '\0';
            if (mkdir(p, 0700) != 0 && errno != EEXIST) {
                rc = -1;
            }
            *s = '/';
        }
    }
    free(p);
    return rc;
}

/* Writes TOKEN to the task's token file atomically (temp file, fsync, rename), 0600. */
int controller_write_token_file(struct controller *c, const char *ns, const char *name,
                            const char *token, struct err *err)
{
    char *path = controller_token_path(c, ns, name);
    unsigned int nonce;
    char *tmp;
    size_t len = strlen(token);
    int fd, rc = E_OK;

    /* A unique temporary name: two reconciles of one task may write at the same time. */
    secret_random(&nonce, sizeof(nonce));
    tmp = xasprintf("%s.%08x.tmp", path, nonce);
    if (mkdirs(path) != 0) {
        rc = err_set(err, E_FAIL, "create the directory of %s: %s", path, strerror(errno));
        goto out;
    }
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        rc = err_set(err, E_FAIL, "create %s: %s", tmp, strerror(errno));
        goto out;
    }
    if (write(fd, token, len) != (ssize_t)len || fsync(fd) != 0) {
        rc = err_set(err, E_FAIL, "write %s: %s", tmp, strerror(errno));
    }
    close(fd);
    if (rc == E_OK && rename(tmp, path) != 0) {
        rc = err_set(err, E_FAIL, "rename %s: %s", tmp, strerror(errno));
    }
out:
    free(path);
    free(tmp);
    return rc;
}

static size_t string_list(const char **out, size_t max, const json_t *arr)
{
    size_t i, n = 0;
    const json_t *v;

    json_array_foreach(arr, i, v)
    {
        if (n < max && json_is_string(v)) {
            out[n++] = json_string_value(v);
        }
    }
    return n;
}

/* Mints the next-generation token for DOC from its spec and the server defaults. */
static int mint_for(char **token_out, char **id_out, struct controller *c, const json_t *doc,
                    int64_t generation, int64_t now_ms, struct err *err)
{
    const json_t *spec = json_object_get(doc, "spec");
    const json_t *repo = json_object_get(spec, "repository");
    const json_t *sandbox = json_object_get(spec, "sandbox");
    const char *tools[64], *models[64];
    struct token_mint_opts o = TOKEN_MINT_OPTS_DEFAULTS;
    struct task_view v;
    json_int_t timeout = json_integer_value(json_object_get(sandbox, "timeoutSeconds"));

    task_view_of(&v, doc);
    o.task = v.name;
    o.ns = v.ns;
    o.generation = generation;
    o.repo = json_string_value(json_object_get(repo, "url"));
    o.branch = json_string_value(json_object_get(repo, "workingBranch"));
    o.tools = tools;
    o.n_tools = string_list(tools, ARRAY_LEN(tools), json_object_get(spec, "allowedTools"));
    o.models = models;
    o.n_models = string_list(models, ARRAY_LEN(models), json_object_get(spec, "capabilities"));
    o.max_cost_micros = v.budget_usd > 0 ? v.budget_usd : c->default_budget_usd;
    o.max_tokens = v.budget_tokens > 0 ? v.budget_tokens : c->default_budget_tokens;
    o.expires_ms = timeout > 0 ? now_ms + (int64_t)timeout * 1000 : 0;
    return token_mint_task(token_out, id_out, c->root_key, &o, err);
}

struct reconcile {
    struct controller *c;
    const char *ns, *name;
    bool plan;                     /* decide (and mint) only; write nothing */
    enum controller_action action; /* out */
    char *token;                   /* owned: the token minted while planning */
    char *id;                      /* owned: its identifier */
    int64_t generation;            /* its generation */
};

static int reconcile_txn(struct task_txn *tx, void *userdata)
{
    struct reconcile *r = userdata;
    struct controller *c = r->c;
    struct token_record rec = {.generation = 0};
    json_t *doc = NULL, *status;
    struct task_view v;
    struct err err = {0};
    char ts[CLOCK_RFC3339_MAX];
    bool has_token, waiting;
    int64_t now = clock_now_ms(task_txn_clock(tx));
    int rc = task_txn_get(&doc, tx, r->ns, r->name, &err);

    if (rc != E_OK) {
        return rc;
    }
    has_token = task_txn_token_current(&rec, tx, r->ns, r->name, &err) == E_OK;
    task_view_of(&v, doc);
    status = json_object_get(doc, "status");
    waiting = json_is_string(json_object_get(status, "message")) &&
              strncmp(json_string_value(json_object_get(status, "message")), WAITING_PREFIX,
                      strlen(WAITING_PREFIX)) == 0;
    r->action = controller_decide(&v, has_token && rec.active,
                                  strcmp(c->provider, "none") == 0, waiting);
    clock_rfc3339(ts, now);
    if (r->plan) {
        /* The token file must hold the new token before the task reads Active, so the
         * token is minted and written first, then applied by a second transaction. */
        if (r->action == CONTROLLER_ACTIVATE) {
            r->generation = rec.generation + 1;
            rc = mint_for(&r->token, &r->id, c, doc, r->generation, now, &err);
        }
        goto out;
    }
    switch (r->action) {
    case CONTROLLER_NOTHING:
        break;
    case CONTROLLER_ACTIVATE:
        if (r->token == NULL || r->generation != rec.generation + 1) {
            /* Someone minted in between: plan again on the next event. */
            rc = err_set(&err, E_AGAIN, "token generation moved on");
            break;
        }
        rc = task_txn_token_revoke(tx, r->ns, r->name, &err);
        if (rc == E_OK) {
            rc = task_txn_token_add(tx, r->ns, r->name, r->generation, r->id, r->token, &err);
        }
        task_set_phase(doc, TASK_ACTIVE, NULL, NULL);
        if (json_is_null(json_object_get(status, "startTime")) ||
            json_object_get(status, "startTime") == NULL) {
            json_object_set_new(status, "startTime", json_string(ts));
        }
        break;
    case CONTROLLER_PAUSE:
        rc = task_txn_token_revoke(tx, r->ns, r->name, &err);
        if (v.phase != TASK_PAUSED) {
            task_set_phase(doc, TASK_PAUSED, "Suspended", "paused by request");
        }
        break;
    case CONTROLLER_REVOKE:
        rc = task_txn_token_revoke(tx, r->ns, r->name, &err);
        break;
    case CONTROLLER_WAIT: {
        char *msg = xasprintf(WAITING_PREFIX " \"%s\" cannot start sandboxes in this build; "
                                             "run with --sandbox-provider none",
                              c->provider);
        task_set_phase(doc, TASK_PENDING, "", msg);
        free(msg);
        break;
    }
    }
    if (rc == E_OK && r->action != CONTROLLER_NOTHING && r->action != CONTROLLER_REVOKE) {
        rc = task_txn_put(tx, doc, &err);
    }
out:
    if (rc != E_OK && rc != E_AGAIN) {
        log_kv(LOG_ERROR, "reconcile_failed", "namespace", r->ns, "name", r->name, "error",
               err.msg, NULL);
    }
    free(rec.token);
    json_decref(doc);
    return rc;
}

static const char *action_name(enum controller_action a)
{
    static const char *const names[] = {"nothing", "activate", "pause", "revoke", "wait"};
    return names[a];
}

int controller_reconcile(struct controller *c, const char *ns, const char *name,
                         struct err *err)
{
    struct reconcile r = {.c = c, .ns = ns, .name = name, .plan = true};
    int rc = task_store_txn(c->store, reconcile_txn, &r, err);

    if (rc == E_OK && r.action == CONTROLLER_ACTIVATE) {
        rc = controller_write_token_file(c, ns, name, r.token, err);
    }
    if (rc == E_OK && r.action != CONTROLLER_NOTHING) {
        r.plan = false;
        rc = task_store_txn(c->store, reconcile_txn, &r, err);
        if (rc == E_AGAIN) {
            rc = E_OK; /* a newer change will be reconciled by its own event */
        } else if (rc == E_OK) {
            log_kv(LOG_INFO, "reconciled", "namespace", ns, "name", name, "action",
                   action_name(r.action), NULL);
        }
    }
    if (r.token != NULL) {
        secret_wipe(r.token, strlen(r.token));
        free(r.token);
    }
    free(r.id);
    return rc;
}

void controller_destroy(struct controller *c)
{
    secret_wipe(c->root_key, sizeof(c->root_key));
    free(c->data_dir);
    free(c->provider);
    free(c);
}
