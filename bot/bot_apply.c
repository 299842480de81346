/* SPDX-License-Identifier: Apache-2.0 */
/* Applying one comment's commands to its PR's task, inside one store transaction: the
 * change, the reaction and the reply are queued and the inbox entry is marked done
 * together, so a crash anywhere applies the comment once or not at all. */
#include <stdlib.h>
#include <string.h>

#include "bot/bot_apply.h"
#include "common/hash.h"
#include "common/money.h"
#include "store/quota.h"

#define ANN_PROVIDER "divergedev.com/provider"
#define ANN_PROJECT "divergedev.com/project"
#define ANN_PR "divergedev.com/pr-number"
#define ANN_MR "divergedev.com/mr-iid"

void bot_task_name(char out[64], const char *provider, const char *project, int64_t number,
                   bool shared_ns)
{
    const char *kind = strcmp(provider, "gitlab") == 0 ? "mr" : "pr";
    uint64_t h = hash_fnv1a(HASH_FNV1A_INIT, provider, strlen(provider));

    if (!shared_ns) {
        snprintf(out, 64, "fix-%s-%lld", kind, (long long)number);
        return;
    }
    /* Not a security boundary (FNV is easy to collide on purpose): bot_task_belongs is.
     * It only keeps honest projects apart; "fix-pr-" + 19 digits + "-" + 8 < 64. */
    h = hash_fnv1a(h, ":", 1);
    h = hash_fnv1a(h, project, strlen(project));
    snprintf(out, 64, "fix-%s-%lld-%08x", kind, (long long)number, (unsigned)(h & 0xffffffffu));
}

bool bot_task_belongs(const json_t *task, const char *provider, const char *project, int64_t number)
{
    const json_t *ann = json_object_get(json_object_get(task, "metadata"), "annotations");
    const char *prov = json_string_value(json_object_get(ann, ANN_PROVIDER));
    const char *proj = json_string_value(json_object_get(ann, ANN_PROJECT));
    const char *num =
        json_string_value(json_object_get(ann, strcmp(provider, "gitlab") == 0 ? ANN_MR : ANN_PR));
    char want[32];

    snprintf(want, sizeof(want), "%lld", (long long)number);
    return prov != NULL && proj != NULL && num != NULL && strcmp(prov, provider) == 0 &&
           strcmp(proj, project) == 0 && strcmp(num, want) == 0;
}

/* The task IN names, fetched inside the transaction: E_NOTFOUND when absent, E_CONFLICT
 * when it is another project's or PR's (never changed from here). */
static int get_own_task(json_t **out, struct task_txn *tx, const struct bot_input *in,
                        struct err *err)
{
    int rc = task_txn_get(out, tx, in->ns, in->task, err);

    if (rc == E_OK &&
        !bot_task_belongs(*out, in->entry->provider, in->entry->project, in->entry->number)) {
        json_decref(*out);
        *out = NULL;
        return err_set(err, E_CONFLICT, "the task belongs to another project or pull request");
    }
    return rc;
}

static int queue(struct task_txn *tx, const struct inbox_entry *e, const char *kind,
                 const char *target, const char *body, struct err *err)
{
    struct outbox_entry o;

    memset(&o, 0, sizeof(o));
    snprintf(o.provider, sizeof(o.provider), "%s", e->provider);
    snprintf(o.kind, sizeof(o.kind), "%s", kind);
    o.project = e->project;
    o.number = e->number;
    o.target = (char *)(uintptr_t)target;
    o.body = (char *)(uintptr_t)body;
    o.installation_id = e->installation_id;
    return task_txn_outbox_add(NULL, tx, &o, err);
}

int bot_queue_reply(struct task_txn *tx, const struct inbox_entry *e, const char *text,
                    struct err *err)
{
    return queue(tx, e, "comment", NULL, text, err);
}

/* The branch a comment-made task clones: the PR head (GitHub, GitLab: the head may live in
 * a fork that lacks the base branch), except for a `local` PR bound to a repository by
 * `diverge local pr open`, which names its base (--base) in that same repository. */
static const char *clone_base(const struct bot_input *in)
{
    if (strcmp(in->entry->provider, "local") == 0 && in->pull->base_ref != NULL) {
        return in->pull->base_ref;
    }
    return in->pull->head_ref;
}

static void set_or_del(json_t *obj, const char *key, const char *value)
{
    if (value != NULL) {
        json_object_set_new(obj, key, json_string(value));
    } else {
        json_object_del(obj, key);
    }
}

/* Records on DOC (this PR's task, spec.repository already the PR head) the repository and
 * base branch the PR targets, and the push grant that lets the controller push a working
 * branch equal to spec.repository.baseBranch (the PR head's name: it is also the branch
 * cloned). The controller never pushes to the recorded base branch of the recorded base
 * repository, granted or not. No known base: no grant, so such a push is refused. */
static void set_push_annotations(json_t *doc, const struct bot_input *in)
{
    json_t *md = json_object_get(doc, "metadata");
    json_t *ann = json_object_get(md, "annotations");
    char grant[TOKEN_PUSH_GRANT_LEN + 1];
    struct token_push_target t = {
        .ns = in->ns,
        .name = in->task,
        .url = in->pull->clone_url,
        .working = in->pull->head_ref,
        .pr_base_url = in->pull->base_url,
        .pr_base_ref = in->pull->base_ref,
    };

    if (!json_is_object(ann)) {
        ann = json_object();
        json_object_set_new(md, "annotations", ann);
    }
    set_or_del(ann, TASK_ANN_PR_BASE_REPOSITORY, t.pr_base_url);
    set_or_del(ann, TASK_ANN_PR_BASE_BRANCH, t.pr_base_ref);
    set_or_del(ann, TASK_ANN_PUSH_GRANT, token_push_grant(grant, in->root_key, &t) ? grant : NULL);
}

/* The spec of a new task made by `/diverge fix`: the PR head is the branch to push to
 * (and, but for local PRs, the one to clone); budgets and limits from agent.yaml, else
 * the server defaults. */
static json_t *new_task(const struct bot_input *in, const char *objective)
{
    const struct config_agent *a = in->agent;
    const struct bot_config *cfg = in->cfg;
    char money[MONEY_STR_MAX], num[32];
    bool gitlab = strcmp(in->entry->provider, "gitlab") == 0;
    json_t *spec, *obj;

    money_format(money,
                 a != NULL && a->has_budget_usd ? a->budget_usd_micros : cfg->default_budget_usd);
    spec =
        json_pack("{s:s, s:{s:s, s:s, s:s}, s:s, s:I, s:I}", "objective", objective, "repository",
                  "url", in->pull->clone_url, "baseBranch", clone_base(in), "workingBranch",
                  in->pull->head_ref, "budgetUSD", money, "budgetTokens",
                  (json_int_t)(a != NULL && a->has_budget_tokens ? a->budget_tokens
                                                                 : cfg->default_budget_tokens),
                  "maxIterations",
                  (json_int_t)(a != NULL && a->has_max_iterations ? a->max_iterations
                                                                  : cfg->default_max_iterations));
    /* Capabilities, tools, sandbox settings and the runner's commands (SPEC §10). */
    config_agent_apply_spec(spec, a);
    snprintf(num, sizeof(num), "%lld", (long long)in->entry->number);
    obj = json_pack("{s:s, s:s, s:{s:s, s:s, s:{s:s, s:s, s:s}}, s:o}", "apiVersion",
                    TASK_API_VERSION, "kind", TASK_KIND, "metadata", "name", in->task, "namespace",
                    in->ns, "annotations", ANN_PROVIDER, in->entry->provider, ANN_PROJECT,
                    in->entry->project, gitlab ? ANN_MR : ANN_PR, num, "spec", spec);
    set_push_annotations(obj, in);
    return obj;
}

/* The PR head (which may have moved) into DOC, this PR's task. */
static void set_head(json_t *doc, const struct bot_input *in)
{
    json_t *repo = json_object_get(json_object_get(doc, "spec"), "repository");

    if (in->pull != NULL && json_is_object(repo)) {
        json_object_set_new(repo, "url", json_string(in->pull->clone_url));
        json_object_set_new(repo, "baseBranch", json_string(clone_base(in)));
        json_object_set_new(repo, "workingBranch", json_string(in->pull->head_ref));
        set_push_annotations(doc, in);
    }
}

static bool finished(const struct task_view *v)
{
    return v->phase == TASK_COMPLETED || v->phase == TASK_FAILED;
}

/* Whether the finished task V has spent its effective budget (the spec's, else the
 * server's default): then a new run would stop at its first charge. */
static bool budget_spent(const struct task_view *v, const struct bot_config *cfg)
{
    int64_t usd = v->budget_usd > 0 ? v->budget_usd : cfg->default_budget_usd;
    int64_t tokens = v->budget_tokens > 0 ? v->budget_tokens : cfg->default_budget_tokens;

    return (usd > 0 && v->cost_usd >= usd) || (tokens > 0 && v->tokens_consumed >= tokens);
}

static void reply_budget_spent(struct buf *reply, const struct bot_input *in,
                               const struct task_view *v)
{
    char spent[MONEY_STR_MAX], budget[MONEY_STR_MAX];

    money_format(spent, v->cost_usd);
    money_format(budget, v->budget_usd > 0 ? v->budget_usd : in->cfg->default_budget_usd);
    buf_printf(
        reply,
        "@%s task `%s` has spent its budget ($%s of $%s, %lld of %lld tokens), so a new "
        "run would stop at once: nothing was started. Raise it with `/diverge budget "
        "+$5` (or a token count such as `/diverge budget 500k`), then `/diverge fix "
        "<objective>` again; both may go in one comment.\n\n",
        in->entry->author, in->task, spent, budget, (long long)v->tokens_consumed,
        (long long)(v->budget_tokens > 0 ? v->budget_tokens : in->cfg->default_budget_tokens));
}

/* `/diverge fix` on this PR's existing task DOC: a new objective; on a finished task also
 * the next run (SPEC §14), unless its budget is spent. *changed_out: DOC was changed. */
static int fix_existing(json_t *doc, struct bot_input *in, const char *objective, struct buf *reply,
                        bool *changed_out, struct err *err)
{
    json_t *spec = json_object_get(doc, "spec");
    struct task_view v;

    task_view_of(&v, doc);
    *changed_out = false;
    if (finished(&v) && budget_spent(&v, in->cfg)) {
        reply_budget_spent(reply, in, &v);
        return E_OK;
    }
    json_object_set_new(spec, "objective", json_string(objective));
    set_head(doc, in);
    if (finished(&v)) {
        int64_t next = (v.run > v.status_run ? v.run : v.status_run) + 1;
        json_object_set_new(spec, "run", json_integer(next));
        json_object_set_new(spec, "suspended", json_false());
    }
    *changed_out = true;
    return task_validate(doc, err);
}

static int apply_fix(struct task_txn *tx, struct bot_input *in, const char *objective,
                     struct buf *reply, struct err *err)
{
    json_t *doc = NULL, *raw, *norm = NULL;
    bool changed = false;
    int rc = get_own_task(&doc, tx, in, err);

    if (rc == E_OK) {
        rc = fix_existing(doc, in, objective, reply, &changed, err);
        if (rc == E_OK && changed) {
            rc = task_txn_put(tx, doc, err);
            in->accepted = rc == E_OK;
        }
        json_decref(doc);
        return rc;
    }
    if (rc != E_NOTFOUND) {
        return rc;
    }
    raw = new_task(in, objective);
    rc = task_normalize_new(&norm, raw, in->ns, err);
    if (rc == E_OK) {
        rc = task_txn_create(NULL, tx, norm, err);
    }
    in->accepted = in->accepted || rc == E_OK;
    json_decref(raw);
    json_decref(norm);
    return rc;
}

/* Raises spec.budgetUSD / budgetTokens from their effective values (SPEC §7). */
static void bump(json_t *spec, const struct slashcmd *c, const struct bot_config *cfg)
{
    if (c->has_usd) {
        int64_t cur = 0;
        char money[MONEY_STR_MAX];
        const char *s = json_string_value(json_object_get(spec, "budgetUSD"));
        if (s == NULL || money_parse(&cur, NULL, s, NULL) != E_OK || cur <= 0) {
            cur = cfg->default_budget_usd;
        }
        money_format(money, cur > INT64_MAX - c->usd_micros ? INT64_MAX : cur + c->usd_micros);
        json_object_set_new(spec, "budgetUSD", json_string(money));
    }
    if (c->has_tokens) {
        json_int_t cur = json_integer_value(json_object_get(spec, "budgetTokens"));
        if (cur <= 0) {
            cur = cfg->default_budget_tokens;
        }
        json_object_set_new(
            spec, "budgetTokens",
            json_integer(cur > INT64_MAX - c->tokens ? INT64_MAX : cur + c->tokens));
    }
}

/* *out: the SpendQuotas of IN's namespace, rolled to now (a new array). */
static int ns_quotas(json_t **out, struct task_txn *tx, const struct bot_input *in, struct err *err)
{
    int64_t now = clock_now_ms(task_txn_clock(tx));
    json_t *q;
    size_t i;
    int rc = task_txn_quota_list(out, tx, in->ns, err);

    if (rc == E_OK) {
        json_array_foreach(*out, i, q)
        {
            (void)quota_roll(q, now);
        }
    }
    return rc;
}

static int64_t spec_money(const json_t *spec, const char *key)
{
    int64_t v = 0;
    const char *s = json_string_value(json_object_get(spec, key));

    return s != NULL && money_parse(&v, NULL, s, NULL) == E_OK ? v : 0;
}

/* After a budget bump of DOC: no budget raised past what the namespace's quotas leave
 * (SPEC §15), never lowered below OLD_USD / OLD_TOKENS either; REPLY says so. */
static int cap_bump(struct task_txn *tx, const struct bot_input *in, json_t *doc, int64_t old_usd,
                    int64_t old_tokens, struct buf *reply, struct err *err)
{
    json_t *spec = json_object_get(doc, "spec"), *qs = NULL;
    struct task_view v;
    int64_t usd = spec_money(spec, "budgetUSD");
    int64_t tokens = json_integer_value(json_object_get(spec, "budgetTokens"));
    char money[MONEY_STR_MAX];
    int rc = ns_quotas(&qs, tx, in, err);

    if (rc != E_OK) {
        return rc;
    }
    task_view_of(&v, doc);
    if (bot_quota_cap(usd > old_usd ? &usd : NULL, old_usd, tokens > old_tokens ? &tokens : NULL,
                      old_tokens, reply, qs, v.cost_usd, v.tokens_consumed)) {
        money_format(money, usd);
        if (usd > 0) {
            json_object_set_new(spec, "budgetUSD", json_string(money));
        }
        if (tokens > 0) {
            json_object_set_new(spec, "budgetTokens", json_integer(tokens));
        }
    }
    json_decref(qs);
    return E_OK;
}

/* guide, budget, pause, resume on the existing task. E_NOTFOUND when there is none;
 * E_DENIED (nothing changed) for a resume of a finished task, which only a fix runs again. */
static int apply_change(struct task_txn *tx, struct bot_input *in, const struct slashcmd *c,
                        struct buf *reply, struct err *err)
{
    json_t *doc = NULL, *spec, *md, *ann;
    struct task_view v;
    int64_t old_usd, old_tokens;
    int rc = get_own_task(&doc, tx, in, err);

    if (rc != E_OK) {
        return rc;
    }
    task_view_of(&v, doc);
    if (c->verb == SLASHCMD_RESUME && finished(&v)) {
        json_decref(doc);
        return E_DENIED;
    }
    spec = json_object_get(doc, "spec");
    md = json_object_get(doc, "metadata");
    old_usd = spec_money(spec, "budgetUSD");
    old_tokens = json_integer_value(json_object_get(spec, "budgetTokens"));
    switch (c->verb) {
    case SLASHCMD_GUIDE:
        ann = json_object_get(md, "annotations");
        if (!json_is_object(ann)) {
            ann = json_object();
            json_object_set_new(md, "annotations", ann);
        }
        json_object_set_new(ann, TASK_ANN_GUIDANCE, json_string(c->text));
        break;
    case SLASHCMD_BUDGET:
        bump(spec, c, in->cfg);
        break;
    case SLASHCMD_PAUSE:
        json_object_set_new(spec, "suspended", json_true());
        break;
    case SLASHCMD_RESUME:
        bump(spec, c, in->cfg);
        json_object_set_new(spec, "suspended", json_false());
        break;
    default:
        break;
    }
    rc =
        c->has_usd || c->has_tokens ? cap_bump(tx, in, doc, old_usd, old_tokens, reply, err) : E_OK;
    if (rc == E_OK) {
        task_sync_effective_limits(doc); /* a bumped budget is the effective one at once */
        rc = task_validate(doc, err);
    }
    if (rc == E_OK) {
        rc = task_txn_put(tx, doc, err);
    }
    json_decref(doc);
    return rc;
}

/* `/diverge fix`, unless a SpendQuota of the namespace is used up (SPEC §15): then a reply
 * naming it and its reset day, and no change. */
static int fix_unless_quota(struct task_txn *tx, struct bot_input *in, const char *objective,
                            struct buf *reply, struct err *err)
{
    json_t *qs = NULL;
    const json_t *full;
    int rc = ns_quotas(&qs, tx, in, err);

    if (rc != E_OK) {
        return rc;
    }
    full = quota_used_up(qs);
    if (full != NULL) {
        char *text = bot_reply_quota_used_up(in->entry->author, full);
        buf_puts(reply, text);
        free(text);
    } else {
        rc = apply_fix(tx, in, objective, reply, err);
    }
    json_decref(qs);
    return rc;
}

static void reply_no_task(struct buf *reply, const struct bot_input *in, const struct slashcmd *c)
{
    buf_printf(reply,
               "@%s there is no task on this %s yet, so `/diverge %s` changed nothing; "
               "`/diverge fix <objective>` starts one.\n\n",
               in->entry->author,
               strcmp(in->entry->provider, "gitlab") == 0 ? "merge request" : "pull request",
               slashcmd_verb_name(c->verb));
}

static void reply_finished(struct buf *reply, const struct bot_input *in)
{
    buf_printf(reply,
               "@%s task `%s` is finished, so there is nothing to resume and `/diverge resume` "
               "changed nothing; `/diverge fix <objective>` starts a new run of it.\n\n",
               in->entry->author, in->task);
}

static int apply_commands(struct task_txn *tx, struct bot_input *in, struct buf *reply,
                          struct err *err)
{
    int rc = E_OK;

    for (size_t i = 0; i < in->cmds->len && rc == E_OK; i++) {
        const struct slashcmd *c = &in->cmds->cmds[i];
        switch (c->verb) {
        case SLASHCMD_FIX:
            rc = fix_unless_quota(tx, in, c->text, reply, err);
            break;
        case SLASHCMD_STATUS:
            buf_puts(reply, in->status_table != NULL ? in->status_table : "");
            buf_puts(reply, "\n");
            break;
        case SLASHCMD_HELP:
            buf_puts(reply, slashcmd_help_markdown());
            buf_puts(reply, "\n");
            break;
        default:
            rc = apply_change(tx, in, c, reply, err);
            if (rc == E_NOTFOUND) {
                reply_no_task(reply, in, c);
                rc = E_OK;
            } else if (rc == E_DENIED) {
                reply_finished(reply, in);
                rc = E_OK;
            } else if (rc == E_OK) {
                in->accepted = true;
            }
            break;
        }
    }
    return rc;
}

static bool changes_task(const struct slashcmd_list *cmds)
{
    for (size_t i = 0; i < cmds->len; i++) {
        if (cmds->cmds[i].verb != SLASHCMD_STATUS && cmds->cmds[i].verb != SLASHCMD_HELP) {
            return true;
        }
    }
    return false;
}

/* When the comment would act on a task that exists but is not this PR's (a namespace two
 * projects map to, a shared namespace, a task made through the API), *out is the refusal
 * and nothing of the comment is applied. */
static int foreign_refusal(char **out, struct task_txn *tx, const struct bot_input *in,
                           struct err *err)
{
    json_t *doc = NULL;
    int rc;

    *out = NULL;
    if (!changes_task(in->cmds)) {
        return E_OK;
    }
    rc = get_own_task(&doc, tx, in, err);
    json_decref(doc);
    if (rc == E_CONFLICT) {
        *out = bot_reply_foreign_task(in->entry->author, in->ns, in->task);
        return E_OK;
    }
    return rc == E_NOTFOUND ? E_OK : rc;
}

/* In one namespace for every project (--namespace), the PR's task is SPEC's plain
 * "fix-pr-<number>" when that name is free or already this PR's, else (another project's
 * task, or one made through the API) the name with the project's hash; a task made under
 * the hashed name keeps it. Sets IN->task. */
static int pick_shared_name(struct task_txn *tx, struct bot_input *in, struct err *err)
{
    const struct inbox_entry *e = in->entry;
    char plain[64], hashed[64];
    json_t *doc = NULL;
    struct err gerr = {0};
    int rc;

    bot_task_name(plain, e->provider, e->project, e->number, false);
    bot_task_name(hashed, e->provider, e->project, e->number, true);
    rc = task_txn_get(&doc, tx, in->ns, hashed, &gerr);
    if (rc == E_NOTFOUND) {
        rc = task_txn_get(&doc, tx, in->ns, plain, &gerr);
        if (rc == E_NOTFOUND ||
            (rc == E_OK && bot_task_belongs(doc, e->provider, e->project, e->number))) {
            snprintf(in->task, sizeof(in->task), "%s", plain);
            json_decref(doc);
            return E_OK;
        }
    }
    json_decref(doc);
    snprintf(in->task, sizeof(in->task), "%s", hashed);
    return rc == E_OK ? E_OK : err_set(err, rc, "%s", gerr.msg);
}

int bot_apply_txn(struct task_txn *tx, void *userdata)
{
    struct bot_input *in = userdata;
    const struct inbox_entry *e = in->entry;
    struct buf reply;
    struct err err = {0};
    char *foreign = NULL;
    int rc = E_OK;

    buf_init(&reply, 0);
    in->accepted = false;
    if (in->shared_ns) {
        rc = pick_shared_name(tx, in, &err);
    }
    if (rc == E_OK && in->refusal == NULL && in->cmds != NULL) {
        rc = foreign_refusal(&foreign, tx, in, &err);
    }
    if (rc != E_OK) {
        /* returned below */
    } else if (in->refusal != NULL || foreign != NULL) {
        buf_puts(&reply, in->refusal != NULL ? in->refusal : foreign);
    } else if (in->cmds != NULL) {
        rc = apply_commands(tx, in, &reply, &err);
    }
    free(foreign);
    if (rc == E_OK && in->accepted) {
        rc = queue(tx, e, "react", e->comment_id, "+1", &err);
    }
    if (rc == E_OK && reply.len > 0) {
        rc = bot_queue_reply(tx, e, reply.data, &err);
    }
    if (rc == E_OK) {
        rc = task_txn_inbox_done(tx, e->id, &err);
    }
    buf_cleanup(&reply);
    return rc;
}
