/* SPDX-License-Identifier: Apache-2.0 */
/* The reconcile loop. Every decision is taken and written inside one store transaction
 * (token index + task status together); the token file is written after the commit and
 * rewritten on every start, so a crash between the two only delays the file. */
#define _GNU_SOURCE /* renameat2 */
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
#include "sandbox/sandbox.h"

/* Provider none (or one this build cannot run): only the token lifecycle. */
static enum controller_action decide_tokens_only(const struct task_view *v,
                                                 const struct controller_observed *o)
{
    switch (v->phase) {
    case TASK_PENDING:
        if (v->suspended) {
            return CONTROLLER_PAUSE;
        }
        if (!o->can_run) {
            return o->waiting_noted ? CONTROLLER_NOTHING : CONTROLLER_WAIT;
        }
        return CONTROLLER_ACTIVATE;
    case TASK_PROVISIONING:
    case TASK_ACTIVE:
        if (v->suspended) {
            return CONTROLLER_PAUSE;
        }
        /* Active without a usable token (e.g. restored from a backup): mint one. */
        return o->token_active || !o->can_run ? CONTROLLER_NOTHING : CONTROLLER_ACTIVATE;
    case TASK_PAUSING:
        return CONTROLLER_PAUSE;
    case TASK_PAUSED:
        if (!v->suspended) {
            return o->can_run ? CONTROLLER_ACTIVATE : CONTROLLER_NOTHING;
        }
        return o->token_active ? CONTROLLER_PAUSE : CONTROLLER_NOTHING;
    case TASK_COMPLETED:
    case TASK_FAILED:
    case TASK_PHASE_COUNT:
        break;
    }
    if (task_rerun_due(v)) {
        return CONTROLLER_RERUN;
    }
    return o->token_active ? CONTROLLER_REVOKE : CONTROLLER_NOTHING;
}

/* A task that should run but whose sandbox is not there. */
static enum controller_action decide_absent(const struct controller_observed *o, bool resume)
{
    /* Started under another --sandbox-provider: its sandbox is not this provider's (and
     * its workspace may never have existed, as under none). It starts again on what is
     * left: the workspace if there, else a fresh clone of its working branch (with its
     * last checkpoint when the staging repository holds one). */
    if (o->can_run && o->provider_changed) {
        return resume ? CONTROLLER_RESUME_START : CONTROLLER_RESTART;
    }
    /* A gone workspace with a checkpoint of it (SPEC §14): a fresh clone continues from
     * that checkpoint (the runner restores it). */
    if (!o->can_run || (!o->workspace_exists && !o->checkpoint)) {
        return CONTROLLER_FAIL_SANDBOX;
    }
    return resume ? CONTROLLER_RESUME_START : CONTROLLER_RESTART;
}

/* A paused task to resume whose sandbox is not there. */
static enum controller_action decide_resume_absent(const struct controller_observed *o)
{
    /* Paused before its first sandbox ran (suspended while Pending, or while its mirror was
     * still being fetched): there is no workspace yet, it is provisioned now. */
    if (o->never_started && !o->workspace_exists && o->can_run) {
        return CONTROLLER_PROVISION;
    }
    return decide_absent(o, true);
}

static enum controller_action decide_active(const struct task_view *v,
                                            const struct controller_observed *o)
{
    if (v->suspended) {
        return CONTROLLER_PAUSE;
    }
    switch ((enum sandbox_state)o->sandbox) {
    case SANDBOX_EXITED:
        return o->exit_code == 0 ? CONTROLLER_COMPLETE : CONTROLLER_FAIL_RUNNER;
    case SANDBOX_ABSENT:
        return decide_absent(o, false);
    case SANDBOX_PAUSED:
        return CONTROLLER_THAW;
    case SANDBOX_RUNNING:
        break;
    }
    return o->timed_out ? CONTROLLER_TIMEOUT : CONTROLLER_NOTHING;
}

static enum controller_action decide_paused(const struct task_view *v,
                                            const struct controller_observed *o)
{
    if (v->suspended) {
        /* A task the meter paused (429) keeps running until its runner exits by itself;
         * one paused by request is frozen. Either way the token goes. Once the runner
         * exited, the run's checkpoint is pushed (SPEC §14) and the sandbox released. */
        if (o->token_active) {
            return CONTROLLER_PAUSE;
        }
        return o->sandbox == SANDBOX_EXITED ? CONTROLLER_PUSH_WIP : CONTROLLER_NOTHING;
    }
    if (o->sandbox == SANDBOX_PAUSED) {
        return CONTROLLER_THAW;
    }
    /* Not frozen: the runner stopped on a 429 and exited, or is about to (thawing it would
     * turn that exit into a completion). A new runner continues from the next iteration,
     * once a sandbox slot is free. */
    if (o->sandbox != SANDBOX_RUNNING && o->can_run && o->queued) {
        return CONTROLLER_NOTHING; /* queued: the queue pass starts it (queue.c) */
    }
    return decide_resume_absent(o);
}

enum controller_action controller_decide(const struct task_view *v,
                                         const struct controller_observed *o)
{
    if (!o->runs_sandboxes) {
        return decide_tokens_only(v, o);
    }
    /* The disk watchdog stopped its sandbox: whatever else happened, it ends here. */
    if (o->disk_over && v->phase != TASK_COMPLETED && v->phase != TASK_FAILED) {
        return CONTROLLER_DISK_LIMIT;
    }
    switch (v->phase) {
    case TASK_PENDING:
    case TASK_PROVISIONING:
        if (v->suspended) {
            return CONTROLLER_PAUSE;
        }
        if (v->phase == TASK_PENDING && o->can_run && o->queued) {
            return CONTROLLER_NOTHING; /* queued: the queue pass starts it (queue.c) */
        }
        return o->can_run ? CONTROLLER_PROVISION : CONTROLLER_FAIL_SANDBOX;
    case TASK_ACTIVE:
        return decide_active(v, o);
    case TASK_PAUSING:
        /* The pause finishes first, whatever spec.suspended says now (a server killed
         * mid-pause: its sandbox died with it, nothing to freeze). A resume that came
         * meanwhile is planned on Paused by the next reconcile (thaw, or a new runner). */
        return CONTROLLER_PAUSE;
    case TASK_PAUSED:
        return decide_paused(v, o);
    case TASK_COMPLETED:
    case TASK_FAILED:
    case TASK_PHASE_COUNT:
        break;
    }
    if (task_rerun_due(v)) {
        return CONTROLLER_RERUN; /* it stops what still runs */
    }
    if (o->sandbox != SANDBOX_ABSENT) {
        return CONTROLLER_STOP;
    }
    return o->token_active ? CONTROLLER_REVOKE : CONTROLLER_NOTHING;
}

const char *controller_action_name(enum controller_action a)
{
    static const char *const names[] = {
        "nothing",      "activate", "pause",        "revoke",   "wait",        "provision",
        "restart",      "thaw",     "resume-start", "complete", "fail-runner", "timeout",
        "fail-sandbox", "stop",     "disk-limit",   "rerun",    "push-wip"};
    return a < ARRAY_LEN(names) ? names[a] : "unknown";
}

bool controller_finishes(enum controller_action a)
{
    return a == CONTROLLER_COMPLETE || a == CONTROLLER_FAIL_RUNNER || a == CONTROLLER_TIMEOUT ||
           a == CONTROLLER_FAIL_SANDBOX || a == CONTROLLER_DISK_LIMIT;
}

char *controller_token_path(const struct controller *c, const char *ns, const char *name)
{
    return xasprintf("%s/tokens/%s/%s/token", c->data_dir, ns, name);
}

/* Writes TOKEN to the task's token file atomically (temp file, rename), 0600. Not fsync'd:
 * the file is derived from the token index, which is. Nothing reads it across a crash (the
 * sandboxes die with the server), and a server that starts again writes every active
 * token's file anew (loop.c resync) and a fresh one before any sandbox starts. A resume
 * writes it while the task waits to be thawed: an fsync there was a disk flush on that
 * path for nothing. The new file takes the path's place by an exchange, then the old one
 * is removed: a reader finds one whole token file at every moment, as with a rename, but
 * ext4 does not first force out the new file's blocks as it does for a rename over a file
 * (auto_da_alloc; 0.5 ms at the median and several at the tail on this path, for a file
 * that is rewritten after a crash anyway). The first file, or a file system without the
 * exchange, takes the rename. */
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
    if (sandbox_mkdirs(path, false) != 0) {
        rc = err_set(err, E_FAIL, "create the directory of %s: %s", path, strerror(errno));
        goto out;
    }
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        rc = err_set(err, E_FAIL, "create %s: %s", tmp, strerror(errno));
        goto out;
    }
    /* The sandbox reads it through a read-only bind: it must own it when we are root. */
    if (c->chown_files && fchown(fd, c->sandbox_uid, c->sandbox_gid) != 0) {
        rc = err_set(err, E_FAIL, "chown %s: %s", tmp, strerror(errno));
    }
    if (rc == E_OK && write(fd, token, len) != (ssize_t)len) {
        rc = err_set(err, E_FAIL, "write %s: %s", tmp, strerror(errno));
    }
    close(fd);
    if (rc == E_OK && renameat2(AT_FDCWD, tmp, AT_FDCWD, path, RENAME_EXCHANGE) == 0) {
        (void)unlink(tmp); /* the old token's file */
    } else if (rc == E_OK && rename(tmp, path) != 0) {
        rc = err_set(err, E_FAIL, "rename %s: %s", tmp, strerror(errno));
    }
    if (rc != E_OK) {
        (void)unlink(tmp); /* no token left behind in the folder the sandbox reads */
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
int controller_mint_for(char **token_out, char **id_out, struct controller *c, const json_t *doc,
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

char *controller_runner_failed_msg(const char *url, int exit_code)
{
    if (url == NULL && exit_code == 2) {
        return xstrdup("no repository: set spec.repository.url, or use --sandbox-provider none "
                       "for an external agent (the runner exited with status 2)");
    }
    return xasprintf("the runner exited with status %d", exit_code);
}
