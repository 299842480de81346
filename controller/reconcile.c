/* SPDX-License-Identifier: Apache-2.0 */
/* One reconcile: a planning transaction reads the task and decides (minting a token when
 * the action needs one), the side effects run outside any transaction (token file,
 * workspace, sandbox, push), and an applying transaction writes the outcome (phase, token
 * index) unless the task moved on meanwhile. Reconciles are serialized by c->lock, so the
 * sandbox of a task is only ever changed by one of them at a time. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "common/secret.h"
#include "controller/controller_int.h"

static bool needs_token(enum controller_action a)
{
    return a == CONTROLLER_ACTIVATE || a == CONTROLLER_PROVISION || a == CONTROLLER_RESTART ||
           a == CONTROLLER_THAW || a == CONTROLLER_RESUME_START;
}

static char *dup_or_null(const json_t *v)
{
    return json_is_string(v) && json_string_length(v) > 0 ? xstrdup(json_string_value(v)) : NULL;
}

/* Copies what execution needs out of DOC (the plan's transaction ends before it runs). */
static void copy_spec(struct reconcile *r, const json_t *doc, const struct task_view *v)
{
    const json_t *spec = json_object_get(doc, "spec");
    const json_t *repo = json_object_get(spec, "repository");
    const json_t *ann = json_object_get(json_object_get(doc, "metadata"), "annotations");

    r->url = dup_or_null(json_object_get(repo, "url"));
    r->base = dup_or_null(json_object_get(repo, "baseBranch"));
    r->working = dup_or_null(json_object_get(repo, "workingBranch"));
    r->objective = xstrdup(v->objective != NULL ? v->objective : "");
    r->ran_provider = dup_or_null(json_object_get(ann, TASK_ANN_SANDBOX_PROVIDER));
    r->agent_cmd = dup_or_null(json_object_get(json_object_get(spec, "runner"), "command"));
    r->verify_cmd = dup_or_null(json_object_get(json_object_get(spec, "runner"), "verifyCommand"));
    r->iteration = v->iteration;
    r->started = json_is_string(json_object_get(json_object_get(doc, "status"), "startTime"));
    r->max_iterations = v->max_iterations;
    r->run = v->run;
    r->timeout_s =
        json_integer_value(json_object_get(json_object_get(spec, "sandbox"), "timeoutSeconds"));
    r->push_refusal = controller_push_refusal(doc, r->c->root_key);
    r->sandbox = json_deep_copy(json_object_get(spec, "sandbox")); /* network, allowedHosts */
    r->preview_env = controller_preview_env_name(doc, r->c->preview_base);
    r->preview_url =
        r->preview_env != NULL ? controller_preview_url(r->c->preview_base, r->preview_env) : NULL;
    if (v->phase == TASK_COMPLETED || v->phase == TASK_FAILED) {
        r->pr_url = dup_or_null(json_object_get(ann, TASK_ANN_PULL_REQUEST_URL));
    }
}

static void observe(struct controller_observed *o, struct reconcile *r, const struct task_view *v,
                    bool token_active, int64_t now)
{
    struct controller *c = r->c;
    const char *msg = NULL;

    memset(o, 0, sizeof(*o));
    o->token_active = token_active;
    o->runs_sandboxes = c->sandboxes != NULL;
    o->can_run = c->problem == NULL && (c->sandboxes != NULL || strcmp(c->provider, "none") == 0);
    (void)msg;
    o->sandbox = SANDBOX_ABSENT;
    o->provider_changed = r->ran_provider != NULL && strcmp(r->ran_provider, c->provider) != 0;
    if (c->sandboxes != NULL) {
        struct sandbox_status st;
        char *ws = xasprintf("%s/workspaces/%s/%s", c->data_dir, r->ns, r->name);
        struct stat sb;
        sandbox_status(&st, c->sandboxes, r->ns, r->name);
        o->sandbox = (int)st.state;
        o->exit_code = st.exit_code;
        o->workspace_exists = stat(ws, &sb) == 0 && S_ISDIR(sb.st_mode);
        o->checkpoint = !o->workspace_exists && controller_has_checkpoint(c, r->ns, r->name);
        o->never_started = !r->started;
        o->disk_over = controller_disk_over(c, r->ns, r->name, NULL);
        o->queued = !controller_queue_admitted(c, r->ns, r->name);
        free(ws);
        if (r->timeout_s > 0 && v->phase == TASK_ACTIVE) {
            o->timed_out = controller_active_ms(c, r->ns, r->name, now) >= r->timeout_s * 1000;
        }
    }
}

static void set_finished(json_t *doc, enum task_phase phase, const char *reason, const char *msg,
                         const char *ts)
{
    task_set_phase(doc, phase, reason, msg);
    json_object_set_new(json_object_get(doc, "status"), "completionTime", json_string(ts));
}

static void set_annotation(json_t *doc, const char *key, const char *value)
{
    json_t *md = json_object_get(doc, "metadata");
    json_t *ann = json_object_get(md, "annotations");

    if (!json_is_object(ann)) {
        ann = json_object();
        json_object_set_new(md, "annotations", ann);
    }
    json_object_set_new(ann, key, json_string(value));
}

static int apply_start(struct reconcile *r, struct task_txn *tx, json_t *doc,
                       const struct token_record *rec, const char *ts, struct err *err)
{
    json_t *status = json_object_get(doc, "status");
    int rc;

    if (r->token == NULL || r->generation != rec->generation + 1) {
        /* Someone minted in between: plan again on the next event. */
        return err_set(err, E_AGAIN, "token generation moved on");
    }
    rc = task_txn_token_revoke(tx, r->ns, r->name, err);
    if (rc == E_OK) {
        rc = task_txn_token_add(tx, r->ns, r->name, r->generation, r->id, r->token, err);
    }
    task_set_phase(doc, TASK_ACTIVE, NULL, NULL);
    set_annotation(doc, TASK_ANN_SANDBOX_PROVIDER, r->c->provider);
    /* What the token just minted carries, and the runner's iteration limit (SPEC §14). */
    task_set_effective_limits(doc, r->c->default_budget_usd, r->c->default_budget_tokens,
                              r->c->sandboxes != NULL ? r->c->default_max_iterations : 0);
    /* A fresh start or a thaw: the stall and the time left are observed anew. */
    json_object_del(status, "stalledSince");
    json_object_del(status, "timeoutAt");
    if (json_is_null(json_object_get(status, "startTime")) ||
        json_object_get(status, "startTime") == NULL) {
        json_object_set_new(status, "startTime", json_string(ts));
    }
    return rc;
}

/* Queues the draft PR of a task that completed (SPEC §4 draftPR) in the transaction that
 * completes it: exactly once, and kept across restarts by the outbox. */
static int queue_draft_pr(struct reconcile *r, struct task_txn *tx, const json_t *doc,
                          struct err *err)
{
    struct outbox_entry e;
    char *provider = NULL, *project = NULL, *target;
    json_t *req;
    int rc;

    if (!controller_draft_pr_target(&provider, &project, doc, r->c->github_api_url)) {
        return E_OK;
    }
    memset(&e, 0, sizeof(e));
    req = controller_draft_pr_request(doc);
    target = xasprintf("%s/%s", r->ns, r->name);
    snprintf(e.provider, sizeof(e.provider), "%s", provider);
    snprintf(e.kind, sizeof(e.kind), "pull");
    e.project = project;
    e.target = target;
    e.body = json_dumps(req, JSON_COMPACT);
    e.coalesce_key = xasprintf("pull/%s", target);
    rc = task_txn_outbox_add(NULL, tx, &e, err);
    if (rc == E_OK) {
        r->draft_pr = xasprintf("%s %s", provider, project);
    }
    free(e.body);
    free(e.coalesce_key);
    free(target);
    json_decref(req);
    free(provider);
    free(project);
    return rc;
}

/* Run RUN of a finished task (SPEC §14): Pending again, iterations from 0, spend kept
 * (the budgets apply to the total). */
static void start_run(json_t *doc, int64_t run)
{
    json_t *status = json_object_get(doc, "status");

    task_set_phase(doc, TASK_PENDING, NULL, NULL);
    json_object_set_new(status, "run", json_integer(run));
    json_object_set_new(status, "iteration", json_integer(0));
    json_object_set_new(status, "startTime", json_null());
    json_object_set_new(status, "completionTime", json_null());
}

/* Whether DOC is pausing because its runner made no progress (runs.c). */
static bool is_no_progress(const json_t *doc)
{
    const char *reason =
        json_string_value(json_object_get(json_object_get(doc, "status"), "reason"));

    return reason != NULL && strcmp(reason, "NoProgress") == 0;
}

/* Writes the outcome of R to DOC and the token index. *put_out: DOC must be stored. */
static int apply_phase(struct reconcile *r, struct task_txn *tx, json_t *doc,
                       const struct token_record *rec, const struct task_view *v, const char *ts,
                       bool *put_out, struct err *err)
{
    int rc = E_OK;

    *put_out = true;
    if (r->fail_reason != NULL) {
        set_finished(doc, TASK_FAILED, r->fail_reason, r->fail_msg, ts);
        return task_txn_token_revoke(tx, r->ns, r->name, err);
    }
    switch (r->action) {
    case CONTROLLER_ACTIVATE:
    case CONTROLLER_PROVISION:
    case CONTROLLER_RESTART:
    case CONTROLLER_THAW:
    case CONTROLLER_RESUME_START:
        return apply_start(r, tx, doc, rec, ts, err);
    case CONTROLLER_PAUSE:
        rc = task_txn_token_revoke(tx, r->ns, r->name, err);
        if (v->phase != TASK_PAUSED && is_no_progress(doc)) {
            const char *m =
                json_string_value(json_object_get(json_object_get(doc, "status"), "message"));
            char *msg = xstrdup(m != NULL ? m : "");
            task_set_phase(doc, TASK_PAUSED, "NoProgress", msg);
            free(msg);
        } else if (v->phase != TASK_PAUSED) {
            task_set_phase(doc, TASK_PAUSED, "Suspended", "paused by request");
        } else {
            *put_out = false;
        }
        return rc;
    case CONTROLLER_WAIT: {
        char *msg =
            r->c->problem != NULL
                ? xasprintf(CONTROLLER_WAITING_PREFIX " \"%s\" cannot start sandboxes: %s",
                            r->c->provider, r->c->problem)
                : xasprintf(CONTROLLER_WAITING_PREFIX " \"%s\" cannot start sandboxes in "
                                                      "this build; run with --sandbox-provider "
                                                      "none, process or local",
                            r->c->provider);
        task_set_phase(doc, TASK_PENDING, "", msg);
        free(msg);
        return E_OK;
    }
    case CONTROLLER_COMPLETE:
        set_finished(doc, TASK_COMPLETED, "", r->url != NULL ? "pushed" : "", ts);
        break;
    case CONTROLLER_FAIL_RUNNER: {
        char *msg = controller_runner_failed_msg(r->url, r->exit_code);
        set_finished(doc, TASK_FAILED, "RunnerFailed", msg, ts);
        free(msg);
        break;
    }
    case CONTROLLER_TIMEOUT:
        set_finished(doc, TASK_FAILED, "Timeout", "sandbox.timeoutSeconds passed", ts);
        break;
    case CONTROLLER_FAIL_SANDBOX:
        set_finished(doc, TASK_FAILED, "SandboxError",
                     r->fail_msg != NULL ? r->fail_msg : "the sandbox cannot run", ts);
        break;
    case CONTROLLER_DISK_LIMIT: /* execution sets fail_reason: not reached */
        set_finished(doc, TASK_FAILED, "DiskLimit", r->fail_msg != NULL ? r->fail_msg : "", ts);
        break;
    case CONTROLLER_RERUN:
        start_run(doc, r->run);
        break;
    case CONTROLLER_PUSH_WIP:
        *put_out = false; /* written by apply_wip when the push went out */
        return E_OK;
    case CONTROLLER_REVOKE:
    case CONTROLLER_STOP:
    case CONTROLLER_NOTHING:
    case CONTROLLER_ACTION_COUNT:
        *put_out = false;
        break;
    }
    return task_txn_token_revoke(tx, r->ns, r->name, err);
}

/* The checkpoint R pushed: annotation TASK_ANN_WIP_BRANCH and status.lastFailure (the
 * sticky comment links the branch and quotes the failure). */
static void apply_wip(struct reconcile *r, json_t *doc, bool *put_out)
{
    json_t *md = json_object_get(doc, "metadata");
    json_t *ann = json_object_get(md, "annotations");
    json_t *status = json_object_get(doc, "status");

    if (!r->wip_pushed) {
        return;
    }
    if (!json_is_object(ann)) {
        ann = json_object();
        json_object_set_new(md, "annotations", ann);
    }
    json_object_set_new(ann, TASK_ANN_WIP_BRANCH, json_sprintf("diverge/wip/%s", r->name));
    if (r->last_failure != NULL) {
        json_object_set_new(status, "lastFailure", json_string(r->last_failure));
    } else {
        json_object_del(status, "lastFailure");
    }
    *put_out = true;
}

static int apply(struct reconcile *r, struct task_txn *tx, json_t *doc,
                 const struct token_record *rec, const struct task_view *v, const char *ts,
                 bool *put_out, struct err *err)
{
    int rc = apply_phase(r, tx, doc, rec, v, ts, put_out, err);

    apply_wip(r, doc, put_out);
    if (rc == E_OK) {
        rc = controller_apply_preview(r, tx, doc, err);
    }
    if (rc == E_OK && r->action == CONTROLLER_COMPLETE && r->fail_reason == NULL) {
        rc = queue_draft_pr(r, tx, doc, err);
    }
    return rc;
}

static int reconcile_txn(struct task_txn *tx, void *userdata)
{
    struct reconcile *r = userdata;
    struct controller *c = r->c;
    struct token_record rec = {.generation = 0};
    struct controller_observed o;
    json_t *doc = NULL, *status;
    struct task_view v;
    struct err err = {0};
    char ts[CLOCK_RFC3339_MAX];
    const char *msg;
    bool has_token, put = false;
    int64_t now = clock_now_ms(task_txn_clock(tx));
    int rc = task_txn_get(&doc, tx, r->ns, r->name, &err);

    if (rc != E_OK) {
        return rc;
    }
    has_token = task_txn_token_current(&rec, tx, r->ns, r->name, &err) == E_OK;
    task_view_of(&v, doc);
    status = json_object_get(doc, "status");
    clock_rfc3339(ts, now);
    if (r->plan) {
        msg = json_string_value(json_object_get(status, "message"));
        copy_spec(r, doc, &v);
        observe(&o, r, &v, has_token && rec.active, now);
        o.waiting_noted = msg != NULL && strncmp(msg, CONTROLLER_WAITING_PREFIX,
                                                 strlen(CONTROLLER_WAITING_PREFIX)) == 0;
        r->action = controller_decide(&v, &o);
        r->phase = v.phase;
        r->exit_code = o.exit_code;
        if (r->action == CONTROLLER_FAIL_SANDBOX) {
            r->fail_msg = xstrdup(c->problem != NULL ? c->problem : "the task's workspace is gone");
        }
        if (r->action == CONTROLLER_DISK_LIMIT) {
            (void)controller_disk_over(c, r->ns, r->name, &r->fail_msg);
        } else if (o.disk_over) {
            controller_disk_clear(c, r->ns, r->name); /* finished meanwhile: nothing to do */
        }
        /* The token file must hold the new token before the task reads Active, so the
         * token is minted and written first, then applied by a second transaction. */
        if (needs_token(r->action)) {
            r->generation = rec.generation + 1;
            rc = controller_mint_for(&r->token, &r->id, c, doc, r->generation, now, &err);
        }
        goto out;
    }
    if (v.phase != r->phase) {
        rc = err_set(&err, E_AGAIN, "the task moved on");
        goto out;
    }
    rc = apply(r, tx, doc, &rec, &v, ts, &put, &err);
    if (rc == E_OK && put) {
        rc = task_txn_put(tx, doc, &err);
    }
out:
    if (rc != E_OK && rc != E_AGAIN) {
        log_kv(LOG_ERROR, "reconcile_failed", "namespace", r->ns, "name", r->name, "error", err.msg,
               NULL);
    }
    free(rec.token);
    json_decref(doc);
    return rc;
}

static void reconcile_cleanup(struct reconcile *r)
{
    if (r->token != NULL) {
        secret_wipe(r->token, strlen(r->token));
        free(r->token);
    }
    free(r->id);
    free(r->url);
    free(r->base);
    free(r->working);
    free(r->objective);
    free(r->ran_provider);
    free(r->agent_cmd);
    free(r->verify_cmd);
    free(r->fail_msg);
    json_decref(r->sandbox);
    free(r->preview_env);
    free(r->preview_url);
    free(r->pr_url);
    free(r->draft_pr);
    free(r->last_failure);
    free(r->mirror);
    controller_launch_free(r->launch);
}

/* Logs that the draft PR of a task that just completed was queued. */
static void log_draft_pr(struct controller *c, const struct reconcile *r)
{
    if (r->draft_pr != NULL) {
        char *log = sandbox_log_path(c->data_dir, r->ns, r->name);
        sandbox_log_event(log, "[diverge] draft pull request queued (%s)", r->draft_pr);
        free(log);
    }
}

/* Logs a finished task's draft PR once (the outbox set the annotation; a marker file
 * under <data-dir>/run keeps restarts from logging it again). */
static void log_pull_request(struct controller *c, const struct reconcile *r)
{
    char *marker;
    int fd;

    if (r->pr_url == NULL) {
        return;
    }
    marker = xasprintf("%s/run/%s.%s.pr", c->data_dir, r->ns, r->name);

    (void)sandbox_mkdirs(marker, false);
    fd = open(marker, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd >= 0) {
        char *log = sandbox_log_path(c->data_dir, r->ns, r->name);
        close(fd);
        sandbox_log_event(log, "[diverge] draft pull request: %s", r->pr_url);
        free(log);
    }
    free(marker);
}

/* Pending → Provisioning while the workspace is prepared (a first clone can take a
 * while): watchers and the sticky comment see that the task was picked up. */
static int mark_provisioning(struct task_txn *tx, void *userdata)
{
    struct reconcile *r = userdata;
    struct task_view v;
    json_t *doc = NULL;
    int rc = task_txn_get(&doc, tx, r->ns, r->name, NULL);

    if (rc == E_OK) {
        task_view_of(&v, doc);
        if (v.phase == TASK_PENDING && !v.suspended) {
            task_set_phase(doc, TASK_PROVISIONING, NULL, NULL);
            rc = task_txn_put(tx, doc, NULL);
            r->phase = TASK_PROVISIONING;
        }
        json_decref(doc);
    }
    return rc;
}

/* A THAW thaws, and a prepared start launches its sandbox, only now that the token is
 * current and the task Active; one that fails turns the task Failed (SandboxError) in one
 * more apply. */
static int start_after_apply(struct controller *c, struct reconcile *r, struct err *err)
{
    int rc;

    if (r->fail_reason != NULL) {
        return E_OK;
    }
    if (r->launch != NULL) {
        rc = controller_launch(c, r);
    } else if (r->action == CONTROLLER_THAW) {
        rc = controller_thaw(c, r);
    } else {
        return E_OK;
    }
    if (rc == E_OK) {
        return E_OK;
    }
    r->phase = TASK_ACTIVE; /* what the apply just wrote */
    rc = task_store_txn(c->store, reconcile_txn, r, err);
    return rc == E_AGAIN ? E_OK : rc;
}

/* Active (or Pending/Provisioning) → Pausing once the sandbox is frozen (SPEC §4): the
 * token is revoked in the same transaction, so no meter charge is accepted from here on
 * (the meter charges Active tasks with an active token only; a call the runner sent just
 * before the freeze may still be charged before it). Paused follows in the apply; a server
 * that dies in between finishes the pause on its restart (its sandboxes died with it). */
static int mark_pausing(struct task_txn *tx, void *userdata)
{
    struct reconcile *r = userdata;
    struct task_view v;
    json_t *doc = NULL;
    int rc = task_txn_get(&doc, tx, r->ns, r->name, NULL);

    if (rc != E_OK) {
        return rc;
    }
    task_view_of(&v, doc);
    if (v.phase != r->phase || !v.suspended) {
        rc = E_AGAIN; /* it moved on: its own event plans again */
    } else {
        rc = task_txn_token_revoke(tx, r->ns, r->name, NULL);
        task_set_phase(doc, TASK_PAUSING, "Suspended", "pausing by request");
        if (rc == E_OK) {
            rc = task_txn_put(tx, doc, NULL);
        }
        if (rc == E_OK) {
            r->phase = TASK_PAUSING;
        }
    }
    json_decref(doc);
    return rc;
}

/* Whether a PAUSE planned on PHASE first writes Pausing. */
static bool pauses_through_pausing(enum controller_action a, enum task_phase phase)
{
    return a == CONTROLLER_PAUSE && phase != TASK_PAUSING && phase != TASK_PAUSED &&
           phase != TASK_COMPLETED && phase != TASK_FAILED;
}

/* What comes between the plan and the execution of R: the token file of ACTIVATE, and the
 * transient phases (Provisioning, Pausing) written before the slow part. */
static int before_execute(struct controller *c, struct reconcile *r, struct err *err)
{
    int rc = E_OK;

    log_pull_request(c, r);
    if (c->sandboxes != NULL && r->phase != TASK_PENDING && r->phase != TASK_PROVISIONING &&
        r->phase != TASK_ACTIVE) {
        /* Paused (also by the meter, whose runner may still be on its way out) or
         * finished: its time no longer counts toward sandbox.timeoutSeconds. */
        controller_timer_set(c, r->ns, r->name, 0);
        controller_note_running(c, r->ns, r->name, false, clock_now_ms(clock_system()));
    }
    if (r->action == CONTROLLER_ACTIVATE) {
        rc = controller_write_token_file(c, r->ns, r->name, r->token, err);
    }
    if (rc == E_OK && r->action == CONTROLLER_PROVISION && r->phase == TASK_PENDING) {
        rc = task_store_txn(c->store, mark_provisioning, r, err);
    }
    if (rc == E_OK && pauses_through_pausing(r->action, r->phase)) {
        if (c->sandboxes != NULL) {
            controller_pause_freeze(c, r); /* frozen first: see controller_int.h */
        }
        rc = task_store_txn(c->store, mark_pausing, r, err);
        if (rc == E_AGAIN) {
            rc = E_OK;
            controller_pause_undo(c, r);
            r->action = CONTROLLER_NOTHING;
        }
    }
    return rc;
}

/* The applying transaction of R. */
static int apply_outcome(struct controller *c, struct reconcile *r, struct err *err)
{
    int rc;

    r->plan = false;
    rc = task_store_txn(c->store, reconcile_txn, r, err);
    if (rc == E_AGAIN) {
        rc = E_OK;                         /* a newer change will be reconciled by its own event */
        controller_launch_free(r->launch); /* its token never became current */
        r->launch = NULL;
    } else if (rc == E_OK) {
        if (r->action == CONTROLLER_DISK_LIMIT) {
            controller_disk_clear(c, r->ns, r->name);
        }
        log_draft_pr(c, r);
        log_kv(LOG_INFO, "reconciled", "namespace", r->ns, "name", r->name, "action",
               controller_action_name(r->action), NULL);
        rc = start_after_apply(c, r, err);
    }
    return rc;
}

/* The planning transaction of R and what comes before its execution. */
/* A start whose mirror is still fetched waits for it (*FETCHING; the fetch reconciles the
 * task again when done): its staging repository is made meanwhile and, on the local
 * provider, its sandbox spawned gated (launch.c), before the Provisioning transaction,
 * since the sandbox's start is the longest way to the agent. A start whose mirror was
 * ready at once (a local remote whose branches the mirror has: no fetch) spawns it, or
 * takes its repository's warm slot, the same way before the workspace is made. */
static int mirror_or_wait(struct controller *c, struct reconcile *r, bool *fetching,
                          struct err *err)
{
    int rc = E_OK;

    *fetching = false;
    if (controller_mirror_async(c, r)) {
        rc = controller_mirror_ready(c, r, err);
        if (rc == E_AGAIN) {
            rc = E_OK;
            *fetching = true;
            controller_prelaunch(c, r); /* first: a warm slot brings its staging along */
            controller_prepare_early(c, r);
        } else if (rc == E_OK && r->mirror_rc == E_OK) {
            controller_prelaunch(c, r);
        }
    }
    return rc;
}

static int plan(struct controller *c, struct reconcile *r, bool *fetching, struct err *err)
{
    int rc = task_store_txn(c->store, reconcile_txn, r, err), mrc;

    /* A push off the lock: NOTHING while it runs, its action once done (push_job.c). */
    if (rc == E_OK && !controller_push_async(c, r)) {
        (void)controller_disk_refuse_start(c, r); /* the data dir is short of space */
    }
    if (rc != E_OK || r->action != CONTROLLER_PROVISION) {
        controller_prelaunch_drop(c, r->ns, r->name); /* started early, not wanted now */
    }
    if (rc == E_OK && !controller_mirror_async(c, r) &&
        !(r->action == CONTROLLER_NOTHING && r->phase == TASK_PENDING)) {
        /* A fetch made before this plan is not this start's: no start, or a later one. A
         * Pending task left alone waits for the queue pass, which decides (queue.c). */
        controller_mirror_unwanted(c, r->ns, r->name);
    }
    if (rc != E_OK) {
        return rc;
    }
    mrc = mirror_or_wait(c, r, fetching, err);
    rc = before_execute(c, r, err);
    return rc == E_OK ? mrc : rc;
}

int controller_reconcile(struct controller *c, const char *ns, const char *name, struct err *err)
{
    struct reconcile r = {.c = c, .ns = ns, .name = name, .plan = true};
    bool fetching = false;
    int rc;

    pthread_mutex_lock(&c->lock);
    if (atomic_load(&c->stopping)) {
        /* Shutting down: sandboxes die with the server and must not read as failures. */
        pthread_mutex_unlock(&c->lock);
        return E_OK;
    }
    rc = plan(c, &r, &fetching, err);
    if (fetching) {
        r.action = CONTROLLER_NOTHING; /* the fetch reconciles the task again when done */
    }
    if (rc == E_OK && r.action != CONTROLLER_NOTHING && r.action != CONTROLLER_ACTIVATE) {
        controller_execute(c, &r);
        controller_mirror_upkeep_async(c, &r); /* after the start took the mirror */
    }
    if (rc == E_OK && r.action != CONTROLLER_NOTHING) {
        rc = apply_outcome(c, &r, err);
    } else if (rc == E_OK && controller_preview_address_changed(&r)) {
        rc = task_store_txn(c->store, controller_preview_refresh_txn, &r, err);
        rc = rc == E_AGAIN ? E_OK : rc;
    }
    pthread_mutex_unlock(&c->lock);
    reconcile_cleanup(&r);
    return rc;
}

const char *controller_sandbox_problem(const struct controller *c)
{
    return c != NULL ? c->problem : NULL;
}
