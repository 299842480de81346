/* SPDX-License-Identifier: Apache-2.0 */
/* `diverge serve --store kubernetes` (SPEC §11, docs/cluster-mode.md): the Kubernetes store
 * and Lease leader election. Every replica serves the API, webhooks (their inbox entries are
 * in the API server before the 202) and the meter; only the leader runs the controller and
 * the bot, outbox and notifier workers. One thread starts and stops them as leadership
 * changes (the elector's callback only records what it wants), so a start and a stop never
 * overlap; SIGTERM stops them, then releases the Lease so another replica takes over.
 * With --leader-elect=false a replica never takes part: it serves only. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bot/bot.h"
#include "common/log.h"
#include "controller/controller.h"
#include "kube/kube.h"
#include "scm/scm.h"
#include "server/serve_int.h"

struct serve_kube {
    struct kube_client *lease_client; /* owned: the elector's (the store owns its own) */
    struct kube_lease *lease;         /* owned */
    char *ns;                         /* namespace of the Lease, token index and queues */
    char *identity;                   /* holderIdentity: $POD_NAME, else hostname-pid */
    pthread_t thread;                 /* starts/stops the leader's workers */
    bool thread_started;
    pthread_mutex_t mu;  /* guards want, quit */
    pthread_cond_t cond; /* want or quit changed */
    bool want;           /* the elector says we lead */
    bool quit;           /* serve is stopping */
    /* the leader's workers: touched by the thread only (and by stop after joining it) */
    bool running;
    struct controller *controller;
    struct scm_outbox *outbox;
    struct bot *bot;
    struct scm_notifier *notifier;
    struct serve_kube_workers workers; /* how the leader makes them (serve.c's) */
};

static int load_client(struct kube_client **out, struct server *srv, struct err *err)
{
    struct kube_config *cfg = NULL;
    int rc = kube_config_load(&cfg, srv->cfg.kubeconfig, err);

    return rc == E_OK ? kube_client_new(out, cfg, err) : rc;
}

int serve_kube_open_store(struct server *srv, const struct serve_kube_workers *w, struct err *err)
{
    struct serve_kube *k = xcalloc(1, sizeof(*k));
    struct kube_client *c = NULL;
    const char *ns;
    int rc;

    k->workers = *w;
    if (pthread_mutex_init(&k->mu, NULL) != 0 || pthread_cond_init(&k->cond, NULL) != 0) {
        abort();
    }
    srv->kube = k;
    rc = load_client(&c, srv, err);
    if (rc == E_OK) {
        rc = load_client(&k->lease_client, srv, err);
    }
    if (rc != E_OK) {
        kube_client_free(c);
        return rc;
    }
    ns = srv->cfg.kube_namespace != NULL ? srv->cfg.kube_namespace
                                         : kube_config_namespace(kube_client_config(c));
    if (!task_name_valid(ns)) {
        kube_client_free(c);
        return err_set(err, E_INVALID, "--kube-namespace is not a dns label");
    }
    k->ns = xstrdup(ns);
    rc = task_store_kube_open(&srv->store, c, k->ns, clock_system(), err);
    if (rc == E_OK) {
        log_kv(LOG_INFO, "kube_store_opened", "server",
               kube_config_server(kube_client_config(k->lease_client)), "namespace", k->ns, NULL);
    }
    return rc;
}

const char *serve_kube_namespace(const struct server *srv)
{
    return srv->kube->ns;
}

static void stop_workers(struct serve_kube *k)
{
    scm_notifier_free(k->notifier);
    k->notifier = NULL;
    bot_free(k->bot);
    k->bot = NULL;
    scm_outbox_free(k->outbox);
    k->outbox = NULL;
    controller_free(k->controller);
    k->controller = NULL;
    k->running = false;
}

static int start_workers(struct serve_kube *k, struct server *srv, struct err *err)
{
    char *meter = xasprintf("%s/api/v1/agenttask/meter", srv->base_url);
    int rc = k->workers.controller_make(&k->controller, srv, err);

    if (rc == E_OK) {
        rc = k->workers.egress_own(srv, k->controller, err);
    }
    if (rc == E_OK) {
        rc = controller_start(k->controller, meter, srv->meter_socket, err);
    }
    if (rc == E_OK) {
        rc = k->workers.scm_start(srv, &k->outbox, &k->bot, &k->notifier, err);
    }
    free(meter);
    k->running = true;
    if (rc != E_OK) {
        stop_workers(k);
    }
    return rc;
}

/* Sleeps MS or until serve stops. */
static void pause_unless_quit(struct serve_kube *k, int64_t ms)
{
    struct timespec ts;

    clock_deadline_in(&ts, CLOCK_REALTIME, ms);
    pthread_mutex_lock(&k->mu);
    while (!k->quit) {
        if (pthread_cond_timedwait(&k->cond, &k->mu, &ts) != 0) {
            break;
        }
    }
    pthread_mutex_unlock(&k->mu);
}

static void *leader_loop(void *arg)
{
    struct server *srv = arg;
    struct serve_kube *k = srv->kube;

    pthread_mutex_lock(&k->mu);
    while (!k->quit) {
        bool want = k->want;
        if (want == k->running) {
            pthread_cond_wait(&k->cond, &k->mu);
            continue;
        }
        pthread_mutex_unlock(&k->mu);
        if (want) {
            struct err err = {0};
            log_kv(LOG_INFO, "leader_elected", "identity", k->identity, NULL);
            if (start_workers(k, srv, &err) != E_OK) {
                log_kv(LOG_ERROR, "leader_workers_failed", "error", err.msg, NULL);
                pause_unless_quit(k, 1000); /* then try again while we still lead */
            }
        } else {
            /* Logged once the workers are stopped: from this line on, this replica
             * reconciles nothing (tests and operators read it that way). */
            stop_workers(k);
            log_kv(LOG_INFO, "leader_lost", "identity", k->identity, NULL);
        }
        pthread_mutex_lock(&k->mu);
    }
    pthread_mutex_unlock(&k->mu);
    if (k->running) {
        stop_workers(k);
    }
    return NULL;
}

/* The elector's callback (its thread): only records the wish; leader_loop acts on it. */
static void on_leader(bool leader, void *userdata)
{
    struct serve_kube *k = userdata;

    pthread_mutex_lock(&k->mu);
    k->want = leader;
    pthread_cond_broadcast(&k->cond);
    pthread_mutex_unlock(&k->mu);
}

/* A test knob in milliseconds (e.g. DIVERGE_LEASE_DURATION_MS), or DEF. */
static int64_t knob_ms(const char *name, int64_t def)
{
    const char *v = getenv(name);
    char *end = NULL;
    long long n;

    if (v == NULL || v[0] == '\0') {
        return def;
    }
    errno = 0;
    n = strtoll(v, &end, 10);
    return errno == 0 && *end == '\0' && n > 0 ? (int64_t)n : def;
}

static char *identity(void)
{
    const char *pod = getenv("POD_NAME");
    char host[256];

    if (pod != NULL && pod[0] != '\0') {
        return xstrdup(pod);
    }
    if (gethostname(host, sizeof(host)) != 0) {
        snprintf(host, sizeof(host), "diverge");
    }
    host[sizeof(host) - 1] = '\0';
    return xasprintf("%s-%ld", host, (long)getpid());
}

int serve_kube_elect_start(struct server *srv, struct err *err)
{
    struct serve_kube *k = srv->kube;
    struct kube_lease_opts o = KUBE_LEASE_OPTS_DEFAULTS;
    int64_t duration_ms = knob_ms("DIVERGE_LEASE_DURATION_MS", 15000);

    k->identity = identity();
    if (srv->cfg.leader_elect != NULL && strcmp(srv->cfg.leader_elect, "false") == 0) {
        /* --leader-elect=false: never touch the Lease, never run the leader's workers
         * (the chart's server Deployment; its service account may not write Leases). */
        log_kv(LOG_INFO, "leader_election_disabled", "identity", k->identity, NULL);
        return E_OK;
    }
    o.ns = k->ns;
    o.name = srv->cfg.lease_name != NULL ? srv->cfg.lease_name : "diverge-leader";
    o.identity = k->identity;
    o.duration_s = (int)((duration_ms + 999) / 1000); /* the Lease counts whole seconds */
    o.renew_deadline_ms = knob_ms("DIVERGE_LEASE_RENEW_DEADLINE_MS", 10000);
    o.retry_ms = knob_ms("DIVERGE_LEASE_RETRY_MS", 2000);
    o.on_change = on_leader;
    o.userdata = k;
    if (pthread_create(&k->thread, NULL, leader_loop, srv) != 0) {
        return err_set(err, E_FAIL, "cannot start the leader thread");
    }
    k->thread_started = true;
    return kube_lease_start(&k->lease, k->lease_client, &o, err);
}

void serve_kube_elect_stop(struct server *srv)
{
    struct serve_kube *k = srv->kube;

    if (k == NULL) {
        return;
    }
    if (k->thread_started) {
        pthread_mutex_lock(&k->mu);
        k->quit = true;
        pthread_cond_broadcast(&k->cond);
        pthread_mutex_unlock(&k->mu);
        pthread_join(k->thread, NULL); /* the workers are stopped when it returns */
        k->thread_started = false;
    }
    /* Only now give the Lease up: nothing of ours runs any more. */
    kube_lease_stop(k->lease, true);
    k->lease = NULL;
    kube_client_free(k->lease_client);
    pthread_cond_destroy(&k->cond);
    pthread_mutex_destroy(&k->mu);
    free(k->ns);
    free(k->identity);
    free(k);
    srv->kube = NULL;
}
