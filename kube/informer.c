/* SPDX-License-Identifier: Apache-2.0 */
/* An informer: list, then watch from the list's resourceVersion, keeping a cache of the
 * objects; a closed stream resumes from the last resourceVersion, 410 Expired relists and
 * the differences to the cache become ADDED/MODIFIED/DELETED events, so a consumer sees every
 * change exactly once in the end state even across gaps. One thread per informer. */
#include "kube/kube_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"

struct kube_informer {
    struct kube_client *c;       /* borrowed */
    struct kube_informer_opts o; /* strings below are owned copies */
    char *ns, *selector;         /* owned or NULL */
    pthread_t thread;            /* the list/watch loop */
    atomic_int stop;             /* set by kube_informer_stop; cancels the watch */
    pthread_mutex_t mu;          /* guards the fields below (and sleeping) */
    pthread_cond_t cond;         /* signalled on stop */
    json_t *cache;               /* "ns/name" -> object */
    char rv[KUBE_RV_MAX];        /* resourceVersion the cache is at */
    bool synced;                 /* a list has completed */
    int64_t relists;             /* lists done (the first included) */
};

static char *key_of(const json_t *obj)
{
    const json_t *md = json_object_get(obj, "metadata");
    const char *ns = json_string_value(json_object_get(md, "namespace"));
    const char *name = json_string_value(json_object_get(md, "name"));

    if (name == NULL) {
        return NULL;
    }
    return xasprintf("%s/%s", ns != NULL ? ns : "", name);
}

static const char *rv_of(const json_t *obj)
{
    return json_string_value(json_object_get(json_object_get(obj, "metadata"), "resourceVersion"));
}

static void emit(struct kube_informer *inf, enum kube_event type, const json_t *obj)
{
    if (inf->o.on_event != NULL) {
        inf->o.on_event(type, obj, inf->o.userdata);
    }
}

/* Replaces the cache by ITEMS at RV, emitting the differences. */
static void apply_list(struct kube_informer *inf, json_t *items, const char *rv)
{
    json_t *fresh = json_object(), *old, *obj;
    const char *key;
    size_t i;

    json_array_foreach(items, i, obj)
    {
        char *k = key_of(obj);
        if (k != NULL) {
            json_object_set(fresh, k, obj);
        }
        free(k);
    }
    pthread_mutex_lock(&inf->mu);
    old = inf->cache;
    inf->cache = json_incref(fresh);
    snprintf(inf->rv, sizeof(inf->rv), "%s", rv);
    inf->synced = true;
    inf->relists++;
    pthread_mutex_unlock(&inf->mu);
    json_object_foreach(fresh, key, obj)
    {
        json_t *prev = json_object_get(old, key);
        if (prev == NULL) {
            emit(inf, KUBE_EVENT_ADDED, obj);
        } else if (rv_of(prev) == NULL || rv_of(obj) == NULL ||
                   strcmp(rv_of(prev), rv_of(obj)) != 0) {
            emit(inf, KUBE_EVENT_MODIFIED, obj);
        }
    }
    json_object_foreach(old, key, obj)
    {
        if (json_object_get(fresh, key) == NULL) {
            emit(inf, KUBE_EVENT_DELETED, obj);
        }
    }
    json_decref(old);
    json_decref(fresh);
}

static int on_watch_event(enum kube_event type, const json_t *obj, void *userdata)
{
    struct kube_informer *inf = userdata;
    char *k;

    if (type == KUBE_EVENT_BOOKMARK) {
        return 0;
    }
    k = key_of(obj);
    if (k == NULL) {
        return 0; /* nothing to key it by: not an object we can track */
    }
    pthread_mutex_lock(&inf->mu);
    if (type == KUBE_EVENT_DELETED) {
        json_object_del(inf->cache, k);
    } else {
        json_object_set_new(inf->cache, k, json_deep_copy(obj));
    }
    pthread_mutex_unlock(&inf->mu);
    emit(inf, type, obj);
    free(k);
    return 0;
}

/* Sleeps MS or until stopped; returns whether to stop. */
static bool pause_ms(struct kube_informer *inf, int64_t ms)
{
    struct timespec ts;

    clock_deadline_in(&ts, CLOCK_MONOTONIC, ms);
    pthread_mutex_lock(&inf->mu);
    while (atomic_load(&inf->stop) == 0) {
        if (pthread_cond_timedwait(&inf->cond, &inf->mu, &ts) == ETIMEDOUT) {
            break;
        }
    }
    pthread_mutex_unlock(&inf->mu);
    return atomic_load(&inf->stop) != 0;
}

static int relist(struct kube_informer *inf, struct err *err)
{
    json_t *items = NULL;
    char rv[KUBE_RV_MAX];
    int rc = kube_list(&items, rv, inf->c, inf->o.res, inf->ns, inf->selector, err);

    if (rc == E_OK) {
        apply_list(inf, items, rv);
    }
    json_decref(items);
    return rc;
}

/* One watch from the cache's resourceVersion. Returns whether a relist is needed. */
static bool watch_once(struct kube_informer *inf, bool *failed_out)
{
    struct kube_watch_opts wo = {
        .label_selector = inf->selector, .timeout_s = inf->o.watch_timeout_s, .cancel = &inf->stop};
    enum kube_watch_end end = KUBE_WATCH_CLOSED;
    struct err err = {0};
    char rv[KUBE_RV_MAX];
    int rc;

    pthread_mutex_lock(&inf->mu);
    snprintf(rv, sizeof(rv), "%s", inf->rv);
    pthread_mutex_unlock(&inf->mu);
    rc = kube_watch(&end, rv, inf->c, inf->o.res, inf->ns, &wo, on_watch_event, inf, &err);
    pthread_mutex_lock(&inf->mu);
    snprintf(inf->rv, sizeof(inf->rv), "%s", rv);
    pthread_mutex_unlock(&inf->mu);
    *failed_out = rc != E_OK;
    if (rc != E_OK) {
        log_kv(LOG_WARN, "informer_watch_failed", "resource", inf->o.res->plural, "error", err.msg,
               NULL);
        /* a malformed stream or a refused resourceVersion: start over from a list */
        return rc != E_AGAIN;
    }
    return end == KUBE_WATCH_GONE;
}

static void *informer_loop(void *arg)
{
    struct kube_informer *inf = arg;
    bool need_list = true;

    while (atomic_load(&inf->stop) == 0) {
        bool failed = false;
        if (need_list) {
            struct err err = {0};
            if (relist(inf, &err) != E_OK) {
                log_kv(LOG_WARN, "informer_list_failed", "resource", inf->o.res->plural, "error",
                       err.msg, NULL);
                if (pause_ms(inf, inf->o.retry_ms)) {
                    break;
                }
                continue;
            }
        }
        need_list = watch_once(inf, &failed);
        if (failed && pause_ms(inf, inf->o.retry_ms)) {
            break;
        }
    }
    return NULL;
}

int kube_informer_start(struct kube_informer **out, struct kube_client *c,
                        const struct kube_informer_opts *opts, struct err *err)
{
    struct kube_informer *inf;
    pthread_condattr_t ca;

    *out = NULL;
    if (opts->res == NULL || (opts->ns != NULL && !kube_name_ok(opts->ns)) || opts->retry_ms < 1 ||
        opts->watch_timeout_s < 0) {
        return err_set(err, E_INVALID, "informer: bad options");
    }
    inf = xcalloc(1, sizeof(*inf));
    inf->c = c;
    inf->o = *opts;
    inf->ns = opts->ns != NULL ? xstrdup(opts->ns) : NULL;
    inf->selector = opts->label_selector != NULL ? xstrdup(opts->label_selector) : NULL;
    inf->cache = json_object();
    atomic_init(&inf->stop, 0);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    if (pthread_mutex_init(&inf->mu, NULL) != 0 || pthread_cond_init(&inf->cond, &ca) != 0) {
        abort();
    }
    pthread_condattr_destroy(&ca);
    if (pthread_create(&inf->thread, NULL, informer_loop, inf) != 0) {
        pthread_cond_destroy(&inf->cond);
        pthread_mutex_destroy(&inf->mu);
        json_decref(inf->cache);
        free(inf->ns);
        free(inf->selector);
        free(inf);
        return err_set(err, E_FAIL, "informer: cannot start its thread");
    }
    *out = inf;
    return E_OK;
}

bool kube_informer_synced(struct kube_informer *inf)
{
    bool v;

    pthread_mutex_lock(&inf->mu);
    v = inf->synced;
    pthread_mutex_unlock(&inf->mu);
    return v;
}

int kube_informer_get(json_t **out, struct kube_informer *inf, const char *ns, const char *name)
{
    char *k = xasprintf("%s/%s", ns != NULL ? ns : "", name);

    pthread_mutex_lock(&inf->mu);
    *out = json_deep_copy(json_object_get(inf->cache, k));
    pthread_mutex_unlock(&inf->mu);
    free(k);
    return *out != NULL ? E_OK : E_NOTFOUND;
}

json_t *kube_informer_list(char rv_out[KUBE_RV_MAX], int64_t *relists_out,
                           struct kube_informer *inf)
{
    json_t *items = json_array(), *obj;
    const char *key;

    pthread_mutex_lock(&inf->mu);
    json_object_foreach(inf->cache, key, obj)
    {
        json_array_append_new(items, json_deep_copy(obj));
    }
    snprintf(rv_out, KUBE_RV_MAX, "%s", inf->rv);
    if (relists_out != NULL) {
        *relists_out = inf->relists;
    }
    pthread_mutex_unlock(&inf->mu);
    return items;
}

void kube_informer_stop(struct kube_informer *inf)
{
    if (inf == NULL) {
        return;
    }
    pthread_mutex_lock(&inf->mu);
    atomic_store(&inf->stop, 1);
    pthread_cond_signal(&inf->cond);
    pthread_mutex_unlock(&inf->mu);
    pthread_join(inf->thread, NULL);
    pthread_cond_destroy(&inf->cond);
    pthread_mutex_destroy(&inf->mu);
    json_decref(inf->cache);
    free(inf->ns);
    free(inf->selector);
    free(inf);
}
