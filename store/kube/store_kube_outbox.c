/* SPDX-License-Identifier: Apache-2.0 */
/* The outbox and the sticky state of the Kubernetes backend, as ConfigMaps
 * (store_kube_cm.c). A pending entry with the same coalesce key takes a newer body (never the
 * one being sent); sticky state is one ConfigMap per key, sticky-<hash of key>. */
#include <stdlib.h>
#include <string.h>

#include "store/kube/store_kube_int.h"

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
    json_t *e =
        json_loads(kst_cm_str(cm, "entry") != NULL ? kst_cm_str(cm, "entry") : "{}", 0, NULL);
    const char *p = json_string_value(json_object_get(e, "provider"));
    const char *k = json_string_value(json_object_get(e, "kind"));

    memset(out, 0, sizeof(*out));
    out->id = kst_id_of_name(kst_cm_name(cm));
    snprintf(out->provider, sizeof(out->provider), "%s", p != NULL ? p : "");
    snprintf(out->kind, sizeof(out->kind), "%s", k != NULL ? k : "");
    out->project = kst_dupv(e, "project");
    out->number = json_integer_value(json_object_get(e, "number"));
    out->target = kst_dupv(e, "target");
    out->body = kst_cm_str(cm, "body") != NULL ? xstrdup(kst_cm_str(cm, "body")) : NULL;
    out->coalesce_key = kst_dupv(e, "coalesceKey");
    out->installation_id = json_integer_value(json_object_get(e, "installationId"));
    out->not_before_ms = kst_cm_int(cm, "next");
    out->attempts = (int)kst_cm_int(cm, "attempts");
    json_decref(e);
}

struct coalesce {
    const char *body;
    int64_t next; /* the new entry's due time */
};

static int apply_coalesce(json_t *cm, void *ud)
{
    const struct coalesce *c = ud;
    int64_t next = kst_cm_int(cm, "next");

    if (!kst_cm_pending(cm)) {
        return E_CONFLICT; /* sent meanwhile: the caller adds a new entry */
    }
    kst_cm_set(cm, "body", c->body);
    if (kst_cm_int(cm, "attempts") == 0 && c->next < next) {
        kst_cm_set_int(cm, "next", c->next);
    }
    return E_OK;
}

/* A pending entry with KEY other than the one being sent, or NULL (new string). */
static char *coalesce_target(struct kube_store *s, const char *key)
{
    json_t *items = kst_cm_cached(s, KST_Q_OUTBOX), *cm;
    char *out = NULL;
    size_t i;

    pthread_mutex_lock(&s->mu);
    json_array_foreach(items, i, cm)
    {
        struct outbox_entry e;
        if (out != NULL || !kst_cm_pending(cm) ||
            strcmp(kst_cm_name(cm), s->outbox_inflight) == 0) {
            continue;
        }
        outbox_from(&e, cm);
        if (e.coalesce_key != NULL && strcmp(e.coalesce_key, key) == 0) {
            out = xstrdup(kst_cm_name(cm));
        }
        outbox_entry_cleanup(&e);
    }
    pthread_mutex_unlock(&s->mu);
    json_decref(items);
    return out;
}

/* Writes a deferred outbox add: into the pending entry with its coalesce key, else as the
 * new ConfigMap OP.cm. */
static int outbox_write(struct kube_store *s, const json_t *op, struct err *err)
{
    const char *key = json_string_value(json_object_get(op, "key"));
    struct coalesce c = {.body = json_string_value(json_object_get(op, "body")),
                         .next = json_integer_value(json_object_get(op, "next"))};
    int rc;

    if (json_is_true(json_object_get(op, "fixed"))) {
        /* Named after its inbox entry: AlreadyExists is this reply queued (perhaps sent)
         * by a leader that died before marking the entry done. */
        int rc2 = kst_cm_create(s, json_object_get(op, "cm"), err);
        if (rc2 == E_CONFLICT) {
            err_clear(err);
        }
        return rc2 == E_CONFLICT ? E_OK : rc2;
    }
    if (key != NULL) {
        char *target = coalesce_target(s, key);
        rc = target != NULL ? kst_cm_update(s, target, apply_coalesce, &c, err) : E_NOTFOUND;
        free(target);
        if (rc != E_NOTFOUND && rc != E_CONFLICT) {
            return rc;
        }
    }
    return kst_cm_create(s, json_object_get(op, "cm"), err);
}

int kst_txn_outbox_add(int64_t *id_out, struct task_txn *tx, const struct outbox_entry *e,
                       struct err *err)
{
    struct kube_store *s = kst_of(tx->st);
    int64_t now = clock_now_ms(tx->st->clock);
    int64_t next = e->not_before_ms > now ? e->not_before_ms : now;
    char name[64], uid[37];
    char *target = e->coalesce_key != NULL ? coalesce_target(s, e->coalesce_key) : NULL;
    json_t *cm, *text;

    (void)err;
    store_new_uid(uid);
    snprintf(name, sizeof(name), "out-%s", uid);
    if (id_out != NULL) { /* the entry it coalesces into, as far as can be told now */
        *id_out = kst_id_of_name(target != NULL ? target : name);
    }
    free(target);
    cm = kst_cm_new(s, name, KST_Q_OUTBOX);
    text = outbox_json(e);
    json_object_set_new(json_object_get(cm, "data"), "entry",
                        kst_str_take(json_dumps(text, JSON_COMPACT | JSON_SORT_KEYS)));
    json_decref(text);
    kst_cm_set(cm, "body", e->body);
    kst_cm_set(cm, "state", "pending");
    kst_cm_set_int(cm, "seq", now);
    kst_cm_set_int(cm, "next", next);
    kst_cm_set_int(cm, "attempts", 0);
    kst_txn_defer(tx, json_pack("{s:s,s:o,s:s?,s:s?,s:I,s:b,s:s}", "op", "outbox", "cm", cm, "key",
                                e->coalesce_key, "body", e->body, "next", (json_int_t)next, "shown",
                                id_out != NULL, "kind", e->kind));
    return E_OK;
}

static bool is_inbox_edit(const json_t *op)
{
    const char *what = json_string_value(json_object_get(op, "op"));
    const char *q = json_string_value(json_object_get(op, "queue"));

    return what != NULL && strcmp(what, "edit") == 0 && q != NULL && strcmp(q, KST_Q_INBOX) == 0;
}

/* KIND as a DNS label part: lower-case letters and digits, at most 16. */
static void name_kind(char out[17], const char *kind)
{
    size_t n = 0;

    for (const char *p = kind != NULL ? kind : ""; *p != '\0' && n < 16; p++) {
        if ((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9')) {
            out[n++] = *p;
        }
    }
    out[n] = '\0';
}

/* How many outbox ops of LATER[FROM..K) have the kind of LATER[K]. */
static int same_kind_before(const json_t *later, size_t from, size_t k)
{
    const char *kind = json_string_value(json_object_get(json_array_get(later, k), "kind"));
    int n = 0;

    for (size_t j = from; j < k; j++) {
        const json_t *o = json_array_get(later, j);
        const char *kj = json_string_value(json_object_get(o, "kind"));
        if (kind != NULL && kj != NULL && strcmp(kind, kj) == 0 &&
            strcmp(json_string_value(json_object_get(o, "op")), "outbox") == 0) {
            n++;
        }
    }
    return n;
}

/* Names the outbox entries a transaction queued for an inbox entry (those deferred before
 * its done/fail mark, since the previous mark) out-i<inbox id>-<kind>-<n>: a rerun of the same
 * entry after a leader died between the reply's write and the mark writes the same names,
 * and its create is AlreadyExists. Entries whose id the caller was told keep theirs. */
void kst_outbox_name_replies(json_t *later)
{
    size_t from = 0, i;
    json_t *op;

    json_array_foreach(later, i, op)
    {
        if (!is_inbox_edit(op)) {
            continue;
        }
        for (size_t k = from; k < i; k++) {
            json_t *o = json_array_get(later, k);
            const char *what = json_string_value(json_object_get(o, "op"));
            char name[64], kind[17];
            if (what == NULL || strcmp(what, "outbox") != 0 ||
                json_is_true(json_object_get(o, "shown"))) {
                continue;
            }
            name_kind(kind, json_string_value(json_object_get(o, "kind")));
            snprintf(name, sizeof(name), "out-i%llx-%s-%d",
                     (unsigned long long)json_integer_value(json_object_get(op, "id")), kind,
                     same_kind_before(later, from, k));
            json_object_set_new(json_object_get(json_object_get(o, "cm"), "metadata"), "name",
                                json_string(name));
            json_object_set_new(o, "fixed", json_true());
        }
        from = i + 1;
    }
}

int kst_outbox_next(struct outbox_entry *out, int64_t *wait_ms_out, struct task_store *st,
                    struct err *err)
{
    struct kube_store *s = kst_of(st);
    json_t *list;
    int rc = E_OK;

    kst_cm_gc(s, KST_Q_OUTBOX, KST_OUTBOX_KEEP_MS);
    list = kst_cm_due(wait_ms_out, s, KST_Q_OUTBOX, 1, "");

    memset(out, 0, sizeof(*out));
    if (json_array_size(list) == 0) {
        rc = err_set(err, E_NOTFOUND, "no outbox entry is due");
    } else {
        outbox_from(out, json_array_get(list, 0));
        pthread_mutex_lock(&s->mu);
        snprintf(s->outbox_inflight, sizeof(s->outbox_inflight), "%s",
                 kst_cm_name(json_array_get(list, 0)));
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

static int outbox_edit(struct task_store *st, int64_t id, const struct kst_edit *e, struct err *err)
{
    int rc = kst_cm_edit_id(kst_of(st), KST_Q_OUTBOX, id, e, err);

    kst_outbox_release(st);
    return rc;
}

int kst_outbox_done(struct task_store *st, int64_t id, const char *result, struct err *err)
{
    struct kst_edit e = {.state = "done", .next_ms = -1, .result = result, .set_result = true};

    return outbox_edit(st, id, &e, err);
}

int kst_outbox_defer(struct task_store *st, int64_t id, int64_t delay_ms, const char *why,
                     struct err *err)
{
    struct kst_edit e = {
        .next_ms = clock_now_ms(st->clock) + delay_ms, .error = why, .set_error = true};

    return outbox_edit(st, id, &e, err);
}

int kst_outbox_retry(struct task_store *st, int64_t id, int64_t delay_ms, bool failed,
                     const char *error, struct err *err)
{
    struct kst_edit e = {.state = failed ? "failed" : "pending",
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
    char *name = kst_cm_name_of_id(s, KST_Q_OUTBOX, id);
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
    snprintf(state_out, 16, "%s", kst_cm_str(cm, "state") != NULL ? kst_cm_str(cm, "state") : "");
    if (kst_cm_str(cm, "result") != NULL && strcmp(state_out, "pending") != 0) {
        *out = xstrdup(kst_cm_str(cm, "result"));
    }
    json_decref(cm);
    return E_OK;
}

int kst_outbox_depth(int64_t *out, struct task_store *st, struct err *err)
{
    (void)err;
    return kst_cm_count_pending(out, kst_of(st), KST_Q_OUTBOX);
}

/* --- sticky state: ConfigMap sticky-<hash of key> ------------------------------------- */

static void sticky_name(char out[64], const char *key)
{
    snprintf(out, 64, "sticky-%016llx", (unsigned long long)kst_fnv(key, 14695981039346656037ULL));
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
    out->comment_id =
        kst_cm_str(cm, "commentId") != NULL ? xstrdup(kst_cm_str(cm, "commentId")) : NULL;
    snprintf(out->body_hash, sizeof(out->body_hash), "%s",
             kst_cm_str(cm, "hash") != NULL ? kst_cm_str(cm, "hash") : "");
    snprintf(out->phase, sizeof(out->phase), "%s",
             kst_cm_str(cm, "phase") != NULL ? kst_cm_str(cm, "phase") : "");
    out->last_sent_ms = kst_cm_int(cm, "lastSentMs");
    json_decref(cm);
    return E_OK;
}

struct note {
    const char *hash, *phase;
};

static int apply_note(json_t *cm, void *ud)
{
    const struct note *n = ud;

    kst_cm_set(cm, "hash", n->hash);
    kst_cm_set(cm, "phase", n->phase);
    return E_OK;
}

int kst_txn_sticky_note(struct task_txn *tx, const char *key, const char *provider,
                        const char *project, int64_t number, const char *ns, const char *name,
                        const char *hash, const char *phase, struct err *err)
{
    struct kube_store *s = kst_of(tx->st);
    char cmname[64];
    json_t *cm;

    (void)err;
    sticky_name(cmname, key);
    cm = kst_cm_new(s, cmname, KST_Q_STICKY);
    kst_cm_set(cm, "key", key);
    kst_cm_set(cm, "provider", provider);
    kst_cm_set(cm, "project", project);
    kst_cm_set_int(cm, "number", number);
    kst_cm_set(cm, "namespace", ns);
    kst_cm_set(cm, "name", name);
    kst_cm_set(cm, "hash", hash);
    kst_cm_set(cm, "phase", phase);
    kst_txn_defer(tx, json_pack("{s:s,s:o}", "op", "sticky", "cm", cm));
    return E_OK;
}

/* Writes a deferred sticky note: creates the ConfigMap, or updates hash and phase. */
static int sticky_write(struct kube_store *s, const json_t *op, struct err *err)
{
    const json_t *cm = json_object_get(op, "cm");
    struct note n = {.hash = kst_cm_str(cm, "hash"), .phase = kst_cm_str(cm, "phase")};
    int rc = kst_cm_create(s, cm, err);

    if (rc == E_CONFLICT) {
        rc = kst_cm_update(s, kst_cm_name(cm), apply_note, &n, err);
    }
    return rc;
}

int kst_queue_apply(struct kube_store *s, const json_t *op, struct err *err)
{
    const char *what = json_string_value(json_object_get(op, "op"));

    if (what != NULL && strcmp(what, "outbox") == 0) {
        return outbox_write(s, op, err);
    }
    if (what != NULL && strcmp(what, "sticky") == 0) {
        return sticky_write(s, op, err);
    }
    {
        struct kst_edit e = {
            .state = json_string_value(json_object_get(op, "state")),
            .next_ms = -1,
            .attempts_add = (int)json_integer_value(json_object_get(op, "attempts")),
            .error = json_string_value(json_object_get(op, "error")),
            .set_error = true,
        };
        return kst_cm_edit_id(s, json_string_value(json_object_get(op, "queue")),
                              json_integer_value(json_object_get(op, "id")), &e, err);
    }
}

struct sent {
    const char *comment_id;
    int64_t now;
};

static int apply_sent(json_t *cm, void *ud)
{
    const struct sent *x = ud;

    kst_cm_set(cm, "commentId", x->comment_id);
    kst_cm_set_int(cm, "lastSentMs", x->now);
    return E_OK;
}

int kst_sticky_sent(struct task_store *st, const char *key, const char *comment_id, struct err *err)
{
    struct sent x = {.comment_id = comment_id, .now = clock_now_ms(st->clock)};
    char name[64];

    sticky_name(name, key);
    return kst_cm_update(kst_of(st), name, apply_sent, &x, err);
}

int kst_sticky_list(json_t **out, struct task_store *st, const char *provider, const char *project,
                    int64_t number, struct err *err)
{
    json_t *items = kst_cm_cached(kst_of(st), KST_Q_STICKY), *cm;
    size_t i;

    (void)err;
    *out = json_object();
    json_array_foreach(items, i, cm)
    {
        const char *p = kst_cm_str(cm, "provider"), *pr = kst_cm_str(cm, "project");
        if (p != NULL && pr != NULL && strcmp(p, provider) == 0 && strcmp(pr, project) == 0 &&
            kst_cm_int(cm, "number") == number && kst_cm_str(cm, "commentId") != NULL) {
            char *k = xasprintf("%s/%s", kst_cm_str(cm, "namespace"), kst_cm_str(cm, "name"));
            json_object_set_new(*out, k, json_string(kst_cm_str(cm, "commentId")));
            free(k);
        }
    }
    json_decref(items);
    return E_OK;
}
