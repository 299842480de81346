/* SPDX-License-Identifier: Apache-2.0 */
/* Transactions of the Kubernetes backend (docs/cluster-mode.md "task_txn semantics"). There
 * is no multi-object transaction in Kubernetes: a transaction reads tasks fresh from the
 * API server, buffers task_txn_put and commits each changed task as rv-guarded writes when
 * FN returns E_OK; a stale write (409) reruns FN from fresh reads (bounded). Token adds,
 * Environment and queue writes are single-object writes made at once, ordered so that a
 * crash between them converges. A token revocation waits until the tasks are written: made
 * at once, a rerun after a stale task write would find the token its own first run revoked
 * and refuse what that run had accepted (a meter charge over the budget answered 401 and
 * never paused its task); written after, a crash in between leaves a token that no longer
 * matters (its task is no longer Active) and is revoked by the next pause or start. Meter request
 * ids are the 32-entry status.lastMeterRequestIds ring of the task, written with its charge (SPEC
 * §7). */
#include <stdlib.h>
#include <string.h>

#include "common/tlscert.h"
#include "store/kube/store_kube_int.h"

struct kst_txn {
    struct task_txn base; /* must be first */
    struct kube_store *s;
    json_t *docs;    /* "ns/name" -> the task as this transaction sees it (shared) */
    json_t *orig;    /* "ns/name" -> the task as stored (read or last written) */
    json_t *dirty;   /* "ns/name" -> true: put, to be written at commit */
    json_t *claimed; /* "uid\nrequest id" -> true: claimed in this transaction */
    json_t *envs;    /* "ns/name" -> Environment to write at commit, or null to delete */
    json_t *later;   /* queue writes (kst_txn_defer), made after the tasks are written */
    json_t *sp;      /* savepoint: {docs, dirty} deep copies, or NULL */
    json_t *seg;     /* "ns/name" -> the task when the current inbox entry's step began */
    json_t *quotas;  /* "ns/name" -> SpendQuota to write at commit, or null to delete */
    json_t *qorig;   /* "ns/name" -> SpendQuota as read (its resourceVersion guards the write) */
    json_t *revokes; /* "ns/name" -> the token id revoked, written after the tasks */
};

static int env_commit(struct kube_store *s, const char *key, json_t *env, struct err *err);

/* A JSON string of S, which it frees. */
static json_t *str_take(char *s)
{
    json_t *j = json_string(s);

    free(s);
    return j;
}

static struct kst_txn *ktx(struct task_txn *tx)
{
    return container_of(tx, struct kst_txn, base);
}

static char *key_of(const char *ns, const char *name)
{
    return xasprintf("%s/%s", ns, name);
}

static void txn_reset(struct kst_txn *t)
{
    json_decref(t->docs);
    json_decref(t->orig);
    json_decref(t->dirty);
    json_decref(t->claimed);
    json_decref(t->envs);
    json_decref(t->later);
    json_decref(t->sp);
    json_decref(t->seg);
    json_decref(t->quotas);
    json_decref(t->qorig);
    json_decref(t->revokes);
    t->revokes = json_object();
    t->quotas = json_object();
    t->qorig = json_object();
    t->seg = json_object();
    t->envs = json_object();
    t->later = json_array();
    t->docs = json_object();
    t->orig = json_object();
    t->dirty = json_object();
    t->claimed = json_object();
    t->sp = NULL;
}

/* Writes every put task; *top_out the newest rv written. */
static int txn_commit(int64_t *top_out, struct kst_txn *t, struct err *err)
{
    const char *key;
    json_t *v;

    *top_out = 0;
    /* Quotas first: a crash or conflict between the two writes can only count a charge
     * twice toward a quota, never lose it (there is no multi-object transaction here). */
    int qrc = kst_quota_commit(t->s, t->quotas, t->qorig, err);

    if (qrc != E_OK) {
        return qrc;
    }
    json_object_clear(t->quotas);
    json_object_foreach(t->dirty, key, v)
    {
        json_t *doc = json_object_get(t->docs, key);
        int64_t rv = 0;
        int rc = kst_write_task(&rv, t->s, doc, json_object_get(t->orig, key), err);
        if (rc != E_OK) {
            return rc;
        }
        json_object_set_new(t->orig, key, json_deep_copy(doc));
        *top_out = rv > *top_out ? rv : *top_out;
    }
    json_object_foreach(t->envs, key, v)
    {
        int rc = env_commit(t->s, key, v, err);
        if (rc != E_OK) {
            return rc;
        }
    }
    return E_OK;
}

static int revokes_commit(struct kube_store *s, json_t *revokes, struct err *err);

int kst_txn(struct task_store *st, task_txn_fn fn, void *userdata, struct err *err)
{
    struct kst_txn t = {.base = {.st = st}, .s = kst_of(st)};
    int64_t top = 0;
    int rc = E_CONFLICT;

    for (int i = 0; i < KST_RETRIES && rc == E_CONFLICT; i++) {
        txn_reset(&t);
        rc = fn(&t.base, userdata);
        if (rc == E_OK) {
            rc = txn_commit(&top, &t, err);
        }
    }
    if (rc == E_OK) {
        rc = revokes_commit(t.s, t.revokes, err);
    }
    if (top > 0) {
        kst_wait_seen(t.s, top, false);
    }
    /* Only once the tasks are written, and once: a rerun FN never doubles a reply; nor
     * does a rerun of the same inbox entry by the next leader (deterministic names). */
    if (rc == E_OK) {
        kst_outbox_name_replies(t.later);
    }
    for (size_t i = 0; rc == E_OK && i < json_array_size(t.later); i++) {
        rc = kst_queue_apply(t.s, json_array_get(t.later, i), err);
    }
    json_decref(t.later);
    json_decref(t.sp);
    json_decref(t.envs);
    json_decref(t.docs);
    json_decref(t.orig);
    json_decref(t.dirty);
    json_decref(t.claimed);
    json_decref(t.seg);
    json_decref(t.quotas);
    json_decref(t.qorig);
    json_decref(t.revokes);
    return rc;
}

int kst_txn_quota_list(json_t **items_out, struct task_txn *tx, const char *ns, struct err *err)
{
    struct kst_txn *t = ktx(tx);

    return kst_quota_list(items_out, t->s, t->quotas, t->qorig, ns, err);
}

int kst_txn_quota_put(struct task_txn *tx, json_t *q, struct err *err)
{
    const json_t *md = json_object_get(q, "metadata");
    const char *ns = json_string_value(json_object_get(md, "namespace"));
    const char *name = json_string_value(json_object_get(md, "name"));
    char *key;

    if (ns == NULL || name == NULL) {
        return err_set(err, E_INVALID, "spendquota without metadata.namespace/name");
    }
    key = key_of(ns, name);
    json_object_set(ktx(tx)->quotas, key, q);
    free(key);
    return E_OK;
}

int kst_txn_quota_delete(struct task_txn *tx, const char *ns, const char *name, struct err *err)
{
    char *key = key_of(ns, name);

    (void)err;
    json_object_set_new(ktx(tx)->quotas, key, json_null());
    free(key);
    return E_OK;
}

int kst_txn_get(json_t **out, struct task_txn *tx, const char *ns, const char *name,
                struct err *err)
{
    struct kst_txn *t = ktx(tx);
    char *key = key_of(ns, name);
    json_t *hit = json_object_get(t->docs, key);
    int rc = E_OK;

    *out = NULL;
    if (hit != NULL) {
        *out = json_incref(hit);
    } else {
        rc = kube_get(out, t->s->c, &KUBE_AGENTTASKS, ns, name, err);
        if (rc == E_OK) {
            kst_fill_status(*out);
            json_object_set_new(t->orig, key, json_deep_copy(*out));
            json_object_set(t->docs, key, *out);
        }
    }
    free(key);
    return rc;
}

int kst_txn_put(struct task_txn *tx, json_t *doc, struct err *err)
{
    struct kst_txn *t = ktx(tx);
    struct task_view v;
    char *key;

    task_view_of(&v, doc);
    if (v.ns == NULL || v.name == NULL) {
        return err_set(err, E_INVALID, "put: task without a name");
    }
    key = key_of(v.ns, v.name);
    if (json_object_get(t->orig, key) == NULL) {
        free(key);
        return err_set(err, E_INVALID, "put: task not read in this transaction");
    }
    json_object_set(t->docs, key, doc);
    json_object_set_new(t->dirty, key, json_true());
    free(key);
    return E_OK;
}

int kst_txn_savepoint(struct task_txn *tx, struct err *err)
{
    struct kst_txn *t = ktx(tx);

    (void)err;
    json_decref(t->sp);
    t->sp = json_pack("{s:o,s:o,s:o,s:o,s:o,s:o,s:o}", "docs", json_deep_copy(t->docs), "dirty",
                      json_deep_copy(t->dirty), "claimed", json_deep_copy(t->claimed), "envs",
                      json_deep_copy(t->envs), "later", json_deep_copy(t->later), "seg",
                      json_deep_copy(t->seg), "revokes", json_deep_copy(t->revokes));
    return E_OK;
}

int kst_txn_release(struct task_txn *tx, struct err *err)
{
    struct kst_txn *t = ktx(tx);

    (void)err;
    json_decref(t->sp);
    t->sp = NULL;
    return E_OK;
}

void kst_txn_rollback_savepoint(struct task_txn *tx)
{
    struct kst_txn *t = ktx(tx);

    if (t->sp == NULL) {
        return;
    }
    json_decref(t->docs);
    json_decref(t->dirty);
    json_decref(t->claimed);
    json_decref(t->envs);
    json_decref(t->later);
    json_decref(t->seg);
    json_decref(t->revokes);
    t->revokes = json_incref(json_object_get(t->sp, "revokes"));
    t->seg = json_incref(json_object_get(t->sp, "seg"));
    t->envs = json_incref(json_object_get(t->sp, "envs"));
    t->later = json_incref(json_object_get(t->sp, "later"));
    t->docs = json_incref(json_object_get(t->sp, "docs"));
    t->dirty = json_incref(json_object_get(t->sp, "dirty"));
    t->claimed = json_incref(json_object_get(t->sp, "claimed"));
    json_decref(t->sp);
    t->sp = NULL;
}

static bool ring_has(const json_t *doc, const char *request_id)
{
    const json_t *ring = json_object_get(json_object_get(doc, "status"), "lastMeterRequestIds");
    const json_t *id;
    size_t i;

    json_array_foreach(ring, i, id)
    {
        if (json_is_string(id) && strcmp(json_string_value(id), request_id) == 0) {
            return true;
        }
    }
    return false;
}

int kst_txn_meter_claim(bool *fresh_out, struct task_txn *tx, const char *task_uid,
                        const char *request_id, int64_t tokens, int64_t cost_micros,
                        struct err *err)
{
    struct kst_txn *t = ktx(tx);
    char *key = xasprintf("%s\n%s", task_uid, request_id);
    const char *k;
    json_t *doc;

    (void)tokens;
    (void)cost_micros;
    (void)err;
    /* The window is the task's ring as read in this transaction (the charge writes the id
     * into it in the same status update), plus what this transaction claimed already. */
    *fresh_out = json_object_get(t->claimed, key) == NULL;
    json_object_foreach(t->docs, k, doc)
    {
        const char *uid =
            json_string_value(json_object_get(json_object_get(doc, "metadata"), "uid"));
        if (*fresh_out && uid != NULL && strcmp(uid, task_uid) == 0 && ring_has(doc, request_id)) {
            *fresh_out = false;
        }
    }
    json_object_set_new(t->claimed, key, json_true());
    free(key);
    return E_OK;
}

/* --- the token index: Secret diverge-agenttask-tokens, one key "<ns>.<task>" per task,
 * value {tokenId, generation, active}; the token itself in Secret task-token-<task>. ---- */

static char *token_secret_name(const char *name)
{
    return xasprintf("task-token-%s", name);
}

/* The Secret data value of KEY in SECRET, decoded, or NULL. */
static char *secret_value(const json_t *secret, const char *key)
{
    const char *b64 = json_string_value(json_object_get(json_object_get(secret, "data"), key));
    char *out = NULL;
    size_t len = 0;

    if (b64 == NULL || kube_base64_decode(&out, &len, b64) != E_OK) {
        return NULL;
    }
    return out;
}

static void secret_set(json_t *secret, const char *key, const char *value)
{
    json_t *data = json_object_get(secret, "data");

    if (!json_is_object(data)) {
        data = json_object();
        json_object_set_new(secret, "data", data);
    }
    json_object_set_new(data, key, str_take(tlscert_base64(value, strlen(value))));
}

static json_t *new_secret(const char *ns, const char *name)
{
    return json_pack("{s:s,s:s,s:{s:s,s:s},s:s,s:{}}", "apiVersion", "v1", "kind", "Secret",
                     "metadata", "name", name, "namespace", ns, "type", "Opaque", "data");
}

static int read_token(struct token_record *out, struct kube_store *s, const char *ns,
                      const char *name, struct err *err)
{
    json_t *index = NULL, *rec = NULL, *tok = NULL;
    char *ikey = xasprintf("%s.%s", ns, name), *val = NULL, *tname = token_secret_name(name);
    int rc;

    memset(out, 0, sizeof(*out));
    rc = kube_get(&index, s->c, &KUBE_SECRETS, s->ns, KST_TOKEN_INDEX, err);
    if (rc == E_OK) {
        val = secret_value(index, ikey);
        rec = val != NULL ? json_loads(val, 0, NULL) : NULL;
        rc = rec != NULL ? E_OK : err_set(err, E_NOTFOUND, "no token for the task");
    }
    if (rc == E_OK) {
        snprintf(out->token_id, sizeof(out->token_id), "%s",
                 json_string_value(json_object_get(rec, "tokenId")) != NULL
                     ? json_string_value(json_object_get(rec, "tokenId"))
                     : "");
        out->generation = json_integer_value(json_object_get(rec, "generation"));
        out->active = json_is_true(json_object_get(rec, "active"));
        rc = kube_get(&tok, s->c, &KUBE_SECRETS, ns, tname, err);
        if (rc == E_NOTFOUND && !out->active) {
            rc = E_OK; /* revoked and its file gone with the task */
            tok = json_pack("{s:{s:s}}", "data", "token", "");
        }
    }
    if (rc == E_OK) {
        out->token = secret_value(tok, "token");
        if (out->token == NULL) {
            rc = err_set(err, E_FAIL, "token secret without a token");
        }
    }
    json_decref(index);
    json_decref(rec);
    json_decref(tok);
    free(val);
    free(ikey);
    free(tname);
    return rc;
}

int kst_token_current(struct token_record *out, struct task_store *st, const char *ns,
                      const char *name, struct err *err)
{
    return read_token(out, kst_of(st), ns, name, err);
}

int kst_txn_token_current(struct token_record *out, struct task_txn *tx, const char *ns,
                          const char *name, struct err *err)
{
    char *key = key_of(ns, name);
    const char *revoked = json_string_value(json_object_get(ktx(tx)->revokes, key));
    int rc = read_token(out, kst_of(tx->st), ns, name, err);

    if (rc == E_OK && revoked != NULL && strcmp(revoked, out->token_id) == 0) {
        out->active = false; /* revoked by this transaction, written at its commit */
    }
    free(key);
    return rc;
}

/* Creates or replaces the Secret NS/NAME with KEY = VALUE (other keys kept). */
static int secret_put(struct kube_store *s, const char *ns, const char *name, const char *key,
                      const char *value, struct err *err)
{
    int rc = E_CONFLICT;

    for (int i = 0; i < KST_RETRIES && rc == E_CONFLICT; i++) {
        json_t *cur = NULL, *res = NULL;
        rc = kube_get(&cur, s->c, &KUBE_SECRETS, ns, name, err);
        if (rc == E_NOTFOUND) {
            cur = new_secret(ns, name);
            secret_set(cur, key, value);
            rc = kube_create(&res, s->c, &KUBE_SECRETS, ns, cur, err);
        } else if (rc == E_OK) {
            secret_set(cur, key, value);
            rc = kube_replace(&res, s->c, &KUBE_SECRETS, ns, cur, err);
        }
        json_decref(cur);
        json_decref(res);
    }
    return rc;
}

static int index_put(struct kube_store *s, const char *ns, const char *name, const char *token_id,
                     int64_t generation, bool active, struct err *err)
{
    json_t *rec = json_pack("{s:s,s:I,s:b}", "tokenId", token_id, "generation",
                            (json_int_t)generation, "active", active);
    char *text = json_dumps(rec, JSON_COMPACT | JSON_SORT_KEYS);
    char *ikey = xasprintf("%s.%s", ns, name);
    int rc = secret_put(s, s->ns, KST_TOKEN_INDEX, ikey, text, err);

    free(ikey);
    free(text);
    json_decref(rec);
    return rc;
}

int kst_txn_token_add(struct task_txn *tx, const char *ns, const char *name, int64_t generation,
                      const char *token_id, const char *token, struct err *err)
{
    struct kube_store *s = kst_of(tx->st);
    char *tname = token_secret_name(name);
    int rc;

    /* the token file first: the index entry never names a token that is not there */
    rc = secret_put(s, ns, tname, "token", token, err);
    free(tname);
    return rc != E_OK ? rc : index_put(s, ns, name, token_id, generation, true, err);
}

int kst_txn_token_revoke(struct task_txn *tx, const char *ns, const char *name, struct err *err)
{
    struct token_record cur;
    int rc = kst_txn_token_current(&cur, tx, ns, name, NULL);

    if (rc == E_OK && cur.active) {
        char *key = key_of(ns, name);
        json_object_set_new(ktx(tx)->revokes, key, json_string(cur.token_id));
        free(key);
    }
    free(cur.token);
    if (rc == E_NOTFOUND || rc == E_OK) {
        return E_OK;
    }
    return err_set(err, rc, "cannot read the token index");
}

/* Revokes the token of NS/NAME at once when it is still TOKEN_ID (NULL: whichever is
 * current); absent or already revoked is done. */
static int revoke_now(struct kube_store *s, const char *ns, const char *name, const char *token_id,
                      struct err *err)
{
    struct token_record cur;
    int rc = read_token(&cur, s, ns, name, NULL);

    if (rc == E_OK && cur.active && (token_id == NULL || strcmp(cur.token_id, token_id) == 0)) {
        rc = index_put(s, ns, name, cur.token_id, cur.generation, false, err);
    } else if (rc == E_NOTFOUND || rc == E_OK) {
        rc = E_OK;
    } else {
        rc = err_set(err, rc, "cannot read the token index");
    }
    free(cur.token);
    return rc;
}

int kst_token_revoke(struct task_store *st, const char *ns, const char *name, struct err *err)
{
    return revoke_now(kst_of(st), ns, name, NULL, err);
}

/* After the tasks are written: revokes each token REVOKES names, unless the index has
 * moved on to another token meanwhile (a later start minted one). */
static int revokes_commit(struct kube_store *s, json_t *revokes, struct err *err)
{
    const char *key;
    json_t *id;

    json_object_foreach(revokes, key, id)
    {
        const char *slash = strchr(key, '/');
        char *ns = xstrndup(key, (size_t)(slash - key));
        int rc = revoke_now(s, ns, slash + 1, json_string_value(id), err);
        free(ns);
        if (rc != E_OK) {
            return rc;
        }
    }
    return E_OK;
}

int kst_txn_create(json_t **out, struct task_txn *tx, const json_t *obj, struct err *err)
{
    struct kst_txn *t = ktx(tx);
    json_t *made = NULL;
    int rc = kst_create_task(&made, t->s, obj, err);

    if (out != NULL) {
        *out = NULL;
    }
    if (rc == E_OK) {
        struct task_view v;
        char *key;
        task_view_of(&v, made);
        key = key_of(v.ns, v.name);
        json_object_set_new(t->orig, key, json_deep_copy(made));
        json_object_set(t->docs, key, made);
        free(key);
        if (out != NULL) {
            *out = json_incref(made);
        }
    }
    json_decref(made);
    return rc;
}

/* --- Environments ----------------------------------------------------------------- */

int kst_txn_env_get(json_t **out, struct task_txn *tx, const char *ns, const char *name,
                    struct err *err)
{
    struct kst_txn *t = ktx(tx);
    char *key = key_of(ns, name);
    json_t *hit = json_object_get(t->envs, key);

    free(key);
    if (hit != NULL) {
        *out = NULL;
        if (json_is_null(hit)) {
            return err_set(err, E_NOTFOUND, "environment not found");
        }
        *out = json_deep_copy(hit);
        return E_OK;
    }
    return kube_get(out, t->s->c, &KUBE_ENVIRONMENTS, ns, name, err);
}

static int env_write(json_t **res, struct kube_store *s, const char *ns, json_t *env,
                     struct err *err)
{
    const char *name = json_string_value(json_object_get(json_object_get(env, "metadata"), "name"));
    json_t *cur = NULL, *main = NULL;
    int rc = kube_get(&cur, s->c, &KUBE_ENVIRONMENTS, ns, name, err);

    *res = NULL;
    if (rc == E_NOTFOUND) {
        rc = kube_create(&main, s->c, &KUBE_ENVIRONMENTS, ns, env, err);
    } else if (rc == E_OK) {
        json_t *copy = json_deep_copy(env);
        json_object_set(json_object_get(copy, "metadata"), "resourceVersion",
                        json_object_get(json_object_get(cur, "metadata"), "resourceVersion"));
        rc = kube_replace(&main, s->c, &KUBE_ENVIRONMENTS, ns, copy, err);
        json_decref(copy);
    }
    json_decref(cur);
    if (rc == E_OK && json_object_get(env, "status") != NULL) {
        json_object_set(main, "status", json_object_get(env, "status"));
        rc = kube_update_status(res, s->c, &KUBE_ENVIRONMENTS, ns, main, err);
        json_decref(main);
    } else {
        *res = main;
    }
    return rc;
}

/* Writes (or, ENV null, deletes) the Environment KEY "ns/name" at commit. */
static int env_commit(struct kube_store *s, const char *key, json_t *env, struct err *err)
{
    char ns[64];
    const char *slash = strchr(key, '/');
    int rc = E_CONFLICT;

    snprintf(ns, sizeof(ns), "%.*s", slash != NULL ? (int)(slash - key) : 0, key);
    if (json_is_null(env)) {
        rc = kube_delete(s->c, &KUBE_ENVIRONMENTS, ns, slash != NULL ? slash + 1 : key, NULL, err);
        return rc == E_NOTFOUND ? E_OK : rc;
    }
    for (int i = 0; i < KST_RETRIES && rc == E_CONFLICT; i++) {
        json_t *res = NULL;
        rc = env_write(&res, s, ns, env, err);
        if (rc == E_OK) {
            json_object_set(env, "metadata", json_object_get(res, "metadata"));
        }
        json_decref(res);
    }
    return rc;
}

int kst_txn_env_put(struct task_txn *tx, json_t *env, struct err *err)
{
    struct kst_txn *t = ktx(tx);
    const json_t *md = json_object_get(env, "metadata");
    const char *ns = json_string_value(json_object_get(md, "namespace"));
    const char *name = json_string_value(json_object_get(md, "name"));
    char *key;

    if (ns == NULL || name == NULL) {
        return err_set(err, E_INVALID, "environment without a namespace or name");
    }
    key = key_of(ns, name);
    json_object_set(t->envs, key, env);
    free(key);
    return E_OK;
}

int kst_txn_env_delete(struct task_txn *tx, const char *ns, const char *name, struct err *err)
{
    char *key = key_of(ns, name);

    (void)err;
    json_object_set_new(ktx(tx)->envs, key, json_null());
    free(key);
    return E_OK;
}

void kst_txn_defer(struct task_txn *tx, json_t *op)
{
    json_array_append_new(ktx(tx)->later, op);
}

/* The task KEY when the current inbox entry's step began. */
static const json_t *seg_base(const struct kst_txn *t, const char *key)
{
    const json_t *b = json_object_get(t->seg, key);

    return b != NULL ? b : json_object_get(t->orig, key);
}

/* Whether a task the step of inbox entry ID changed already carries ID (as stored): the
 * step was applied by a leader that died before the entry's done mark. */
static bool step_applied(const struct kst_txn *t, int64_t id)
{
    const char *key;
    json_t *v;

    json_object_foreach(t->dirty, key, v)
    {
        if (!json_equal(json_object_get(t->docs, key), seg_base(t, key)) &&
            kst_applied_has(json_object_get(t->orig, key), id)) {
            return true;
        }
    }
    return false;
}

void kst_txn_inbox_mark(struct task_txn *tx, int64_t id)
{
    struct kst_txn *t = ktx(tx);
    bool applied = step_applied(t, id);
    const char *key;
    void *tmp;
    json_t *v;

    json_object_foreach_safe(t->dirty, tmp, key, v)
    {
        json_t *doc = json_object_get(t->docs, key);
        const json_t *base = seg_base(t, key), *orig = json_object_get(t->orig, key);
        if (json_equal(doc, base)) {
            continue;
        }
        if (applied) { /* undo this step's task changes: they are stored already */
            bool same = json_equal(base, orig);
            json_object_set_new(t->docs, key, json_deep_copy(base));
            if (same) {
                json_object_del(t->dirty, key);
            }
        } else if (json_equal(json_object_get(doc, "status"), json_object_get(base, "status"))) {
            /* the mark rides in the same write as the change (metadata and spec; a status
             * change is a second write, so such a step is not marked) */
            kst_applied_add(doc, id);
        }
    }
    json_decref(t->seg);
    t->seg = json_deep_copy(t->docs);
}
