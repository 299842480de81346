/* SPDX-License-Identifier: Apache-2.0 */
/* The repository mirror is fetched outside the reconcile lock and off the controller's
 * threads: a first clone of a large or slow repository must not hold up every other
 * task. A start that needs the mirror (provision, restart, resume with a new runner)
 * finds a finished fetch for its task and uses it, or starts one in its own thread and
 * returns; the fetch queues the task for the tick thread when it is done, whose reconcile
 * plans again and starts the sandbox. One fetch per task at a time (the reconciles in
 * between see it running); fetches of one repository are serialized by the mirror's own
 * lock (controller_mirror), so two tasks on it never run git on it at once.
 *
 * A task's fetch may start as soon as the task exists (controller_mirror_prefetch, from
 * the store's ADDED event, before the first plan and its transactions): always after the
 * request that made it, so its start still gets the head of that moment or later. The
 * mirror's gc (controller_mirror_upkeep) runs in a job of its own after a start, under the
 * mirror's lock, when the mirror's packs call for it: never on a start's way. */
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "controller/controller_int.h"

struct controller_mirror_job {
    struct controller *c;
    char *ns, *name, *url, *log;       /* owned */
    char *base, *working;              /* owned, or NULL: the branches the start needs */
    struct controller_git_bound bound; /* cancelled at shutdown */
    pthread_t thread;
    bool done;     /* guarded by c->notes_lock; the fields below are the thread's until then */
    bool stale;    /* the task was deleted while it ran: nobody takes the result */
    bool prefetch; /* started for a new task, not yet adopted by a plan that starts it */
    bool upkeep;   /* the mirror's gc (ns "", name the URL), not a task's fetch */
    int rc;
    char *dir;       /* owned: the mirror when rc == E_OK */
    const char *how; /* static */
    struct err err;
    struct controller_mirror_job *next;
};

/* Joins J's thread and frees it. */
static void job_free(struct controller_mirror_job *j)
{
    pthread_join(j->thread, NULL);
    controller_git_bound_cleanup(&j->bound);
    free(j->ns);
    free(j->name);
    free(j->url);
    free(j->log);
    free(j->base);
    free(j->working);
    free(j->dir);
    free(j);
}

static bool same(const char *a, const char *b)
{
    return a == NULL ? b == NULL : b != NULL && strcmp(a, b) == 0;
}

/* Whether J fetched what R's start needs: the same repository and branches. */
static bool serves(const struct controller_mirror_job *j, const struct reconcile *r)
{
    return strcmp(j->url, r->url) == 0 && same(j->base, r->base) && same(j->working, r->working);
}

static void *job_main(void *arg)
{
    struct controller_mirror_job *j = arg;
    struct controller *c = j->c;

    if (j->upkeep) {
        if (controller_mirror_upkeep(c, j->url, &j->err) != E_OK) {
            log_kv(LOG_WARN, "mirror_upkeep_failed", "error", j->err.msg, NULL);
        }
        pthread_mutex_lock(&c->notes_lock);
        j->done = true;
        pthread_mutex_unlock(&c->notes_lock);
        return NULL;
    }
    /* The task's base and working branches when both are plain names (the working one
     * may be unset); else every branch, as the runner's own clone may need. */
    const char *branches[] = {j->base, j->working, NULL};
    bool only = j->base != NULL && controller_plain_branch(j->base) &&
                (j->working == NULL || controller_plain_branch(j->working));
    j->rc = controller_mirror_branches(&j->dir, c, j->url, only ? branches : NULL, j->log, &j->how,
                                       &j->bound, &j->err);
    if (j->rc == E_OK) {
        sandbox_log_event(j->log, "[diverge] repository mirror %s", j->how);
    } else if (controller_git_cancelled(&j->bound) != NULL) {
        /* No reconcile reports it: the server stops. */
        sandbox_log_event(j->log, "[diverge] repository mirror: %s", j->err.msg);
    }
    pthread_mutex_lock(&c->notes_lock);
    j->done = true;
    pthread_mutex_unlock(&c->notes_lock);
    controller_on_exit(j->ns, j->name, c); /* reconcile the task again */
    return NULL;
}

/* The job of NS/NAME in C's list (notes_lock held), or NULL; *PP_OUT: its link. */
static struct controller_mirror_job *find(struct controller *c, const char *ns, const char *name,
                                          struct controller_mirror_job ***pp_out)
{
    struct controller_mirror_job **pp;

    for (pp = &c->mirror_jobs; *pp != NULL; pp = &(*pp)->next) {
        if (!(*pp)->upkeep && strcmp((*pp)->ns, ns) == 0 && strcmp((*pp)->name, name) == 0) {
            *pp_out = pp;
            return *pp;
        }
    }
    return NULL;
}

/* Starts the fetch of NS/NAME's mirror of URL, for its branches BASE and WORKING (either
 * may be NULL), with notes_lock held; *OUT: the job. */
static int start_job(struct controller_mirror_job **out, struct controller *c, const char *ns,
                     const char *name, const char *url, const char *base, const char *working,
                     struct err *err)
{
    struct controller_mirror_job *j = xcalloc(1, sizeof(*j));

    j->c = c;
    j->ns = xstrdup(ns);
    j->name = xstrdup(name);
    j->url = xstrdup(url);
    j->base = base != NULL ? xstrdup(base) : NULL;
    j->working = working != NULL ? xstrdup(working) : NULL;
    j->upkeep = ns[0] == '\0';
    j->log = j->upkeep ? NULL : sandbox_log_path(c->data_dir, ns, name);
    controller_git_bound_init(&j->bound, CONTROLLER_PUSH_LIMIT_MS);
    if (pthread_create(&j->thread, NULL, job_main, j) != 0) {
        controller_git_bound_cleanup(&j->bound);
        free(j->ns);
        free(j->name);
        free(j->url);
        free(j->log);
        free(j->base);
        free(j->working);
        free(j);
        return err_set(err, E_FAIL, "cannot start the mirror fetch thread");
    }
    j->next = c->mirror_jobs;
    c->mirror_jobs = j;
    *out = j;
    return E_OK;
}

/* Moves J's outcome into R. */
static void take(struct reconcile *r, struct controller_mirror_job *j)
{
    r->mirror_done = true;
    r->mirror_rc = j->rc;
    r->mirror = j->dir;
    j->dir = NULL;
    r->mirror_err = j->err;
}

bool controller_mirror_async(const struct controller *c, const struct reconcile *r)
{
    return c->sandboxes != NULL && c->mirror_async && r->url != NULL &&
           (r->action == CONTROLLER_PROVISION || r->action == CONTROLLER_RESTART ||
            r->action == CONTROLLER_RESUME_START);
}

int controller_mirror_ready(struct controller *c, struct reconcile *r, struct err *err)
{
    struct controller_mirror_job **pp = NULL, *j, *done = NULL;
    int rc = E_AGAIN;

    pthread_mutex_lock(&c->notes_lock);
    j = find(c, r->ns, r->name, &pp);
    if (j != NULL && j->done) {
        *pp = j->next; /* taken out: joined and freed below, outside the lock */
        done = j;
        j = NULL;
    }
    if (j == NULL && (done == NULL || done->stale || !serves(done, r))) {
        /* none, or one for another URL or branches, or a dropped or deleted task */
        rc = start_job(&j, c, r->ns, r->name, r->url, r->base, r->working, err);
        rc = rc == E_OK ? E_AGAIN : rc;
    } else if (j == NULL) {
        rc = E_OK;
    } else {
        j->prefetch = false; /* a prefetch this start adopts; one for another URL or
                                branches is taken when done, seen to differ and fetched
                                again */
    }
    pthread_mutex_unlock(&c->notes_lock);
    if (done != NULL) {
        if (rc == E_OK) {
            take(r, done);
        }
        job_free(done);
    }
    return rc;
}

void controller_mirror_forget(struct controller *c, const char *ns, const char *name)
{
    struct controller_mirror_job **pp = NULL, *j;

    pthread_mutex_lock(&c->notes_lock);
    j = find(c, ns, name, &pp);
    if (j != NULL) {
        j->stale = true;
    }
    pthread_mutex_unlock(&c->notes_lock);
}

void controller_mirror_prefetch(struct controller *c, const char *ns, const char *name,
                                const char *url, const char *base, const char *working)
{
    struct controller_mirror_job **pp = NULL, *j;
    struct err err = {0};

    if (c->sandboxes == NULL || !c->mirror_async || url == NULL || ns[0] == '\0' ||
        atomic_load(&c->stopping)) {
        return;
    }
    pthread_mutex_lock(&c->notes_lock);
    if (find(c, ns, name, &pp) == NULL &&
        start_job(&j, c, ns, name, url, base, working, &err) == E_OK) {
        j->prefetch = true;
    }
    pthread_mutex_unlock(&c->notes_lock);
}

void controller_mirror_unwanted(struct controller *c, const char *ns, const char *name)
{
    struct controller_mirror_job **pp = NULL, *j, *done = NULL;

    pthread_mutex_lock(&c->notes_lock);
    j = find(c, ns, name, &pp);
    if (j != NULL && j->prefetch && j->done) {
        *pp = j->next;
        done = j;
    } else if (j != NULL && j->prefetch) {
        j->stale = true; /* still fetching: a later start waits for it and fetches again */
    }
    pthread_mutex_unlock(&c->notes_lock);
    if (done != NULL) {
        job_free(done);
    }
}

/* Takes the finished upkeep jobs out of C's list into *DONE; whether one for URL runs. */
static bool reap_upkeep(struct controller *c, const char *url, struct controller_mirror_job **done)
{
    struct controller_mirror_job **pp = &c->mirror_jobs;
    bool running = false;

    while (*pp != NULL) {
        struct controller_mirror_job *j = *pp;
        if (j->upkeep && j->done) {
            *pp = j->next;
            j->next = *done;
            *done = j;
        } else {
            running = running || (j->upkeep && strcmp(j->url, url) == 0);
            pp = &j->next;
        }
    }
    return running;
}

void controller_mirror_upkeep_async(struct controller *c, const struct reconcile *r)
{
    struct controller_mirror_job *done = NULL, *j;
    struct err err = {0};
    char *dir;
    bool wants;

    if (!r->mirror_done || r->mirror_rc != E_OK || r->url == NULL) {
        return;
    }
    dir = controller_mirror_path(c->data_dir, r->url);
    wants = controller_mirror_wants_upkeep(dir); /* a count without the lock: a hint */
    free(dir);
    pthread_mutex_lock(&c->notes_lock);
    if (!reap_upkeep(c, r->url, &done) && wants && !atomic_load(&c->stopping)) {
        (void)start_job(&j, c, "", r->url, r->url, NULL, NULL, &err);
    }
    pthread_mutex_unlock(&c->notes_lock);
    while (done != NULL) {
        struct controller_mirror_job *next = done->next;
        job_free(done);
        done = next;
    }
}

void controller_mirror_jobs_stop(struct controller *c)
{
    struct controller_mirror_job *j;

    pthread_mutex_lock(&c->notes_lock);
    j = c->mirror_jobs;
    c->mirror_jobs = NULL;
    for (struct controller_mirror_job *k = j; k != NULL; k = k->next) {
        /* A remote that hangs must not hold the server's stop: the start is made again
         * by the next server. */
        controller_git_cancel(&k->bound, "the server is stopping");
    }
    pthread_mutex_unlock(&c->notes_lock);
    while (j != NULL) {
        struct controller_mirror_job *next = j->next;
        job_free(j); /* waits for its git */
        j = next;
    }
}
