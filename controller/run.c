/* SPDX-License-Identifier: Apache-2.0 */
/* The tick thread that reconciles the tasks notes.c queued (runner exits) and those whose
 * time is up (and checkpoints the counted time of running tasks), and the sandbox
 * provider, made with notes.c's controller_on_exit as its exit callback. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "controller/controller_int.h"

/* --- the tick thread ---------------------------------------------------------------- */

static void reconcile_note(struct controller *c, struct controller_note *n)
{
    struct err err = {0};

    if (controller_reconcile(c, n->ns, n->name, &err) != E_OK && err.code != E_NOTFOUND) {
        log_kv(LOG_WARN, "reconcile_error", "namespace", n->ns, "task", n->name, "error", err.msg,
               NULL);
    }
}

/* When the tick's queue passes run: the periodic one, and the spacing after the last. */
struct pass_clock {
    int64_t next_pass;  /* the next periodic pass while a task waits */
    int64_t pass_after; /* no pass before (CONTROLLER_QUEUE_SPACING) */
};

/* A runner exit may have freed a slot, a SpendQuota changed (poked), or a task waits and
 * a cap may have moved without a task event (every period). One pass serves every event
 * before it; after a pass of D ms the next one waits until CONTROLLER_QUEUE_SPACING D ms
 * have passed, so that passes over a long queue (every task event pokes one) take at most
 * a share of one core. */
static void queue_tick(struct controller *c, struct pass_clock *pc, bool had_notes)
{
    int64_t now = clock_now_ms(clock_system());

    if (had_notes || (now >= pc->next_pass && controller_queue_waiting(c))) {
        atomic_store(&c->queue_poked, true);
    }
    if (now >= pc->pass_after && atomic_exchange(&c->queue_poked, false)) {
        int64_t took_ms = controller_queue_pass(c) / 1000000;
        now = clock_now_ms(clock_system());
        pc->pass_after = now + took_ms * CONTROLLER_QUEUE_SPACING;
        pc->next_pass = now + CONTROLLER_QUEUE_PERIOD_MS;
    }
}

/* Waits (C->notes_lock held) for a note or a poke, at most a second, and while a pass is
 * asked for but spaced, until it may run. */
static void tick_wait(struct controller *c, const struct pass_clock *pc)
{
    int64_t now = clock_now_ms(clock_system());
    bool poked = atomic_load(&c->queue_poked);
    int64_t wait_ms = poked ? pc->pass_after - now : 1000;
    struct timespec ts;

    if (c->notes != NULL || atomic_load(&c->stopping) || (poked && wait_ms <= 0)) {
        return;
    }
    wait_ms = wait_ms > 1000 ? 1000 : wait_ms;
    clock_deadline_in(&ts, CLOCK_REALTIME, wait_ms);
    pthread_cond_timedwait(&c->notes_cond, &c->notes_lock, &ts);
}

static void *tick(void *arg)
{
    struct controller *c = arg;
    struct pass_clock pc = {0};
    int64_t next_checkpoint = 0;

    pthread_mutex_lock(&c->notes_lock);
    while (!atomic_load(&c->stopping)) {
        struct controller_note *todo = c->notes, *n;
        int64_t now = clock_now_ms(clock_system());

        c->notes = NULL;
        /* Tasks with a timer run a sandbox: the checkpoint keeps the time the server is
         * down (killed) out of their counted time. */
        if (now >= next_checkpoint) {
            for (struct controller_timer *t = c->timers; t != NULL; t = t->next) {
                controller_note_seen(c, t->ns, t->name, now);
            }
            next_checkpoint = now + CONTROLLER_CHECKPOINT_MS;
        }
        /* Timed-out tasks are reconciled every tick until the reconcile disarms them. */
        for (struct controller_timer *t = c->timers; t != NULL; t = t->next) {
            if (t->deadline_ms <= now) {
                n = xcalloc(1, sizeof(*n));
                n->ns = xstrdup(t->ns);
                n->name = xstrdup(t->name);
                n->next = todo;
                todo = n;
            }
        }
        pthread_mutex_unlock(&c->notes_lock);
        bool had_notes = todo != NULL;
        controller_runs_tick(c, now);
        controller_slots_tick(c, now);
        while (todo != NULL) {
            n = todo;
            todo = n->next;
            if (!atomic_load(&c->stopping)) {
                reconcile_note(c, n);
            }
            free(n->ns);
            free(n->name);
            free(n);
        }
        queue_tick(c, &pc, had_notes);
        pthread_mutex_lock(&c->notes_lock);
        tick_wait(c, &pc);
    }
    pthread_mutex_unlock(&c->notes_lock);
    return NULL;
}

int controller_tick_start(struct controller *c, struct err *err)
{
    if (pthread_create(&c->tick, NULL, tick, c) != 0) {
        return err_set(err, E_FAIL, "cannot start the sandbox tick thread");
    }
    c->tick_running = true;
    c->mirror_async = true;
    return E_OK;
}

void controller_tick_stop(struct controller *c)
{
    struct controller_note *n;

    atomic_store(&c->stopping, true);
    pthread_mutex_lock(&c->notes_lock);
    pthread_cond_broadcast(&c->notes_cond);
    pthread_mutex_unlock(&c->notes_lock);
    if (c->tick_running) {
        pthread_join(c->tick, NULL);
        c->tick_running = false;
    }
    /* Under the lock: a mirror fetch still running (controller_free stops those later)
     * may queue a note meanwhile (controller_on_exit). */
    pthread_mutex_lock(&c->notes_lock);
    while ((n = c->notes) != NULL) {
        c->notes = n->next;
        free(n->ns);
        free(n->name);
        free(n);
    }
    while (c->timers != NULL) {
        struct controller_timer *t = c->timers;
        c->timers = t->next;
        free(t->ns);
        free(t->name);
        free(t->meter_id);
        free(t);
    }
    pthread_mutex_unlock(&c->notes_lock);
}

/* --- provider ---------------------------------------------------------------------- */

static char *default_runner_path(void)
{
    const char *env = getenv("DIVERGE_RUNNER_PATH");
    char exe[4096];
    ssize_t n;

    if (env != NULL && env[0] != '\0') {
        return xstrdup(env);
    }
    n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0) {
        return xstrdup("diverge-agent-runner");
    }
    exe[n] = '\0';
    return xasprintf("%s/diverge-agent-runner", dirname(exe));
}

/* Creates C's provider (none for "none", or agent-sandbox without a cluster). */
static int open_provider(struct controller *c, const struct controller_config *cfg,
                         const char *state, struct err *err)
{
    if (strcmp(c->provider, "process") == 0) {
        struct sandbox_process_opts o = {
            .state_dir = state, .on_exit = controller_on_exit, .on_exit_userdata = c};
        return sandbox_process_new(&c->sandboxes, &o, err);
    }
    if (strcmp(c->provider, "local") == 0) {
        struct sandbox_local_opts o = {.user = cfg->sandbox_user,
                                       .tools = cfg->sandbox_tools,
                                       .memory_bytes = cfg->sandbox_memory,
                                       .pids = cfg->sandbox_pids,
                                       .cpus_milli = cfg->sandbox_cpus_milli,
                                       .state_dir = state,
                                       .on_exit = controller_on_exit,
                                       .on_exit_userdata = c};
        return sandbox_local_new(&c->sandboxes, &o, err);
    }
    if (strcmp(c->provider, "agent-sandbox") == 0 && cfg->kube != NULL) {
        struct sandbox_agent_opts o = {.kube = cfg->kube,
                                       .warm_pool = cfg->sandbox_warm_pool,
                                       .poll_ms = cfg->sandbox_poll_ms,
                                       .data_dir = c->data_dir,
                                       .on_exit = controller_on_exit,
                                       .on_exit_userdata = c};
        return sandbox_agent_new(&c->sandboxes, &o, err);
    }
    if (strcmp(c->provider, "agent-sandbox") == 0) {
        c->problem = xstrdup("no Kubernetes configuration (--kubeconfig, KUBECONFIG, the "
                             "in-cluster service account or ~/.kube/config)");
        fprintf(stderr, "diverge: serve: agent-sandbox: %s; tasks wait\n", c->problem);
    }
    return E_OK;
}

int controller_sandboxes_open(struct controller *c, const struct controller_config *cfg,
                              struct err *err)
{
    char *state;
    int rc = controller_egress_init(c, cfg, err);

    if (rc != E_OK) {
        return rc;
    }
    controller_meter_sweep(c);
    state = xasprintf("%s/run", c->data_dir);
    c->runner_path = cfg->runner_path != NULL ? xstrdup(cfg->runner_path) : default_runner_path();
    rc = open_provider(c, cfg, state, err);
    free(state);
    if (rc != E_OK || c->sandboxes == NULL) {
        return rc;
    }
    c->problem = sandbox_probe(c->sandboxes);
    /* agent-sandbox: the runner is the sandbox image's. */
    if (c->problem == NULL && strcmp(c->provider, "agent-sandbox") != 0 &&
        access(c->runner_path, X_OK) != 0) {
        c->problem = xasprintf("the runner %s cannot be executed (%s); build it next to "
                               "diverge or set DIVERGE_RUNNER_PATH",
                               c->runner_path, strerror(errno));
    }
    c->chown_files = sandbox_owner(c->sandboxes, &c->sandbox_uid, &c->sandbox_gid);
    if (c->problem != NULL) {
        log_kv(LOG_ERROR, "sandbox_unavailable", "provider", c->provider, "reason", c->problem,
               NULL);
        fprintf(stderr, "diverge: serve: sandboxes cannot run: %s\n", c->problem);
    }
    return E_OK;
}
