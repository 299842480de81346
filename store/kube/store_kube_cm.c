/* SPDX-License-Identifier: Apache-2.0 */
/* The ConfigMaps behind the inbox, outbox and sticky state of the Kubernetes backend
 * (docs/cluster-mode.md "Inbox and outbox: decision"): one ConfigMap per entry in the
 * store's namespace, labelled divergedev.com/queue=inbox|outbox|sticky and followed by an
 * informer whose cache answers reads. An entry's id is a 53-bit hash of its name; arrival
 * order is its data.seq (ms, then name). Shared helpers of store_kube_queue.c (inbox) and
 * store_kube_outbox.c (outbox, sticky). */
#include <stdlib.h>
#include <string.h>

#include "store/kube/store_kube_int.h"

/* A JSON string of S, which it frees. */
json_t *kst_str_take(char *s)
{
    json_t *j = json_string(s);

    free(s);
    return j;
}

uint64_t kst_fnv(const char *s, uint64_t h)
{
    for (; *s != '\0'; s++) {
        h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    }
    return (h ^ 0xff) * 1099511628211ULL; /* field separator */
}

int64_t kst_id_of_name(const char *name)
{
    int64_t id = (int64_t)(kst_fnv(name, 14695981039346656037ULL) & ((1ULL << 53) - 1));
    return id == 0 ? 1 : id;
}

const char *kst_cm_name(const json_t *cm)
{
    return json_string_value(json_object_get(json_object_get(cm, "metadata"), "name"));
}

const char *kst_cm_str(const json_t *cm, const char *key)
{
    return json_string_value(json_object_get(json_object_get(cm, "data"), key));
}

int64_t kst_cm_int(const json_t *cm, const char *key)
{
    const char *v = kst_cm_str(cm, key);
    return v != NULL ? (int64_t)strtoll(v, NULL, 10) : 0;
}

void kst_cm_set(json_t *cm, const char *key, const char *value)
{
    json_t *data = json_object_get(cm, "data");

    if (!json_is_object(data)) {
        data = json_object();
        json_object_set_new(cm, "data", data);
    }
    if (value == NULL) {
        json_object_del(data, key);
    } else {
        json_object_set_new(data, key, json_string(value));
    }
}

void kst_cm_set_int(json_t *cm, const char *key, int64_t v)
{
    char buf[32];

    snprintf(buf, sizeof(buf), "%lld", (long long)v);
    kst_cm_set(cm, key, buf);
}

static const char *cm_queue(const json_t *cm)
{
    return json_string_value(json_object_get(
        json_object_get(json_object_get(cm, "metadata"), "labels"), KST_QUEUE_LABEL));
}

void kst_queue_event(enum kube_event type, const json_t *obj, void *userdata)
{
    struct kube_store *s = userdata;
    const char *q = cm_queue(obj);
    int64_t rv = kst_rv_of(obj);

    if (type == KUBE_EVENT_BOOKMARK) {
        return;
    }
    pthread_mutex_lock(&s->mu);
    if (rv > s->queue_rv) {
        s->queue_rv = rv;
    }
    if (q != NULL && strcmp(q, KST_Q_INBOX) == 0) {
        s->inbox_gen++;
    } else if (q != NULL && strcmp(q, KST_Q_OUTBOX) == 0) {
        s->outbox_gen++;
    }
    pthread_cond_broadcast(&s->changed);
    pthread_mutex_unlock(&s->mu);
}

json_t *kst_cm_new(struct kube_store *s, const char *name, const char *queue)
{
    return json_pack("{s:s,s:s,s:{s:s,s:s,s:{s:s}},s:{}}", "apiVersion", "v1", "kind", "ConfigMap",
                     "metadata", "name", name, "namespace", s->ns, "labels", KST_QUEUE_LABEL, queue,
                     "data");
}

/* Creates CM; *rv_out its rv. E_CONFLICT when the name exists. */
int kst_cm_create(struct kube_store *s, const json_t *cm, struct err *err)
{
    json_t *res = NULL;
    int rc = kube_create(&res, s->c, &KUBE_CONFIGMAPS, s->ns, cm, err);

    if (rc == E_OK) {
        kst_wait_seen(s, kst_rv_of(res), true);
    }
    json_decref(res);
    return rc;
}

/* Reads the ConfigMap NAME, lets FN change it (FN returning non-zero: no write, that code)
 * and replaces it rv-guarded, retrying conflicts. */
int kst_cm_update(struct kube_store *s, const char *name, kst_cm_edit_fn fn, void *ud,
                  struct err *err)
{
    int rc = E_CONFLICT;

    for (int i = 0; i < KST_RETRIES && rc == E_CONFLICT; i++) {
        json_t *cm = NULL, *res = NULL;
        rc = kube_get(&cm, s->c, &KUBE_CONFIGMAPS, s->ns, name, err);
        if (rc == E_OK) {
            rc = fn(cm, ud);
        }
        if (rc == E_OK) {
            rc = kube_replace(&res, s->c, &KUBE_CONFIGMAPS, s->ns, cm, err);
        }
        if (rc == E_OK) {
            kst_wait_seen(s, kst_rv_of(res), true);
        }
        json_decref(cm);
        json_decref(res);
    }
    return rc == TASK_MUTATE_UNCHANGED ? E_OK : rc;
}

/* The cached entries of QUEUE, sorted by arrival (seq, then name). New array. */
static int cmp_seq(const void *a, const void *b)
{
    const json_t *x = *(const json_t *const *)a, *y = *(const json_t *const *)b;
    int64_t sx = kst_cm_int(x, "seq"), sy = kst_cm_int(y, "seq");

    if (sx != sy) {
        return sx < sy ? -1 : 1;
    }
    return strcmp(kst_cm_name(x), kst_cm_name(y));
}

json_t *kst_cm_cached(struct kube_store *s, const char *queue)
{
    char rv[KUBE_RV_MAX];
    json_t *all = kube_informer_list(rv, NULL, s->queue), *out = json_array(), *cm;
    json_t **v = xcalloc(json_array_size(all) + 1, sizeof(*v));
    size_t i, n = 0;

    json_array_foreach(all, i, cm)
    {
        const char *q = cm_queue(cm);
        if (q != NULL && strcmp(q, queue) == 0 && kst_cm_name(cm) != NULL) {
            v[n++] = cm;
        }
    }
    qsort(v, n, sizeof(*v), cmp_seq);
    for (i = 0; i < n; i++) {
        json_array_append(out, v[i]);
    }
    free(v);
    json_decref(all);
    return out;
}

/* The name of the entry of QUEUE with ID, or NULL (new string). */
char *kst_cm_name_of_id(struct kube_store *s, const char *queue, int64_t id)
{
    json_t *items = kst_cm_cached(s, queue), *cm;
    char *out = NULL;
    size_t i;

    json_array_foreach(items, i, cm)
    {
        if (kst_id_of_name(kst_cm_name(cm)) == id) {
            out = xstrdup(kst_cm_name(cm));
            break;
        }
    }
    json_decref(items);
    return out;
}

bool kst_cm_pending(const json_t *cm)
{
    const char *st = kst_cm_str(cm, "state");
    return st != NULL && strcmp(st, "pending") == 0;
}

/* --- state changes of one entry ---------------------------------------------------- */

static int apply_edit(json_t *cm, void *ud)
{
    const struct kst_edit *e = ud;

    if (e->state != NULL) {
        kst_cm_set(cm, "state", e->state);
    }
    if (e->next_ms >= 0) {
        kst_cm_set_int(cm, "next", e->next_ms);
    }
    kst_cm_set_int(cm, "attempts", kst_cm_int(cm, "attempts") + e->attempts_add);
    if (e->set_error) {
        kst_cm_set(cm, "error", e->error);
    }
    if (e->set_result) {
        kst_cm_set(cm, "result", e->result);
    }
    if (e->state != NULL && strcmp(e->state, "pending") != 0) {
        kst_cm_set_int(cm, "doneMs", e->now_ms); /* kst_cm_gc deletes it once old */
    }
    return E_OK;
}

int kst_cm_edit_id(struct kube_store *s, const char *queue, int64_t id, const struct kst_edit *e,
                   struct err *err)
{
    char *name = kst_cm_name_of_id(s, queue, id);
    struct kst_edit now = *e;
    int rc;

    if (name == NULL) {
        return err_set(err, E_NOTFOUND, "%s entry %lld not found", queue, (long long)id);
    }
    now.now_ms = clock_now_ms(s->base.clock);
    rc = kst_cm_update(s, name, apply_edit, &now, err);
    free(name);
    return rc;
}

char *kst_dupv(const json_t *o, const char *k)
{
    const char *v = json_string_value(json_object_get(o, k));
    return v != NULL ? xstrdup(v) : NULL;
}

static void pr_key(char *out, size_t n, const json_t *cm)
{
    json_t *e =
        json_loads(kst_cm_str(cm, "entry") != NULL ? kst_cm_str(cm, "entry") : "{}", 0, NULL);

    snprintf(out, n, "%s\n%s\n%lld",
             json_string_value(json_object_get(e, "provider")) != NULL
                 ? json_string_value(json_object_get(e, "provider"))
                 : "",
             json_string_value(json_object_get(e, "project")) != NULL
                 ? json_string_value(json_object_get(e, "project"))
                 : "",
             (long long)json_integer_value(json_object_get(e, "number")));
    json_decref(e);
}

/* The due pending entries of QUEUE in order, at most MAX, each PR's from its oldest
 * pending one and only while they are due (so a PR's order holds); SKIP (or "") is
 * never taken. *wait_ms_out: until the next not-due one, -1 when nothing else is
 * pending. New array. */
json_t *kst_cm_due(int64_t *wait_ms_out, struct kube_store *s, const char *queue, size_t max,
                   const char *skip)
{
    json_t *items = kst_cm_cached(s, queue), *out = json_array(), *blocked = json_object(), *cm;
    int64_t now = clock_now_ms(s->base.clock);
    size_t i;

    *wait_ms_out = -1;
    json_array_foreach(items, i, cm)
    {
        char key[600];
        enum store_claim step;
        if (!kst_cm_pending(cm)) {
            continue;
        }
        pr_key(key, sizeof(key), cm);
        step = store_queue_claim(wait_ms_out, json_object_get(blocked, key) != NULL,
                                 kst_cm_int(cm, "next"), now,
                                 strcmp(kst_cm_name(cm), skip) == 0 || json_array_size(out) >= max);
        if (step == STORE_CLAIM_TAKE) {
            json_array_append(out, cm);
        } else if (step == STORE_CLAIM_CLOSE) {
            json_object_set_new(blocked, key, json_true());
        }
    }
    json_decref(blocked);
    json_decref(items);
    return out;
}

int kst_cm_count_pending(int64_t *out, struct kube_store *s, const char *queue)
{
    json_t *items = kst_cm_cached(s, queue), *cm;
    size_t i;

    *out = 0;
    json_array_foreach(items, i, cm)
    {
        *out += kst_cm_pending(cm);
    }
    json_decref(items);
    return E_OK;
}

int64_t kst_queue_gen(struct task_store *st, bool outbox)
{
    struct kube_store *s = kst_of(st);

    return store_gen_get(&s->mu, outbox ? &s->outbox_gen : &s->inbox_gen);
}

void kst_queue_wait(struct task_store *st, bool outbox, int64_t since_gen, int64_t timeout_ms)
{
    struct kube_store *s = kst_of(st);

    store_gen_wait(&s->mu, &s->changed, outbox ? &s->outbox_gen : &s->inbox_gen, since_gen,
                   timeout_ms);
}

void kst_cm_gc(struct kube_store *s, const char *queue, int64_t keep_ms)
{
    int64_t now = clock_now_ms(s->base.clock);
    int slot = strcmp(queue, KST_Q_INBOX) == 0 ? 0 : 1;
    json_t *items, *cm;
    size_t i;

    pthread_mutex_lock(&s->mu);
    if (s->gc_ms[slot] != 0 && now - s->gc_ms[slot] < KST_GC_EVERY_MS) {
        pthread_mutex_unlock(&s->mu);
        return;
    }
    s->gc_ms[slot] = now;
    pthread_mutex_unlock(&s->mu);
    items = kst_cm_cached(s, queue);
    json_array_foreach(items, i, cm)
    {
        int64_t done = kst_cm_int(cm, "doneMs");
        if (!kst_cm_pending(cm) && done > 0 && now - done > keep_ms) {
            const char *rv = json_string_value(
                json_object_get(json_object_get(cm, "metadata"), "resourceVersion"));
            /* rv-guarded: an entry changed meanwhile stays */
            (void)kube_delete(s->c, &KUBE_CONFIGMAPS, s->ns, kst_cm_name(cm), rv, NULL);
        }
    }
    json_decref(items);
}
