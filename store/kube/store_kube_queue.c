/* SPDX-License-Identifier: Apache-2.0 */
/* The inbox of the Kubernetes backend: every replica accepts webhooks and writes the entry
 * (a ConfigMap, store_kube_cm.c) to the API server before answering 202; only the leader's
 * bot takes entries. The entry's name is derived from (provider, project, comment id), so a
 * redelivery's create is AlreadyExists: a duplicate. Entries are kept once done (state
 * done/failed) so that redeliveries stay duplicates. */
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "store/kube/store_kube_int.h"

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

static void inbox_from(struct inbox_entry *out, const json_t *cm)
{
    json_t *e =
        json_loads(kst_cm_str(cm, "entry") != NULL ? kst_cm_str(cm, "entry") : "{}", 0, NULL);

    memset(out, 0, sizeof(*out));
    out->id = kst_id_of_name(kst_cm_name(cm));
    snprintf(out->provider, sizeof(out->provider), "%s",
             json_string_value(json_object_get(e, "provider")) != NULL
                 ? json_string_value(json_object_get(e, "provider"))
                 : "");
    out->delivery_id = kst_dupv(e, "deliveryId");
    out->project = kst_dupv(e, "project");
    out->number = json_integer_value(json_object_get(e, "number"));
    out->comment_id = kst_dupv(e, "commentId");
    out->author = kst_dupv(e, "author");
    out->author_association = kst_dupv(e, "authorAssociation");
    out->author_id = json_integer_value(json_object_get(e, "authorId"));
    out->installation_id = json_integer_value(json_object_get(e, "installationId"));
    out->body = kst_dupv(e, "body");
    out->extra = kst_dupv(e, "extra");
    out->attempts = (int)kst_cm_int(cm, "attempts");
    json_decref(e);
}

static bool same_delivery(const json_t *cm, const char *delivery_id)
{
    json_t *e;
    bool same;

    if (delivery_id == NULL || kst_cm_str(cm, "entry") == NULL) {
        return false;
    }
    e = json_loads(kst_cm_str(cm, "entry"), 0, NULL);
    same = json_is_string(json_object_get(e, "deliveryId")) &&
           strcmp(json_string_value(json_object_get(e, "deliveryId")), delivery_id) == 0;
    json_decref(e);
    return same;
}

int kst_inbox_add(bool *duplicate_out, struct task_store *st, const struct inbox_entry *e,
                  struct err *err)
{
    struct kube_store *s = kst_of(st);
    uint64_t h = kst_fnv(e->comment_id != NULL ? e->comment_id : "",
                         kst_fnv(e->project != NULL ? e->project : "",
                                 kst_fnv(e->provider, 14695981039346656037ULL)));
    char name[64];
    json_t *items = kst_cm_cached(s, KST_Q_INBOX), *cm, *text;
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
    cm = kst_cm_new(s, name, KST_Q_INBOX);
    text = inbox_json(e);
    json_object_set_new(json_object_get(cm, "data"), "entry",
                        kst_str_take(json_dumps(text, JSON_COMPACT | JSON_SORT_KEYS)));
    json_decref(text);
    kst_cm_set(cm, "state", "pending");
    kst_cm_set_int(cm, "seq", clock_now_ms(st->clock));
    kst_cm_set_int(cm, "next", 0);
    kst_cm_set_int(cm, "attempts", 0);
    rc = kst_cm_create(s, cm, err);
    json_decref(cm);
    if (rc == E_CONFLICT) {
        *duplicate_out = true;
        rc = E_OK;
    }
    return rc;
}

int kst_inbox_next_batch(struct inbox_entry *out, size_t max, size_t *n_out, int64_t *wait_ms_out,
                         struct task_store *st, struct err *err)
{
    json_t *list, *cm;
    size_t i;

    kst_cm_gc(kst_of(st), KST_Q_INBOX, KST_INBOX_KEEP_MS); /* only the leader's bot asks */
    list = kst_cm_due(wait_ms_out, kst_of(st), KST_Q_INBOX, max, "");

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
    struct kst_edit e = {.state = failed ? "failed" : "pending",
                         .next_ms = clock_now_ms(st->clock) + delay_ms,
                         .attempts_add = 1,
                         .error = error,
                         .set_error = true};

    return kst_cm_edit_id(kst_of(st), KST_Q_INBOX, id, &e, err);
}

/* --- the inbox entries a task's last changes came from ------------------------------- */

static void id_text(char out[24], int64_t id)
{
    snprintf(out, 24, "%llx", (unsigned long long)id);
}

bool kst_applied_has(const json_t *doc, int64_t id)
{
    const char *list = json_string_value(json_object_get(
        json_object_get(json_object_get(doc, "metadata"), "annotations"), KST_ANN_APPLIED));
    char want[24];
    size_t n;

    id_text(want, id);
    n = strlen(want);
    for (const char *p = list; p != NULL && *p != '\0';) {
        const char *end = strchr(p, ',');
        size_t len = end != NULL ? (size_t)(end - p) : strlen(p);
        if (len == n && strncmp(p, want, n) == 0) {
            return true;
        }
        p = end != NULL ? end + 1 : NULL;
    }
    return false;
}

void kst_applied_add(json_t *doc, int64_t id)
{
    json_t *md = json_object_get(doc, "metadata"), *ann = json_object_get(md, "annotations");
    const char *old;
    char one[24];
    struct buf b;
    int commas = 0;

    if (!json_is_object(md) || kst_applied_has(doc, id)) {
        return;
    }
    if (!json_is_object(ann)) {
        ann = json_object();
        json_object_set_new(md, "annotations", ann);
    }
    old = json_string_value(json_object_get(ann, KST_ANN_APPLIED));
    buf_init(&b, 0);
    id_text(one, id);
    buf_puts(&b, one);
    for (const char *p = old; p != NULL && *p != '\0'; p++) { /* newest first, at most 16 */
        if (*p == ',' && ++commas >= KST_APPLIED_KEEP - 1) {
            break;
        }
        if (p == old) {
            buf_puts(&b, ",");
        }
        buf_append(&b, p, 1);
    }
    json_object_set_new(ann, KST_ANN_APPLIED, json_string(b.data));
    buf_cleanup(&b);
}

int kst_txn_inbox_fail(struct task_txn *tx, int64_t id, const char *error, struct err *err)
{
    (void)err;
    kst_txn_inbox_mark(tx, id);
    kst_txn_defer(tx,
                  json_pack("{s:s,s:s,s:I,s:s,s:i,s:s?}", "op", "edit", "queue", KST_Q_INBOX, "id",
                            (json_int_t)id, "state", "failed", "attempts", 1, "error", error));
    return E_OK;
}

int kst_txn_inbox_done(struct task_txn *tx, int64_t id, struct err *err)
{
    (void)err;
    kst_txn_inbox_mark(tx, id);
    kst_txn_defer(tx, json_pack("{s:s,s:s,s:I,s:s,s:i}", "op", "edit", "queue", KST_Q_INBOX, "id",
                                (json_int_t)id, "state", "done", "attempts", 0));
    return E_OK;
}

int kst_inbox_depth(int64_t *out, struct task_store *st, struct err *err)
{
    (void)err;
    return kst_cm_count_pending(out, kst_of(st), KST_Q_INBOX);
}

int kst_inbox_installation(int64_t *out, struct task_store *st, const char *provider,
                           const char *project, struct err *err)
{
    json_t *items = kst_cm_cached(kst_of(st), KST_Q_INBOX), *cm;
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
