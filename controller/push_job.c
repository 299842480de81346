/* SPDX-License-Identifier: Apache-2.0 */
/* The pushes to the remote run outside the reconcile lock and off the controller's
 * threads, as the mirror fetch does (mirror_job.c): a slow or hanging remote must not hold
 * up the start, pause, resume or deletion of every other task. The reconcile that plans a
 * pushing action (a runner exit 0: the working branch; a run that ended without a passing
 * verify: its checkpoint) does what comes before the push under the lock
 * (controller_push_begin), starts the job and plans NOTHING; the task stays as it is
 * (Active, or Paused for a checkpoint) and its reconciles plan NOTHING while the job runs
 * (a pause then waits for the push: the runner exited 0 already, the task completes). The
 * job queues the task for the tick thread when done; that reconcile takes the outcome and
 * applies the action as a push under the lock did (Completed, or Failed with PushFailed or
 * PushTooLarge; the wip annotation), then plans once more for what came meanwhile.
 *
 * A deleted task's push is cancelled: its git and git's helpers are killed (a process
 * group of their own), the result dropped. A server that stops kills every push and waits
 * for the jobs; its next run restarts the task as after any restart (the push is done
 * again once its runner exits 0 again). One push per task at a time. */
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "controller/controller_int.h"

struct controller_push_job {
    struct controller *c;
    char *ns, *name, *log; /* owned */
    struct reconcile r;    /* the job's: ns and name point above; url, base, working owned */
    enum task_phase phase; /* the phase the push was planned on */
    struct controller_git_bound bound;
    pthread_t thread;
    bool done;  /* guarded by c->notes_lock; R's outcome is the thread's until then */
    bool stale; /* the task was deleted while it ran: nobody takes the result */
    struct controller_push_job *next;
};

/* Frees J (its thread joined, or never started). */
static void job_release(struct controller_push_job *j)
{
    controller_git_bound_cleanup(&j->bound);
    free(j->r.url);
    free(j->r.base);
    free(j->r.working);
    free(j->r.fail_msg);
    free(j->r.last_failure);
    free(j->ns);
    free(j->name);
    free(j->log);
    free(j);
}

/* Joins J's thread and frees it. */
static void job_free(struct controller_push_job *j)
{
    pthread_join(j->thread, NULL);
    job_release(j);
}

/* Frees the jobs of the list J. */
static void jobs_free(struct controller_push_job *j)
{
    while (j != NULL) {
        struct controller_push_job *next = j->next;
        job_free(j); /* waits for its git to die */
        j = next;
    }
}

/* The finished jobs of deleted tasks taken out of C's list (notes_lock held). */
static struct controller_push_job *reap_forgotten(struct controller *c)
{
    struct controller_push_job **pp = &c->push_forgotten, *done = NULL;

    while (*pp != NULL) {
        struct controller_push_job *j = *pp;
        if (j->done) {
            *pp = j->next;
            j->next = done;
            done = j;
        } else {
            pp = &j->next;
        }
    }
    return done;
}

static void *job_main(void *arg)
{
    struct controller_push_job *j = arg;
    struct controller *c = j->c;
    bool stale;

    controller_push_run(c, &j->r, j->log);
    pthread_mutex_lock(&c->notes_lock);
    j->done = true;
    stale = j->stale;
    pthread_mutex_unlock(&c->notes_lock);
    if (!stale) {
        controller_on_exit(j->ns, j->name, c); /* reconcile the task again */
    }
    return NULL;
}

/* The job of NS/NAME in C's list (notes_lock held), or NULL; *PP_OUT: its link. */
static struct controller_push_job *find(struct controller *c, const char *ns, const char *name,
                                        struct controller_push_job ***pp_out)
{
    struct controller_push_job **pp;

    for (pp = &c->push_jobs; *pp != NULL; pp = &(*pp)->next) {
        if (strcmp((*pp)->ns, ns) == 0 && strcmp((*pp)->name, name) == 0) {
            *pp_out = pp;
            return *pp;
        }
    }
    return NULL;
}

/* A job for R's push (a copy of what the push reads of R); not started. */
static struct controller_push_job *job_new(struct controller *c, const struct reconcile *r)
{
    struct controller_push_job *j = xcalloc(1, sizeof(*j));

    j->c = c;
    j->ns = xstrdup(r->ns);
    j->name = xstrdup(r->name);
    j->log = sandbox_log_path(c->data_dir, r->ns, r->name);
    j->phase = r->phase;
    j->r.c = c;
    j->r.ns = j->ns;
    j->r.name = j->name;
    j->r.action = r->action;
    j->r.phase = r->phase;
    j->r.exit_code = r->exit_code;
    j->r.url = r->url != NULL ? xstrdup(r->url) : NULL;
    j->r.base = r->base != NULL ? xstrdup(r->base) : NULL;
    j->r.working = r->working != NULL ? xstrdup(r->working) : NULL;
    j->r.push_refusal = r->push_refusal;
    controller_git_bound_init(&j->bound, CONTROLLER_PUSH_LIMIT_MS);
    j->r.git_bound = &j->bound;
    return j;
}

/* Starts R's push in a job (C->lock held), what comes before it done now; returns
 * whether R waits for it. Without a thread the push runs now, under the lock (R->pushed);
 * a server that stops pushes nothing (the task starts again with the next one). */
static bool start(struct controller *c, struct reconcile *r)
{
    struct controller_push_job *j;
    bool ok;

    if (atomic_load(&c->stopping)) {
        return true;
    }
    j = job_new(c, r);
    controller_push_begin(c, r, j->log);
    pthread_mutex_lock(&c->notes_lock);
    ok = pthread_create(&j->thread, NULL, job_main, j) == 0;
    if (ok) {
        j->next = c->push_jobs;
        c->push_jobs = j;
    }
    pthread_mutex_unlock(&c->notes_lock);
    if (!ok) {
        controller_push_run(c, r, j->log);
        r->pushed = true;
        job_release(j);
    }
    return ok;
}

/* Moves the outcome of J (done) into R, which applies J's action. */
static void take(struct reconcile *r, struct controller_push_job *j)
{
    r->action = j->r.action;
    r->exit_code = j->r.exit_code;
    r->pushed = true;
    r->fail_reason = j->r.fail_reason;
    free(r->fail_msg);
    r->fail_msg = j->r.fail_msg;
    j->r.fail_msg = NULL;
    r->wip_pushed = j->r.wip_pushed;
    free(r->last_failure);
    r->last_failure = j->r.last_failure;
    j->r.last_failure = NULL;
}

bool controller_push_async(struct controller *c, struct reconcile *r)
{
    struct controller_push_job **pp = NULL, *j, *done = NULL, *gone;
    bool waits = false;

    if (c->sandboxes == NULL || !c->mirror_async) {
        return false; /* no tick thread to pick the task up again: pushed under the lock */
    }
    pthread_mutex_lock(&c->notes_lock);
    gone = reap_forgotten(c);
    j = find(c, r->ns, r->name, &pp);
    if (j != NULL && j->done) {
        *pp = j->next; /* taken out: joined and freed below, outside the lock */
        done = j;
    } else if (j != NULL) {
        waits = true;
    }
    pthread_mutex_unlock(&c->notes_lock);
    jobs_free(gone);
    if (done != NULL) {
        if (!done->stale && done->phase == r->phase) {
            take(r, done);
            controller_on_exit(r->ns, r->name, c); /* what came while it pushed */
        }
        /* Else the task moved on meanwhile: planned as it is now. */
        job_free(done);
        return false;
    }
    if (!waits && controller_pushes(c, r)) {
        waits = start(c, r);
    }
    if (waits) {
        r->action = CONTROLLER_NOTHING;
    }
    return waits;
}

void controller_push_forget(struct controller *c, const char *ns, const char *name)
{
    struct controller_push_job **pp = NULL, *j, *gone;

    pthread_mutex_lock(&c->notes_lock);
    j = find(c, ns, name, &pp);
    if (j != NULL) {
        *pp = j->next;
        j->stale = true;
        controller_git_cancel(&j->bound, "the task was deleted");
        j->next = c->push_forgotten; /* joined once done (here, or controller_push_async) */
        c->push_forgotten = j;
    }
    gone = reap_forgotten(c);
    pthread_mutex_unlock(&c->notes_lock);
    jobs_free(gone);
}

void controller_push_jobs_stop(struct controller *c)
{
    struct controller_push_job *j, *gone;

    pthread_mutex_lock(&c->lock); /* no reconcile starts one past this */
    pthread_mutex_lock(&c->notes_lock);
    j = c->push_jobs;
    gone = c->push_forgotten;
    c->push_jobs = NULL;
    c->push_forgotten = NULL;
    for (struct controller_push_job *k = j; k != NULL; k = k->next) {
        k->stale = true;
        controller_git_cancel(&k->bound, "the server is stopping (the task starts again with "
                                         "the next server)");
    }
    pthread_mutex_unlock(&c->notes_lock);
    pthread_mutex_unlock(&c->lock);
    jobs_free(j);
    jobs_free(gone);
}
