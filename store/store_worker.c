/* SPDX-License-Identifier: Apache-2.0 */
/* The one background-worker loop: a thread that sleeps in the store (a queue's
 * change counter or the change feed) until there is work or a deadline, and
 * applies it in batches. The stop flag is checked at least once a second. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

#include "common/hash.h"
#include "store/store.h"

/* The longest sleep between checks of the stop flag, in ms. */
#define STORE_WORKER_POLL_MS 1000
/* How long a feed waits after a batch it wanted nothing of (see run_feed). */
#define STORE_WORKER_LINGER_MS 2

struct store_worker {
    struct task_store *store;              /* borrowed */
    const struct store_worker_config *cfg; /* borrowed */
    void *userdata;                        /* passed to every callback */
    char name[16];                         /* thread name, NUL-terminated */
    atomic_bool stop;                      /* set by store_worker_stop */
    uint64_t seed;                         /* of the batch's task hash (names are users') */
    pthread_t thread;
};

static void run_queue(struct store_worker *w)
{
    bool outbox = w->cfg->wake == STORE_WORKER_OUTBOX;

    while (!atomic_load(&w->stop)) {
        /* The counter is read before the step so an entry queued while the step ran
         * ends the sleep at once instead of being slept through. */
        int64_t gen = task_store_queue_gen(w->store, outbox);
        int64_t wait = w->cfg->step(w->userdata);

        if (wait == 0) {
            continue;
        }
        if (wait < 0 || wait > STORE_WORKER_POLL_MS) {
            wait = STORE_WORKER_POLL_MS;
        }
        task_store_queue_wait(w->store, outbox, gen, wait);
    }
}

/* A wanted event, copied: the feed's own are borrowed for the callback only. */
struct kept {
    struct task_event ev; /* points into the three owned strings below */
    char *ns, *name, *json;
};

struct batch {
    struct kept *k; /* owned */
    size_t n, cap;
    struct store_worker *w;
};

static int keep(const struct task_event *ev, void *userdata)
{
    struct batch *b = userdata;
    struct kept *k;

    if (b->w->cfg->wants != NULL && !b->w->cfg->wants(ev, b->w->userdata)) {
        return 0;
    }
    if (b->n == b->cap) {
        b->cap = b->cap == 0 ? 16 : b->cap * 2;
        b->k = xrealloc(b->k, b->cap * sizeof(*b->k));
    }
    k = &b->k[b->n++];
    k->ns = xstrdup(ev->ns);
    k->name = xstrdup(ev->name);
    k->json = xstrdup(ev->json != NULL ? ev->json : "");
    k->ev = *ev;
    k->ev.ns = k->ns;
    k->ev.name = k->name;
    k->ev.json = k->json;
    return 0;
}

static bool same_task(const struct kept *a, const struct kept *b)
{
    return strcmp(a->ns, b->ns) == 0 && strcmp(a->name, b->name) == 0;
}

/* Marks in OLDER[i] each event of B that a later event of the same task follows: one hash
 * probe per event (a feed that fell behind hands over thousands at once, and comparing
 * every pair of them cost the thread more than applying them). */
static void mark_older(bool *older, const struct batch *b, uint64_t seed)
{
    size_t size = 16, mask;
    size_t *slots; /* index + 1 of the newest event of a task, 0: empty */

    while (size < b->n * 2) {
        size *= 2;
    }
    mask = size - 1;
    slots = xcalloc(size, sizeof(*slots));
    for (size_t i = b->n; i-- > 0;) {
        size_t at = (size_t)hash_fnv1a_pair(seed, b->k[i].ns, b->k[i].name) & mask;
        while (slots[at] != 0 && !same_task(&b->k[slots[at] - 1], &b->k[i])) {
            at = (at + 1) & mask;
        }
        older[i] = slots[at] != 0;
        if (slots[at] == 0) {
            slots[at] = i + 1;
        }
    }
    free(slots);
}

static void apply_batch(struct store_worker *w, struct batch *b)
{
    bool *older = xcalloc(b->n + 1, sizeof(*older));

    /* Only the newest state of each task matters: an older event of a task that changed
     * again in this batch is skipped. */
    mark_older(older, b, w->seed);
    for (size_t i = 0; i < b->n; i++) {
        if (!older[i] && !atomic_load(&w->stop)) {
            w->cfg->apply(&b->k[i].ev, w->userdata);
        }
        free(b->k[i].ns);
        free(b->k[i].name);
        free(b->k[i].json);
    }
    free(older);
    free(b->k);
}

static void run_feed(struct store_worker *w)
{
    int64_t rv = w->cfg->resync(w->userdata);

    while (!atomic_load(&w->stop)) {
        struct batch b = {.w = w};
        int64_t last = rv;
        int rc = task_store_watch(&last, w->store, NULL, rv, STORE_WORKER_POLL_MS, keep, &b, NULL);

        bool unwanted_only = rc == E_OK && b.n == 0 && last > rv;

        /* E_AGAIN: the feed moved on past RV; look at everything again. */
        rv = rc == E_AGAIN ? w->cfg->resync(w->userdata) : last;
        apply_batch(w, &b);
        if (unwanted_only && !atomic_load(&w->stop)) {
            /* Changes it does not follow (a meter charge each, thousands a second): wait
             * a little for more rather than wake for each one. */
            struct timespec linger = {0, STORE_WORKER_LINGER_MS * 1000000L};
            nanosleep(&linger, NULL);
        }
    }
}

static void *run(void *arg)
{
    struct store_worker *w = arg;

    prctl(PR_SET_NAME, w->name, 0, 0, 0);
    if (w->cfg->wake == STORE_WORKER_FEED) {
        run_feed(w);
    } else {
        run_queue(w);
    }
    return NULL;
}

int store_worker_start(struct store_worker **out, struct task_store *store,
                       const struct store_worker_config *cfg, void *userdata, struct err *err)
{
    struct store_worker *w;

    *out = NULL;
    if (cfg->wake == STORE_WORKER_FEED) {
        ASSERT(cfg->resync != NULL && cfg->apply != NULL);
    } else {
        ASSERT(cfg->step != NULL);
    }
    w = xcalloc(1, sizeof(*w));
    w->store = store;
    w->cfg = cfg;
    w->userdata = userdata;
    snprintf(w->name, sizeof(w->name), "%s", cfg->name != NULL ? cfg->name : "worker");
    atomic_init(&w->stop, false);
    w->seed = hash_seed(w);
    if (pthread_create(&w->thread, NULL, run, w) != 0) {
        free(w);
        return err_set(err, E_FAIL, "cannot start the %s worker",
                       cfg->name != NULL ? cfg->name : "background");
    }
    *out = w;
    return E_OK;
}

bool store_worker_stopping(const struct store_worker *w)
{
    return atomic_load(&w->stop);
}

void store_worker_stop(struct store_worker *w)
{
    if (w == NULL) {
        return;
    }
    atomic_store(&w->stop, true);
    task_store_wake(w->store);
    pthread_join(w->thread, NULL);
    free(w);
}
