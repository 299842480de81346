/* SPDX-License-Identifier: Apache-2.0 */
/* The runner's early thread. main() starts it first of all to load libcurl (curl_lazy.c)
 * while the runner waits at its gate. A thread created while the loader maps libcurl and
 * its libraries waits for the whole load: pthread_create allocates the new thread's TLS
 * under the dynamic loader's lock. So the start's first heartbeat, which runs beside the
 * checkout, is handed to this thread (runner_early_then) rather than to a new one: the
 * checkout starts at once, and the heartbeat follows the load on the thread that made it.
 * Without an early thread (the unit tests) the caller starts a thread of its own. */
#include <pthread.h>
#include <stdbool.h>

#include "runner/runner.h"

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cond = PTHREAD_COND_INITIALIZER;
static pthread_t g_thread;
static bool g_running;        /* the thread was started and not joined yet */
static bool g_stopping;       /* runner_early_stop: no job comes any more */
static void (*g_first)(void); /* its first job */
static void (*g_job)(void *); /* the job handed to it, NULL when none (yet) */
static void *g_job_arg;
static bool g_job_done; /* g_job returned */

static void *early_main(void *arg)
{
    void (*job)(void *) = NULL;
    void *job_arg = NULL;

    (void)arg;
    g_first();
    pthread_mutex_lock(&g_lock);
    while (g_job == NULL && !g_stopping) {
        pthread_cond_wait(&g_cond, &g_lock);
    }
    job = g_job;
    job_arg = g_job_arg;
    pthread_mutex_unlock(&g_lock);
    if (job != NULL) {
        job(job_arg);
    }
    pthread_mutex_lock(&g_lock);
    g_job_done = true;
    pthread_cond_broadcast(&g_cond);
    pthread_mutex_unlock(&g_lock);
    return NULL;
}

void runner_early_start(void (*first)(void))
{
    g_first = first;
    g_running = pthread_create(&g_thread, NULL, early_main, NULL) == 0;
}

bool runner_early_then(void (*job)(void *), void *arg)
{
    bool taken = false;

    pthread_mutex_lock(&g_lock);
    if (g_running && !g_stopping && g_job == NULL) {
        g_job = job;
        g_job_arg = arg;
        taken = true;
        pthread_cond_broadcast(&g_cond);
    }
    pthread_mutex_unlock(&g_lock);
    return taken;
}

void runner_early_wait(void)
{
    pthread_mutex_lock(&g_lock);
    while (!g_job_done) {
        pthread_cond_wait(&g_cond, &g_lock);
    }
    pthread_mutex_unlock(&g_lock);
}

void runner_early_stop(void)
{
    if (!g_running) {
        return;
    }
    pthread_mutex_lock(&g_lock);
    g_stopping = true;
    pthread_cond_broadcast(&g_cond);
    pthread_mutex_unlock(&g_lock);
    pthread_join(g_thread, NULL);
    g_running = false;
}
