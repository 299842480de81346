/* SPDX-License-Identifier: Apache-2.0 */
/* The agent-sandbox provider's poll thread (the operations are agent.c's): what the
 * cluster says of each live claim becomes the box's state, so status() never calls the
 * API server; the claims a previous server left are adopted; and the provider is made
 * here, as making it starts that thread and adopts them. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "sandbox/agent/agent_int.h"
#include "common/log.h"
#include "kube/kube.h"
#include "store/store.h"

#define POLL_DEFAULT_MS 2000

/* --- the poll thread ------------------------------------------------------------------- */

struct poll_item {
    char *ns, *name, *claim;
    uint64_t gen;
};

static const struct kube_resource PODS = {"", "v1", "pods", "Pod"};

/* The finished runner's exit status from SB's pod into O (when the pod can be read: the
 * Finished condition only says succeeded or failed). */
static void pod_exit(struct sandbox_agent_obs *o, struct agent_provider *ap, const char *ns,
                     const json_t *sb)
{
    const char *pod = sandbox_agent_pod_name(sb);
    struct err err = {0};
    json_t *doc = NULL;
    int code;

    if (pod != NULL && kube_get(&doc, ap->kube, &PODS, ns, pod, &err) == E_OK &&
        sandbox_agent_pod_exit(&code, doc) && (code == 0) == (o->exit_code == 0)) {
        o->exit_code = code;
    }
    json_decref(doc);
}

/* Reads CLAIM and its bound Sandbox: *claim_out and *sb_out new objects or NULL. E_OK also
 * when the claim is gone (*claim_out NULL); else the error of a failed read. */
static int read_pair(json_t **claim_out, json_t **sb_out, struct agent_provider *ap, const char *ns,
                     const char *claim)
{
    struct err err = {0};
    const char *sb;
    int rc = kube_get(claim_out, ap->kube, &KUBE_SANDBOXCLAIMS, ns, claim, &err);

    *sb_out = NULL;
    if (rc == E_NOTFOUND) {
        *claim_out = NULL;
        return E_OK;
    }
    if (rc != E_OK) {
        *claim_out = NULL;
        return rc;
    }
    sb = sandbox_agent_bound(*claim_out);
    if (sb != NULL && kube_get(sb_out, ap->kube, &KUBE_SANDBOXES, ns, sb, &err) != E_OK) {
        *sb_out = NULL;
    }
    return E_OK;
}

/* Sets B's pod IP to IP (may be NULL); whether it changed. */
static bool box_set_ip(struct agent_box *b, const char *ip)
{
    if ((ip == NULL) == (b->ip == NULL) && (ip == NULL || strcmp(ip, b->ip) == 0)) {
        return false;
    }
    free(b->ip);
    b->ip = ip != NULL ? xstrdup(ip) : NULL;
    return true;
}

/* Whether an adopted box's time just ran out (told once: the reconcile sees the timeout). */
static bool deadline_due(struct agent_box *b)
{
    if (b->deadline_ms <= 0 || b->deadline_told || b->state != SANDBOX_RUNNING ||
        clock_now_ms(clock_system()) < b->deadline_ms) {
        return false;
    }
    b->deadline_told = true;
    return true;
}

/* Applies what was read of IT to its box (unless the box changed meanwhile); true when the
 * controller should reconcile the task (the runner finished, or the pod IP changed). */
static bool poll_apply(struct agent_provider *ap, const struct poll_item *it, const json_t *claim,
                       const json_t *sb)
{
    struct sandbox_agent_obs o;
    struct agent_box *b;
    bool tell = false;

    sandbox_agent_observe(&o, claim, sb);
    if (o.state == SANDBOX_EXITED && o.exit_code != SANDBOX_AGENT_EXIT_GONE) {
        pod_exit(&o, ap, it->ns, sb);
    }
    if (claim == NULL) {
        o.state = SANDBOX_EXITED; /* deleted or expired under us: nothing runs any more */
        o.exit_code = SANDBOX_AGENT_EXIT_GONE;
    }
    pthread_mutex_lock(&ap->lock);
    b = *agent_find(ap, it->ns, it->name);
    if (b != NULL && b->gen == it->gen && b->state != SANDBOX_EXITED) {
        /* A suspension in progress stays PAUSED whatever the pod still says. */
        if (o.state == SANDBOX_EXITED || b->state == SANDBOX_RUNNING) {
            tell = o.state == SANDBOX_EXITED;
            if (o.state == SANDBOX_EXITED) {
                sandbox_log_event(b->log_path, "[diverge] sandbox %s: %s (exit %d)", b->claim,
                                  claim == NULL ? "claim gone" : "runner finished", o.exit_code);
            }
            b->state = o.state;
            b->exit_code = o.exit_code;
        }
        if (box_set_ip(b, o.ip)) {
            tell = tell || b->state == SANDBOX_RUNNING;
        }
        tell = deadline_due(b) || tell;
    }
    pthread_mutex_unlock(&ap->lock);
    return tell;
}

/* Whether SB runs although IT's box is paused (suspended before it was bound). */
static bool late_suspend(struct agent_provider *ap, const struct poll_item *it, const json_t *sb)
{
    const char *mode =
        json_string_value(json_object_get(json_object_get(sb, "spec"), "operatingMode"));
    struct agent_box *b;
    bool late;

    if (mode != NULL && strcmp(mode, "Suspended") == 0) {
        return false;
    }
    pthread_mutex_lock(&ap->lock);
    b = *agent_find(ap, it->ns, it->name);
    late = b != NULL && b->state == SANDBOX_PAUSED;
    pthread_mutex_unlock(&ap->lock);
    return late;
}

static size_t poll_snapshot(struct agent_provider *ap, struct poll_item **out)
{
    size_t n = 0, i = 0;

    for (struct agent_box *b = ap->head; b != NULL; b = b->next) {
        n++;
    }
    *out = n > 0 ? xcalloc(n, sizeof(**out)) : NULL;
    for (struct agent_box *b = ap->head; b != NULL; b = b->next, i++) {
        (*out)[i] = (struct poll_item){xstrdup(b->ns), xstrdup(b->name), xstrdup(b->claim), b->gen};
    }
    return n;
}

static void poll_once(struct agent_provider *ap)
{
    struct poll_item *items;
    size_t n;

    pthread_mutex_lock(&ap->lock);
    n = poll_snapshot(ap, &items);
    pthread_mutex_unlock(&ap->lock);
    for (size_t i = 0; i < n; i++) {
        json_t *claim = NULL, *sb = NULL;
        if (read_pair(&claim, &sb, ap, items[i].ns, items[i].claim) == E_OK &&
            poll_apply(ap, &items[i], claim, sb) && ap->base.on_exit != NULL) {
            ap->base.on_exit(items[i].ns, items[i].name, ap->base.on_exit_userdata);
        }
        if (sb != NULL && late_suspend(ap, &items[i], sb)) {
            agent_suspend_late(ap, items[i].ns, items[i].name);
        }
        json_decref(claim);
        json_decref(sb);
        free(items[i].ns);
        free(items[i].name);
        free(items[i].claim);
    }
    free(items);
}

void *agent_poll_thread(void *arg)
{
    struct agent_provider *ap = arg;

    pthread_mutex_lock(&ap->lock);
    while (!ap->stopping) {
        struct timespec ts;
        pthread_mutex_unlock(&ap->lock);
        poll_once(ap);
        pthread_mutex_lock(&ap->lock);
        if (ap->stopping) {
            break;
        }
        clock_deadline_in(&ts, CLOCK_MONOTONIC, ap->poll_ms);
        (void)pthread_cond_timedwait(&ap->cond, &ap->lock, &ts);
    }
    pthread_mutex_unlock(&ap->lock);
    return NULL;
}

/* The claim name of ITEM when it is a task's (its label names a task whose claim name it
 * has, and it is not being deleted): a new string, with *NS_OUT and *TASK_OUT borrowed. */
static char *adoptable(const json_t *item, const char **ns_out, const char **task_out)
{
    const json_t *md = json_object_get(item, "metadata");
    const char *claim = json_string_value(json_object_get(md, "name"));
    const char *task =
        json_string_value(json_object_get(json_object_get(md, "labels"), SANDBOX_AGENT_LABEL_TASK));
    char *want;

    *ns_out = json_string_value(json_object_get(md, "namespace"));
    *task_out = task;
    if (*ns_out == NULL || claim == NULL || task == NULL || !task_name_valid(task) ||
        json_object_get(md, "deletionTimestamp") != NULL) {
        return NULL;
    }
    want = sandbox_agent_claim_name(task);
    if (strcmp(want, claim) != 0) {
        free(want);
        return NULL;
    }
    return want;
}

/* The box of an adopted claim DOC (bound to SB, may be NULL). Takes CLAIM. */
static struct agent_box *adopted_box(struct agent_provider *ap, const char *data_dir,
                                     const char *ns, const char *task, char *claim,
                                     const json_t *doc, const json_t *sb)
{
    struct agent_box *b = xcalloc(1, sizeof(*b));
    struct sandbox_agent_obs o;
    const char *shut = json_string_value(json_object_get(
        json_object_get(json_object_get(doc, "spec"), "lifecycle"), "shutdownTime"));

    sandbox_agent_observe(&o, doc, sb);
    if (o.state == SANDBOX_EXITED && o.exit_code != SANDBOX_AGENT_EXIT_GONE) {
        pod_exit(&o, ap, ns, sb);
    }
    b->ns = xstrdup(ns);
    b->name = xstrdup(task);
    b->claim = claim;
    b->token_path = xasprintf("%s/tokens/%s/%s/token", data_dir, ns, task);
    b->log_path = sandbox_log_path(data_dir, ns, task);
    b->state = o.state;
    b->exit_code = o.exit_code;
    b->ip = o.ip != NULL && o.state == SANDBOX_RUNNING ? xstrdup(o.ip) : NULL;
    if (shut != NULL && clock_parse_rfc3339(&b->deadline_ms, shut) == E_OK) {
        b->deadline_ms -= SANDBOX_AGENT_GRACE_S * 1000;
    } else {
        b->deadline_ms = 0;
    }
    return b;
}

/* Whether the claim DOC is a repository task's (its env names DIVERGE_PUSH_URL). */
static bool claim_pushes(const json_t *doc)
{
    const json_t *env = json_object_get(json_object_get(doc, "spec"), "env"), *e;
    size_t i;

    json_array_foreach(env, i, e)
    {
        const char *n = json_string_value(json_object_get(e, "name"));

        if (n != NULL && strcmp(n, "DIVERGE_PUSH_URL") == 0) {
            return true;
        }
    }
    return false;
}

/* A repository task's claim adopted by a replica whose data dir lacks the task's staging
 * repository (the pod pushed into the previous leader's): the push after the runner's
 * exit cannot work. Said at once, in the task log and the server log (docs/cluster-mode.md
 * "Together": the replicas must share <data-dir>/mirrors and <data-dir>/staging). */
static void adopted_staging_check(const char *data_dir, const struct agent_box *b,
                                  const json_t *doc)
{
    char *dir = xasprintf("%s/staging/%s/%s.git", data_dir, b->ns, b->name);
    struct stat st;

    if (claim_pushes(doc) && stat(dir, &st) != 0) {
        sandbox_log_event(b->log_path,
                          "[diverge] no staging repository for this task on this replica: "
                          "the replicas must share <data-dir>/staging and <data-dir>/mirrors "
                          "(the sandbox's push cannot be delivered)");
        log_kv(LOG_WARN, "sandbox_staging_missing", "namespace", b->ns, "task", b->name, NULL);
    }
    free(dir);
}

/* Adopts the one claim ITEM when it is a task's; with AP->lock not held. */
static void adopt_one(struct agent_provider *ap, const char *data_dir, const json_t *item)
{
    const char *ns, *task;
    char *claim = adoptable(item, &ns, &task);
    json_t *doc = NULL, *sb = NULL;
    struct agent_box *b;

    if (claim == NULL || read_pair(&doc, &sb, ap, ns, claim) != E_OK || doc == NULL) {
        free(claim);
        return;
    }
    b = adopted_box(ap, data_dir, ns, task, claim, doc, sb);
    sandbox_log_event(b->log_path, "[diverge] sandbox claim %s/%s adopted", ns, b->claim);
    adopted_staging_check(data_dir, b, doc);
    pthread_mutex_lock(&ap->lock);
    if (*agent_find(ap, ns, task) == NULL) {
        b->next = ap->head;
        ap->head = b;
        b = NULL;
    }
    pthread_mutex_unlock(&ap->lock);
    if (b != NULL) {
        agent_box_free(b);
    }
    json_decref(doc);
    json_decref(sb);
}

void agent_adopt(struct agent_provider *ap, const char *data_dir)
{
    char rv[KUBE_RV_MAX];
    struct err err = {0};
    json_t *items = NULL, *item;
    size_t i;

    if (kube_list(&items, rv, ap->kube, &KUBE_SANDBOXCLAIMS, NULL,
                  SANDBOX_AGENT_LABEL_MANAGED "=diverge", &err) != E_OK) {
        log_kv(LOG_WARN, "sandbox_claims_unlisted", "error", err.msg, NULL);
        return;
    }
    json_array_foreach(items, i, item)
    {
        adopt_one(ap, data_dir, item);
    }
    json_decref(items);
}

/* --- the provider ---------------------------------------------------------------------- */

int sandbox_agent_new(struct sandbox_provider **out, const struct sandbox_agent_opts *o,
                      struct err *err)
{
    struct agent_provider *ap;
    pthread_condattr_t ca;

    if (o->kube == NULL) {
        return err_set(err, E_INVALID, "agent-sandbox needs a Kubernetes client");
    }
    if (o->warm_pool == NULL || o->warm_pool[0] == '\0') {
        return err_set(err, E_INVALID,
                       "agent-sandbox needs a warm pool (--sandbox-warm-pool or "
                       "DIVERGE_SANDBOX_WARMPOOL)");
    }
    ap = xcalloc(1, sizeof(*ap));
    ap->base.ops = &agent_ops;
    ap->base.on_exit = o->on_exit;
    ap->base.on_exit_userdata = o->on_exit_userdata;
    ap->kube = o->kube;
    ap->pool = xstrdup(o->warm_pool);
    ap->poll_ms = o->poll_ms > 0 ? o->poll_ms : POLL_DEFAULT_MS;
    pthread_mutex_init(&ap->lock, NULL);
    pthread_mutex_init(&ap->op_lock, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&ap->cond, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&ap->thread, NULL, agent_poll_thread, ap) != 0) {
        pthread_mutex_destroy(&ap->lock);
        pthread_mutex_destroy(&ap->op_lock);
        pthread_cond_destroy(&ap->cond);
        free(ap->pool);
        free(ap);
        return err_set(err, E_FAIL, "cannot start the agent-sandbox poll thread");
    }
    if (o->data_dir != NULL) {
        agent_adopt(ap, o->data_dir);
    }
    *out = &ap->base;
    return E_OK;
}
