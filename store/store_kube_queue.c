/* SPDX-License-Identifier: Apache-2.0 */
/* The inbox, outbox and sticky state of the Kubernetes backend: one ConfigMap per entry in
 * the store's namespace, labelled divergedev.com/queue=inbox|outbox|sticky and followed by
 * an informer (docs/cluster-mode.md "Inbox and outbox: decision"). Every replica accepts
 * webhooks and writes the entry to the API server before answering 202; only the leader's
 * workers take entries. The inbox entry's name is derived from (provider, project, comment
 * id), so a redelivery's create is AlreadyExists: a duplicate. An entry's id is a 53-bit
 * hash of its name; arrival order is its data.seq (ms, then name). Entries are kept once
 * done (state done/failed) so redeliveries stay duplicates. */
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "store/store_kube_int.h"

#define Q_INBOX "inbox"
#define Q_OUTBOX "outbox"
#define Q_STICKY "sticky"

/* A JSON string of S, which it frees. */
static json_t *str_take(char *s)
{
    json_t *j = json_string(s);

    free(s);
    return j;
}

static uint64_t fnv(const char *s, uint64_t h)
{
    for (; *s != '\0'; s++) {
        h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    }
    return (h ^ 0xff) * 1099511628211ULL; /* field separator */
}

static int64_t id_of_name(const char *name)
{
    int64_t id = (int64_t)(fnv(name, 14695981039346656037ULL) & ((1ULL << 53) - 1));
    return id == 0 ? 1 : id;
}

static const char *cm_name(const json_t *cm)
{
    return json_string_value(json_object_get(json_object_get(cm, "metadata"), "name"));
}

static const char *cm_str(const json_t *cm, const char *key)
{
    return json_string_value(json_object_get(json_object_get(cm, "data"), key));
}

static int64_t cm_int(const json_t *cm, const char *key)
{
    const char *v = cm_str(cm, key);
    return v != NULL ? (int64_t)strtoll(v, NULL, 10) : 0;
}

static void cm_set(json_t *cm, const char *key, const char *value)
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

static void cm_set_int(json_t *cm, const char *key, int64_t v)
{
    char buf[32];

    snprintf(buf, sizeof(buf), "%lld", (long long)v);
    cm_set(cm, key, buf);
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
    if (q != NULL && strcmp(q, Q_INBOX) == 0) {
        s->inbox_gen++;
    } else if (q != NULL && strcmp(q, Q_OUTBOX) == 0) {
        s->outbox_gen++;
    }
    pthread_cond_broadcast(&s->changed);
    pthread_mutex_unlock(&s->mu);
}

static json_t *new_cm(struct kube_store *s, const char *name, const char *queue)
{
    return json_pack("{s:s,s:s,s:{s:s,s:s,s:{s:s}},s:{}}", "apiVersion", "v1", "kind", "ConfigMap",
                     "metadata", "name", name, "namespace", s->ns, "labels", KST_QUEUE_LABEL, queue,
                     "data");
}

/* Creates CM; *rv_out its rv. E_CONFLICT when the name exists. */
static int cm_create(struct kube_store *s, const json_t *cm, struct err *err)
{
    json_t *res = NULL;
    int rc = kube_create(&res, s->c, &KUBE_CONFIGMAPS, s->ns, cm, err);

    if (rc == E_OK) {
        kst_wait_seen(s, kst_rv_of(res), true);
    }
    json_decref(res);
    return rc;
}

typedef int (*cm_edit_fn)(json_t *cm, void *ud);

/* Reads the ConfigMap NAME, lets FN change it (FN returning non-zero: no write, that code)
 * and replaces it rv-guarded, retrying conflicts. */
static int cm_update(struct kube_store *s, const char *name, cm_edit_fn fn, void *ud,
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
    int64_t sx = cm_int(x, "seq"), sy = cm_int(y, "seq");

    if (sx != sy) {
        return sx < sy ? -1 : 1;
    }
    return strcmp(cm_name(x), cm_name(y));
}

static json_t *cached(struct kube_store *s, const char *queue)
{
    char rv[KUBE_RV_MAX];
    json_t *all = kube_informer_list(rv, NULL, s->queue), *out = json_array(), *cm;
    json_t **v = xcalloc(json_array_size(all) + 1, sizeof(*v));
    size_t i, n = 0;

    json_array_foreach(all, i, cm)
    {
        const char *q = cm_queue(cm);
        if (q != NULL && strcmp(q, queue) == 0 && cm_name(cm) != NULL) {
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
static char *name_of_id(struct kube_store *s, const char *queue, int64_t id)
{
    json_t *items = cached(s, queue), *cm;
    char *out = NULL;
    size_t i;

    json_array_foreach(items, i, cm)
    {
        if (id_of_name(cm_name(cm)) == id) {
            out = xstrdup(cm_name(cm));
            break;
        }
    }
    json_decref(items);
    return out;
}

static bool pending(const json_t *cm)
{
    const char *st = cm_str(cm, "state");
    return st != NULL && strcmp(st, "pending") == 0;
}

/* --- state changes of one entry ---------------------------------------------------- */

struct edit {
    const char *state; /* new state, or NULL to keep */
    int64_t next_ms;   /* new next, or -1 to keep */
    int attempts_add;
    const char *error; /* or NULL */
    const char *result;
    bool set_error, set_result;
};

static int apply_edit(json_t *cm, void *ud)
{
    const struct edit *e = ud;

    if (e->state != NULL) {
        cm_set(cm, "state", e->state);
    }
    if (e->next_ms >= 0) {
        cm_set_int(cm, "next", e->next_ms);
    }
    cm_set_int(cm, "attempts", cm_int(cm, "attempts") + e->attempts_add);
    if (e->set_error) {
        cm_set(cm, "error", e->error);
    }
    if (e->set_result) {
        cm_set(cm, "result", e->result);
    }
    return E_OK;
}

static int edit_id(struct kube_store *s, const char *queue, int64_t id, const struct edit *e,
                   struct err *err)
{
    char *name = name_of_id(s, queue, id);
    int rc;

    if (name == NULL) {
        return err_set(err, E_NOTFOUND, "%s entry %lld not found", queue, (long long)id);
    }
    rc = cm_update(s, name, apply_edit, (void *)(uintptr_t)e, err);
    free(name);
    return rc;
}

/* --- inbox ------------------------------------------------------------------------- */

static json_t *inbox_json(const struct inbox_entry *e)
{
    return json_pack("{s:s,s:s?,s:s,s:I,s:s,s:s,s:s?,s:I,s:I,s:s,s:s?}", "provider", e->provider,
                     "deliveryId", e->delivery_id, "project", e->project, "number",
                     (json_int_t)e->number, "commentId", e->comment_id, "author", e->author,
                     "authorAssociation", e->author_association, "authorId",
                     (json_int_t)e->author_id, "installationId", (json_int_t)e->installation_id,
                     "body", e->body, "extra", e->extra);
}

static char *dupv(const json_t *o, const char *k)
{
    const char *v = json_string_value(json_object_get(o, k));
    return v != NULL ? xstrdup(v) : NULL;
}

static void inbox_from(struct inbox_entry *out, const json_t *cm)
{
    json_t *e = json_loads(cm_str(cm, "entry") != NULL ? cm_str(cm, "entry") : "{}", 0, NULL);

    memset(out, 0, sizeof(*out));
    out->id = id_of_name(cm_name(cm));
    snprintf(out->provider, sizeof(out->provider), "%s",
             json_string_value(json_object_get(e, "provider")) != NULL
                 ? json_string_value(json_object_get(e, "provider"))
                 : "");
    out->delivery_id = dupv(e, "deliveryId");
    out->project = dupv(e, "project");
    out->number = json_integer_value(json_object_get(e, "number"));
    out->comment_id = dupv(e, "commentId");
    out->author = dupv(e, "author");
    out->author_association = dupv(e, "authorAssociation");
    out->author_id = json_integer_value(json_object_get(e, "authorId"));
    out->installation_id = json_integer_value(json_object_get(e, "installationId"));
    out->body = dupv(e, "body");
    out->extra = dupv(e, "extra");
    out->attempts = (int)cm_int(cm, "attempts");
    json_decref(e);
}

static bool same_delivery(const json_t *cm, const char *delivery_id)
{
    json_t *e;
    bool same;

    if (delivery_id == NULL || cm_str(cm, "entry") == NULL) {
        return false;
    }
    e = json_loads(cm_str(cm, "entry"), 0, NULL);
    same = json_is_string(json_object_get(e, "deliveryId")) &&
           strcmp(json_string_value(json_object_get(e, "deliveryId")), delivery_id) == 0;
    json_decref(e);
    return same;
}

int kst_inbox_add(bool *duplicate_out, struct task_store *st, const struct inbox_entry *e,
                  struct err *err)
{
    struct kube_store *s = kst_of(st);
    uint64_t h =
        fnv(e->comment_id != NULL ? e->comment_id : "",
            fnv(e->project != NULL ? e->project : "", fnv(e->provider, 14695981039346656037ULL)));
    char name[64];
    json_t *items = cached(s, Q_INBOX), *cm, *text;
    size_t i;
    int rc;

    *duplicate_out = false;
    json_array_foreach(items, i, cm)
    {
        *duplicate_out = *duplicate_out || same_delivery(cm, e->delivery_id);
    }
    json_decref(items);
    if (*duplicate_out) {
        return E_OK;
    }
    snprintf(name, sizeof(name), "in-%s-%016llx", e->provider, (unsigned long long)h);
    cm = new_cm(s, name, Q_INBOX);
    text = inbox_json(e);
    json_object_set_new(json_object_get(cm, "data"), "entry",
                        str_take(json_dumps(text, JSON_COMPACT | JSON_SORT_KEYS)));
    json_decref(text);
    cm_set(cm, "state", "pending");
    cm_set_int(cm, "seq", clock_now_ms(st->clock));
    cm_set_int(cm, "next", 0);
    cm_set_int(cm, "attempts", 0);
    rc = cm_create(s, cm, err);
    json_decref(cm);
    if (rc == E_CONFLICT) {
        *duplicate_out = true;
        rc = E_OK;
    }
    return rc;
}

static void pr_key(char *out, size_t n, const json_t *cm)
{
    json_t *e = json_loads(cm_str(cm, "entry") != NULL ? cm_str(cm, "entry") : "{}", 0, NULL);

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

/* The due pending entries of QUEUE in order, at most MAX, each PR's from its oldest pending
 * one and only while they are due (so a PR's order holds); SKIP (or "") is never taken.
 * *wait_ms_out: until the next not-due one, -1 when nothing else is pending. New array. */
static json_t *due(int64_t *wait_ms_out, struct kube_store *s, const char *queue, size_t max,
                   const char *skip)
{
    json_t *items = cached(s, queue), *out = json_array(), *blocked = json_object(), *cm;
    int64_t now = clock_now_ms(s->base.clock);
    size_t i;

    *wait_ms_out = -1;
    json_array_foreach(items, i, cm)
    {
        char key[600];
        int64_t next = cm_int(cm, "next");
        if (!pending(cm)) {
            continue;
        }
        pr_key(key, sizeof(key), cm);
        if (json_object_get(blocked, key) != NULL) {
            continue;
        }
        if (next > now || strcmp(cm_name(cm), skip) == 0 || json_array_size(out) >= max) {
            json_object_set_new(blocked, key, json_true());
            if (next > now && (*wait_ms_out < 0 || next - now < *wait_ms_out)) {
                *wait_ms_out = next - now;
            } else if (next <= now && *wait_ms_out < 0) {
                *wait_ms_out = 0;
            }
            continue;
        }
        json_array_append(out, cm);
    }
    json_decref(blocked);
    json_decref(items);
    return out;
}

int kst_inbox_next_batch(struct inbox_entry *out, size_t max, size_t *n_out, int64_t *wait_ms_out,
                         struct task_store *st, struct err *err)
{
    json_t *list = due(wait_ms_out, kst_of(st), Q_INBOX, max, ""), *cm;
    size_t i;

    memset(out, 0, max * sizeof(*out));
    *n_out = json_array_size(list);
    json_array_foreach(list, i, cm)
    {
        inbox_from(&out[i], cm);
    }
    json_decref(list);
    if (*n_out == 0) {
        return err_set(err, E_NOTFOUND, "no inbox entry is due");
    }
    *wait_ms_out = 0;
    return E_OK;
}

int kst_inbox_retry(struct task_store *st, int64_t id, int64_t delay_ms, bool failed,
                    const char *error, struct err *err)
{
    struct edit e = {.state = failed ? "failed" : "pending",
                     .next_ms = clock_now_ms(st->clock) + delay_ms,
                     .attempts_add = 1,
                     .error = error,
                     .set_error = true};

    return edit_id(kst_of(st), Q_INBOX, id, &e, err);
}

int kst_txn_inbox_fail(struct task_txn *tx, int64_t id, const char *error, struct err *err)
{
    struct edit e = {
        .state = "failed", .next_ms = -1, .attempts_add = 1, .error = error, .set_error = true};

    return edit_id(kst_of(tx->st), Q_INBOX, id, &e, err);
}

int kst_txn_inbox_done(struct task_txn *tx, int64_t id, struct err *err)
{
    struct edit e = {.state = "done", .next_ms = -1, .set_error = true};

    return edit_id(kst_of(tx->st), Q_INBOX, id, &e, err);
}

static int count_pending(int64_t *out, struct kube_store *s, const char *queue)
{
    json_t *items = cached(s, queue), *cm;
    size_t i;

    *out = 0;
    json_array_foreach(items, i, cm)
    {
        *out += pending(cm);
    }
    json_decref(items);
    return E_OK;
}

int kst_inbox_depth(int64_t *out, struct task_store *st, struct err *err)
{
    (void)err;
    return count_pending(out, kst_of(st), Q_INBOX);
}

int kst_inbox_installation(int64_t *out, struct task_store *st, const char *provider,
                           const char *project, struct err *err)
{
    json_t *items = cached(kst_of(st), Q_INBOX), *cm;
    size_t i;

    (void)err;
    *out = 0;
    json_array_foreach(items, i, cm) /* arrival order: the last match is the newest */
    {
        struct inbox_entry e;
        inbox_from(&e, cm);
        if (strcmp(e.provider, provider) == 0 && e.project != NULL &&
            strcmp(e.project, project) == 0 && e.installation_id != 0) {
            *out = e.installation_id;
        }
        inbox_entry_cleanup(&e);
    }
    json_decref(items);
    return E_OK;
}

/* --- outbox ------------------------------------------------------------------------ */

static json_t *outbox_json(const struct outbox_entry *e)
{
    return json_pack("{s:s,s:s,s:s,s:I,s:s?,s:s?,s:I}", "provider", e->provider, "kind", e->kind,
                     "project", e->project, "number", (json_int_t)e->number, "target", e->target,
                     "coalesceKey", e->coalesce_key, "installationId",
                     (json_int_t)e->installation_id);
}

static void outbox_from(struct outbox_entry *out, const json_t *cm)
{
    json_t *e = json_loads(cm_str(cm, "entry") != NULL ? cm_str(cm, "entry") : "{}", 0, NULL);
    const char *p = json_string_value(json_object_get(e, "provider"));
    const char *k = json_string_value(json_object_get(e, "kind"));

    memset(out, 0, sizeof(*out));
    out->id = id_of_name(cm_name(cm));
    snprintf(out->provider, sizeof(out->provider), "%s", p != NULL ? p : "");
    snprintf(out->kind, sizeof(out->kind), "%s", k != NULL ? k : "");
    out->project = dupv(e, "project");
    out->number = json_integer_value(json_object_get(e, "number"));
    out->target = dupv(e, "target");
    out->body = cm_str(cm, "body") != NULL ? xstrdup(cm_str(cm, "body")) : NULL;
    out->coalesce_key = dupv(e, "coalesceKey");
    out->installation_id = json_integer_value(json_object_get(e, "installationId"));
    out->not_before_ms = cm_int(cm, "next");
    out->attempts = (int)cm_int(cm, "attempts");
    json_decref(e);
}

struct coalesce {
    const char *body;
    int64_t next; /* the new entry's due time */
};

static int apply_coalesce(json_t *cm, void *ud)
{
    const struct coalesce *c = ud;
    int64_t next = cm_int(cm, "next");

    if (!pending(cm)) {
        return E_CONFLICT; /* sent meanwhile: the caller adds a new entry */
    }
    cm_set(cm, "body", c->body);
    if (cm_int(cm, "attempts") == 0 && c->next < next) {
        cm_set_int(cm, "next", c->next);
    }
    return E_OK;
}

/* A pending entry with KEY other than the one being sent, or NULL (new string). */
static char *coalesce_target(struct kube_store *s, const char *key)
{
    json_t *items = cached(s, Q_OUTBOX), *cm;
    char *out = NULL;
    size_t i;

    pthread_mutex_lock(&s->mu);
    json_array_foreach(items, i, cm)
    {
        struct outbox_entry e;
        if (out != NULL || !pending(cm) || strcmp(cm_name(cm), s->outbox_inflight) == 0) {
            continue;
        }
        outbox_from(&e, cm);
        if (e.coalesce_key != NULL && strcmp(e.coalesce_key, key) == 0) {
            out = xstrdup(cm_name(cm));
        }
        outbox_entry_cleanup(&e);
    }
    pthread_mutex_unlock(&s->mu);
    json_decref(items);
    return out;
}

int kst_txn_outbox_add(int64_t *id_out, struct task_txn *tx, const struct outbox_entry *e,
                       struct err *err)
{
    struct kube_store *s = kst_of(tx->st);
    int64_t now = clock_now_ms(tx->st->clock);
    struct coalesce c = {.body = e->body, .next = e->not_before_ms > now ? e->not_before_ms : now};
    char name[64], uid[37];
    json_t *cm, *text;
    int rc;

    if (id_out != NULL) {
        *id_out = 0;
    }
    if (e->coalesce_key != NULL) {
        char *target = coalesce_target(s, e->coalesce_key);
        rc = target != NULL ? cm_update(s, target, apply_coalesce, &c, err) : E_NOTFOUND;
        if (rc == E_OK && id_out != NULL) {
            *id_out = id_of_name(target);
        }
        free(target);
        if (rc != E_NOTFOUND && rc != E_CONFLICT) {
            return rc;
        }
    }
    sqlst_new_uid(uid);
    snprintf(name, sizeof(name), "out-%s", uid);
    cm = new_cm(s, name, Q_OUTBOX);
    text = outbox_json(e);
    cm_set(cm, "entry", NULL);
    json_object_set_new(json_object_get(cm, "data"), "entry",
                        str_take(json_dumps(text, JSON_COMPACT | JSON_SORT_KEYS)));
    json_decref(text);
    cm_set(cm, "body", e->body);
    cm_set(cm, "state", "pending");
    cm_set_int(cm, "seq", now);
    cm_set_int(cm, "next", c.next);
    cm_set_int(cm, "attempts", 0);
    rc = cm_create(s, cm, err);
    json_decref(cm);
    if (rc == E_OK && id_out != NULL) {
        *id_out = id_of_name(name);
    }
    return rc;
}

int kst_outbox_next(struct outbox_entry *out, int64_t *wait_ms_out, struct task_store *st,
                    struct err *err)
{
    struct kube_store *s = kst_of(st);
    json_t *list = due(wait_ms_out, s, Q_OUTBOX, 1, "");
    int rc = E_OK;

    memset(out, 0, sizeof(*out));
    if (json_array_size(list) == 0) {
        rc = err_set(err, E_NOTFOUND, "no outbox entry is due");
    } else {
        outbox_from(out, json_array_get(list, 0));
        pthread_mutex_lock(&s->mu);
        snprintf(s->outbox_inflight, sizeof(s->outbox_inflight), "%s",
                 cm_name(json_array_get(list, 0)));
        pthread_mutex_unlock(&s->mu);
        *wait_ms_out = 0;
    }
    json_decref(list);
    return rc;
}

void kst_outbox_release(struct task_store *st)
{
    struct kube_store *s = kst_of(st);

    pthread_mutex_lock(&s->mu);
    s->outbox_inflight[0] = '\0';
    pthread_mutex_unlock(&s->mu);
}

static int outbox_edit(struct task_store *st, int64_t id, const struct edit *e, struct err *err)
{
    int rc = edit_id(kst_of(st), Q_OUTBOX, id, e, err);

    kst_outbox_release(st);
    return rc;
}

int kst_outbox_done(struct task_store *st, int64_t id, const char *result, struct err *err)
{
    struct edit e = {.state = "done", .next_ms = -1, .result = result, .set_result = true};

    return outbox_edit(st, id, &e, err);
}

int kst_outbox_defer(struct task_store *st, int64_t id, int64_t delay_ms, const char *why,
                     struct err *err)
{
    struct edit e = {
        .next_ms = clock_now_ms(st->clock) + delay_ms, .error = why, .set_error = true};

    return outbox_edit(st, id, &e, err);
}

int kst_outbox_retry(struct task_store *st, int64_t id, int64_t delay_ms, bool failed,
                     const char *error, struct err *err)
{
    struct edit e = {.state = failed ? "failed" : "pending",
                     .next_ms = clock_now_ms(st->clock) + delay_ms,
                     .attempts_add = 1,
                     .error = error,
                     .set_error = true};

    return outbox_edit(st, id, &e, err);
}

int kst_outbox_result(char **out, char state_out[16], struct task_store *st, int64_t id,
                      struct err *err)
{
    struct kube_store *s = kst_of(st);
    char *name = name_of_id(s, Q_OUTBOX, id);
    json_t *cm = NULL;
    int rc;

    *out = NULL;
    state_out[0] = '\0';
    if (name == NULL) {
        return err_set(err, E_NOTFOUND, "outbox entry %lld not found", (long long)id);
    }
    rc = kube_informer_get(&cm, s->queue, s->ns, name);
    free(name);
    if (rc != E_OK) {
        return err_set(err, E_NOTFOUND, "outbox entry %lld not found", (long long)id);
    }
    snprintf(state_out, 16, "%s", cm_str(cm, "state") != NULL ? cm_str(cm, "state") : "");
    if (cm_str(cm, "result") != NULL && strcmp(state_out, "pending") != 0) {
        *out = xstrdup(cm_str(cm, "result"));
    }
    json_decref(cm);
    return E_OK;
}

int kst_outbox_depth(int64_t *out, struct task_store *st, struct err *err)
{
    (void)err;
    return count_pending(out, kst_of(st), Q_OUTBOX);
}

int64_t kst_queue_gen(struct task_store *st, bool outbox)
{
    struct kube_store *s = kst_of(st);
    int64_t g;

    pthread_mutex_lock(&s->mu);
    g = outbox ? s->outbox_gen : s->inbox_gen;
    pthread_mutex_unlock(&s->mu);
    return g;
}

void kst_queue_wait(struct task_store *st, bool outbox, int64_t since_gen, int64_t timeout_ms)
{
    struct kube_store *s = kst_of(st);
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += (time_t)(timeout_ms / 1000);
    ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&s->mu);
    while ((outbox ? s->outbox_gen : s->inbox_gen) <= since_gen) {
        if (pthread_cond_timedwait(&s->changed, &s->mu, &ts) != 0) {
            break;
        }
    }
    pthread_mutex_unlock(&s->mu);
}

/* --- sticky state: ConfigMap sticky-<hash of key> ------------------------------------- */

static void sticky_name(char out[64], const char *key)
{
    snprintf(out, 64, "sticky-%016llx", (unsigned long long)fnv(key, 14695981039346656037ULL));
}

int kst_sticky_get(struct sticky_state *out, struct task_store *st, const char *key,
                   struct err *err)
{
    struct kube_store *s = kst_of(st);
    char name[64];
    json_t *cm = NULL;

    memset(out, 0, sizeof(*out));
    sticky_name(name, key);
    if (kube_informer_get(&cm, s->queue, s->ns, name) != E_OK) {
        return err_set(err, E_NOTFOUND, "no sticky state");
    }
    out->comment_id = cm_str(cm, "commentId") != NULL ? xstrdup(cm_str(cm, "commentId")) : NULL;
    snprintf(out->body_hash, sizeof(out->body_hash), "%s",
             cm_str(cm, "hash") != NULL ? cm_str(cm, "hash") : "");
    snprintf(out->phase, sizeof(out->phase), "%s",
             cm_str(cm, "phase") != NULL ? cm_str(cm, "phase") : "");
    out->last_sent_ms = cm_int(cm, "lastSentMs");
    json_decref(cm);
    return E_OK;
}

struct note {
    const char *hash, *phase;
};

static int apply_note(json_t *cm, void *ud)
{
    const struct note *n = ud;

    cm_set(cm, "hash", n->hash);
    cm_set(cm, "phase", n->phase);
    return E_OK;
}

int kst_txn_sticky_note(struct task_txn *tx, const char *key, const char *provider,
                        const char *project, int64_t number, const char *ns, const char *name,
                        const char *hash, const char *phase, struct err *err)
{
    struct kube_store *s = kst_of(tx->st);
    struct note n = {.hash = hash, .phase = phase};
    char cmname[64];
    json_t *cm;
    int rc;

    sticky_name(cmname, key);
    cm = new_cm(s, cmname, Q_STICKY);
    cm_set(cm, "key", key);
    cm_set(cm, "provider", provider);
    cm_set(cm, "project", project);
    cm_set_int(cm, "number", number);
    cm_set(cm, "namespace", ns);
    cm_set(cm, "name", name);
    cm_set(cm, "hash", hash);
    cm_set(cm, "phase", phase);
    rc = cm_create(s, cm, err);
    json_decref(cm);
    if (rc == E_CONFLICT) {
        rc = cm_update(s, cmname, apply_note, &n, err);
    }
    return rc;
}

struct sent {
    const char *comment_id;
    int64_t now;
};

static int apply_sent(json_t *cm, void *ud)
{
    const struct sent *x = ud;

    cm_set(cm, "commentId", x->comment_id);
    cm_set_int(cm, "lastSentMs", x->now);
    return E_OK;
}

int kst_sticky_sent(struct task_store *st, const char *key, const char *comment_id, struct err *err)
{
    struct sent x = {.comment_id = comment_id, .now = clock_now_ms(st->clock)};
    char name[64];

    sticky_name(name, key);
    return cm_update(kst_of(st), name, apply_sent, &x, err);
}

int kst_sticky_list(json_t **out, struct task_store *st, const char *provider, const char *project,
                    int64_t number, struct err *err)
{
    json_t *items = cached(kst_of(st), Q_STICKY), *cm;
    size_t i;

    (void)err;
    *out = json_object();
    json_array_foreach(items, i, cm)
    {
        const char *p = cm_str(cm, "provider"), *pr = cm_str(cm, "project");
        if (p != NULL && pr != NULL && strcmp(p, provider) == 0 && strcmp(pr, project) == 0 &&
            cm_int(cm, "number") == number && cm_str(cm, "commentId") != NULL) {
            char *k = xasprintf("%s/%s", cm_str(cm, "namespace"), cm_str(cm, "name"));
            json_object_set_new(*out, k, json_string(cm_str(cm, "commentId")));
            free(k);
        }
    }
    json_decref(items);
    return E_OK;
}
