/* SPDX-License-Identifier: Apache-2.0 */
/* The SCMTaskNotifier: keeps one sticky status comment per task and PR/MR current. It
 * follows the store's change feed, renders the comment, and queues it in the durable
 * outbox under one coalescing key per task: a phase change goes out at once, a spend-only
 * change at most once per min_interval, an unchanged body never. */
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "scm/render.h"
#include "scm/scm.h"

struct scm_notifier {
    struct task_store *store;       /* borrowed */
    const struct scm_registry *reg; /* borrowed */
    struct scm_notifier_config cfg;
    struct store_worker *worker; /* owned; NULL in manual mode */
};

/* Where TASK's sticky comment lives; false when it was not made from a comment. */
static bool target_of(const char **provider, const char **project, int64_t *number,
                      const json_t *task)
{
    const json_t *ann = json_object_get(json_object_get(task, "metadata"), "annotations");
    const char *num = json_string_value(json_object_get(ann, "divergedev.com/pr-number"));

    if (num == NULL) {
        num = json_string_value(json_object_get(ann, "divergedev.com/mr-iid"));
    }
    *provider = json_string_value(json_object_get(ann, "divergedev.com/provider"));
    *project = json_string_value(json_object_get(ann, "divergedev.com/project"));
    *number = num != NULL ? strtoll(num, NULL, 10) : 0;
    return *provider != NULL && *project != NULL && *number > 0;
}

char *scm_sticky_key(const char *provider, const char *project, int64_t number, const char *ns,
                     const char *name)
{
    return xasprintf("sticky/%s/%s#%lld/%s/%s", provider, project, (long long)number, ns, name);
}

struct queue_args {
    struct outbox_entry *e;
    const char *key, *provider, *project, *ns, *name, *hash, *phase;
    int64_t number;
};

static int queue_txn(struct task_txn *tx, void *userdata)
{
    struct queue_args *a = userdata;
    int rc = task_txn_outbox_add(NULL, tx, a->e, NULL);

    return rc != E_OK ? rc
                      : task_txn_sticky_note(tx, a->key, a->provider, a->project, a->number, a->ns,
                                             a->name, a->hash, a->phase, NULL);
}

int scm_notifier_sync(struct scm_notifier *n, const json_t *task, struct err *err)
{
    const char *provider, *project;
    int64_t number;
    struct task_view v;
    struct sticky_state st;
    struct outbox_entry e;
    struct queue_args a;
    char hash[17], *body = NULL, *key;
    bool phase_changed;
    int rc;

    if (!target_of(&provider, &project, &number, task) ||
        scm_registry_get(n->reg, provider) == NULL) {
        return E_OK;
    }
    task_view_of(&v, task);
    rc = scm_render_sticky_dashboard(&body, task, n->cfg.dashboard_url,
                                     clock_now_ms(clock_system()), err);
    if (rc != E_OK) {
        return rc;
    }
    scm_render_hash(hash, body);
    key = scm_sticky_key(provider, project, number, v.ns, v.name);
    rc = task_store_sticky_get(&st, n->store, key, err);
    if (rc != E_OK && rc != E_NOTFOUND) {
        goto out;
    }
    rc = E_OK;
    if (strcmp(st.body_hash, hash) == 0) {
        goto out; /* unchanged: never sent again */
    }
    phase_changed = strcmp(st.phase, task_phase_name(v.phase)) != 0;
    memset(&e, 0, sizeof(e));
    snprintf(e.provider, sizeof(e.provider), "%s", provider);
    snprintf(e.kind, sizeof(e.kind), "%s", st.comment_id != NULL ? "edit" : "sticky");
    e.project = (char *)(uintptr_t)project;
    e.number = number;
    e.target = st.comment_id;
    e.body = body;
    e.coalesce_key = key;
    /* A GitHub App answers as the installation the project's comments came through (the
     * inbox keeps it durably); the app JWT alone may not touch comments. */
    rc = task_store_inbox_installation(&e.installation_id, n->store, provider, project, err);
    if (rc != E_OK) {
        goto out;
    }
    /* A phase change goes out now; a spend-only change waits out the interval. */
    e.not_before_ms = phase_changed ? 0 : st.last_sent_ms + n->cfg.min_interval_ms;
    a = (struct queue_args){.e = &e,
                            .key = key,
                            .provider = provider,
                            .project = project,
                            .ns = v.ns,
                            .name = v.name,
                            .hash = hash,
                            .phase = task_phase_name(v.phase),
                            .number = number};
    rc = task_store_txn(n->store, queue_txn, &a, err);
out:
    sticky_state_cleanup(&st);
    free(key);
    free(body);
    return rc;
}

static void sync_text(struct scm_notifier *n, const char *json)
{
    json_t *task = json_loads(json, 0, NULL);
    struct err err = {0};

    if (task != NULL && scm_notifier_sync(n, task, &err) != E_OK) {
        log_kv(LOG_WARN, "notifier_error", "error", err.msg, NULL);
    }
    json_decref(task);
}

/* Changes the notifier follows: live tasks made from a PR/MR comment. */
static bool wants(const struct task_event *ev, void *userdata)
{
    (void)userdata;
    return ev->type != TASK_EVENT_DELETED && ev->from_scm;
}

static void apply(const struct task_event *ev, void *userdata)
{
    sync_text(userdata, ev->json);
}

static int64_t resync(void *userdata)
{
    struct scm_notifier *n = userdata;
    json_t *items = NULL, *t;
    int64_t rv = 0;
    size_t i;
    struct err err = {0};

    if (task_store_list(&items, &rv, n->store, NULL, &err) != E_OK) {
        return 0;
    }
    json_array_foreach(items, i, t)
    {
        if (scm_notifier_sync(n, t, &err) != E_OK) {
            log_kv(LOG_WARN, "notifier_error", "error", err.msg, NULL);
        }
    }
    json_decref(items);
    return rv;
}

static const struct store_worker_config feed = {.name = "notifier",
                                                .wake = STORE_WORKER_FEED,
                                                .resync = resync,
                                                .wants = wants,
                                                .apply = apply};

int scm_notifier_new(struct scm_notifier **out, struct task_store *store,
                     const struct scm_registry *registry, const struct scm_notifier_config *cfg,
                     struct err *err)
{
    struct scm_notifier *n = xcalloc(1, sizeof(*n));
    int rc = E_OK;

    *out = NULL;
    *n = (struct scm_notifier){.store = store, .reg = registry, .cfg = *cfg};
    /* Manual mode (tests) has no thread: the caller drives scm_notifier_sync. */
    if (!cfg->manual) {
        rc = store_worker_start(&n->worker, store, &feed, n, err);
    }
    if (rc != E_OK) {
        free(n);
        return rc;
    }
    *out = n;
    return E_OK;
}

void scm_notifier_free(struct scm_notifier *n)
{
    /* The worker goes first: it may be applying a change to N. */
    store_worker_stop(n != NULL ? n->worker : NULL);
    free(n);
}
