/* SPDX-License-Identifier: Apache-2.0 */
/* Leader election over a coordination.k8s.io/v1 Lease, as client-go's leaderelection does
 * it: a pure decision (lease + now + identity -> create, renew, acquire or wait), the record
 * to write for it, and a thread that applies it every retry period. Every write is guarded
 * by the resourceVersion read just before, so two electors can never both win one round. */
#include "kube/kube_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"

enum kube_lease_action kube_lease_decide(const json_t *lease, int64_t now_ms, const char *identity)
{
    const json_t *spec;
    const char *holder, *renew;
    json_int_t dur;
    int64_t renew_ms = 0;

    if (lease == NULL) {
        return KUBE_LEASE_CREATE;
    }
    spec = json_object_get(lease, "spec");
    holder = json_string_value(json_object_get(spec, "holderIdentity"));
    if (holder != NULL && strcmp(holder, identity) == 0) {
        return KUBE_LEASE_RENEW;
    }
    if (holder == NULL || *holder == '\0') {
        return KUBE_LEASE_ACQUIRE; /* released */
    }
    renew = json_string_value(json_object_get(spec, "renewTime"));
    dur = json_integer_value(json_object_get(spec, "leaseDurationSeconds"));
    if (renew == NULL || clock_parse_rfc3339(&renew_ms, renew) != E_OK || dur <= 0 ||
        dur > 86400 * 365) {
        return KUBE_LEASE_ACQUIRE; /* nobody can be relying on a lease we cannot read */
    }
    return renew_ms + (int64_t)dur * 1000 < now_ms ? KUBE_LEASE_ACQUIRE : KUBE_LEASE_WAIT;
}

/* metav1.MicroTime: "2006-01-02T15:04:05.000000Z". */
static void micro_time(char out[80], int64_t ms)
{
    time_t secs = (time_t)(ms / 1000);
    struct tm tm;

    gmtime_r(&secs, &tm);
    snprintf(out, 80, "%04d-%02d-%02dT%02d:%02d:%02d.%06dZ", tm.tm_year + 1900, tm.tm_mon + 1,
             tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (int)(ms % 1000) * 1000);
}

static json_t *spec_of(json_t *lease)
{
    json_t *spec = json_object_get(lease, "spec");

    if (!json_is_object(spec)) {
        spec = json_object();
        json_object_set_new(lease, "spec", spec);
    }
    return spec;
}

json_t *kube_lease_build(enum kube_lease_action action, const json_t *lease, const char *ns,
                         const char *name, const char *identity, int64_t now_ms, int duration_s)
{
    char now[80];
    json_t *out, *spec;
    json_int_t transitions = 0;

    micro_time(now, now_ms);
    if (action == KUBE_LEASE_CREATE || lease == NULL) {
        return json_pack("{s:s, s:s, s:{s:s, s:s}, s:{s:s, s:i, s:s, s:s, s:i}}", "apiVersion",
                         "coordination.k8s.io/v1", "kind", "Lease", "metadata", "name", name,
                         "namespace", ns, "spec", "holderIdentity", identity,
                         "leaseDurationSeconds", duration_s, "acquireTime", now, "renewTime", now,
                         "leaseTransitions", 0);
    }
    out = json_deep_copy(lease);
    spec = spec_of(out);
    transitions = json_integer_value(json_object_get(spec, "leaseTransitions"));
    json_object_set_new(spec, "holderIdentity", json_string(identity));
    json_object_set_new(spec, "leaseDurationSeconds", json_integer(duration_s));
    json_object_set_new(spec, "renewTime", json_string(now));
    if (action == KUBE_LEASE_ACQUIRE) {
        json_object_set_new(spec, "acquireTime", json_string(now));
        json_object_set_new(
            spec, "leaseTransitions",
            json_integer(transitions >= 0 && transitions < INT32_MAX ? transitions + 1 : 1));
    }
    return out;
}

json_t *kube_lease_build_release(const json_t *lease, int64_t now_ms)
{
    char now[80];
    json_t *out = json_deep_copy(lease), *spec;

    micro_time(now, now_ms);
    spec = spec_of(out);
    json_object_set_new(spec, "holderIdentity", json_string(""));
    json_object_set_new(spec, "leaseDurationSeconds", json_integer(1));
    json_object_set_new(spec, "renewTime", json_string(now));
    json_object_set_new(spec, "acquireTime", json_string(now));
    return out;
}

/* ---- the elector thread ----------------------------------------------------------- */

struct kube_lease {
    struct kube_client *c;      /* borrowed */
    struct kube_lease_opts o;   /* strings below are owned copies */
    char *ns, *name, *identity; /* owned */
    pthread_t thread;           /* the elector */
    pthread_mutex_t mu;         /* guards the fields below */
    pthread_cond_t cond;        /* signalled by kube_lease_stop */
    bool stop;                  /* kube_lease_stop was called */
    bool leader;                /* we hold the lease */
};

static int64_t now_ms(const struct kube_lease *l)
{
    return clock_now_ms(l->o.clock);
}

static int64_t mono_ms(void)
{
    return clock_mono_ns() / 1000000;
}

/* Milliseconds left of a round that started at START_MS (monotonic) and may take at most
 * LIMIT_MS; at least 1 so a call always gets a (tiny) chance. */
static long left_ms(int64_t start_ms, int64_t limit_ms)
{
    int64_t left = limit_ms - (mono_ms() - start_ms);

    return left > 1 ? (long)left : 1;
}

/* One round: read, decide, write, all within LIMIT_MS (a leader must know it failed to renew
 * before its lease runs out, so no call may hang past the renew deadline). E_OK with
 * *leading_out telling whether we hold the lease now. */
static int try_once(bool *leading_out, struct kube_lease *l, int64_t limit_ms, struct err *err)
{
    int64_t start = mono_ms();
    json_t *cur = NULL, *next = NULL, *written = NULL;
    char *url = NULL, *coll = NULL;
    enum kube_lease_action a;
    int rc;

    *leading_out = false;
    rc = kube_url(&url, l->c, &KUBE_LEASES, l->ns, l->name, NULL, err);
    if (rc == E_OK) {
        rc = kube_url(&coll, l->c, &KUBE_LEASES, l->ns, NULL, NULL, err);
    }
    if (rc == E_OK) {
        rc = kube_call(&cur, l->c, "GET", url, NULL, NULL, left_ms(start, limit_ms), "get lease",
                       err);
    }
    if (rc == E_NOTFOUND) {
        rc = E_OK;
    }
    if (rc != E_OK) {
        goto out;
    }
    a = kube_lease_decide(cur, now_ms(l), l->identity);
    if (a != KUBE_LEASE_WAIT) {
        next = kube_lease_build(a, cur, l->ns, l->name, l->identity, now_ms(l), l->o.duration_s);
        rc = kube_call(&written, l->c, a == KUBE_LEASE_CREATE ? "POST" : "PUT",
                       a == KUBE_LEASE_CREATE ? coll : url, "application/json", next,
                       left_ms(start, limit_ms), "write lease", err);
    }
    *leading_out = rc == E_OK && written != NULL;
out:
    json_decref(written);
    json_decref(next);
    json_decref(cur);
    free(url);
    free(coll);
    return rc;
}

static void set_leader(struct kube_lease *l, bool leader)
{
    bool changed;

    pthread_mutex_lock(&l->mu);
    changed = l->leader != leader;
    l->leader = leader;
    pthread_mutex_unlock(&l->mu);
    if (changed) {
        log_kv(LOG_INFO, leader ? "lease_acquired" : "lease_lost", "lease", l->name, "identity",
               l->identity, NULL);
        if (l->o.on_change != NULL) {
            l->o.on_change(leader, l->o.userdata);
        }
    }
}

/* Sleeps RETRY_MS or until stopped; returns whether to stop. */
static bool wait_round(struct kube_lease *l)
{
    struct timespec ts;
    bool stop;

    clock_deadline_in(&ts, CLOCK_MONOTONIC, l->o.retry_ms);
    pthread_mutex_lock(&l->mu);
    while (!l->stop) {
        if (pthread_cond_timedwait(&l->cond, &l->mu, &ts) == ETIMEDOUT) {
            break;
        }
    }
    stop = l->stop;
    pthread_mutex_unlock(&l->mu);
    return stop;
}

static void *elector(void *arg)
{
    struct kube_lease *l = arg;
    int64_t last_ok = 0;

    do {
        struct err err = {0};
        bool leading = false;
        int64_t limit = l->o.renew_deadline_ms;
        int rc;

        if (kube_lease_is_leader(l)) {
            limit = l->o.renew_deadline_ms - (mono_ms() - last_ok);
        }
        rc = try_once(&leading, l, limit, &err);

        if (leading) {
            last_ok = mono_ms();
            set_leader(l, true);
        } else if (rc == E_OK) {
            set_leader(l, false); /* another holder's lease is valid */
        } else if (kube_lease_is_leader(l) && mono_ms() - last_ok > l->o.renew_deadline_ms) {
            log_kv(LOG_WARN, "lease_renew_failed", "lease", l->name, "error", err.msg, NULL);
            set_leader(l, false);
        }
    } while (!wait_round(l));
    return NULL;
}

static char *dup_or_null(const char *s)
{
    return s != NULL ? xstrdup(s) : NULL;
}

int kube_lease_start(struct kube_lease **out, struct kube_client *c,
                     const struct kube_lease_opts *opts, struct err *err)
{
    struct kube_lease *l;

    *out = NULL;
    if (opts->identity == NULL || *opts->identity == '\0' || strlen(opts->identity) > 253 ||
        !kube_name_ok(opts->ns) || !kube_object_name_ok(opts->name) || opts->duration_s < 1 ||
        opts->renew_deadline_ms >= (int64_t)opts->duration_s * 1000 || opts->retry_ms < 1 ||
        opts->retry_ms >= opts->renew_deadline_ms) {
        return err_set(err, E_INVALID,
                       "lease: bad options (identity, namespace, name, or "
                       "retry < renew deadline < duration)");
    }
    l = xcalloc(1, sizeof(*l));
    l->c = c;
    l->o = *opts;
    l->ns = dup_or_null(opts->ns);
    l->name = dup_or_null(opts->name);
    l->identity = dup_or_null(opts->identity);
    if (l->o.clock == NULL) {
        l->o.clock = clock_system();
    }
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    if (pthread_mutex_init(&l->mu, NULL) != 0 || pthread_cond_init(&l->cond, &ca) != 0) {
        abort();
    }
    pthread_condattr_destroy(&ca);
    if (pthread_create(&l->thread, NULL, elector, l) != 0) {
        pthread_cond_destroy(&l->cond);
        pthread_mutex_destroy(&l->mu);
        free(l->ns);
        free(l->name);
        free(l->identity);
        free(l);
        return err_set(err, E_FAIL, "lease: cannot start the elector thread");
    }
    *out = l;
    return E_OK;
}

bool kube_lease_is_leader(struct kube_lease *l)
{
    bool v;

    pthread_mutex_lock(&l->mu);
    v = l->leader;
    pthread_mutex_unlock(&l->mu);
    return v;
}

/* Writes the release record over the lease we hold (guarded by its resourceVersion: if
 * someone else wrote it since, it is not ours to release). */
static void release(struct kube_lease *l)
{
    struct err err = {0};
    json_t *cur = NULL, *rel = NULL, *written = NULL;

    if (kube_get(&cur, l->c, &KUBE_LEASES, l->ns, l->name, &err) != E_OK ||
        kube_lease_decide(cur, now_ms(l), l->identity) != KUBE_LEASE_RENEW) {
        goto out;
    }
    rel = kube_lease_build_release(cur, now_ms(l));
    if (kube_replace(&written, l->c, &KUBE_LEASES, l->ns, rel, &err) != E_OK) {
        log_kv(LOG_WARN, "lease_release_failed", "lease", l->name, "error", err.msg, NULL);
    }
out:
    json_decref(written);
    json_decref(rel);
    json_decref(cur);
}

void kube_lease_stop(struct kube_lease *l, bool do_release)
{
    if (l == NULL) {
        return;
    }
    pthread_mutex_lock(&l->mu);
    l->stop = true;
    pthread_cond_signal(&l->cond);
    pthread_mutex_unlock(&l->mu);
    pthread_join(l->thread, NULL);
    if (do_release && kube_lease_is_leader(l)) {
        release(l);
    }
    set_leader(l, false);
    pthread_cond_destroy(&l->cond);
    pthread_mutex_destroy(&l->mu);
    free(l->ns);
    free(l->name);
    free(l->identity);
    free(l);
}
