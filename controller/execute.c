/* SPDX-License-Identifier: Apache-2.0 */
/* What a reconcile does outside the store with a sandbox provider: prepare the workspace
 * (token file, mirror, staging, state dir), start/freeze/thaw/stop the sandbox, and push
 * the working branch from staging after a runner exit 0. Every step is logged to the task
 * log; a failure that ends the task is left in the reconcile for the apply transaction. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/gitref.h"
#include "common/log.h"
#include "common/proc.h"
#include "controller/controller_int.h"

static int remove_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    (void)remove(path);
    return 0;
}

void controller_remove_tree(const char *path)
{
    (void)nftw(path, remove_one, 16, FTW_DEPTH | FTW_PHYS);
}

void controller_forget_task(struct controller *c, const char *ns, const char *name)
{
    char *dirs[] = {
        xasprintf("%s/workspaces/%s/%s", c->data_dir, ns, name),
        xasprintf("%s/staging/%s/%s.git", c->data_dir, ns, name),
        xasprintf("%s/state/%s/%s", c->data_dir, ns, name),
        xasprintf("%s/tokens/%s/%s", c->data_dir, ns, name),
        xasprintf("%s/run/%s.%s.pause", c->data_dir, ns, name), /* older servers' record */
        xasprintf("%s/run/%s.%s.active", c->data_dir, ns, name),
        xasprintf("%s/run/%s.%s.pr", c->data_dir, ns, name),
    };

    for (size_t i = 0; i < ARRAY_LEN(dirs); i++) {
        controller_remove_tree(dirs[i]);
        free(dirs[i]);
    }
}

void controller_forget_run(struct controller *c, const char *ns, const char *name)
{
    char *dirs[] = {
        xasprintf("%s/workspaces/%s/%s", c->data_dir, ns, name),
        xasprintf("%s/staging/%s/%s.git", c->data_dir, ns, name),
        xasprintf("%s/state/%s/%s", c->data_dir, ns, name),
        xasprintf("%s/run/%s.%s.active", c->data_dir, ns, name),
        xasprintf("%s/run/%s.%s.pr", c->data_dir, ns, name),
    };

    for (size_t i = 0; i < ARRAY_LEN(dirs); i++) {
        controller_remove_tree(dirs[i]);
        free(dirs[i]);
    }
}

bool controller_has_checkpoint(const struct controller *c, const char *ns, const char *name)
{
    char *staging = xasprintf("%s/staging/%s/%s.git", c->data_dir, ns, name);
    char *ref = xasprintf("refs/heads/diverge/wip/%s", name);
    /* From the files (the sandbox wrote them; git does not read them here): a wrong
     * answer costs a start that finds no checkpoint, nothing else. */
    bool has = gitref_read(NULL, staging, ref, CONTROLLER_PACKED_REFS_MAX) == 1;

    free(staging);
    free(ref);
    return has;
}

static void fail(struct reconcile *r, const char *reason, const struct err *err)
{
    r->fail_reason = reason;
    free(r->fail_msg);
    r->fail_msg = xstrdup(err->msg[0] != '\0' ? err->msg : "sandbox error");
}

/* R's mirror into P: the one fetched off the lock (mirror_job.c, which logged how), else
 * fetched now. */
static int mirror_of(struct controller *c, struct reconcile *r, struct controller_paths *p,
                     struct err *err)
{
    const char *how = NULL;
    int rc;

    if (!r->mirror_done) {
        rc = controller_mirror(&p->mirror, c, r->url, p->log, &how, err);
        if (rc == E_OK) {
            sandbox_log_event(p->log, "[diverge] repository mirror %s", how);
        }
        return rc;
    }
    rc = r->mirror_rc;
    p->mirror = r->mirror;
    r->mirror = NULL;
    if (rc != E_OK) {
        *err = r->mirror_err;
    }
    return rc;
}

/* The mirror given to the sandbox user (controller_give_mirror) and, for a fresh local
 * sandbox, the workspace's git directory made from it (workspace_clone.c); when that
 * cannot be done, the workspace is left empty and the runner clones as before. */
static int mirror_workspace(struct controller *c, const struct reconcile *r,
                            struct controller_paths *p, struct err *err)
{
    const char *working = r->working != NULL && r->working[0] != '\0' ? r->working : NULL;
    int lock, rc;

    if (c->chown_files && strcmp(c->provider, "local") == 0 && working != NULL &&
        controller_dir_empty(p->workspace)) {
        char *gitdir = xasprintf("%s/.git", p->workspace);
        struct controller_clone q = {.url = r->url,
                                     .mirror = p->mirror,
                                     .gitdir = gitdir,
                                     .base = r->base != NULL ? r->base : "main",
                                     .working = working};
        struct err why = {0};

        rc = controller_workspace_clone(c, &q, &why);
        if (rc != E_OK) {
            sandbox_log_event(p->log,
                              "[diverge] workspace not made from the mirror (%s): the "
                              "runner clones it",
                              why.msg);
            controller_remove_tree(gitdir);
        }
        free(gitdir);
        if (rc == E_OK) {
            return E_OK;
        }
    }
    lock = controller_mirror_lock(c->data_dir, r->url, err);
    if (lock < 0) {
        return E_FAIL;
    }
    rc = controller_give_mirror(c, p->mirror, NULL, err);
    close(lock);
    return rc;
}

void controller_prepare_early(struct controller *c, const struct reconcile *r)
{
    struct controller_paths p;
    struct err err = {0};

    if (r->action != CONTROLLER_PROVISION || c->sandboxes == NULL) {
        return;
    }
    controller_paths_of(&p, c, r->ns, r->name);
    /* Not the workspace: whether it exists decides how a task starts (reconcile.c). An
     * error is prepare()'s to report: it makes the same again. */
    (void)controller_staging(p.staging, p.log, &err);
    controller_paths_cleanup(&p);
}

/* Prepares everything the sandbox needs; E_OK or an error for SandboxError. */
static int prepare(struct controller *c, struct reconcile *r, struct controller_paths *p,
                   struct err *err)
{
    int rc = controller_write_token_file(c, r->ns, r->name, r->token, err);

    if (rc == E_OK &&
        (sandbox_mkdirs(p->workspace, true) != 0 || sandbox_mkdirs(p->state, true) != 0)) {
        rc = err_set(err, E_FAIL, "create the workspace: %s", strerror(errno));
    }
    if (rc == E_OK && r->url != NULL) {
        rc = mirror_of(c, r, p, err);
    }
    if (rc == E_OK) {
        rc = controller_staging(p->staging, p->log, err);
    }
    if (rc == E_OK && p->mirror != NULL) {
        rc = mirror_workspace(c, r, p, err);
    }
    if (rc == E_OK) {
        rc = controller_give(c, p->workspace, err);
    }
    if (rc == E_OK) {
        rc = controller_give(c, p->state, err);
    }
    if (rc == E_OK) {
        rc = controller_give(c, p->staging, err);
    }
    if (rc == E_OK) {
        rc = controller_give(c, p->token_dir, err);
    }
    return rc;
}

static void arm_timer(struct controller *c, const struct reconcile *r)
{
    int64_t now = clock_now_ms(clock_system());
    int64_t used = controller_active_ms(c, r->ns, r->name, now);

    /* Every running sandbox has a timer (stalls are watched), the far future without a
     * timeout. */
    controller_timer_set(c, r->ns, r->name,
                         r->timeout_s > 0 ? now + r->timeout_s * 1000 - used : INT64_MAX);
    /* SPEC §14: at 80 % of sandbox.timeoutSeconds the agent hears how long is left. */
    controller_timer_warn(c, r->ns, r->name,
                          r->timeout_s > 0 ? now + r->timeout_s * 800 - used : 0);
}

/* The log line of a start that is not a first one: after a server restart, or under a
 * --sandbox-provider other than the one the task last ran under (WS_KEPT: its workspace
 * held something; CHECKPOINT: its staging repository holds its last checkpoint, which
 * the runner restores on a fresh clone). */
static void log_restart(const struct controller *c, const struct reconcile *r, const char *log,
                        enum controller_start_mode mode, int64_t iteration, bool ws_kept,
                        bool checkpoint)
{
    char *from = ws_kept      ? xstrdup("continuing on its workspace")
                 : checkpoint ? xasprintf("its workspace was gone, so it continues from its "
                                          "last checkpoint diverge/wip/%s",
                                          r->name)
                              : xstrdup("its workspace was gone, so it continues from its "
                                        "working branch (nothing of the old sandbox that was "
                                        "not pushed is kept)");

    if (mode != CONTROLLER_START_FRESH && r->ran_provider != NULL &&
        strcmp(r->ran_provider, c->provider) != 0) {
        sandbox_log_event(log,
                          "[diverge] restarted under --sandbox-provider %s (it ran under "
                          "%s before): %s (iteration %lld)",
                          c->provider, r->ran_provider, from, (long long)iteration);
    } else if (mode != CONTROLLER_START_FRESH && !ws_kept) {
        sandbox_log_event(log, "[diverge] %s: %s (iteration %lld)",
                          mode == CONTROLLER_START_RESTART ? "restarted" : "resuming", from,
                          (long long)iteration);
    } else if (mode == CONTROLLER_START_RESTART) {
        sandbox_log_event(log, "[diverge] restarted after server restart (iteration %lld)",
                          (long long)iteration);
    }
    free(from);
}

/* The start L prepared for R, on the gated sandbox PRE spawned while the mirror was
 * fetched when that was given the same (then L is freed and PRE is R's launch), else on a
 * sandbox of its own: its egress proxy and meter socket opened here. */
static int finish_start(struct controller *c, struct reconcile *r, struct controller_launch *l,
                        struct controller_launch *pre, struct err *err)
{
    int rc;

    if (pre != NULL && controller_prelaunch_fits(pre, l)) {
        controller_launch_free(l);
        controller_gate_ready(pre); /* the checkout runs while the apply commits */
        r->launch = pre;
        return E_OK;
    }
    if (pre != NULL) {
        sandbox_log_event(l->p.log, "[diverge] the sandbox started early does not fit the "
                                    "start any more: starting another");
        controller_prelaunch_discard(c, pre);
    }
    rc = controller_launch_sockets(c, l, r, err);
    if (rc == E_OK) {
        controller_launch_spec(l, c, r);
        r->launch = l;
    }
    return rc;
}

/* Everything of a start but the sandbox itself: the workspace, token file, mirror,
 * staging, egress proxy and meter socket. R->launch on success, R->fail_reason else. */
static void do_start(struct controller *c, struct reconcile *r, enum controller_start_mode mode)
{
    struct controller_launch *l = controller_launch_new(mode);
    struct controller_launch *pre = NULL;
    struct err err = {0};
    bool ws_kept, checkpoint;
    int rc;

    l->iteration = r->iteration > 0 ? r->iteration : 1;
    if (mode == CONTROLLER_START_RESUME) {
        l->iteration = r->iteration + 1;
    }
    controller_paths_of(&l->p, c, r->ns, r->name);
    ws_kept = !controller_dir_empty(l->p.workspace); /* before prepare() creates it */
    checkpoint = !ws_kept && controller_has_checkpoint(c, r->ns, r->name);
    if (mode == CONTROLLER_START_FRESH) {
        pre = controller_prelaunch_take(c, r->ns, r->name); /* gated: it wrote nothing */
    }
    if (pre == NULL) {
        /* Whatever an older run left goes first: nothing may write the workspace while it
         * is prepared (and handed to the sandbox user). */
        sandbox_stop(c->sandboxes, r->ns, r->name);
    }
    /* agent-sandbox pods clone and push over the server's git smart HTTP
     * (server/api_git.c), which serves this mirror and staging repository. */
    rc = prepare(c, r, &l->p, &err);
    if (rc == E_OK) {
        l->n = controller_build_env(l->env, c, r, &l->p, l->iteration);
        log_restart(c, r, l->p.log, mode, l->iteration, ws_kept, checkpoint);
        rc = finish_start(c, r, l, pre, &err);
        pre = NULL;
    }
    if (rc != E_OK) {
        sandbox_log_event(l->p.log, "[diverge] failed: %s", err.msg);
        fail(r, "SandboxError", &err);
        controller_launch_free(l);
        controller_prelaunch_discard(c, pre);
    }
}

int controller_launch(struct controller *c, struct reconcile *r)
{
    struct controller_launch *l = r->launch;
    struct err err = {0};
    int rc = l->gate >= 0 ? controller_gate_open(l, &err)
                          : sandbox_start(c->sandboxes, &l->s, &err); /* takes s.egress, s.meter */

    l->s.egress = NULL;
    l->s.meter = NULL;
    if (rc != E_OK) {
        sandbox_log_event(l->p.log, "[diverge] failed: %s", err.msg);
        fail(r, "SandboxError", &err);
        return rc;
    }
    controller_note_running(c, r->ns, r->name, true, clock_now_ms(clock_system()));
    arm_timer(c, r);
    if (l->mode == CONTROLLER_START_FRESH) {
        controller_slot_want(c, r->url); /* the next task of this repository: warm */
    }
    sandbox_log_event(l->p.log, "[diverge] %s (provider %s, iteration %lld)",
                      l->mode == CONTROLLER_START_FRESH    ? "provisioned"
                      : l->mode == CONTROLLER_START_RESUME ? "resumed"
                                                           : "started",
                      c->provider, (long long)l->iteration);
    return E_OK;
}

/* Before the apply: only the fresh token goes into the file. The sandbox is thawed by
 * controller_thaw once the apply made that token current and the task Active; a runner
 * thawed earlier meters with a token the server does not know yet (401, exit 4). */
static void thaw_prepare(struct controller *c, struct reconcile *r, const char *log)
{
    struct err err = {0};

    if (controller_write_token_file(c, r->ns, r->name, r->token, &err) != E_OK) {
        sandbox_log_event(log, "[diverge] failed to resume: %s", err.msg);
        fail(r, "SandboxError", &err);
    }
}

int controller_thaw(struct controller *c, struct reconcile *r)
{
    char *log = sandbox_log_path(c->data_dir, r->ns, r->name);
    struct err err = {0};
    int rc = sandbox_resume(c->sandboxes, r->ns, r->name, &err);

    if (rc == E_NOTFOUND) {
        rc = E_OK; /* it was running: only the token changed */
    }
    if (rc != E_OK) {
        sandbox_log_event(log, "[diverge] failed to resume: %s", err.msg);
        fail(r, "SandboxError", &err);
        controller_timer_set(c, r->ns, r->name, 0);
        sandbox_stop(c->sandboxes, r->ns, r->name);
    } else {
        controller_note_running(c, r->ns, r->name, true, clock_now_ms(clock_system()));
        arm_timer(c, r);
        sandbox_log_event(log, "[diverge] resumed (thawed, fresh token)");
    }
    free(log);
    return rc;
}

void controller_pause_freeze(struct controller *c, struct reconcile *r)
{
    int64_t now = clock_now_ms(clock_system());
    struct sandbox_status st;
    struct err err = {0};
    char *log;
    int rc = E_OK;

    sandbox_status(&st, c->sandboxes, r->ns, r->name);
    if (st.state == SANDBOX_RUNNING) {
        rc = sandbox_suspend(c->sandboxes, r->ns, r->name, &err);
    }
    /* The time counted toward the timeout ends when the freeze began; the bookkeeping (a
     * file rewritten) comes after it, off the pause's way. */
    controller_timer_set(c, r->ns, r->name, 0);
    controller_note_running(c, r->ns, r->name, false, now);
    if (st.state == SANDBOX_PAUSED) {
        r->froze = true; /* frozen by the request that suspended it (suspend.c) */
        return;
    }
    if (st.state != SANDBOX_RUNNING) {
        return;
    }
    log = sandbox_log_path(c->data_dir, r->ns, r->name);
    if (rc != E_OK) {
        /* Nothing may keep running unmetered: a sandbox that cannot be frozen is stopped
         * (a resume starts a new runner from the next iteration on the workspace). */
        sandbox_log_event(log, "[diverge] freeze failed: %s; sandbox stopped instead", err.msg);
        sandbox_stop(c->sandboxes, r->ns, r->name);
    } else {
        r->froze = true;
    }
    free(log);
}

void controller_pause_undo(struct controller *c, struct reconcile *r)
{
    struct err err = {0};

    if (!r->froze) {
        return;
    }
    r->froze = false;
    if (sandbox_resume(c->sandboxes, r->ns, r->name, &err) == E_OK) {
        controller_note_running(c, r->ns, r->name, true, clock_now_ms(clock_system()));
        arm_timer(c, r);
    }
}

static void do_pause(struct controller *c, struct reconcile *r, const char *log)
{
    struct sandbox_status st;

    if (r->froze) {
        sandbox_log_event(log, "[diverge] paused (every process frozen, token revoked)");
        return;
    }
    /* Pausing or Paused already (a server restarted mid-pause, or a task the meter
     * paused): the freeze of controller_pause_freeze did not run. */
    sandbox_status(&st, c->sandboxes, r->ns, r->name);
    if (r->phase == TASK_PAUSED || st.state != SANDBOX_RUNNING) {
        /* A task the meter paused keeps running until its runner stops by itself (exit 0
         * on 429); freezing it there would turn that exit into a completion after a thaw. */
        controller_timer_set(c, r->ns, r->name, 0);
        controller_note_running(c, r->ns, r->name, false, clock_now_ms(clock_system()));
        sandbox_log_event(log, "[diverge] paused (token revoked%s)",
                          st.state == SANDBOX_ABSENT ? "; no sandbox runs, nothing to freeze" : "");
        return;
    }
    controller_pause_freeze(c, r);
    if (r->froze) {
        sandbox_log_event(log, "[diverge] paused (every process frozen, token revoked)");
    }
}

/* E_OK when the push of R's working branch from STAGING stays within --max-push-bytes;
 * E_TOOBIG (with the sizes) when it would not. The staging repo is sanitized first: git
 * reads it here as the server's user. */
static int check_push_size(struct controller *c, const struct reconcile *r, const char *staging,
                           const char *branch, struct err *err)
{
    char *mirror;
    int64_t size = 0;
    int rc;

    if (c->max_push_bytes <= 0) {
        return E_OK;
    }
    mirror = controller_mirror_path(c->data_dir, r->url);
    rc = controller_staging_sanitize(staging, err);
    if (rc == E_OK) {
        rc = controller_push_size(&size, staging, mirror, branch, r->git_bound, err);
    }
    free(mirror);
    if (rc == E_OK && size > c->max_push_bytes) {
        rc = err_set(err, E_TOOBIG,
                     "refusing to push refs/heads/%s: it would send %lld bytes of new objects, "
                     "more than the limit of %lld (--max-push-bytes); the commits stay in the "
                     "task's staging repository",
                     branch, (long long)size, (long long)c->max_push_bytes);
    }
    return rc;
}

/* The commit refs/heads/BRANCH of the (sanitized) STAGING repository is at, as 40 hex
 * digits in OUT; "" when git cannot say. */
static void branch_commit(char out[41], const char *staging, const char *branch)
{
    char *ref = xasprintf("refs/heads/%s^{commit}", branch);
    const char *argv[] = {"git", "--git-dir", staging, "rev-parse", "--verify", "-q", ref, NULL};
    struct err err = {0};
    struct buf b;
    int status = -1;
    size_t n = 0;

    out[0] = '\0';
    buf_init(&b, 128);
    if (proc_run(&status, &b, NULL, false, argv, &err) == E_OK && status == 0 && b.len >= 40) {
        while (n < 40 && strchr("0123456789abcdef", b.data[n]) != NULL && b.data[n] != '\0') {
            n++;
        }
    }
    if (n == 40 && (b.len == 40 || b.data[40] == '\n')) {
        memcpy(out, b.data, 40);
        out[40] = '\0';
    }
    buf_cleanup(&b);
    free(ref);
}

/* Whether R's push was cancelled (the task deleted, the server stopping): its outcome is
 * dropped, so the log says so instead of a failure. */
static bool push_cancelled(const struct reconcile *r, const char *log, const char *what)
{
    const char *why = r->git_bound != NULL ? controller_git_cancelled(r->git_bound) : NULL;

    if (why != NULL) {
        sandbox_log_event(log, "[diverge] %s stopped: %s", what, why);
    }
    return why != NULL;
}

static void complete(struct controller *c, struct reconcile *r, const char *log)
{
    char commit[41];
    char *staging = xasprintf("%s/staging/%s/%s.git", c->data_dir, r->ns, r->name);
    struct err err = {0};

    if (r->url != NULL) {
        if (r->push_refusal != NULL) {
            err_set(&err, E_DENIED, "refusing to push the working branch: %s", r->push_refusal);
        } else if (check_push_size(c, r, staging, r->working, &err) == E_OK &&
                   controller_push(c, staging, r->url, r->working, log, r->git_bound, &err) ==
                       E_OK) {
            branch_commit(commit, staging, r->working);
            sandbox_log_event(log, "[diverge] pushed refs/heads/%s%s%s", r->working,
                              commit[0] != '\0' ? " at " : "", commit);
        }
        if (err.code != E_OK && !push_cancelled(r, log, "push")) {
            sandbox_log_event(log, "[diverge] push failed: %s", err.msg);
            fail(r, err.code == E_TOOBIG ? "PushTooLarge" : "PushFailed", &err);
        }
    }
    free(staging);
}

/* The runner's last failure (<state>/usage.jsonl.failure, written inside the sandbox:
 * untrusted) as valid UTF-8 without control characters but newline and tab, at most
 * CONTROLLER_FAILURE_MAX bytes; NULL when there is none. */
char *controller_read_failure(struct controller *c, const char *ns, const char *name,
                              const char *file)
{
    char *path = xasprintf("%s/state/%s/%s/usage.jsonl.%s", c->data_dir, ns, name, file);
    char raw[CONTROLLER_FAILURE_MAX], *out = NULL;
    struct stat st;
    ssize_t n = -1;
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);

    if (fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
        n = read(fd, raw, sizeof(raw) - 1);
    }
    if (fd >= 0) {
        close(fd);
    }
    if (n > 0) {
        for (ssize_t i = 0; i < n; i++) {
            unsigned char ch = (unsigned char)raw[i];
            if ((ch < 0x20 && ch != '\n' && ch != '\t') || ch == 0x7f) {
                raw[i] = '?';
            }
        }
        out = xmalloc(CONTROLLER_FAILURE_MAX);
        (void)err_utf8_copy(out, CONTROLLER_FAILURE_MAX, raw, (size_t)n);
    }
    free(path);
    return out;
}

/* SPEC §14: a run that ends without a passing verify has its last checkpoint (the
 * staging repository's refs/heads/diverge/wip/<task>, made by the runner) pushed to the
 * remote as diverge/wip/<task>, never forced, never as the working or base branch. */
static void push_wip(struct controller *c, struct reconcile *r, const char *log)
{
    char *staging = xasprintf("%s/staging/%s/%s.git", c->data_dir, r->ns, r->name);
    char *branch = xasprintf("diverge/wip/%s", r->name);
    char *ref = xasprintf("refs/heads/%s", branch);
    const char *has[] = {"git", "--git-dir", staging, "rev-parse", "--verify", "-q", ref, NULL};
    struct err err = {0};
    struct stat st;

    if (!c->push_wip || r->url == NULL || stat(staging, &st) != 0) {
        goto out;
    }
    if ((r->working != NULL && strcmp(r->working, branch) == 0) ||
        (r->base != NULL && strcmp(r->base, branch) == 0)) {
        sandbox_log_event(log,
                          "[diverge] checkpoint not pushed: %s is the task's working or "
                          "base branch",
                          branch);
        goto out;
    }
    /* git reads the staging repository as the server's user: sanitized first. */
    if (controller_staging_sanitize(staging, &err) != E_OK ||
        controller_git(NULL, has, &err) != E_OK) {
        sandbox_log_event(log, "[diverge] no checkpoint to push");
        goto out;
    }
    if (check_push_size(c, r, staging, branch, &err) == E_OK &&
        controller_push(c, staging, r->url, branch, log, r->git_bound, &err) == E_OK) {
        sandbox_log_event(log, "[diverge] pushed the last checkpoint to refs/heads/%s", branch);
        r->wip_pushed = true;
        free(r->last_failure);
        r->last_failure = controller_read_failure(c, r->ns, r->name, "failure");
    } else if (!push_cancelled(r, log, "checkpoint push")) {
        sandbox_log_event(log, "[diverge] checkpoint push failed: %s", err.msg);
    }
out:
    free(staging);
    free(branch);
    free(ref);
}

/* A task the disk watchdog stopped, or whose start the reserve refused: Failed. */
static void disk_limit(struct controller *c, struct reconcile *r, const char *log)
{
    char *ws = xasprintf("%s/workspaces/%s/%s", c->data_dir, r->ns, r->name);
    struct stat st;

    if (r->fail_msg == NULL) {
        r->fail_msg = xstrdup("disk limit");
    }
    r->fail_reason = "DiskLimit";
    sandbox_log_event(log, "[diverge] failed: %s%s", r->fail_msg,
                      lstat(ws, &st) == 0 ? " (the workspace is kept until the task is deleted)"
                                          : "");
    free(ws);
}

/* Before run N of a task whose run N-1 failed (SPEC §14 "the next run ... starts from
 * it"): a new staging repository at <staging>.next holding nothing but the checkpoint
 * refs/heads/diverge/wip/<task> of the old one, renamed into place once the old one is
 * gone. Returns that path, or NULL when there is no checkpoint to keep. */
static char *keep_checkpoint(struct controller *c, const struct reconcile *r, const char *log)
{
    char *staging = xasprintf("%s/staging/%s/%s.git", c->data_dir, r->ns, r->name);
    char *next = xasprintf("%s.next", staging);
    char *branch = xasprintf("diverge/wip/%s", r->name);
    char *ref = xasprintf("refs/heads/%s", branch);
    struct err err = {0};
    bool kept = false;

    controller_remove_tree(next); /* an interrupted one */
    /* The checkpoint is never the working or base branch (the runner refuses those). */
    if (r->phase == TASK_FAILED && controller_has_checkpoint(c, r->ns, r->name) &&
        !(r->working != NULL && strcmp(r->working, branch) == 0) &&
        !(r->base != NULL && strcmp(r->base, branch) == 0)) {
        /* The old repository was written by the sandbox: sanitized before git reads it. */
        kept = controller_staging_sanitize(staging, &err) == E_OK &&
               controller_repo_has(staging, ref) && controller_staging(next, log, &err) == E_OK &&
               controller_checkpoint_copy(next, staging, branch, log, &err) == E_OK;
        if (!kept) {
            sandbox_log_event(log, "[diverge] the checkpoint %s could not be kept: %s", branch,
                              err.msg[0] != '\0' ? err.msg : "no such branch");
        }
    }
    if (!kept) {
        controller_remove_tree(next);
        free(next);
        next = NULL;
    }
    free(staging);
    free(branch);
    free(ref);
    return next;
}

/* Run N of a finished task: nothing of the previous run runs or stays but its log and,
 * after a failed run, its checkpoint, which the runner of run N restores. */
static void rerun(struct controller *c, struct reconcile *r, const char *log)
{
    char *kept, *staging;

    if (c->sandboxes != NULL) {
        controller_timer_set(c, r->ns, r->name, 0);
        sandbox_stop(c->sandboxes, r->ns, r->name);
    }
    controller_disk_clear(c, r->ns, r->name);
    kept = c->sandboxes != NULL ? keep_checkpoint(c, r, log) : NULL;
    controller_forget_run(c, r->ns, r->name);
    sandbox_log_event(log, "[diverge] run %lld requested: objective \"%s\"", (long long)r->run,
                      r->objective);
    if (kept != NULL) {
        staging = xasprintf("%s/staging/%s/%s.git", c->data_dir, r->ns, r->name);
        if (rename(kept, staging) == 0) {
            sandbox_log_event(log,
                              "[diverge] run %lld starts from the checkpoint diverge/wip/%s of "
                              "the previous run",
                              (long long)r->run, r->name);
        } else {
            sandbox_log_event(log, "[diverge] the checkpoint could not be kept: %s",
                              strerror(errno));
            controller_remove_tree(kept);
        }
        free(staging);
        free(kept);
    }
}

bool controller_pushes(const struct controller *c, const struct reconcile *r)
{
    switch (r->action) {
    case CONTROLLER_COMPLETE:
        return r->url != NULL;
    case CONTROLLER_FAIL_RUNNER:
    case CONTROLLER_TIMEOUT:
    case CONTROLLER_PUSH_WIP:
        return c->push_wip && r->url != NULL;
    default:
        return false;
    }
}

void controller_push_begin(struct controller *c, struct reconcile *r, const char *log)
{
    if (r->action == CONTROLLER_FAIL_RUNNER) {
        char *msg = controller_runner_failed_msg(r->url, r->exit_code);

        sandbox_log_event(log, "[diverge] failed: %s", msg);
        free(msg);
    } else if (r->action == CONTROLLER_TIMEOUT) {
        sandbox_log_event(log,
                          "[diverge] timeout: sandbox.timeoutSeconds %lld passed; "
                          "stopping every process",
                          (long long)r->timeout_s);
        /* Nothing may write the staging repository while it is pushed. */
        sandbox_stop(c->sandboxes, r->ns, r->name);
    }
    if (c->sandboxes != NULL && r->action != CONTROLLER_PUSH_WIP) {
        controller_timer_set(c, r->ns, r->name, 0);
        controller_note_running(c, r->ns, r->name, false, clock_now_ms(clock_system()));
    }
}

void controller_push_run(struct controller *c, struct reconcile *r, const char *log)
{
    if (r->action == CONTROLLER_COMPLETE) {
        complete(c, r, log);
    } else {
        push_wip(c, r, log);
    }
}

void controller_execute(struct controller *c, struct reconcile *r)
{
    char *log = sandbox_log_path(c->data_dir, r->ns, r->name);

    switch (r->action) {
    case CONTROLLER_PROVISION:
        do_start(c, r, CONTROLLER_START_FRESH);
        break;
    case CONTROLLER_RESTART:
        do_start(c, r, CONTROLLER_START_RESTART);
        break;
    case CONTROLLER_RESUME_START:
        do_start(c, r, CONTROLLER_START_RESUME);
        break;
    case CONTROLLER_THAW:
        thaw_prepare(c, r, log);
        break;
    case CONTROLLER_PAUSE:
        if (c->sandboxes != NULL) {
            do_pause(c, r, log);
        }
        break;
    case CONTROLLER_COMPLETE:
    case CONTROLLER_FAIL_RUNNER:
    case CONTROLLER_TIMEOUT:
    case CONTROLLER_PUSH_WIP:
        /* Pushed off the lock already (push_job.c), or pushed now: no tick thread. */
        if (!r->pushed) {
            controller_push_begin(c, r, log);
            controller_push_run(c, r, log);
        }
        break;
    case CONTROLLER_FAIL_SANDBOX:
        sandbox_log_event(log, "[diverge] failed: %s",
                          r->fail_msg != NULL ? r->fail_msg : "sandbox error");
        break;
    case CONTROLLER_DISK_LIMIT:
        disk_limit(c, r, log);
        break;
    case CONTROLLER_RERUN:
        rerun(c, r, log);
        break;
    case CONTROLLER_NOTHING:
    case CONTROLLER_ACTIVATE:
    case CONTROLLER_REVOKE:
    case CONTROLLER_WAIT:
    case CONTROLLER_STOP:
    case CONTROLLER_ACTION_COUNT:
        break;
    }
    if (c->sandboxes != NULL && (controller_finishes(r->action) || r->action == CONTROLLER_STOP ||
                                 r->action == CONTROLLER_PUSH_WIP || r->fail_reason != NULL)) {
        controller_timer_set(c, r->ns, r->name, 0);
        controller_note_running(c, r->ns, r->name, false, clock_now_ms(clock_system()));
        sandbox_stop(c->sandboxes, r->ns, r->name);
    }
    free(log);
}
