/* SPDX-License-Identifier: Apache-2.0 */
/* The `agent-sandbox` sandbox provider (SPEC §11): each task's runner runs in a pod that
 * kubernetes-sigs/agent-sandbox provisions for the SandboxClaim `diverge-<task>` in the
 * task's namespace, from the warm pool given to the provider. start creates the claim
 * (AlreadyExists: already provisioned, adopted) and publishes the token; suspend and resume
 * merge-patch the bound Sandbox's spec.operatingMode; stop deletes the claim (agent-sandbox
 * deletes the Sandbox and pod with it) and the token Secret. A poll thread reads each live
 * claim and its Sandbox: status() answers from what it read last (no API call inside a
 * reconcile), and a runner that finished or a pod IP that changed is reported through
 * on_exit so the controller reconciles the task. Pods outlive the server: free() leaves
 * the cluster alone (the next leader restarts them, SPEC §9 restart). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/secret.h"
#include "sandbox/agent/agent_int.h"
#include "kube/kube.h"

#define TOKEN_FILE_MAX 8192

static struct agent_provider *to_agent(struct sandbox_provider *p)
{
    return container_of(p, struct agent_provider, base);
}

struct agent_box **agent_find(struct agent_provider *ap, const char *ns, const char *name)
{
    struct agent_box **pp;

    for (pp = &ap->head; *pp != NULL; pp = &(*pp)->next) {
        if (strcmp((*pp)->ns, ns) == 0 && strcmp((*pp)->name, name) == 0) {
            break;
        }
    }
    return pp;
}

void agent_box_free(struct agent_box *b)
{
    free(b->ns);
    free(b->name);
    free(b->claim);
    free(b->token_path);
    free(b->log_path);
    free(b->ip);
    free(b);
}

/* The kube calls without the answer (the client always returns one). */
static int k_create(struct agent_provider *ap, const struct kube_resource *res, const char *ns,
                    const json_t *doc, struct err *err)
{
    json_t *out = NULL;
    int rc = kube_create(&out, ap->kube, res, ns, doc, err);

    json_decref(out);
    return rc;
}

static int k_patch(struct agent_provider *ap, const struct kube_resource *res, const char *ns,
                   const char *name, const json_t *patch, struct err *err)
{
    json_t *out = NULL;
    int rc = kube_merge_patch(&out, ap->kube, res, ns, name, patch, err);

    json_decref(out);
    return rc;
}

/* --- the token Secret ------------------------------------------------------------------ */

/* Publishes TOKEN as the Secret task-token-<task> the sandbox pod mounts (SPEC §11). In
 * cluster mode the kubernetes store writes it with the token index; until then (SQLite
 * store with agent-sandbox sandboxes) this is the only writer. Create, else replace the
 * data of the existing one. */
static int token_put(struct agent_provider *ap, const char *ns, const char *task, const char *token,
                     struct err *err)
{
    json_t *doc = sandbox_agent_secret(ns, task, token);
    char *name = sandbox_agent_secret_name(task);
    int rc = k_create(ap, &KUBE_SECRETS, ns, doc, err);

    if (rc == E_CONFLICT) {
        json_t *patch = json_pack("{s:O}", "data", json_object_get(doc, "data"));
        *err = (struct err){0};
        rc = k_patch(ap, &KUBE_SECRETS, ns, name, patch, err);
        json_decref(patch);
    }
    json_decref(doc);
    free(name);
    return rc;
}

static void token_delete(struct agent_provider *ap, const char *ns, const char *task)
{
    char *name = sandbox_agent_secret_name(task);
    struct err err = {0};

    (void)kube_delete(ap->kube, &KUBE_SECRETS, ns, name, NULL, &err);
    free(name);
}

/* The token the controller wrote to PATH (a new secret string), or NULL. */
static char *token_read(const char *path)
{
    char *buf = xcalloc(1, TOKEN_FILE_MAX + 1);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    ssize_t n = fd >= 0 ? read(fd, buf, TOKEN_FILE_MAX) : -1;

    if (fd >= 0) {
        close(fd);
    }
    if (n <= 0) {
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    return buf;
}

/* --- operations ------------------------------------------------------------------------- */

static int claim_create(struct agent_provider *ap, const struct sandbox_spec *s, const char *claim,
                        struct err *err)
{
    json_t *doc = sandbox_agent_claim(s, ap->pool, clock_now_ms(clock_system()));
    json_t *old = NULL;
    int rc = k_create(ap, &KUBE_SANDBOXCLAIMS, s->ns, doc, err);

    json_decref(doc);
    if (rc != E_CONFLICT) {
        return rc;
    }
    /* AlreadyExists: this task's sandbox is already provisioned (a repeated provision, or
     * another replica's): adopted, never a second one. Unless it is on its way out. */
    *err = (struct err){0};
    rc = kube_get(&old, ap->kube, &KUBE_SANDBOXCLAIMS, s->ns, claim, err);
    if (rc == E_OK && json_object_get(json_object_get(old, "metadata"), "deletionTimestamp")) {
        rc = err_set(err, E_FAIL, "sandbox claim %s is still being deleted", claim);
    }
    json_decref(old);
    return rc;
}

static int agent_start(struct sandbox_provider *p, const struct sandbox_spec *s, struct err *err)
{
    struct agent_provider *ap = to_agent(p);
    char *claim = sandbox_agent_claim_name(s->name);
    struct agent_box *b, **pp;
    int rc = E_OK;

    sandbox_meter_free(s->meter); /* never made for pods (they meter over HTTP) */
    if (s->egress != NULL) {
        sandbox_egress_free(s->egress);
        rc = err_set(err, E_INVALID,
                     "sandbox network proxy is not available with agent-sandbox: egress of "
                     "sandbox pods is the NetworkPolicy's (use network none)");
    } else if (s->token == NULL) {
        rc = err_set(err, E_INVALID, "no token for the sandbox");
    }
    if (rc == E_OK) {
        rc = token_put(ap, s->ns, s->name, s->token, err);
    }
    if (rc == E_OK) {
        rc = claim_create(ap, s, claim, err);
    }
    if (rc != E_OK) {
        free(claim);
        return rc;
    }
    sandbox_log_event(s->log_path, "[diverge] sandbox claim %s/%s (warm pool %s)", s->ns, claim,
                      ap->pool);
    pthread_mutex_lock(&ap->lock);
    pp = agent_find(ap, s->ns, s->name);
    if (*pp == NULL) {
        *pp = xcalloc(1, sizeof(**pp));
        (*pp)->ns = xstrdup(s->ns);
        (*pp)->name = xstrdup(s->name);
    }
    b = *pp;
    free(b->claim);
    free(b->token_path);
    free(b->log_path);
    free(b->ip);
    b->claim = claim;
    b->token_path = xasprintf("%s/token", s->token_dir);
    b->log_path = xstrdup(s->log_path);
    b->timeout_s = s->timeout_s;
    b->ip = NULL;
    b->state = SANDBOX_RUNNING;
    b->exit_code = 0;
    b->gen++;
    pthread_cond_signal(&ap->cond);
    pthread_mutex_unlock(&ap->lock);
    return E_OK;
}

/* The bound Sandbox of NS/NAME's claim (new string), E_NOTFOUND when there is no claim,
 * E_AGAIN when it is not bound yet. */
static int bound_sandbox(char **out, struct agent_provider *ap, const char *ns, const char *name,
                         struct err *err)
{
    char *claim = sandbox_agent_claim_name(name);
    json_t *doc = NULL;
    int rc = kube_get(&doc, ap->kube, &KUBE_SANDBOXCLAIMS, ns, claim, err);
    const char *sb = rc == E_OK ? sandbox_agent_bound(doc) : NULL;

    *out = NULL;
    if (rc == E_OK && sb == NULL) {
        rc = err_set(err, E_AGAIN, "sandbox claim %s is not bound to a sandbox yet", claim);
    } else if (rc == E_OK) {
        *out = xstrdup(sb);
    }
    json_decref(doc);
    free(claim);
    return rc;
}

static int set_mode(struct agent_provider *ap, const char *ns, const char *name, const char *mode,
                    struct err *err)
{
    char *sb = NULL;
    int rc = bound_sandbox(&sb, ap, ns, name, err);
    json_t *patch;

    if (rc != E_OK) {
        return rc;
    }
    patch = json_pack("{s:{s:s}}", "spec", "operatingMode", mode);
    rc = k_patch(ap, &KUBE_SANDBOXES, ns, sb, patch, err);
    json_decref(patch);
    free(sb);
    return rc;
}

/* Moves the claim's spec.lifecycle.shutdownTime to now + TIMEOUT_S + grace: paused time
 * does not count against sandbox.timeoutSeconds (SPEC §4), so after a pause the old
 * shutdownTime could end the sandbox before the controller's own timeout. */
static void extend_claim(struct agent_provider *ap, const char *ns, const char *name,
                         int64_t timeout_s)
{
    char ts[CLOCK_RFC3339_MAX];
    char *claim = sandbox_agent_claim_name(name);
    struct err err = {0};
    json_t *patch;

    clock_rfc3339(ts, clock_now_ms(clock_system()) + (timeout_s + SANDBOX_AGENT_GRACE_S) * 1000);
    patch = json_pack("{s:{s:{s:s}}}", "spec", "lifecycle", "shutdownTime", ts);
    /* Not fatal (RBAC may not grant patch on claims): the old shutdownTime then ends the
     * sandbox early, which the poll reports as a sandbox gone. */
    if (k_patch(ap, &KUBE_SANDBOXCLAIMS, ns, claim, patch, &err) != E_OK) {
        log_kv(LOG_WARN, "sandbox_claim_extend_failed", "namespace", ns, "claim", claim, "error",
               err.msg, NULL);
    }
    json_decref(patch);
    free(claim);
}

/* Sets the state of NS/NAME's box to STATE when it is in FROM (with the lock held);
 * false when there is no such box. */
static bool box_move(struct agent_provider *ap, const char *ns, const char *name,
                     enum sandbox_state from, enum sandbox_state state)
{
    struct agent_box *b = *agent_find(ap, ns, name);

    if (b == NULL || b->state != from) {
        return false;
    }
    b->state = state;
    free(b->ip);
    b->ip = NULL;
    b->gen++;
    if (from == SANDBOX_PAUSED) {
        b->deadline_ms = 0; /* resumed: the controller armed its timer again */
    }
    return true;
}

/* A copy of NS/NAME's box fields the operations need (with AP->lock taken here); false
 * when there is no box. */
static bool box_peek(struct agent_provider *ap, const char *ns, const char *name,
                     enum sandbox_state *state, char **token_path, char **log_path,
                     int64_t *timeout_s)
{
    struct agent_box *b;

    pthread_mutex_lock(&ap->lock);
    b = *agent_find(ap, ns, name);
    if (b != NULL) {
        *state = b->state;
        *token_path = xstrdup(b->token_path);
        *log_path = xstrdup(b->log_path);
        *timeout_s = b->timeout_s;
    }
    pthread_mutex_unlock(&ap->lock);
    return b != NULL;
}

static int agent_suspend(struct sandbox_provider *p, const char *ns, const char *name,
                         struct err *err)
{
    struct agent_provider *ap = to_agent(p);
    enum sandbox_state state = SANDBOX_ABSENT;
    char *token_path = NULL, *log = NULL;
    int64_t timeout_s = 0;
    int rc;

    pthread_mutex_lock(&ap->op_lock);
    if (!box_peek(ap, ns, name, &state, &token_path, &log, &timeout_s) ||
        state != SANDBOX_RUNNING) {
        rc = err_set(err, E_NOTFOUND, "no running sandbox");
        goto out;
    }
    rc = set_mode(ap, ns, name, "Suspended", err);
    if (rc == E_AGAIN) {
        /* Not bound yet: the poll suspends the Sandbox as soon as the claim names it. */
        sandbox_log_event(log, "[diverge] sandbox not bound yet: suspended once it is");
        rc = E_OK;
    } else if (rc == E_OK) {
        sandbox_log_event(log, "[diverge] sandbox operatingMode Suspended (agent-sandbox "
                               "deletes the pod and keeps the Sandbox and its volumes)");
    }
    if (rc == E_OK) {
        pthread_mutex_lock(&ap->lock);
        (void)box_move(ap, ns, name, SANDBOX_RUNNING, SANDBOX_PAUSED);
        pthread_mutex_unlock(&ap->lock);
    }
out:
    pthread_mutex_unlock(&ap->op_lock);
    free(token_path);
    free(log);
    return rc;
}

/* Puts TOKEN into the env of NS/NAME's bound Sandbox's pod template: agent-sandbox makes
 * the pod of a resumed Sandbox from that template (the claim's env was copied into it when
 * the Sandbox was made), so the new pod runs with the fresh token. Not bound yet: the
 * claim's env, copied at binding. */
static int token_env_update(struct agent_provider *ap, const char *ns, const char *name,
                            const char *token, struct err *err)
{
    char *sb = NULL;
    json_t *doc = NULL, *patch = NULL;
    int rc = bound_sandbox(&sb, ap, ns, name, err);

    if (rc == E_AGAIN) {
        char *claim = sandbox_agent_claim_name(name);
        *err = (struct err){0};
        rc = kube_get(&doc, ap->kube, &KUBE_SANDBOXCLAIMS, ns, claim, err);
        patch = rc == E_OK ? sandbox_agent_claim_token_patch(doc, token) : NULL;
        if (patch != NULL) {
            rc = k_patch(ap, &KUBE_SANDBOXCLAIMS, ns, claim, patch, err);
        }
        free(claim);
    } else if (rc == E_OK) {
        rc = kube_get(&doc, ap->kube, &KUBE_SANDBOXES, ns, sb, err);
        patch = rc == E_OK ? sandbox_agent_token_patch(doc, token) : NULL;
        if (patch != NULL) {
            rc = k_patch(ap, &KUBE_SANDBOXES, ns, sb, patch, err);
        }
    }
    json_decref(patch);
    json_decref(doc);
    free(sb);
    return rc;
}

/* Writes the token the controller just wrote to TOKEN_PATH to the task's Secret and to
 * the env the next pod starts with. */
static int token_refresh(struct agent_provider *ap, const char *ns, const char *name,
                         const char *token_path, struct err *err)
{
    char *token = token_read(token_path);
    int rc = token == NULL ? err_set(err, E_FAIL, "read the token file %s", token_path)
                           : token_put(ap, ns, name, token, err);

    if (rc == E_OK) {
        rc = token_env_update(ap, ns, name, token, err);
    }

    if (token != NULL) {
        secret_wipe(token, strlen(token));
        free(token);
    }
    return rc;
}

static int agent_resume(struct sandbox_provider *p, const char *ns, const char *name,
                        struct err *err)
{
    struct agent_provider *ap = to_agent(p);
    enum sandbox_state state = SANDBOX_ABSENT;
    char *token_path = NULL, *log = NULL;
    int64_t timeout_s = 0;
    int rc;

    pthread_mutex_lock(&ap->op_lock);
    if (!box_peek(ap, ns, name, &state, &token_path, &log, &timeout_s)) {
        rc = err_set(err, E_NOTFOUND, "no suspended sandbox");
        goto out;
    }
    /* The fresh token first, also for a sandbox that still runs (its suspension failed):
     * no pod may go on with the revoked one. */
    rc = token_refresh(ap, ns, name, token_path, err);
    if (rc == E_OK && state != SANDBOX_PAUSED) {
        rc = err_set(err, E_NOTFOUND, "no suspended sandbox");
        goto out;
    }
    if (rc == E_OK && timeout_s > 0) {
        extend_claim(ap, ns, name, timeout_s);
    }
    if (rc == E_OK) {
        rc = set_mode(ap, ns, name, "Running", err);
        rc = rc == E_AGAIN ? E_OK : rc; /* never bound: it never was suspended */
    }
    if (rc == E_OK) {
        pthread_mutex_lock(&ap->lock);
        (void)box_move(ap, ns, name, SANDBOX_PAUSED, SANDBOX_RUNNING);
        pthread_mutex_unlock(&ap->lock);
    }
out:
    pthread_mutex_unlock(&ap->op_lock);
    free(token_path);
    free(log);
    return rc;
}

/* The poll saw NS/NAME's bound Sandbox running while the box is paused (it was suspended
 * before the claim was bound): suspends it now, unless a resume came first. */
void agent_suspend_late(struct agent_provider *ap, const char *ns, const char *name)
{
    struct agent_box *b;
    struct err err = {0};
    bool paused;

    pthread_mutex_lock(&ap->op_lock);
    pthread_mutex_lock(&ap->lock);
    b = *agent_find(ap, ns, name);
    paused = b != NULL && b->state == SANDBOX_PAUSED;
    pthread_mutex_unlock(&ap->lock);
    if (paused && set_mode(ap, ns, name, "Suspended", &err) != E_OK) {
        log_kv(LOG_WARN, "sandbox_suspend_failed", "namespace", ns, "task", name, "error", err.msg,
               NULL);
    }
    pthread_mutex_unlock(&ap->op_lock);
}

static void agent_status(struct sandbox_status *out, struct sandbox_provider *p, const char *ns,
                         const char *name)
{
    struct agent_provider *ap = to_agent(p);
    struct agent_box *b;

    pthread_mutex_lock(&ap->lock);
    b = *agent_find(ap, ns, name);
    out->state = b != NULL ? b->state : SANDBOX_ABSENT;
    out->exit_code = b != NULL ? b->exit_code : 0;
    pthread_mutex_unlock(&ap->lock);
}

static char *agent_address(struct sandbox_provider *p, const char *ns, const char *name)
{
    struct agent_provider *ap = to_agent(p);
    struct agent_box *b;
    char *ip = NULL;

    pthread_mutex_lock(&ap->lock);
    b = *agent_find(ap, ns, name);
    if (b != NULL && b->state == SANDBOX_RUNNING && b->ip != NULL) {
        ip = xstrdup(b->ip);
    }
    pthread_mutex_unlock(&ap->lock);
    return ip;
}

static void agent_stop(struct sandbox_provider *p, const char *ns, const char *name)
{
    struct agent_provider *ap = to_agent(p);
    char *claim = sandbox_agent_claim_name(name);
    struct agent_box **pp, *b;
    struct err err = {0};
    int rc;

    pthread_mutex_lock(&ap->lock);
    pp = agent_find(ap, ns, name);
    b = *pp;
    if (b != NULL) {
        *pp = b->next;
    }
    pthread_mutex_unlock(&ap->lock);
    /* Also without a record: what a previous server (or leader) left goes too. */
    rc = kube_delete(ap->kube, &KUBE_SANDBOXCLAIMS, ns, claim, NULL, &err);
    if (rc != E_OK && rc != E_NOTFOUND) {
        log_kv(LOG_WARN, "sandbox_claim_delete_failed", "namespace", ns, "claim", claim, "error",
               err.msg, NULL);
    } else if (rc == E_OK && b != NULL) {
        sandbox_log_event(b->log_path, "[diverge] sandbox claim %s deleted", claim);
    }
    token_delete(ap, ns, name);
    if (b != NULL) {
        agent_box_free(b);
    }
    free(claim);
}

static void agent_free(struct sandbox_provider *p);

const struct sandbox_provider_ops agent_ops = {
    .name = "agent-sandbox",
    .start = agent_start,
    .suspend = agent_suspend,
    .resume = agent_resume,
    .status = agent_status,
    .stop = agent_stop,
    .free = agent_free,
    .address = agent_address,
};

static void agent_free(struct sandbox_provider *p)
{
    struct agent_provider *ap = to_agent(p);

    pthread_mutex_lock(&ap->lock);
    ap->stopping = true;
    pthread_cond_broadcast(&ap->cond);
    pthread_mutex_unlock(&ap->lock);
    pthread_join(ap->thread, NULL);
    while (ap->head != NULL) {
        struct agent_box *b = ap->head;
        ap->head = b->next;
        agent_box_free(b);
    }
    pthread_mutex_destroy(&ap->lock);
    pthread_mutex_destroy(&ap->op_lock);
    pthread_cond_destroy(&ap->cond);
    free(ap->pool);
    free(ap);
}
