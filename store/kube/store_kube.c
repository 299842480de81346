/* SPDX-License-Identifier: Apache-2.0 */
/* The Kubernetes backend of task_store (docs/cluster-mode.md): AgentTasks on an informer
 * whose cache answers reads and whose events feed a bounded ring for watchers; writes are
 * resourceVersion-guarded calls with conflict retries; rv is the API server's
 * resourceVersion. Environments are read and written directly. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "store/kube/store_kube_int.h"

int64_t kst_rv_of(const json_t *obj)
{
    const char *rv =
        json_string_value(json_object_get(json_object_get(obj, "metadata"), "resourceVersion"));
    char *end = NULL;
    long long v;

    if (rv == NULL || rv[0] == '\0') {
        return 0;
    }
    errno = 0;
    v = strtoll(rv, &end, 10);
    if (errno != 0 || *end != '\0' || v < 0) {
        return 0;
    }
    return (int64_t)v;
}

void kst_wait_seen(struct kube_store *s, int64_t rv, bool queue)
{
    struct timespec ts;

    clock_deadline_in(&ts, CLOCK_REALTIME, KST_SEEN_MS);
    pthread_mutex_lock(&s->mu);
    while ((queue ? s->queue_rv : s->rv) < rv) {
        if (pthread_cond_timedwait(&s->changed, &s->mu, &ts) != 0) {
            break;
        }
    }
    pthread_mutex_unlock(&s->mu);
}

/* --- tasks ------------------------------------------------------------------------ */

json_t *kst_fill_status(json_t *obj)
{
    if (json_is_object(obj) && !json_is_object(json_object_get(obj, "status"))) {
        json_object_set_new(obj, "status", task_initial_status());
    }
    return obj;
}

static int kst_get(json_t **out, struct task_store *st, const char *ns, const char *name,
                   struct err *err)
{
    struct kube_store *s = kst_of(st);
    int rc = kube_informer_get(out, s->tasks, ns, name);

    if (rc != E_OK) {
        rc = kube_get(out, s->c, &KUBE_AGENTTASKS, ns, name, err);
    }
    if (rc == E_OK) {
        kst_fill_status(*out);
    }
    return rc;
}

static bool same_uid(const json_t *a, const json_t *b)
{
    const char *ua = json_string_value(json_object_get(json_object_get(a, "metadata"), "uid"));
    const char *ub = json_string_value(json_object_get(json_object_get(b, "metadata"), "uid"));

    return ua != NULL && ub != NULL && strcmp(ua, ub) == 0;
}

/* Writes STATUS onto *MADE, the object just created (the API server drops a status given to
 * a create). Another writer may have written the new object's status first: a leader's
 * controller that saw its ADDED event and reconciled it (its status starts from the same
 * initial one). Then the object is made all the same and that status stands (*WROTE false).
 * A conflict while no status is written yet retries on the fresh object. *MADE is replaced
 * by the object as stored. */
static int create_status(json_t **made, bool *wrote, struct kube_store *s, const char *ns,
                         json_t *status, struct err *err)
{
    /* A copy: *MADE, which holds the name, is replaced below. */
    char *name =
        xstrdup(json_string_value(json_object_get(json_object_get(*made, "metadata"), "name")));
    int rc = E_OK;

    *wrote = false;
    for (int i = 0; i < KST_RETRIES; i++) {
        json_t *done = NULL, *fresh = NULL;

        json_object_set(*made, "status", status);
        rc = kube_update_status(&done, s->c, &KUBE_AGENTTASKS, ns, *made, err);
        if (rc == E_OK) {
            json_decref(*made);
            *made = done;
            *wrote = true;
            goto out;
        }
        if (rc != E_CONFLICT ||
            (rc = kube_get(&fresh, s->c, &KUBE_AGENTTASKS, ns, name, err)) != E_OK) {
            goto out;
        }
        if (!same_uid(fresh, *made)) {
            json_decref(fresh);
            rc = err_set(err, E_FAIL,
                         "agenttasks \"%s\" was deleted and made again while it "
                         "was being created",
                         name);
            goto out;
        }
        json_decref(*made);
        *made = fresh;
        if (json_is_object(json_object_get(fresh, "status"))) {
            log_kv(LOG_INFO, "task_create_status_taken", "namespace", ns, "name", name, NULL);
            goto out;
        }
    }
    rc = err_set(err, E_AGAIN,
                 "agenttasks \"%s\": its status kept changing while it was "
                 "being created",
                 name);
out:
    free(name);
    return rc;
}

int kst_create_task(json_t **out, struct kube_store *s, const json_t *obj, struct err *err)
{
    const char *ns =
        json_string_value(json_object_get(json_object_get(obj, "metadata"), "namespace"));
    json_t *made = NULL;
    int rc = kube_create(&made, s->c, &KUBE_AGENTTASKS, ns, obj, err);

    if (rc == E_CONFLICT) {
        rc = err_set(err, E_CONFLICT, "agenttasks \"%s\" already exists",
                     json_string_value(json_object_get(json_object_get(obj, "metadata"), "name")));
    }
    if (rc == E_OK && json_object_get(obj, "status") != NULL) {
        bool wrote = false;
        rc = create_status(&made, &wrote, s, ns, json_object_get(obj, "status"), err);
        if (rc == E_OK && wrote) {
            kst_event_phase(s, made, "");
        }
    }
    if (rc == E_OK) {
        kst_wait_seen(s, kst_rv_of(made), false);
    }
    if (rc == E_OK && out != NULL) {
        *out = made;
        made = NULL;
    }
    json_decref(made);
    return rc;
}

static int kst_create(json_t **out, struct task_store *st, const json_t *obj, struct err *err)
{
    *out = NULL;
    return kst_create_task(out, kst_of(st), obj, err);
}

/* Whether the main resource (labels, annotations, spec) of A and B differs. */
static bool main_differs(const json_t *a, const json_t *b)
{
    const json_t *ma = json_object_get(a, "metadata"), *mb = json_object_get(b, "metadata");

    return !json_equal(json_object_get(a, "spec"), json_object_get(b, "spec")) ||
           !json_equal(json_object_get(ma, "labels"), json_object_get(mb, "labels")) ||
           !json_equal(json_object_get(ma, "annotations"), json_object_get(mb, "annotations"));
}

int kst_write_task(int64_t *rv_out, struct kube_store *s, json_t *doc, const json_t *orig,
                   struct err *err)
{
    const char *nsv =
        json_string_value(json_object_get(json_object_get(doc, "metadata"), "namespace"));
    char ns[64];
    json_t *res = NULL;
    int rc = E_OK;

    *rv_out = 0;
    snprintf(ns, sizeof(ns), "%s", nsv != NULL ? nsv : "");
    if (main_differs(doc, orig)) {
        rc = kube_replace(&res, s->c, &KUBE_AGENTTASKS, ns, doc, err);
        if (rc != E_OK) {
            return rc;
        }
        json_object_set(doc, "metadata", json_object_get(res, "metadata"));
        *rv_out = kst_rv_of(res);
        json_decref(res);
        res = NULL;
    }
    if (!json_equal(json_object_get(doc, "status"), json_object_get(orig, "status"))) {
        rc = kube_update_status(&res, s->c, &KUBE_AGENTTASKS, ns, doc, err);
        if (rc != E_OK) {
            return rc;
        }
        json_object_set(doc, "metadata", json_object_get(res, "metadata"));
        *rv_out = kst_rv_of(res);
        kst_event_phase(s, res, kst_phase_of(orig));
        json_decref(res);
    }
    return E_OK;
}

static int kst_mutate(json_t **out, struct task_store *st, const char *ns, const char *name,
                      task_mutate_fn fn, void *userdata, struct err *err)
{
    struct kube_store *s = kst_of(st);
    int rc = E_CONFLICT;

    if (out != NULL) {
        *out = NULL;
    }
    for (int i = 0; i < KST_RETRIES && rc == E_CONFLICT; i++) {
        json_t *orig = NULL, *doc;
        int64_t rv = 0;
        rc = kube_get(&orig, s->c, &KUBE_AGENTTASKS, ns, name, err);
        if (rc != E_OK) {
            return rc;
        }
        kst_fill_status(orig);
        doc = json_deep_copy(orig);
        rc = fn(doc, err, userdata);
        if (rc == TASK_MUTATE_UNCHANGED) {
            rc = E_OK;
        } else if (rc == E_OK) {
            rc = kst_write_task(&rv, s, doc, orig, err);
        }
        if (rc == E_OK) {
            kst_wait_seen(s, rv, false);
            if (out != NULL) {
                *out = json_incref(doc);
            }
        }
        json_decref(doc);
        json_decref(orig);
    }
    return rc;
}

/* Deletes the Environments of NS owned by the task with uid UID (what the API server's
 * garbage collector does with ownerReferences; done here so it does not wait for it). */
static void delete_owned_envs(struct kube_store *s, const char *ns, const char *uid)
{
    json_t *items = NULL, *env;
    char rv[KUBE_RV_MAX];
    size_t i;

    if (uid == NULL || kube_list(&items, rv, s->c, &KUBE_ENVIRONMENTS, ns, NULL, NULL) != E_OK) {
        return;
    }
    json_array_foreach(items, i, env)
    {
        const json_t *md = json_object_get(env, "metadata");
        const json_t *owner = json_array_get(json_object_get(md, "ownerReferences"), 0);
        const char *ouid = json_string_value(json_object_get(owner, "uid"));
        if (ouid != NULL && strcmp(ouid, uid) == 0) {
            (void)kube_delete(s->c, &KUBE_ENVIRONMENTS, ns,
                              json_string_value(json_object_get(md, "name")), NULL, NULL);
        }
    }
    json_decref(items);
}

static int kst_remove(json_t **out, struct task_store *st, const char *ns, const char *name,
                      int64_t expect_rv, struct err *err)
{
    struct kube_store *s = kst_of(st);
    json_t *cur = NULL;
    char rvbuf[32];
    int rc;

    if (out != NULL) {
        *out = NULL;
    }
    rc = kube_get(&cur, s->c, &KUBE_AGENTTASKS, ns, name, err);
    if (rc != E_OK) {
        return rc;
    }
    snprintf(rvbuf, sizeof(rvbuf), "%lld",
             (long long)(expect_rv != 0 ? expect_rv : kst_rv_of(cur)));
    rc = kube_delete(s->c, &KUBE_AGENTTASKS, ns, name, rvbuf, err);
    if (rc == E_CONFLICT && expect_rv != 0) {
        rc = err_set(err, E_CONFLICT, "resourceVersion does not match");
    }
    if (rc == E_OK) {
        /* as the embedded store: deleting the task revokes its token (index entry kept) */
        (void)kst_token_revoke(st, ns, name, NULL);
        delete_owned_envs(
            s, ns, json_string_value(json_object_get(json_object_get(cur, "metadata"), "uid")));
        /* the DELETED event has a newer rv than the object: wait for the object to go */
        for (int i = 0; i < KST_SEEN_MS / 10; i++) {
            json_t *left = NULL;
            if (kube_informer_get(&left, s->tasks, ns, name) != E_OK) {
                break;
            }
            json_decref(left);
            struct timespec ts = {.tv_sec = 0, .tv_nsec = 10000000L};
            nanosleep(&ts, NULL);
        }
    }
    if (rc == E_OK && out != NULL) {
        *out = cur;
        cur = NULL;
    }
    json_decref(cur);
    return rc;
}

static int cmp_task(const void *a, const void *b)
{
    const json_t *x = *(const json_t *const *)a, *y = *(const json_t *const *)b;
    struct task_view va, vb;
    int c;

    task_view_of(&va, x);
    task_view_of(&vb, y);
    c = strcmp(va.ns != NULL ? va.ns : "", vb.ns != NULL ? vb.ns : "");
    return c != 0 ? c : strcmp(va.name != NULL ? va.name : "", vb.name != NULL ? vb.name : "");
}

/* The cached tasks of NS (NULL: all), sorted; *rv_out the feed's rv at (before) the read. */
static json_t *cached_tasks(int64_t *rv_out, struct kube_store *s, const char *ns)
{
    char rv[KUBE_RV_MAX];
    json_t *all, *out = json_array(), *obj;
    json_t **v;
    size_t i, n = 0;

    pthread_mutex_lock(&s->mu);
    *rv_out = s->rv;
    pthread_mutex_unlock(&s->mu);
    all = kube_informer_list(rv, NULL, s->tasks);
    v = xcalloc(json_array_size(all) + 1, sizeof(*v));
    json_array_foreach(all, i, obj)
    {
        struct task_view tv;
        kst_fill_status(obj);
        task_view_of(&tv, obj);
        if (ns == NULL || (tv.ns != NULL && strcmp(tv.ns, ns) == 0)) {
            v[n++] = obj;
        }
    }
    qsort(v, n, sizeof(*v), cmp_task);
    for (i = 0; i < n; i++) {
        json_array_append(out, v[i]);
    }
    free(v);
    json_decref(all);
    return out;
}

static int kst_list(json_t **items_out, int64_t *rv_out, struct task_store *st, const char *ns,
                    struct err *err)
{
    (void)err;
    *items_out = cached_tasks(rv_out, kst_of(st), ns);
    return E_OK;
}

int kst_list_text(int64_t *rv_out, struct task_store *st, const char *ns, task_text_fn fn,
                  void *userdata, struct err *err)
{
    json_t *items = cached_tasks(rv_out, kst_of(st), ns), *obj;
    size_t i;
    int rc = E_OK;

    (void)err;
    json_array_foreach(items, i, obj)
    {
        char *text = json_dumps(obj, JSON_COMPACT);
        rc = fn(text, strlen(text), userdata);
        free(text);
        if (rc != E_OK) {
            break;
        }
    }
    json_decref(items);
    return rc;
}

int kst_get_text(struct task_store *st, const char *ns, const char *name, task_text_fn fn,
                 void *userdata, struct err *err)
{
    json_t *obj = NULL;
    char *text;
    int rc = kst_get(&obj, st, ns, name, err);

    if (rc != E_OK) {
        return rc;
    }
    text = json_dumps(obj, JSON_COMPACT);
    json_decref(obj);
    if (text == NULL) {
        return err_set(err, E_FAIL, "encode agenttasks \"%s\"", name);
    }
    rc = fn(text, strlen(text), userdata);
    free(text);
    return rc;
}

static int kst_count_phases(int64_t counts_out[TASK_PHASE_COUNT], struct task_store *st,
                            struct err *err)
{
    int64_t rv;
    json_t *items = cached_tasks(&rv, kst_of(st), NULL), *obj;
    size_t i;

    (void)err;
    memset(counts_out, 0, sizeof(int64_t) * TASK_PHASE_COUNT);
    json_array_foreach(items, i, obj)
    {
        struct task_view v;
        task_view_of(&v, obj);
        if ((int)v.phase >= 0 && v.phase < TASK_PHASE_COUNT) {
            counts_out[v.phase]++;
        }
    }
    json_decref(items);
    return E_OK;
}

int kst_totals(struct task_totals *out, struct task_store *st, struct err *err)
{
    int64_t rv;
    json_t *items = cached_tasks(&rv, kst_of(st), NULL), *obj;
    size_t i;

    (void)err;
    memset(out, 0, sizeof(*out));
    json_array_foreach(items, i, obj)
    {
        struct task_view v;
        task_view_of(&v, obj);
        out->cost_usd += (double)v.cost_usd / 1e6;
        out->tokens += v.tokens_consumed;
    }
    json_decref(items);
    return E_OK;
}

static int kst_env_list(json_t **items_out, struct task_store *st, const char *ns, struct err *err)
{
    char rv[KUBE_RV_MAX];

    return kube_list(items_out, rv, kst_of(st)->c, &KUBE_ENVIRONMENTS, ns, NULL, err);
}

static int kst_env_get(json_t **out, struct task_store *st, const char *ns, const char *name,
                       struct err *err)
{
    return kube_get(out, kst_of(st)->c, &KUBE_ENVIRONMENTS, ns, name, err);
}

static void kst_close(struct task_store *st)
{
    struct kube_store *s = kst_of(st);

    kube_informer_stop(s->queue);
    kube_informer_stop(s->tasks);
    for (size_t i = 0; i < KST_RING; i++) {
        free(s->ring[i].json);
    }
    kube_client_free(s->c);
    pthread_cond_destroy(&s->changed);
    pthread_mutex_destroy(&s->mu);
    free(s->ns);
    free(s);
}

#define KST_OP_ENTRY(NAME) STORE_XOPS_ENTRY(kst, NAME)

static const struct task_store_ops kube_ops = {.name = "kubernetes", STORE_OPS_NAMES(KST_OP_ENTRY)};

#define KST_XOP_ENTRY(RET, NAME, PARAMS) STORE_XOPS_ENTRY(kst, NAME)

static const struct task_store_xops kube_xops = {
    STORE_XOPS_SHARED(KST_XOP_ENTRY)
    /* local_*: NULL, the `local` SCM keeps its threads in the embedded store only */
};

/* Waits (bounded) for INF's first list. */
static int wait_synced(struct kube_informer *inf, const char *what, struct err *err)
{
    for (int i = 0; i < KST_SEEN_MS / 10; i++) {
        if (kube_informer_synced(inf)) {
            return E_OK;
        }
        struct timespec ts = {.tv_sec = 0, .tv_nsec = 10000000L};
        nanosleep(&ts, NULL);
    }
    return err_set(err, E_AGAIN, "kubernetes store: cannot list %s", what);
}

static int start_informers(struct kube_store *s, struct err *err)
{
    struct kube_informer_opts to = KUBE_INFORMER_OPTS_DEFAULTS;
    struct kube_informer_opts qo = KUBE_INFORMER_OPTS_DEFAULTS;
    char rv[KUBE_RV_MAX];
    json_t *items = NULL;
    int rc;

    /* The first list's rv: the feed starts there, and the informer's ADDED events for that
     * list are not changes. */
    rc = kube_list(&items, rv, s->c, &KUBE_AGENTTASKS, NULL, NULL, err);
    json_decref(items);
    if (rc != E_OK) {
        return rc;
    }
    s->prime_rv = strtoll(rv, NULL, 10);
    s->rv = s->prime_rv;
    s->floor = s->prime_rv;
    to.res = &KUBE_AGENTTASKS;
    to.on_event = kst_on_task_event;
    to.userdata = s;
    to.retry_ms = 200;
    rc = kube_informer_start(&s->tasks, s->c, &to, err);
    if (rc == E_OK) {
        qo.res = &KUBE_CONFIGMAPS;
        qo.ns = s->ns;
        qo.label_selector = KST_QUEUE_LABEL;
        qo.on_event = kst_queue_event;
        qo.userdata = s;
        qo.retry_ms = 200;
        rc = kube_informer_start(&s->queue, s->c, &qo, err);
    }
    if (rc == E_OK) {
        rc = wait_synced(s->tasks, "agenttasks", err);
    }
    if (rc == E_OK) {
        rc = wait_synced(s->queue, "configmaps", err);
    }
    return rc;
}

int task_store_kube_open(struct task_store **out, struct kube_client *c, const char *ns,
                         const struct clock *clock, struct err *err)
{
    struct kube_store *s;
    int rc;

    *out = NULL;
    if (ns == NULL || !task_name_valid(ns)) {
        kube_client_free(c);
        return err_set(err, E_INVALID, "kubernetes store: namespace is not a dns label");
    }
    s = xcalloc(1, sizeof(*s));
    s->base.ops = &kube_ops;
    s->base.xops = &kube_xops;
    s->base.clock = clock;
    s->c = c;
    s->ns = xstrdup(ns);
    if (pthread_mutex_init(&s->mu, NULL) != 0 || pthread_cond_init(&s->changed, NULL) != 0) {
        abort();
    }
    rc = start_informers(s, err);
    if (rc != E_OK) {
        kst_close(&s->base);
        return rc;
    }
    *out = &s->base;
    return E_OK;
}
