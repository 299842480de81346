/* SPDX-License-Identifier: Apache-2.0 */
/* The controller's worker: reconcile everything on start, then every task the change feed
 * names. No polling: the store worker sleeps in the store's watch until something changes. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/secret.h"
#include "controller/controller_int.h"
#include "kube/kube.h"

/* Changes the controller acts on. A running task that is not asked to pause needs
 * nothing: this skips the stream of MODIFIED events every meter charge makes. */
static bool wants(const struct task_event *ev, void *userdata)
{
    struct controller *c = userdata;

    if (ev->type == TASK_EVENT_DELETED) {
        return c->sandboxes != NULL; /* its sandbox must go */
    }
    return !(ev->phase == TASK_ACTIVE && !ev->suspended);
}

static void reconcile_one(struct controller *c, const char *ns, const char *name)
{
    struct err err = {0};

    if (controller_reconcile(c, ns, name, &err) != E_OK && err.code != E_NOTFOUND) {
        log_kv(LOG_WARN, "reconcile_error", "namespace", ns, "task", name, "error", err.msg, NULL);
    }
}

/* A new task's mirror fetch, started before its plan (mirror_job.c): the plan and the
 * Provisioning transaction then run while git fetches. */
static void prefetch(struct controller *c, const struct task_event *ev)
{
    json_t *doc, *repo;
    const char *url;

    if (c->sandboxes == NULL || ev->json == NULL) {
        return;
    }
    doc = json_loads(ev->json, 0, NULL);
    repo = json_object_get(json_object_get(doc, "spec"), "repository");
    url = json_string_value(json_object_get(repo, "url"));
    sandbox_warm(c->sandboxes, ev->ns, ev->name); /* a start is coming: its cgroups first */
    controller_mirror_prefetch(c, ev->ns, ev->name, url,
                               json_string_value(json_object_get(repo, "baseBranch")),
                               json_string_value(json_object_get(repo, "workingBranch")));
    json_decref(doc);
}

bool controller_warms(const struct controller *c)
{
    return c != NULL && sandbox_warms(c->sandboxes);
}

void controller_start_coming(struct controller *c)
{
    if (c != NULL && c->sandboxes != NULL) {
        sandbox_warm(c->sandboxes, NULL, NULL); /* the task's own warm-up: prefetch */
    }
}

/* A deleted task: nothing of it runs, its files go (its log stays unless DROP_LOG). */
static void forget(struct controller *c, const char *ns, const char *name, bool drop_log)
{
    char *log = sandbox_log_path(c->data_dir, ns, name);

    pthread_mutex_lock(&c->lock);
    controller_timer_set(c, ns, name, 0);
    if (c->sandboxes != NULL) {
        sandbox_stop(c->sandboxes, ns, name);
    }
    controller_push_forget(c, ns, name); /* its git killed before its staging goes */
    controller_forget_task(c, ns, name); /* a new task of that name starts clean */
    controller_mirror_forget(c, ns, name);
    controller_disk_clear(c, ns, name);
    if (drop_log) {
        (void)unlink(log);
    }
    pthread_mutex_unlock(&c->lock);
    if (!drop_log) {
        sandbox_log_event(log, "[diverge] task deleted: sandbox stopped");
    }
    free(log);
}

void controller_release_task(struct controller *c, const char *ns, const char *name)
{
    if (c != NULL) {
        forget(c, ns, name, true);
    }
}

static void apply(const struct task_event *ev, void *userdata)
{
    struct controller *c = userdata;
    bool passed = false;

    if (ev->type == TASK_EVENT_DELETED) {
        forget(c, ev->ns, ev->name, false);
    } else if (controller_queue_holds(c, ev)) {
        /* It waits (its own event, or the pass's Queued status): nothing to reconcile, no
         * fetch or warm slot to prepare for a start that is not coming yet. Reconciling
         * each in the writer's line let the feed fall a ring behind under a stream of
         * creates, and every fall meant a resync of every stored task. */
    } else {
        if (ev->type == TASK_EVENT_ADDED && ev->phase == TASK_PENDING && !ev->suspended) {
            prefetch(c, ev);
            /* Under a running-task limit (the default) the queue admits a new task: its
             * pass first, so the plan below (or the pass's own) starts it, not the next.
             * Only when no task waits: else it waits too (first come, first served), and
             * the tick's pass places it with the others. */
            if (!controller_queue_waiting(c)) {
                controller_queue_pass(c);
                passed = true;
            }
        }
        reconcile_one(c, ev->ns, ev->name);
    }
    if (!passed) {
        /* A slot may have come free, or a task joined the queue: the tick thread runs one
         * pass for all the events that came meanwhile (a pass writes the positions of the
         * waiting tasks, and each such write is an event again). */
        controller_queue_poke(c);
    }
}

/* Whether the queue holds the listed task V waiting (as apply() asks of an event): a feed
 * that fell behind resyncs without a transaction and a wait for the lock for each task of
 * a long queue. */
static bool resync_holds(struct controller *c, const struct task_view *v)
{
    struct task_event ev = {.type = TASK_EVENT_MODIFIED,
                            .ns = v->ns,
                            .name = v->name,
                            .phase = v->phase,
                            .suspended = v->suspended};

    return v->ns != NULL && v->name != NULL && controller_queue_holds(c, &ev);
}

/* Reconciles every task and rewrites the token files of tasks holding an active token. */
static int64_t resync(void *userdata)
{
    struct controller *c = userdata;
    json_t *items = NULL, *item;
    int64_t rv = 0;
    size_t i;
    struct err err = {0};

    if (task_store_list(&items, &rv, c->store, NULL, &err) != E_OK) {
        log_kv(LOG_ERROR, "controller_list_failed", "error", err.msg, NULL);
        return 0;
    }
    json_array_foreach(items, i, item)
    {
        struct task_view v;
        struct token_record rec;
        task_view_of(&v, item);
        if (resync_holds(c, &v)) {
            continue; /* its start mints and writes a fresh token */
        }
        reconcile_one(c, v.ns, v.name);
        /* Read and written under the lock, as a start writes its fresh token and makes it
         * current in one hold: a start beside this one (one that waited for its mirror's
         * fetch, run by the fetch's thread) can no longer have its token file overwritten
         * with the token it replaced (the runner then met "token revoked" and exited 4). */
        pthread_mutex_lock(&c->lock);
        if (task_store_token_current(&rec, c->store, v.ns, v.name, NULL) == E_OK) {
            if (rec.active) {
                (void)controller_write_token_file(c, v.ns, v.name, rec.token, NULL);
            }
            secret_wipe(rec.token, strlen(rec.token));
            free(rec.token);
        }
        pthread_mutex_unlock(&c->lock);
    }
    json_decref(items);
    controller_queue_pass(c);
    return rv;
}

/* What controller_new takes from CFG, released when it fails before owning it. */
static void config_release(const struct controller_config *cfg)
{
    if (cfg->kube_owned) {
        kube_client_free(cfg->kube);
    }
    if (cfg->git_auth.free != NULL) {
        cfg->git_auth.free(cfg->git_auth.userdata);
    }
}

/* Frees C's memory (the threads must not run). */
static void controller_destroy(struct controller *c)
{
    secret_wipe(c->root_key, sizeof(c->root_key));
    free(c->data_dir);
    free(c->provider);
    free(c->meter_url);
    free(c->meter_socket);
    free(c->runner_path);
    free(c->agent_cmd);
    free(c->sandbox_tools);
    free(c->verify_cmd);
    free(c->problem);
    if (c->kube_owned) {
        kube_client_free(c->kube);
    }
    controller_egress_cleanup(c);
    controller_disk_cleanup(c);
    free(c->preview_base);
    free(c->github_api_url);
    if (c->git_auth.free != NULL) {
        c->git_auth.free(c->git_auth.userdata);
    }
    for (size_t i = 0; i < ARRAY_LEN(c->shallow_memo); i++) {
        free(c->shallow_memo[i].text);
    }
    pthread_mutex_destroy(&c->lock);
    pthread_mutex_destroy(&c->notes_lock);
    pthread_mutex_destroy(&c->active_lock);
    controller_queue_free(c);
    pthread_mutex_destroy(&c->pass_lock);
    pthread_mutex_destroy(&c->queue_lock);
    pthread_cond_destroy(&c->notes_cond);
    free(c);
}

/* C's settings from CFG (strings copied). */
static void copy_config(struct controller *c, struct task_store *store,
                        const struct controller_config *cfg)
{
    c->store = store;
    c->data_dir = xstrdup(cfg->data_dir);
    memcpy(c->root_key, cfg->root_key, TOKEN_ROOT_KEY_LEN);
    c->default_budget_usd = cfg->default_budget_usd;
    c->default_budget_tokens = cfg->default_budget_tokens;
    c->default_max_iterations = cfg->default_max_iterations > 0 ? cfg->default_max_iterations : 5;
    c->provider = xstrdup(cfg->sandbox_provider);
    c->meter_url = cfg->meter_url != NULL ? xstrdup(cfg->meter_url) : NULL;
    c->agent_cmd = cfg->agent_cmd != NULL ? xstrdup(cfg->agent_cmd) : NULL;
    c->verify_cmd = cfg->verify_cmd != NULL ? xstrdup(cfg->verify_cmd) : NULL;
    c->sandbox_tools = cfg->sandbox_tools != NULL ? xstrdup(cfg->sandbox_tools) : NULL;
    c->log_cap = cfg->log_cap;
    c->sandbox_disk = cfg->sandbox_disk;
    c->disk_reserve = cfg->data_dir_reserve;
    c->max_push_bytes = cfg->max_push_bytes;
    c->push_wip = cfg->push_wip;
    c->stall_after_ms = cfg->stall_after_ms;
    c->no_progress_after = cfg->no_progress_after;
    c->preview_base = cfg->preview_base_url != NULL && cfg->preview_base_url[0] != '\0'
                          ? xstrdup(cfg->preview_base_url)
                          : NULL;
    c->github_api_url = cfg->github_api_url != NULL ? xstrdup(cfg->github_api_url) : NULL;
    c->git_auth = cfg->git_auth;
    c->meter_sockets = cfg->meter_sockets;
    c->kube = cfg->kube;
    c->kube_owned = cfg->kube_owned;
}

int controller_new(struct controller **out, struct task_store *store,
                   const struct controller_config *cfg, struct err *err)
{
    struct controller *c = xcalloc(1, sizeof(*c));
    int rc;

    *out = NULL;
    if (cfg->preview_base_url != NULL && cfg->preview_base_url[0] != '\0' &&
        !controller_preview_base_valid(cfg->preview_base_url)) {
        free(c);
        config_release(cfg);
        return err_set(err, E_INVALID,
                       "--preview-base-url must be an http:// or https:// URL with a host and "
                       "no query or fragment");
    }
    copy_config(c, store, cfg);
    pthread_mutex_init(&c->lock, NULL);
    pthread_mutex_init(&c->notes_lock, NULL);
    pthread_mutex_init(&c->active_lock, NULL);
    pthread_mutex_init(&c->pass_lock, NULL);
    pthread_mutex_init(&c->queue_lock, NULL);
    c->max_running = cfg->max_running_tasks > 0 ? cfg->max_running_tasks : 0;
    secret_random(&c->run_id, sizeof(c->run_id));
    c->run_id |= 1; /* never 0, the value of "no run" */
    pthread_cond_init(&c->notes_cond, NULL);
    atomic_init(&c->stopping, false);
    atomic_init(&c->queue_poked, false);
    controller_disk_init(c);
    rc = controller_sandboxes_open(c, cfg, err);
    if (rc == E_OK) {
        controller_slots_init(c, cfg->warm_slots);
    }
    if (rc == E_OK && !cfg->manual && !cfg->deferred) {
        rc = controller_start(c, NULL, NULL, err);
    }
    if (rc != E_OK) {
        controller_tick_stop(c);
        controller_disk_stop(c);
        sandbox_provider_free(c->sandboxes);
        controller_destroy(c);
        return rc;
    }
    *out = c;
    return E_OK;
}

int controller_start(struct controller *c, const char *meter_url, const char *meter_socket,
                     struct err *err)
{
    /* Reconciles run on the store's change feed: every task at start, then each change. */
    static const struct store_worker_config feed = {.name = "controller",
                                                    .wake = STORE_WORKER_FEED,
                                                    .resync = resync,
                                                    .wants = wants,
                                                    .apply = apply};
    int rc = E_OK;

    if (meter_url != NULL) {
        free(c->meter_url);
        c->meter_url = xstrdup(meter_url);
    }
    if (meter_socket != NULL) {
        c->meter_socket = xstrdup(meter_socket);
        if (c->meter_sockets.open == NULL) {
            controller_expose_socket(c, meter_socket); /* sandboxes share it */
        }
    }
    rc = controller_disk_start(c, err);
    if (rc == E_OK && c->sandboxes != NULL) {
        rc = controller_tick_start(c, err);
    }
    if (rc == E_OK) {
        rc = store_worker_start(&c->worker, c->store, &feed, c, err);
    }
    return rc;
}

void controller_free(struct controller *c)
{
    if (c != NULL) {
        /* First: no reconcile may read a sandbox killed by the shutdown as a failure. */
        atomic_store(&c->stopping, true);
        controller_tick_stop(c);
        controller_disk_stop(c);      /* it stops sandboxes: before the provider goes */
        store_worker_stop(c->worker); /* no reconcile runs past this line */
        controller_prelaunch_drop_all(c);
        controller_slots_drop_all(c); /* the warm sandboxes and their folders */
        /* Sandboxes die with the server (SPEC §9); the next one restarts them. */
        sandbox_provider_free(c->sandboxes);
        c->sandboxes = NULL;
        controller_push_jobs_stop(c);   /* kills pushes still running */
        controller_mirror_jobs_stop(c); /* waits for fetches still running */
        controller_tick_stop(c);        /* frees what exits and fetches queued meanwhile */
        controller_destroy(c);
    }
}
