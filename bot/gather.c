/* SPDX-License-Identifier: Apache-2.0 */
/* The bot's reads before its transaction: who may run which command (the permission
 * cache), the PR head and agent.yaml for fix, the status table. Nothing here writes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bot/bot_apply.h"
#include "common/hash.h"
#include "store/quota.h"

/* --- permissions ------------------------------------------------------------------ */

/* The tiers of PROVIDER's comments: GitLab's own when configured. */
static void tiers_of(enum scm_level *fix, enum scm_level *budget, const struct bot *b,
                     const char *provider)
{
    bool gl = provider != NULL && strcmp(provider, "gitlab") == 0;

    *fix = gl && b->cfg.gitlab_min_fix != SCM_LEVEL_NONE ? b->cfg.gitlab_min_fix : b->cfg.min_fix;
    *budget = gl && b->cfg.gitlab_min_budget != SCM_LEVEL_NONE ? b->cfg.gitlab_min_budget
                                                               : b->cfg.min_budget;
}

static enum scm_level required_level(const struct bot *b, const struct slashcmd_list *cmds,
                                     const char *provider)
{
    enum scm_level need = SCM_LEVEL_NONE, min_fix, min_budget;

    tiers_of(&min_fix, &min_budget, b, provider);

    for (size_t i = 0; i < cmds->len; i++) {
        const struct slashcmd *c = &cmds->cmds[i];
        enum scm_level l = SCM_LEVEL_NONE;
        switch (c->verb) {
        case SLASHCMD_FIX:
        case SLASHCMD_GUIDE:
        case SLASHCMD_PAUSE:
            l = min_fix;
            break;
        case SLASHCMD_RESUME:
            l = c->has_usd || c->has_tokens ? min_budget : min_fix;
            break;
        case SLASHCMD_BUDGET:
            l = min_budget;
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
                                 const struct bot *b, const char *provider)
{
    for (size_t i = 0; i < cmds->len; i++) {
        struct slashcmd_list one = {.cmds = &cmds->cmds[i], .len = 1};
        if (required_level(b, &one, provider) >= need) {
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
    struct scm_ref ref = {
        .project = e->project, .number = e->number, .installation_id = e->installation_id};
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

/* The PR head (and base branch): from the payload when it carried them (GitLab), else the
 * SCM's API. */
static int head_of(struct scm_pull *out, struct scm_provider *p, const struct inbox_entry *e,
                   struct err *err)
{
    json_t *extra = e->extra != NULL ? json_loads(e->extra, 0, NULL) : NULL;
    const char *ref = json_string_value(json_object_get(extra, "head_ref"));
    const char *url = json_string_value(json_object_get(extra, "clone_url"));
    const char *base = json_string_value(json_object_get(extra, "base_ref"));
    const char *base_url = json_string_value(json_object_get(extra, "base_url"));
    struct scm_ref sref = {
        .project = e->project, .number = e->number, .installation_id = e->installation_id};
    int rc = E_OK;

    memset(out, 0, sizeof(*out));
    if (ref != NULL && url != NULL) {
        out->head_ref = xstrdup(ref);
        out->clone_url = xstrdup(url);
        out->base_ref = base != NULL ? xstrdup(base) : NULL;
        out->base_url = base_url != NULL ? xstrdup(base_url) : NULL;
    } else {
        rc = p->ops->pull_info(out, p, &sref, NULL, err);
    }
    json_decref(extra);
    return rc;
}

/* A limit: the spec's, else the one that applies (status.effective…), else "-". */
static const char *limit_text(char tmp[32], const json_t *spec, const char *key,
                              const json_t *status, const char *effective)
{
    const json_t *v = json_object_get(spec, key);

    if (v == NULL || json_is_null(v)) {
        v = json_object_get(status, effective);
    }
    if (json_is_string(v)) {
        return json_string_value(v);
    }
    if (json_is_integer(v) && json_integer_value(v) > 0) {
        snprintf(tmp, 32, "%lld", (long long)json_integer_value(v));
        return tmp;
    }
    return "-";
}

/* One row of the status table for task T. */
static void put_row(struct buf *out, const json_t *t, const char *preview, const char *link)
{
    const json_t *spec = json_object_get(t, "spec"), *st = json_object_get(t, "status");
    const json_t *pos = json_object_get(st, "queuePosition");
    const char *ph = json_string_value(json_object_get(st, "phase"));
    const char *cost = json_string_value(json_object_get(st, "costUSD"));
    char usd[32], tokens[32], phase[64];

    snprintf(phase, sizeof(phase), "%s", ph != NULL ? ph : "Pending");
    if (json_is_integer(pos) && json_integer_value(pos) > 0) {
        snprintf(phase, sizeof(phase), "%s (queued #%lld)", ph != NULL ? ph : "Pending",
                 (long long)json_integer_value(pos));
    }
    buf_printf(
        out, "| `%s` | %s | $%s / $%s | %lld / %s | %s | %s |\n",
        json_string_value(json_object_get(json_object_get(t, "metadata"), "name")), phase,
        cost != NULL ? cost : "0", limit_text(usd, spec, "budgetUSD", st, "effectiveBudgetUSD"),
        (long long)json_integer_value(json_object_get(st, "tokensConsumed")),
        limit_text(tokens, spec, "budgetTokens", st, "effectiveBudgetTokens"), preview, link);
}

static char *status_table(struct bot *b, const struct bot_input *in)
{
    json_t *items = NULL, *t;
    int64_t rv;
    size_t i, shown = 0;
    struct buf out;

    buf_init(&out, 0);
    json_t *stickies = NULL;

    buf_printf(&out,
               "**Tasks of %s**\n\n| Task | Phase | Spend / budget | Tokens / budget | "
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
            const json_t *st = json_object_get(t, "status");
            const char *prev = json_string_value(json_object_get(st, "previewUrl"));
            /* Only this exact project's tasks: a namespace may hold other projects' too. */
            if (proj == NULL || strcmp(proj, in->entry->project) != 0 || prov == NULL ||
                strcmp(prov, in->entry->provider) != 0) {
                continue;
            }
            char key[160], link[96];
            const char *sticky;
            snprintf(key, sizeof(key), "%s/%s", in->ns,
                     json_string_value(json_object_get(md, "name")));
            sticky = json_string_value(json_object_get(stickies, key));
            if (sticky != NULL) {
                /* An in-page anchor: it works on GitHub, GitHub Enterprise and GitLab. */
                snprintf(link, sizeof(link), "[status](#%s%s)",
                         strcmp(in->entry->provider, "gitlab") == 0 ? "note_" : "issuecomment-",
                         sticky);
            } else {
                snprintf(link, sizeof(link), "—");
            }
            put_row(&out, t, prev != NULL && prev[0] != '\0' ? prev : "—", link);
            shown++;
        }
        json_decref(items);
    }
    if (shown == 0) {
        buf_puts(&out, "| — | no tasks yet | | | | |\n");
    }
    json_decref(stickies);
    if (task_store_quota_list(&items, b->store, in->ns, NULL) == E_OK) {
        bot_quota_lines(&out, items);
        json_decref(items);
    }
    return buf_take(&out);
}

void bot_gathered_cleanup(struct gathered *g)
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
    enum scm_level need = required_level(b, g->cmds, e->provider), have = SCM_LEVEL_NONE;
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
                               e->author, first_needing(g->cmds, need, b, e->provider),
                               scm_level_name_for(e->provider, need), e->project,
                               scm_level_name_for(e->provider, have));
    }
    return E_OK;
}

/* For `/diverge fix`: the PR's head and the agent.yaml of its base branch. E_AGAIN: try the
 * entry again later; E_FAIL: the PR is gone. */
static int gather_fix(struct gathered *g, struct scm_provider *p, const struct inbox_entry *e,
                      struct err *err)
{
    struct scm_ref ref = {
        .project = e->project, .number = e->number, .installation_id = e->installation_id};
    struct err perr = {0};
    char *yaml = NULL;
    size_t ylen = 0;
    int rc = head_of(&g->pull, p, e, err);

    if (rc != E_OK) {
        return rc == E_NOTFOUND ? E_FAIL : E_AGAIN;
    }
    g->have_pull = true;
    if (g->pull.head_gone) {
        /* Never the base repository instead: no task is made or changed. */
        g->refusal = bot_reply_head_gone(e->author, e->provider);
        return E_OK;
    }
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

int bot_gather(struct gathered *g, struct bot *b, struct scm_provider *p,
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
    if (slashcmd_has(g->cmds, SLASHCMD_FIX)) {
        if (b->cfg.fix_coming != NULL) {
            b->cfg.fix_coming(b->cfg.fix_coming_userdata);
        }
        rc = gather_fix(g, p, e, err);
        if (rc != E_OK) {
            return rc;
        }
    }
    if (g->refusal == NULL && slashcmd_has(g->cmds, SLASHCMD_STATUS)) {
        g->status = status_table(b, in);
    }
    return E_OK;
}
