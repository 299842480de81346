/* SPDX-License-Identifier: Apache-2.0 */
/* The controller thread: reconcile everything on start, then every task the change feed
 * names. No polling: the thread sleeps in the store's watch until something changes. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>

#include "common/log.h"
#include "common/secret.h"
#include "controller/controller_int.h"

struct changed {
    char **keys; /* "ns\0name" pairs, owned */
    size_t n, cap;
};

static int collect(const struct task_event *ev, void *userdata)
{
    struct changed *ch = userdata;

    if (ev->type == TASK_EVENT_DELETED) {
        return 0;
    }
    /* A running task that is not asked to pause needs nothing: this skips the stream of
     * MODIFIED events every meter charge makes. */
    if (ev->phase == TASK_ACTIVE && !ev->suspended) {
        return 0;
    }
    if (ch->n == ch->cap) {
        ch->cap = ch->cap == 0 ? 16 : ch->cap * 2;
        ch->keys = xrealloc(ch->keys, ch->cap * sizeof(*ch->keys));
    }
    ch->keys[ch->n++] = xasprintf("%s/%s", ev->ns, ev->name);
    return 0;
}

static void reconcile_key(struct controller *c, const char *key)
{
    char *copy = xstrdup(key), *slash = strchr(copy, '/');
    struct err err = {0};

    *slash = '\0';
    if (controller_reconcile(c, copy, slash + 1, &err) != E_OK && err.code != E_NOTFOUND) {
        log_kv(LOG_WARN, "reconcile_error", "task", key, "error", err.msg, NULL);
    }
    free(copy);
}

/* Reconciles every task and rewrites the token files of tasks holding an active token. */
static int64_t resync(struct controller *c)
{
    json_t *items = NULL, *item;
    int64_t rv = 0;
    size_t i;
    struct err err = {0};

    if (task_store_list(&items, &rv, c->store, NULL, &err) != E_OK) {
        log_kv(LOG_ERROR, "controller_list_failed", "error", err.msg, NULL);
        return 0;
    }
    json_array_foreach(items, i, item)
    {
        struct task_view v;
        struct token_record rec;
        char *key;
        task_view_of(&v, item);
        key = xasprintf("%s/%s", v.ns, v.name);
        reconcile_key(c, key);
        free(key);
        if (task_store_token_current(&rec, c->store, v.ns, v.name, NULL) == E_OK) {
            if (rec.active) {
                (void)controller_write_token_file(c, v.ns, v.name, rec.token, NULL);
            }
            secret_wipe(rec.token, strlen(rec.token));
            free(rec.token);
        }
    }
    json_decref(items);
    return rv;
}

static void *run(void *arg)
{
    struct controller *c = arg;
    int64_t rv;

    prctl(PR_SET_NAME, "controller", 0, 0, 0);
    rv = resync(c);

    while (!atomic_load(&c->stop)) {
        struct changed ch = {0};
        struct err err = {0};
        int64_t last = rv;
        int rc = task_store_watch(&last, c->store, NULL, rv, 1000, collect, &ch, &err);

        if (rc == E_AGAIN) {
            rv = resync(c); /* fell behind the feed: look at everything */
        } else {
            rv = last;
        }
        for (size_t i = 0; i < ch.n; i++) {
            /* Later events of the same task need no second pass. */
            bool dup = false;
            for (size_t k = i + 1; k < ch.n && !dup; k++) {
                dup = strcmp(ch.keys[i], ch.keys[k]) == 0;
            }
            if (!dup && !atomic_load(&c->stop)) {
                reconcile_key(c, ch.keys[i]);
            }
            free(ch.keys[i]);
        }
        free(ch.keys);
    }
    return NULL;
}

int controller_new(struct controller **out, struct task_store *store,
                   const struct controller_config *cfg, struct err *err)
{
    struct controller *c = xcalloc(1, sizeof(*c));

    *out = NULL;
    c->store = store;
    c->data_dir = xstrdup(cfg->data_dir);
    memcpy(c->root_key, cfg->root_key, TOKEN_ROOT_KEY_LEN);
    c->default_budget_usd = cfg->default_budget_usd;
    c->default_budget_tokens = cfg->default_budget_tokens;
    c->provider = xstrdup(cfg->sandbox_provider);
    atomic_init(&c->stop, false);
    if (cfg->manual) {
        *out = c;
        return E_OK;
    }
    if (pthread_create(&c->thread, NULL, run, c) != 0) {
        controller_destroy(c);
        return err_set(err, E_FAIL, "cannot start the controller thread");
    }
    c->started = true;
    *out = c;
    return E_OK;
}

void controller_free(struct controller *c)
{
    if (c == NULL) {
        return;
    }
    atomic_store(&c->stop, true);
    task_store_wake(c->store);
    if (c->started) {
        pthread_join(c->thread, NULL);
    }
    controller_destroy(c);
}
