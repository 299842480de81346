/* SPDX-License-Identifier: Apache-2.0 */
/* Inside bot/: the bot's state (worker.c), what it gathered about one comment (gather.c),
 * and the transaction that applies it (bot_apply.c). */
#ifndef DIVERGE_BOT_BOT_APPLY_H
#define DIVERGE_BOT_BOT_APPLY_H

#include "bot/bot.h"
#include "common/buf.h"
#include "common/config.h"

struct bot_input {
    const struct inbox_entry *entry; /* the comment */
    const struct bot_config *cfg;
    const unsigned char *root_key;    /* TOKEN_ROOT_KEY_LEN bytes: the push grants' key */
    const struct slashcmd_list *cmds; /* NULL when the comment did not parse */
    const char *refusal;              /* reply instead of applying anything, or NULL */
    const struct scm_pull *pull;      /* the PR head, for fix; NULL otherwise */
    const struct config_agent *agent; /* .diverge/agent.yaml on the base branch, or NULL */
    const char *status_table;         /* for status, or NULL */
    char ns[64];                      /* the project's namespace */
    char task[64];                    /* bot_task_name(); in one shared namespace, chosen
                                         in the transaction (bot_apply_txn) */
    bool shared_ns;                   /* --namespace: every project's tasks in NS */
    bool accepted;                    /* out: a task-changing command was applied */
};

/* The permission cache: one slot per hash of provider/project/user. */
#define PERM_CACHE 256

struct perm_entry {
    char key[256]; /* provider/project/user */
    enum scm_level level;
    int64_t expires_ms; /* 0 = empty slot */
};

struct bot {
    struct task_store *store;       /* borrowed */
    const struct scm_registry *reg; /* borrowed */
    struct bot_config cfg;
    char *ns_override; /* owned copy of cfg.namespace_override */
    /* A copy of cfg.root_key (NULL in cfg here); wiped on free. */
    unsigned char root_key[TOKEN_ROOT_KEY_LEN];
    struct perm_entry perms[PERM_CACHE];
    struct store_worker *worker; /* owned: the thread applying the inbox */
};

/* What the SCM told about one comment before its transaction. */
struct gathered {
    struct slashcmd_list *cmds; /* owned; NULL when the comment did not parse */
    char *refusal;              /* owned reply instead of applying anything, or NULL */
    struct scm_pull pull;       /* the PR head, for fix */
    bool have_pull;             /* pull is set */
    struct config_agent *agent; /* owned agent.yaml of the base branch, or NULL */
    char *status;               /* owned status table, or NULL */
};

/* Everything from the SCM before the transaction into G (cleaned up with
 * bot_gathered_cleanup() whatever it returns). E_AGAIN: try the entry again later;
 * E_FAIL: the PR is gone. */
int bot_gather(struct gathered *g, struct bot *b, struct scm_provider *p,
               const struct inbox_entry *e, const struct bot_input *in, struct err *err);
void bot_gathered_cleanup(struct gathered *g);

/* The task_txn_fn applying IN (struct bot_input *): task changes, the +1 reaction, one
 * reply comment, and the inbox entry marked done. */
int bot_apply_txn(struct task_txn *tx, void *in);

/* Queues a reply with TEXT to the entry's PR/MR (inside a transaction). */
int bot_queue_reply(struct task_txn *tx, const struct inbox_entry *e, const char *text,
                    struct err *err);

/* Reply texts (reply.c). Every piece of user text in them is quoted with slashcmd_quote;
 * AUTHOR is the commenter's login, checked by the webhook parser. New strings; caller frees. */

/* The comment did not parse: WHY is slashcmd_parse's message (its arguments quoted). */
char *bot_reply_unreadable(const char *author, const char *why);
/* .diverge/agent.yaml on BRANCH (the base) did not load: WHY is the loader's message. */
char *bot_reply_bad_agent_yaml(const char *author, const char *branch, const char *why);
/* A refusal when a fix objective or guide hint of CMDS is over its cap, else NULL. */
char *bot_reply_too_long(const char *author, const struct slashcmd_list *cmds);
/* The PR's head repository (GitLab: the MR's source project) was deleted: no task. */
char *bot_reply_head_gone(const char *author, const char *provider);
/* The task NS/TASK exists but is not this PR's (bot_task_belongs): nothing is changed. */
char *bot_reply_foreign_task(const char *author, const char *ns, const char *task);

/* SpendQuotas (quota_text.c, SPEC §15). QUOTAS: a namespace's, rolled to now. */
/* Appends one "Project quota `team`: $used / $limit · tokens ... resets DAY" line per
 * quota to OUT (nothing when QUOTAS is empty). */
void bot_quota_lines(struct buf *out, const json_t *quotas);
/* The refusal of `/diverge fix` when the quota Q is used up: its name, use and reset day. */
char *bot_reply_quota_used_up(const char *author, const json_t *q);
/* Lowers the raised budgets *USD_IO (micro-dollars, raised from OLD_USD) and *TOKENS_IO
 * (from OLD_TOKENS; either may be NULL) to what the task has spent (SPENT_*) plus what
 * QUOTAS leave, never below the old values; appends why to NOTE. Returns whether it
 * lowered one. */
bool bot_quota_cap(int64_t *usd_io, int64_t old_usd, int64_t *tokens_io, int64_t old_tokens,
                   struct buf *note, const json_t *quotas, int64_t spent_usd, int64_t spent_tokens);

#endif
