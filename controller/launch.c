/* SPDX-License-Identifier: Apache-2.0 */
/* What a start hands the sandbox provider: the task's paths, the runner's environment
 * (SPEC §9) and the sandbox spec; and the prelaunch, a fresh local start whose sandbox
 * is spawned while its mirror is still fetched, so that bubblewrap and the runner start
 * alongside the fetch. Its runner waits on a start gate (DIVERGE_START_GATE_FD: the read
 * end of a pipe the sandbox inherits) before it touches the workspace or meters: the
 * start writes "c" once the workspace is made (the runner checks it out) and "g" once the
 * apply made the task Active and its token current (controller_launch), exactly when it
 * would have spawned the sandbox otherwise (the runner meters and runs the agent). A
 * prelaunch that does not fit the start (anything the sandbox was given differs) or is
 * not wanted any more is stopped and the start spawns as before. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "controller/controller_int.h"

void controller_paths_of(struct controller_paths *p, struct controller *c, const char *ns,
                         const char *name)
{
    p->workspace = xasprintf("%s/workspaces/%s/%s", c->data_dir, ns, name);
    p->token_dir = xasprintf("%s/tokens/%s/%s", c->data_dir, ns, name);
    p->staging = xasprintf("%s/staging/%s/%s.git", c->data_dir, ns, name);
    p->state = xasprintf("%s/state/%s/%s", c->data_dir, ns, name);
    p->mirror = NULL;
    p->log = sandbox_log_path(c->data_dir, ns, name);
    p->sock_dir = NULL;
    if (c->meter_socket != NULL && c->meter_sockets.open == NULL) {
        p->sock_dir = xstrdup(c->meter_socket);
        *strrchr(p->sock_dir, '/') = '\0';
    }
}

void controller_paths_cleanup(struct controller_paths *p)
{
    free(p->workspace);
    free(p->token_dir);
    free(p->staging);
    free(p->state);
    free(p->mirror);
    free(p->log);
    free(p->sock_dir);
}

/* The preview variables of SPEC §4 at ENV[N] when the task has a linked preview. */
static size_t preview_env(char **env, size_t n, const struct reconcile *r)
{
    if (r->preview_url != NULL) {
        env[n++] = xasprintf("DIVERGE_PREVIEW_URL=%s", r->preview_url);
        env[n++] = xstrdup("DIVERGE_PREVIEW_HEADER_KEY=" CONTROLLER_PREVIEW_HEADER);
        env[n++] = xasprintf("DIVERGE_PREVIEW_HEADER_VALUE=%s", r->preview_env);
    }
    return n;
}

/* A, else B, else "". */
static const char *first_set(const char *a, const char *b)
{
    return a != NULL ? a : b != NULL ? b : "";
}

/* The environment of SPEC §9, with paths as the sandbox sees them. */
/* The run's limits and commands: iterations, run number, agent and verify commands. */
static size_t run_env(char **env, size_t n, const struct controller *c, const struct reconcile *r,
                      int64_t start_iteration)
{
    env[n++] = xasprintf(
        "DIVERGE_MAX_ITERATIONS=%lld",
        (long long)(r->max_iterations > 0 ? r->max_iterations : c->default_max_iterations));
    env[n++] = xasprintf("DIVERGE_START_ITERATION=%lld", (long long)start_iteration);
    env[n++] = xasprintf("DIVERGE_RUN=%lld", (long long)(r->run > 0 ? r->run : 1));
    /* The task's own commands (spec.runner, from agent.yaml) over the server's defaults. */
    env[n++] = xasprintf("DIVERGE_AGENT_CMD=%s", first_set(r->agent_cmd, c->agent_cmd));
    env[n++] = xasprintf("DIVERGE_VERIFY_CMD=%s", first_set(r->verify_cmd, c->verify_cmd));
    env[n++] = xasprintf("DIVERGE_NO_PROGRESS_AFTER=%lld", (long long)c->no_progress_after);
    return n;
}

char *controller_env_path(const struct controller *c)
{
    return c->sandbox_tools != NULL
               ? xasprintf("PATH=%s/bin:/usr/local/bin:/usr/bin:/bin", c->sandbox_tools)
               : xstrdup("PATH=/usr/local/bin:/usr/bin:/bin");
}

size_t controller_build_env(char **env, struct controller *c, const struct reconcile *r,
                            const struct controller_paths *p, int64_t start_iteration)
{
    bool inside = strcmp(c->provider, "local") == 0;
    const char *ws = inside ? SANDBOX_IN_WORKSPACE : p->workspace;
    const char *state = inside ? SANDBOX_IN_STATE : p->state;
    size_t n = 0;

    env[n++] = controller_env_path(c);
    env[n++] = xasprintf("HOME=%s", state);
    env[n++] = xstrdup("LANG=C.UTF-8");
    env[n++] = xasprintf("DIVERGE_METER_URL=%s", c->meter_url != NULL ? c->meter_url : "");
    if (c->meter_socket != NULL && c->meter_sockets.open == NULL) {
        env[n++] = inside ? xstrdup("DIVERGE_METER_SOCKET=" SANDBOX_IN_SOCK_DIR "/meter.sock")
                          : xasprintf("DIVERGE_METER_SOCKET=%s", c->meter_socket);
    }
    env[n++] = inside ? xasprintf("DIVERGE_TOKEN_FILE=%s/token", SANDBOX_IN_TOKEN_DIR)
                      : xasprintf("DIVERGE_TOKEN_FILE=%s/token", p->token_dir);
    env[n++] = xasprintf("DIVERGE_TASK_NAME=%s", r->name);
    env[n++] = xasprintf("DIVERGE_NAMESPACE=%s", r->ns);
    env[n++] = xasprintf("DIVERGE_OBJECTIVE=%s", r->objective);
    if (p->mirror != NULL) {
        env[n++] = xasprintf("DIVERGE_REPO_URL=file://%s", inside ? SANDBOX_IN_MIRROR : p->mirror);
    }
    env[n++] = xasprintf("DIVERGE_PUSH_URL=file://%s", inside ? SANDBOX_IN_STAGING : p->staging);
    env[n++] = xasprintf("DIVERGE_BASE_BRANCH=%s", r->base != NULL ? r->base : "main");
    env[n++] = xasprintf("DIVERGE_WORKING_BRANCH=%s", r->working != NULL ? r->working : "");
    n = run_env(env, n, c, r, start_iteration);
    env[n++] = xasprintf("DIVERGE_WORKSPACE_DIR=%s", ws);
    env[n++] = xasprintf("DIVERGE_USAGE_FILE=%s/usage.jsonl", state);
    n = preview_env(env, n, r);
    env[n] = NULL;
    return n;
}

struct controller_launch *controller_launch_new(enum controller_start_mode mode)
{
    struct controller_launch *l = xcalloc(1, sizeof(*l));

    l->mode = mode;
    l->gate = -1;
    return l;
}

void controller_launch_free(struct controller_launch *l)
{
    if (l == NULL) {
        return;
    }
    sandbox_egress_free(l->s.egress); /* NULL once started: the sandbox took them over */
    sandbox_meter_free(l->s.meter);
    if (l->gate >= 0) {
        close(l->gate); /* its runner reads the end of the pipe and exits */
    }
    for (size_t i = 0; i < l->n; i++) {
        free(l->env[i]);
    }
    controller_paths_cleanup(&l->p);
    free(l->ns);
    free(l->name);
    free(l);
}

void controller_launch_spec(struct controller_launch *l, const struct controller *c,
                            const struct reconcile *r)
{
    struct sandbox_spec *s = &l->s;

    s->ns = r->ns;
    s->name = r->name;
    s->runner_path = c->runner_path;
    s->workspace = l->p.workspace;
    s->token_dir = l->p.token_dir;
    s->mirror = l->p.mirror;
    s->staging = l->p.staging;
    s->usage_dir = l->p.state;
    s->sock_dir = s->meter != NULL ? s->meter->dir : l->p.sock_dir;
    s->log_path = l->p.log;
    s->log_cap = c->log_cap;
    s->token = r->token;
    s->timeout_s = r->timeout_s;
    for (size_t i = 0; i <= l->n; i++) {
        s->env[i] = l->env[i];
    }
}

/* --- the prelaunch ---------------------------------------------------------------- */

/* Fills IDS with the identities of L's directories (0 for one that is not there). */
static void dir_ids(unsigned long long ids[CONTROLLER_PRELAUNCH_DIRS][2],
                    const struct controller_paths *p)
{
    const char *dirs[CONTROLLER_PRELAUNCH_DIRS] = {p->workspace, p->state, p->staging, p->token_dir,
                                                   p->mirror};

    for (size_t i = 0; i < CONTROLLER_PRELAUNCH_DIRS; i++) {
        struct stat sb;
        bool ok = dirs[i] != NULL && lstat(dirs[i], &sb) == 0 && S_ISDIR(sb.st_mode);

        ids[i][0] = ok ? (unsigned long long)sb.st_ino : 0;
        ids[i][1] = ok ? (unsigned long long)sb.st_dev : 0;
    }
}

bool controller_dir_empty(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    bool empty = true;

    while (d != NULL && empty && (e = readdir(d)) != NULL) {
        empty = strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0;
    }
    if (d != NULL) {
        closedir(d);
    }
    return empty;
}

/* The link to the prelaunch of NS/NAME in C's list (its target NULL when there is none). */
static struct controller_launch **find_pre(struct controller *c, const char *ns, const char *name)
{
    struct controller_launch **pp = &c->prelaunches;

    while (*pp != NULL && (strcmp((*pp)->ns, ns) != 0 || strcmp((*pp)->name, name) != 0)) {
        pp = &(*pp)->next;
    }
    return pp;
}

/* Whether R may be prelaunched now (C->lock held); its mirror's path in *MIRROR_OUT. */
static bool wanted(char **mirror_out, struct controller *c, const struct reconcile *r,
                   const struct controller_paths *p)
{
    struct sandbox_status st;
    struct stat sb;

    *mirror_out = NULL;
    if (c->sandboxes == NULL || c->problem != NULL || strcmp(c->provider, "local") != 0 ||
        r->action != CONTROLLER_PROVISION || r->url == NULL || r->started) {
        return false;
    }
    if (*find_pre(c, r->ns, r->name) != NULL) {
        return false;
    }
    sandbox_status(&st, c->sandboxes, r->ns, r->name);
    if (st.state != SANDBOX_ABSENT || controller_has_checkpoint(c, r->ns, r->name) ||
        !controller_dir_empty(p->workspace)) {
        return false;
    }
    *mirror_out = controller_mirror_path(c->data_dir, r->url);
    return stat(*mirror_out, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* The directories a sandbox binds, made and given to the sandbox user as prepare() does
 * (it does so again; the token file is written there). */
static int make_dirs(struct controller *c, const struct controller_paths *p, struct err *err)
{
    int rc = E_OK;

    if (sandbox_mkdirs(p->workspace, true) != 0 || sandbox_mkdirs(p->state, true) != 0 ||
        sandbox_mkdirs(p->token_dir, true) != 0) {
        return err_set(err, E_FAIL, "create the task's directories: %s", strerror(errno));
    }
    rc = controller_staging(p->staging, p->log, err);
    controller_reach(c, p->mirror); /* a mirror cloned for this task was not reached yet */
    const char *give[] = {p->workspace, p->state, p->staging, p->token_dir};
    for (size_t i = 0; i < ARRAY_LEN(give) && rc == E_OK; i++) {
        rc = controller_give(c, give[i], err);
    }
    return rc;
}

int controller_launch_sockets(struct controller *c, struct controller_launch *l,
                              const struct reconcile *r, struct err *err)
{
    int rc = controller_egress_open(&l->s.egress, c, r, l->p.log, l->env, &l->n, err);

    if (rc == E_OK && strcmp(c->provider, "agent-sandbox") != 0) {
        rc = controller_meter_open(&l->s.meter, c, l->p.log, l->env, &l->n, err);
    }
    return rc;
}

/* Opens L's egress proxy and meter socket and spawns its sandbox with the read end of
 * a new gate; L->gate is the write end. */
static int spawn_gated(struct controller *c, struct controller_launch *l, const struct reconcile *r,
                       struct err *err)
{
    int gate[2], rc;

    if (pipe2(gate, O_CLOEXEC) != 0) {
        return err_set(err, E_FAIL, "start gate: %s", strerror(errno));
    }
    l->gate = gate[1];
    l->env[l->n++] = xasprintf("DIVERGE_START_GATE_FD=%d", gate[0]);
    l->env[l->n] = NULL;
    rc = controller_launch_sockets(c, l, r, err);
    if (rc == E_OK) {
        controller_launch_spec(l, c, r);
        l->s.gate_fd = gate[0];
        rc = sandbox_start(c->sandboxes, &l->s, err); /* takes s.egress and s.meter over */
        l->s.egress = NULL;
        l->s.meter = NULL;
    }
    close(gate[0]);
    /* Nothing of R (freed after this pass) is read from the spec again. */
    l->s.ns = l->s.name = l->s.token = NULL;
    return rc;
}

void controller_prelaunch(struct controller *c, const struct reconcile *r)
{
    struct controller_launch *l = controller_launch_new(CONTROLLER_START_FRESH);
    struct err err = {0};
    char *mirror = NULL;
    int rc;

    controller_paths_of(&l->p, c, r->ns, r->name);
    if (!wanted(&mirror, c, r, &l->p)) {
        free(mirror);
        controller_launch_free(l);
        return;
    }
    l->p.mirror = mirror;
    l->ns = xstrdup(r->ns);
    l->name = xstrdup(r->name);
    l->iteration = r->iteration > 0 ? r->iteration : 1;
    if (controller_slot_claim(c, l, r)) {
        dir_ids(l->ids, &l->p);
        l->next = c->prelaunches;
        c->prelaunches = l;
        return;
    }
    rc = make_dirs(c, &l->p, &err);
    if (rc == E_OK) {
        l->n = l->n_base = controller_build_env(l->env, c, r, &l->p, l->iteration);
        dir_ids(l->ids, &l->p);
        rc = spawn_gated(c, l, r, &err);
    }
    if (rc != E_OK) {
        log_kv(LOG_DEBUG, "prelaunch_skipped", "namespace", r->ns, "task", r->name, "error",
               err.msg, NULL);
        controller_prelaunch_discard(c, l);
        return;
    }
    sandbox_log_event(
        l->p.log, "[diverge] sandbox %s: its runner waits until the workspace is made",
        r->mirror_done ? "started ahead of the workspace" : "started while the mirror is fetched");
    l->next = c->prelaunches;
    c->prelaunches = l;
}

void controller_prelaunch_discard(struct controller *c, struct controller_launch *pre)
{
    if (pre == NULL) {
        return;
    }
    if (pre->ns != NULL && c->sandboxes != NULL) {
        sandbox_stop(c->sandboxes, pre->ns, pre->name);
    }
    controller_launch_free(pre); /* closes the gate */
}

struct controller_launch *controller_prelaunch_take(struct controller *c, const char *ns,
                                                    const char *name)
{
    struct controller_launch **pp = find_pre(c, ns, name), *l = *pp;
    struct sandbox_status st;

    if (l == NULL) {
        return NULL;
    }
    *pp = l->next;
    l->next = NULL;
    sandbox_status(&st, c->sandboxes, ns, name);
    if (st.state != SANDBOX_RUNNING) {
        controller_prelaunch_discard(c, l);
        return NULL;
    }
    return l;
}

bool controller_prelaunch_fits(const struct controller_launch *pre,
                               const struct controller_launch *l)
{
    unsigned long long ids[CONTROLLER_PRELAUNCH_DIRS][2];

    if (pre->n_base != l->n || l->mode != CONTROLLER_START_FRESH) {
        return false;
    }
    for (size_t i = 0; i < l->n; i++) {
        if (strcmp(pre->env[i], l->env[i]) != 0) {
            return false;
        }
    }
    dir_ids(ids, &l->p);
    return memcmp(ids, pre->ids, sizeof(ids)) == 0;
}

void controller_prelaunch_drop(struct controller *c, const char *ns, const char *name)
{
    struct controller_launch *l = controller_prelaunch_take(c, ns, name);
    char *ws = l != NULL ? xstrdup(l->p.workspace) : NULL;

    controller_prelaunch_discard(c, l);
    if (ws != NULL) {
        /* The empty workspace it made would read as one a sandbox ran in (a task paused
         * before its first start would resume rather than be provisioned). */
        (void)rmdir(ws);
        free(ws);
    }
}

void controller_prelaunch_drop_all(struct controller *c)
{
    while (c->prelaunches != NULL) {
        struct controller_launch *l = c->prelaunches;

        c->prelaunches = l->next;
        controller_prelaunch_discard(c, l);
    }
}

/* Writes the gate's byte B; whether it went through. */
static bool gate_say(const struct controller_launch *l, char b)
{
    ssize_t n;

    do {
        n = write(l->gate, &b, 1);
    } while (n < 0 && errno == EINTR);
    return n == 1;
}

void controller_gate_ready(struct controller_launch *l)
{
    (void)gate_say(l, 'c'); /* a runner that is gone shows at the "g" (controller_gate_open) */
}

int controller_gate_open(struct controller_launch *l, struct err *err)
{
    bool ok = gate_say(l, 'g');

    close(l->gate);
    l->gate = -1;
    return ok ? E_OK : err_set(err, E_FAIL, "the sandbox exited before its start");
}
