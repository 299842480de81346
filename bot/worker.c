/* SPDX-License-Identifier: Apache-2.0 */
/* The bot worker thread: takes the next inbox entry, gathers what applying it needs from
 * the SCM (permission, PR head, agent.yaml) outside any transaction, then applies it in
 * one transaction (bot_apply.c). SCM trouble retries the entry later, in order. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "bot/bot_apply.h"
#include "common/hash.h"
#include "common/log.h"
#include "common/secret.h"
#include "scm/render.h"

/* C lower-cased, or '-' when it is not a letter or digit. */
static char slug_char(char c)
{
    c = (c >= 'A' && c <= 'Z') ? (char)(c - 'A' + 'a') : c;
    return ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')) ? c : '-';
}

/* Writes the slug of PROJECT into OUT (at most 63 bytes, not terminated): lower case, each
 * run of other characters one dash, none leading. Returns its full length, maybe over 63. */
static size_t slug(char out[64], const char *project)
{
    size_t n = 0;
    char prev = '-'; /* no leading dash */

    for (const char *p = project; *p != '\0'; p++) {
        char c = slug_char(*p);
        if (c == '-' && prev == '-') {
            continue; /* no doubled dashes */
        }
        if (n < 63) {
            out[n] = c;
        }
        n++;
        prev = c;
    }
    return n;
}

static size_t trim_dashes(const char *s, size_t n)
{
    while (n > 0 && s[n - 1] == '-') {
        n--;
    }
    return n;
}

void bot_project_namespace(char out[64], const char *project)
{
    size_t n = slug(out, project);
    uint64_t h = hash_fnv1a_str(project);

    if (n > 63) {
        /* Too long: keep 56 characters and add a hash of the whole path. */
        n = trim_dashes(out, 56);
        snprintf(out + n, 64 - n, "-%06x", (unsigned)(h & 0xffffff));
        return;
    }
    n = trim_dashes(out, n);
    if (n == 0) {
        out[n++] = 'p';
    }
    out[n] = '\0';
}

/* --- the loop ----------------------------------------------------------------------- */

static bool ignored(struct scm_provider *p, const struct inbox_entry *e)
{
    const char *login = p->ops->bot_login(p);

    /* Never answer ourselves: our own account, or a comment carrying the sticky marker. */
    return (login != NULL && strcasecmp(login, e->author) == 0) ||
           strstr(e->body, SCM_STICKY_MARKER) != NULL;
}

#define BOT_BATCH 32 /* comments applied per transaction, at most */

/* What to do with one entry of a batch. */
enum prep_kind {
    PREP_SKIP,  /* nothing in the batch transaction (retried later, already recorded) */
    PREP_DONE,  /* ignored: mark it done */
    PREP_FAIL,  /* give up: mark it failed */
    PREP_APPLY, /* apply IN */
};

struct prepared {
    struct inbox_entry e; /* owned */
    enum prep_kind kind;
    struct bot_input in;
    struct gathered g;     /* owned */
    char why[ERR_MSG_MAX]; /* for PREP_FAIL */
};

static void retry_later(struct bot *b, struct prepared *pr, const char *why)
{
    const struct inbox_entry *e = &pr->e;
    char delay[32];
    int64_t d = 1000LL << (e->attempts < 8 ? e->attempts : 8);

    if (e->attempts + 1 >= b->cfg.max_attempts) {
        pr->kind = PREP_FAIL;
        snprintf(pr->why, sizeof(pr->why), "%s", why);
        return;
    }
    snprintf(delay, sizeof(delay), "%lld", (long long)d);
    log_kv(LOG_WARN, "comment_retry", "project", e->project, "comment", e->comment_id, "delay_ms",
           delay, "error", why, NULL);
    (void)task_store_inbox_retry(b->store, e->id, d, false, why, NULL);
    pr->kind = PREP_SKIP;
}

/* Everything outside the transaction: the SCM calls of one entry. */
static void prepare(struct bot *b, struct prepared *pr)
{
    const struct inbox_entry *e = &pr->e;
    struct scm_provider *p = scm_registry_get(b->reg, e->provider);
    struct err err = {0};

    memset(&pr->in, 0, sizeof(pr->in));
    memset(&pr->g, 0, sizeof(pr->g));
    if (p == NULL) {
        pr->kind = PREP_FAIL;
        snprintf(pr->why, sizeof(pr->why), "no provider configured for this comment");
        return;
    }
    if (ignored(p, e)) {
        pr->kind = PREP_DONE;
        return;
    }
    pr->in.entry = e;
    pr->in.cfg = &b->cfg;
    pr->in.root_key = b->root_key;
    if (b->ns_override != NULL) {
        snprintf(pr->in.ns, sizeof(pr->in.ns), "%s", b->ns_override);
    } else {
        bot_project_namespace(pr->in.ns, e->project);
    }
    pr->in.shared_ns = b->ns_override != NULL;
    bot_task_name(pr->in.task, e->provider, e->project, e->number, pr->in.shared_ns);
    if (bot_gather(&pr->g, b, p, e, &pr->in, &err) != E_OK) {
        retry_later(b, pr, err.msg);
        return;
    }
    pr->in.cmds = pr->g.cmds;
    pr->in.refusal = pr->g.refusal;
    pr->in.pull = pr->g.have_pull ? &pr->g.pull : NULL;
    pr->in.agent = pr->g.agent;
    pr->in.status_table = pr->g.status;
    pr->kind = PREP_APPLY;
}

static int apply_one(struct task_txn *tx, struct prepared *pr, struct err *err)
{
    switch (pr->kind) {
    case PREP_DONE:
        return task_txn_inbox_done(tx, pr->e.id, err);
    case PREP_FAIL:
        log_kv(LOG_ERROR, "comment_failed", "provider", pr->e.provider, "project", pr->e.project,
               "comment", pr->e.comment_id, "error", pr->why, NULL);
        return task_txn_inbox_fail(tx, pr->e.id, pr->why, err);
    case PREP_APPLY:
        return bot_apply_txn(tx, &pr->in);
    case PREP_SKIP:
        break;
    }
    return E_OK;
}

struct batch {
    struct prepared *items;
    size_t n;
};

static int batch_txn(struct task_txn *tx, void *userdata)
{
    struct batch *bt = userdata;
    struct err err = {0};

    for (size_t i = 0; i < bt->n; i++) {
        int rc = apply_one(tx, &bt->items[i], &err);
        if (rc != E_OK) {
            return rc;
        }
    }
    return E_OK;
}

static void log_applied(const struct prepared *pr);

/* Applies one entry in its own transaction (after its batch failed): a refused change
 * becomes a reply, any other failure a later retry. */
static bool apply_alone(struct bot *b, struct prepared *pr)
{
    struct batch one = {.items = pr, .n = 1};
    struct err err = {0};
    int rc = task_store_txn(b->store, batch_txn, &one, &err);

    if (rc == E_INVALID && pr->kind == PREP_APPLY) {
        char *msg = xasprintf("@%s that would make the task invalid: %s. Nothing was changed.\n",
                              pr->e.author, err.msg);
        pr->in.refusal = msg;
        rc = task_store_txn(b->store, batch_txn, &one, &err);
        free(msg);
        pr->in.refusal = pr->g.refusal;
    }
    if (rc != E_OK) {
        (void)task_store_inbox_retry(b->store, pr->e.id, 2000,
                                     pr->e.attempts + 1 >= b->cfg.max_attempts, err.msg, NULL);
        return false;
    }
    log_applied(pr);
    return true;
}

static void log_applied(const struct prepared *pr)
{
    char n[32];

    if (pr->kind != PREP_APPLY) {
        return;
    }
    snprintf(n, sizeof(n), "%zu", pr->g.cmds != NULL ? pr->g.cmds->len : 0);
    log_kv(LOG_INFO, "comment_applied", "provider", pr->e.provider, "project", pr->e.project,
           "comment", pr->e.comment_id, "author", pr->e.author, "commands", n, "task", pr->in.task,
           "refused", pr->g.refusal != NULL ? "true" : "false", NULL);
}

static bool same_pr(const struct inbox_entry *x, const struct inbox_entry *y)
{
    return x->number == y->number && strcmp(x->project, y->project) == 0 &&
           strcmp(x->provider, y->provider) == 0;
}

/* Whether an earlier item of ITEMS[I]'s PR must wait (then this one waits behind it:
 * order per PR). */
static bool blocked_by_earlier(const struct prepared *items, size_t i)
{
    for (size_t k = 0; k < i; k++) {
        if (items[k].kind == PREP_SKIP && same_pr(&items[k].e, &items[i].e)) {
            return true;
        }
    }
    return false;
}

/* After the batch transaction failed: each item in its own transaction. */
static void apply_each_alone(struct bot *b, struct prepared *items, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (apply_alone(b, &items[i])) {
            continue;
        }
        /* Keep the PR's order: its later comments wait behind this one. */
        for (size_t k = i + 1; k < n; k++) {
            if (same_pr(&items[k].e, &items[i].e)) {
                items[k].kind = PREP_SKIP;
            }
        }
    }
}

/* Up to BOT_BATCH due comments (in order per PR): SCM calls for each, then ONE
 * transaction for all, so a burst of commands costs one fsync, not one each. */
static void process_batch(struct bot *b, struct inbox_entry *entries, size_t n)
{
    struct prepared *items = xcalloc(n, sizeof(*items));
    struct batch bt = {.items = items, .n = n};
    struct err err = {0};

    for (size_t i = 0; i < n; i++) {
        items[i].e = entries[i];
        if (blocked_by_earlier(items, i)) {
            items[i].kind = PREP_SKIP;
            continue;
        }
        prepare(b, &items[i]);
    }
    if (task_store_txn(b->store, batch_txn, &bt, &err) == E_OK) {
        for (size_t i = 0; i < n; i++) {
            log_applied(&items[i]);
        }
    } else {
        apply_each_alone(b, items, n);
    }
    for (size_t i = 0; i < n; i++) {
        bot_gathered_cleanup(&items[i].g);
        inbox_entry_cleanup(&items[i].e);
    }
    free(items);
}

/* One inbox batch (the store worker's step): 0 when a batch was applied, else the ms
 * until the next entry is due (-1: none queued). */
static int64_t step(void *userdata)
{
    struct bot *b = userdata;
    struct inbox_entry entries[BOT_BATCH];
    int64_t wait = -1;
    size_t n = 0;

    if (task_store_inbox_next_batch(entries, BOT_BATCH, &n, &wait, b->store, NULL) == E_OK) {
        process_batch(b, entries, n);
        return 0;
    }
    return wait;
}

static const struct store_worker_config inbox = {
    .name = "bot", .wake = STORE_WORKER_INBOX, .step = step};

int bot_new(struct bot **out, struct task_store *store, const struct scm_registry *registry,
            const struct bot_config *cfg, struct err *err)
{
    struct bot *b = xcalloc(1, sizeof(*b));
    int rc;

    *out = NULL;
    b->store = store;
    b->reg = registry;
    b->cfg = *cfg;
    if (cfg->namespace_override != NULL && cfg->namespace_override[0] != '\0') {
        b->ns_override = xstrdup(cfg->namespace_override);
    }
    b->cfg.namespace_override = NULL;
    if (cfg->root_key == NULL) {
        free(b->ns_override);
        free(b);
        return err_set(err, E_INVALID, "the bot needs the root key (push grants)");
    }
    memcpy(b->root_key, cfg->root_key, TOKEN_ROOT_KEY_LEN);
    b->cfg.root_key = NULL;
    rc = store_worker_start(&b->worker, store, &inbox, b, err);
    if (rc != E_OK) {
        free(b->ns_override);
        free(b);
        return rc;
    }
    *out = b;
    return E_OK;
}

void bot_free(struct bot *b)
{
    if (b == NULL) {
        return;
    }
    store_worker_stop(b->worker);
    free(b->ns_override);
    secret_wipe(b->root_key, sizeof(b->root_key));
    free(b);
}
