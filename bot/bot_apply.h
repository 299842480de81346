/* SPDX-License-Identifier: Apache-2.0 */
/* Inside bot/: what the worker gathered about one comment, and the transaction that
 * applies it (bot_apply.c). */
#ifndef DIVERGE_BOT_BOT_APPLY_H
#define DIVERGE_BOT_BOT_APPLY_H

#include "bot/bot.h"
#include "common/buf.h"
#include "common/config.h"

struct bot_input {
    const struct inbox_entry *entry;     /* the comment */
    const struct bot_config *cfg;
    const struct slashcmd_list *cmds;    /* NULL when the comment did not parse */
    const char *refusal;                 /* reply instead of applying anything, or NULL */
    const struct scm_pull *pull;         /* the PR head, for fix; NULL otherwise */
    const struct config_agent *agent;    /* .diverge/agent.yaml on the base branch, or NULL */
    const char *status_table;            /* for status, or NULL */
    char ns[64];                         /* the project's namespace */
    char task[64];                       /* bot_task_name() */
    bool accepted;                       /* out: a task-changing command was applied */
};

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
/* The task NS/TASK exists but is not this PR's (bot_task_belongs): nothing is changed. */
char *bot_reply_foreign_task(const char *author, const char *ns, const char *task);

#endif
