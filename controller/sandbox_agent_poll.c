/* SPDX-License-Identifier: Apache-2.0 */
/* The agent-sandbox provider's poll thread (see sandbox_agent.c): what the cluster says of
 * each live claim becomes the box's state, so status() never calls the API server. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "controller/controller_int.h"
#include "controller/sandbox_agent_int.h"
#include "kube/kube.h"

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
                controller_log_event(b->log_path, "[diverge] sandbox %s: %s (exit %d)", b->claim,
                                     claim == NULL ? "claim gone" : "runner finished", o.exit_code);
            }
            b->state = o.state;
            b->exit_code = o.exit_code;
        }
        if (box_set_ip(b, o.ip)) {
            tell = tell || b->state == SANDBOX_RUNNING;
        }
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
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_sec += (time_t)(ap->poll_ms / 1000);
        ts.tv_nsec += (long)(ap->poll_ms % 1000) * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        (void)pthread_cond_timedwait(&ap->cond, &ap->lock, &ts);
    }
    pthread_mutex_unlock(&ap->lock);
    return NULL;
}
