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
#include "common/money.h"
#include "scm/render.h"

#define PERM_CACHE 256

struct perm_entry {
    char key[256];       /* provider/project/user */
    enum scm_level level;
    int64_t expires_ms;  /* 0 = empty slot */
};

struct bot {
    struct task_store *store;          /* borrowed */
    const struct scm_registry *reg;    /* borrowed */
    struct bot_config cfg;
    char *ns_override;                 /* owned copy of cfg.namespace_override */
    struct perm_entry perms[PERM_CACHE];
    struct store_worker *worker;       /* owned: the thread applying the inbox */
};

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

/* --- permissions ------------------------------------------------------------------ */

static enum scm_level required_level(const struct bot *b, const struct slashcmd_list *cmds)
{
    enum scm_level need = SCM_LEVEL_NONE;

    for (size_t i = 0; i < cmds->len; i++) {
        const struct slashcmd *c = &cmds->cmds[i];
        enum scm_level l = SCM_LEVEL_NONE;
        switch (c->verb) {
        case SLASHCMD_FIX:
        case SLASHCMD_GUIDE:
        case SLASHCMD_PAUSE:
            l = b->cfg.min_fix;
            break;
        case SLASHCMD_RESUME:
            l = c->has_usd || c->has_tokens ? b->cfg.min_budget : b->cfg.min_fix;
            break;
        case SLASHCMD_BUDGET:
            l = b->cfg.min_budget;
            break;
        case SLASHCMD_STATUS:
        case SLASHCMD_HELP:
            break;
        }
        need = l > need ? l : need;
    }
    return need;
}

static const char *first_needing(const struct slashcmd_list *cmds, enum scm_level need,
                                 const struct bot *b)
{
    for (size_t i = 0; i < cmds->len; i++) {
        struct slashcmd_list one = {.cmds = &cmds->cmds[i], .len = 1};
        if (required_level(b, &one) >= need) {
            return slashcmd_verb_name(cmds->cmds[i].verb);
        }
    }
    return "this command";
}

/* The commenter's level: GitHub's author_association OWNER/MEMBER/COLLABORATOR counts as
 * write without a call (it under-reports, never over-reports); anything more comes from
 * the permission API, cached for cfg.permission_ttl_ms. */
static int level_of(enum scm_level *out, struct bot *b, struct scm_provider *p,
                    const struct inbox_entry *e, enum scm_level need, struct err *err)
{
    const char *assoc = e->author_association;
    struct scm_ref ref = {.project = e->project, .number = e->number,
                          .installation_id = e->installation_id};
    int64_t now = clock_now_ms(clock_system());
    struct perm_entry *slot;
    char key[256];
    int rc;

    if (assoc != NULL && need <= SCM_LEVEL_WRITE &&
        (strcmp(assoc, "OWNER") == 0 || strcmp(assoc, "MEMBER") == 0 ||
         strcmp(assoc, "COLLABORATOR") == 0)) {
        *out = SCM_LEVEL_WRITE;
        return E_OK;
    }
    snprintf(key, sizeof(key), "%s/%s/%s", e->provider, e->project, e->author);
    slot = &b->perms[hash_fnv1a_str(key) % PERM_CACHE];
    if (slot->expires_ms > now && strcmp(slot->key, key) == 0) {
        *out = slot->level;
        return E_OK;
    }
    rc = p->ops->permission_of(out, p, &ref, e->author, e->author_id, NULL, err);
    if (rc == E_OK) {
        snprintf(slot->key, sizeof(slot->key), "%s", key);
        slot->level = *out;
        slot->expires_ms = now + b->cfg.permission_ttl_ms;
    }
    return rc;
}

/* --- gathering ---------------------------------------------------------------------- */

static bool has_verb(const struct slashcmd_list *cmds, enum slashcmd_verb v)
{
    for (size_t i = 0; cmds != NULL && i < cmds->len; i++) {
        if (cmds->cmds[i].verb == v) {
            return true;
        }
    }
    return false;
}

/* The PR head (and base branch): from the payload when it carried them (GitLab), else the
 * SCM's API. */
static int head_of(struct scm_pull *out, struct scm_provider *p, const struct inbox_entry *e,
                   struct err *err)
{
    json_t *extra = e->extra != NULL ? json_loads(e->extra, 0, NULL) : NULL;
    const char *ref = json_string_value(json_object_get(extra, "head_ref"));
    const char *url = json_string_value(json_object_get(extra, "clone_url"));
    const char *base = json_string_value(json_object_get(extra, "base_ref"));
    struct scm_ref sref = {.project = e->project, .number = e->number,
                           .installation_id = e->installation_id};
    int rc = E_OK;

    memset(out, 0, sizeof(*out));
    if (ref != NULL && url != NULL) {
        out->head_ref = xstrdup(ref);
        out->clone_url = xstrdup(url);
        out->base_ref = base != NULL ? xstrdup(base) : NULL;
    } else {
        rc = p->ops->pull_info(out, p, &sref, NULL, err);
    }
    json_decref(extra);
    return rc;
}

static char *status_table(struct bot *b, const struct bot_input *in)
{
    json_t *items = NULL, *t;
    int64_t rv;
    size_t i, shown = 0;
    struct buf out;

    buf_init(&out, 0);
    json_t *stickies = NULL;

    buf_printf(&out, "**Tasks of %s**\n\n| Task | Phase | Spend / budget | Tokens / budget | "
                     "Preview | Status comment |\n|---|---|---|---|---|---|\n",
               in->entry->project);
    (void)task_store_sticky_list(&stickies, b->store, in->entry->provider, in->entry->project,
                                 in->entry->number, NULL);
    if (task_store_list(&items, &rv, b->store, in->ns, NULL) == E_OK) {
        json_array_foreach(items, i, t)
        {
            const json_t *md = json_object_get(t, "metadata");
            const json_t *ann = json_object_get(md, "annotations");
            const char *proj = json_string_value(json_object_get(ann, "divergedev.com/project"));
            const char *prov = json_string_value(json_object_get(ann, "divergedev.com/provider"));
            const json_t *spec = json_object_get(t, "spec"), *st = json_object_get(t, "status");
            const char *prev = json_string_value(json_object_get(st, "previewUrl"));
            /* Only this exact project's tasks: a namespace may hold other projects' too. */
            if (proj == NULL || strcmp(proj, in->entry->project) != 0 || prov == NULL ||
                strcmp(prov, in->entry->provider) != 0) {
                continue;
            }
            char key[160], link[96];
            const char *sticky;
            snprintf(key, sizeof(key), "%s/%s", in->ns, json_string_value(json_object_get(md, "name")));
            sticky = json_string_value(json_object_get(stickies, key));
            if (sticky != NULL) {
                /* An in-page anchor: it works on GitHub, GitHub Enterprise and GitLab. */
                snprintf(link, sizeof(link), "[status](#%s%s)",
                         strcmp(in->entry->provider, "gitlab") == 0 ? "note_" : "issuecomment-",
                         sticky);
            } else {
                snprintf(link, sizeof(link), "—");
            }
            buf_printf(&out, "| `%s` | %s | $%s / $%s | %lld / %lld | %s | %s |\n",
                       json_string_value(json_object_get(md, "name")),
                       json_string_value(json_object_get(st, "phase")),
                       json_string_value(json_object_get(st, "costUSD")),
                       json_string_value(json_object_get(spec, "budgetUSD")) != NULL
                           ? json_string_value(json_object_get(spec, "budgetUSD"))
                           : "-",
                       (long long)json_integer_value(json_object_get(st, "tokensConsumed")),
                       (long long)json_integer_value(json_object_get(spec, "budgetTokens")),
                       prev != NULL && prev[0] != '\0' ? prev : "—", link);
            shown++;
        }
        json_decref(items);
    }
    if (shown == 0) {
        buf_puts(&out, "| — | no tasks yet | | | | |\n");
    }
    json_decref(stickies);
    return buf_take(&out);
}

struct gathered {
    struct slashcmd_list *cmds;
    char *refusal;
    struct scm_pull pull;
    bool have_pull;
    struct config_agent *agent;
    char *status;
};

static void gathered_cleanup(struct gathered *g)
{
    slashcmd_list_free(g->cmds);
    free(g->refusal);
    scm_pull_cleanup(&g->pull);
    config_agent_free(g->agent);
    free(g->status);
}

/* Refuses (through g->refusal) commands that need more permission than the author has.
 * E_AGAIN: the SCM could not tell. */
static int check_permission(struct gathered *g, struct bot *b, struct scm_provider *p,
                            const struct inbox_entry *e, struct err *err)
{
    enum scm_level need = required_level(b, g->cmds), have = SCM_LEVEL_NONE;
    int rc;

    if (need <= SCM_LEVEL_NONE) {
        return E_OK;
    }
    rc = level_of(&have, b, p, e, need, err);
    if (rc != E_OK) {
        return E_AGAIN;
    }
    if (have < need) {
        g->refusal = xasprintf("@%s `/diverge %s` needs the **%s** permission on %s "
                               "(you have **%s**). Nothing was changed.\n",
                               e->author, first_needing(g->cmds, need, b), scm_level_name(need),
                               e->project, scm_level_name(have));
    }
    return E_OK;
}

/* For `/diverge fix`: the PR's head and the agent.yaml of its base branch. E_AGAIN: try the
 * entry again later; E_FAIL: the PR is gone. */
static int gather_fix(struct gathered *g, struct scm_provider *p, const struct inbox_entry *e,
                      struct err *err)
{
    struct scm_ref ref = {.project = e->project, .number = e->number,
                          .installation_id = e->installation_id};
    struct err perr = {0};
    char *yaml = NULL;
    size_t ylen = 0;
    int rc = head_of(&g->pull, p, e, err);

    if (rc != E_OK) {
        return rc == E_NOTFOUND ? E_FAIL : E_AGAIN;
    }
    g->have_pull = true;
    /* The config comes from the base branch of the base repository (the one the
     * comment is on), never from the head, which the PR's author controls: a change
     * to it takes effect once merged (SPEC §5). No known base: server defaults. */
    rc = g->pull.base_ref == NULL ? E_NOTFOUND
                                  : p->ops->file_at(&yaml, &ylen, p, &ref, g->pull.base_ref,
                                                    ".diverge/agent.yaml", NULL, err);
    if (rc == E_OK &&
        config_agent_load_mem(&g->agent, ".diverge/agent.yaml", yaml, ylen, &perr) != E_OK) {
        g->refusal = bot_reply_bad_agent_yaml(e->author, g->pull.base_ref, perr.msg);
    }
    free(yaml);
    return rc == E_OK || rc == E_NOTFOUND ? E_OK : E_AGAIN;
}

/* Everything from the SCM before the transaction. E_AGAIN: try the entry again later. */
static int gather(struct gathered *g, struct bot *b, struct scm_provider *p,
                  const struct inbox_entry *e, const struct bot_input *in, struct err *err)
{
    struct err perr = {0};
    int rc;

    if (slashcmd_parse(&g->cmds, e->body, strlen(e->body), &perr) != E_OK) {
        g->refusal = bot_reply_unreadable(e->author, perr.msg);
        return E_OK;
    }
    rc = check_permission(g, b, p, e, err);
    if (rc != E_OK || g->refusal != NULL) {
        return rc;
    }
    g->refusal = bot_reply_too_long(e->author, g->cmds);
    if (g->refusal != NULL) {
        return E_OK;
    }
    if (has_verb(g->cmds, SLASHCMD_FIX)) {
        rc = gather_fix(g, p, e, err);
        if (rc != E_OK) {
            return rc;
        }
    }
    if (g->refusal == NULL && has_verb(g->cmds, SLASHCMD_STATUS)) {
        g->status = status_table(b, in);
    }
    return E_OK;
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
    struct inbox_entry e;     /* owned */
    enum prep_kind kind;
    struct bot_input in;
    struct gathered g;        /* owned */
    char why[ERR_MSG_MAX];    /* for PREP_FAIL */
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
    log_kv(LOG_WARN, "comment_retry", "project", e->project, "comment", e->comment_id,
           "delay_ms", delay, "error", why, NULL);
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
    if (b->ns_override != NULL) {
        snprintf(pr->in.ns, sizeof(pr->in.ns), "%s", b->ns_override);
    } else {
        bot_project_namespace(pr->in.ns, e->project);
    }
    bot_task_name(pr->in.task, e->provider, e->project, e->number, b->ns_override != NULL);
    if (gather(&pr->g, b, p, e, &pr->in, &err) != E_OK) {
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
           "comment", pr->e.comment_id, "author", pr->e.author, "commands", n, "task",
           pr->in.task, "refused", pr->g.refusal != NULL ? "true" : "false", NULL);
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
        gathered_cleanup(&items[i].g);
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
    free(b);
}
