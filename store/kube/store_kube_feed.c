/* SPDX-License-Identifier: Apache-2.0 */
/* The change feed of the Kubernetes backend: the AgentTask informer's events go into a
 * bounded ring (KST_RING events, STORE_EVENT_RING_BYTES of JSON) that task_store_watch
 * serves; a watcher from before what the ring holds gets E_AGAIN (HTTP 410: list again). */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "store/kube/store_kube_int.h"

static enum task_event_type event_type(enum kube_event type)
{
    return type == KUBE_EVENT_ADDED     ? TASK_EVENT_ADDED
           : type == KUBE_EVENT_DELETED ? TASK_EVENT_DELETED
                                        : TASK_EVENT_MODIFIED;
}

/* Drops the oldest event; watchers from before it must list again. Caller holds mu. */
static void ring_evict(struct kube_store *s)
{
    struct event *e = &s->ring[s->first % KST_RING];

    if (e->rv + 1 > s->floor) {
        s->floor = e->rv + 1;
    }
    s->ring_bytes -= e->bytes;
    free(e->json);
    memset(e, 0, sizeof(*e));
    s->first++;
}

/* The informer's callback: every task change goes into the ring. A change older than what
 * the ring already holds comes from a relist (the informer's gap repair): watchers that
 * might have missed it must list again, so the floor moves past everything published. */
void kst_on_task_event(enum kube_event type, const json_t *obj, void *userdata)
{
    struct kube_store *s = userdata;
    int64_t rv = kst_rv_of(obj);
    struct event *slot;

    if (type == KUBE_EVENT_BOOKMARK) {
        return;
    }
    pthread_mutex_lock(&s->mu);
    if (rv <= s->prime_rv && type != KUBE_EVENT_DELETED) {
        pthread_mutex_unlock(&s->mu); /* the first list's own objects: not changes */
        return;
    }
    if (rv <= s->rv) {
        s->floor = s->rv + 1;
        rv = s->rv + 1; /* keeps the ring ordered; nobody at or past the floor saw it */
    }
    if (s->seq - s->first == KST_RING) {
        ring_evict(s);
    }
    slot = &s->ring[s->seq % KST_RING];
    if (json_is_object(json_object_get(obj, "status"))) {
        store_event_fill(slot, rv, event_type(type), obj, json_dumps(obj, JSON_COMPACT));
    } else {
        json_t *copy = kst_fill_status(json_deep_copy(obj)); /* as every read shows it */
        store_event_fill(slot, rv, event_type(type), copy, json_dumps(copy, JSON_COMPACT));
        json_decref(copy);
    }
    s->ring_bytes += slot->bytes; /* measured by store_event_fill */
    /* at most STORE_EVENT_RING_BYTES of JSON (security review finding 7b), but the newest */
    while (s->ring_bytes > STORE_EVENT_RING_BYTES && s->first < s->seq) {
        ring_evict(s);
    }
    s->seq++;
    s->rv = rv;
    pthread_cond_broadcast(&s->changed);
    pthread_mutex_unlock(&s->mu);
}

/* Copies the events after SINCE_RV (of NS) out of the ring; caller holds mu. */
static size_t ring_collect(struct event **out, struct kube_store *s, const char *ns,
                           int64_t since_rv)
{
    int64_t first = s->first;
    size_t n = 0;

    *out = xcalloc((size_t)(s->seq - first) + 1, sizeof(**out));
    for (int64_t q = first; q < s->seq; q++) {
        const struct event *e = &s->ring[q % KST_RING];
        if (e->rv > since_rv && (ns == NULL || strcmp(e->ns, ns) == 0)) {
            (*out)[n] = *e;
            (*out)[n].json = xstrdup(e->json);
            n++;
        }
    }
    return n;
}

int kst_watch(int64_t *last_rv_out, struct task_store *st, const char *ns, int64_t since_rv,
              int timeout_ms, task_event_fn fn, void *userdata, struct err *err)
{
    struct kube_store *s = kst_of(st);
    struct event *evs = NULL;
    struct timespec deadline;
    int64_t wake_gen, top;
    size_t n;

    *last_rv_out = since_rv;
    clock_deadline_in(&deadline, CLOCK_REALTIME, timeout_ms);
    pthread_mutex_lock(&s->mu);
    wake_gen = s->wake_gen;
    while (s->rv <= since_rv && s->wake_gen == wake_gen && since_rv >= s->floor - 1) {
        if (pthread_cond_timedwait(&s->changed, &s->mu, &deadline) != 0) {
            break;
        }
    }
    if (since_rv < s->floor - 1 || (s->rv > since_rv && since_rv < s->prime_rv)) {
        pthread_mutex_unlock(&s->mu);
        return err_set(err, E_AGAIN, "too old resource version: %lld", (long long)since_rv);
    }
    top = s->rv;
    n = ring_collect(&evs, s, ns, since_rv);
    pthread_mutex_unlock(&s->mu);
    if (top > since_rv) {
        *last_rv_out = top;
    }
    for (size_t i = 0; i < n; i++) {
        struct task_event ev = {.type = evs[i].type,
                                .rv = evs[i].rv,
                                .ns = evs[i].ns,
                                .name = evs[i].name,
                                .phase = evs[i].phase,
                                .suspended = evs[i].suspended,
                                .from_scm = evs[i].from_scm,
                                .json = evs[i].json};
        if (fn(&ev, userdata) != 0) {
            *last_rv_out = evs[i].rv;
            for (size_t j = i; j < n; j++) {
                free(evs[j].json);
            }
            free(evs);
            return E_OK;
        }
        free(evs[i].json);
    }
    free(evs);
    return E_OK;
}

void kst_wake(struct task_store *st)
{
    struct kube_store *s = kst_of(st);

    pthread_mutex_lock(&s->mu);
    s->wake_gen++;
    s->inbox_gen++;
    s->outbox_gen++;
    pthread_cond_broadcast(&s->changed);
    pthread_mutex_unlock(&s->mu);
}
