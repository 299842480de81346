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
    const struct config_agent *agent;    /* .diverge/agent.yaml at the head, or NULL */
    const char *status_table;            /* for status, or NULL */
    char ns[64];                         /* the project's namespace */
    char task[64];                       /* fix-pr-<n> / fix-mr-<iid> */
    bool accepted;                       /* out: a task-changing command was applied */
};

/* The task_txn_fn applying IN (struct bot_input *): task changes, the +1 reaction, one
 * reply comment, and the inbox entry marked done. */
int bot_apply_txn(struct task_txn *tx, void *in);

/* Queues a reply with TEXT to the entry's PR/MR (inside a transaction). */
int bot_queue_reply(struct task_txn *tx, const struct inbox_entry *e, const char *text,
                    struct err *err);

#endif
