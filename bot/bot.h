/* SPDX-License-Identifier: Apache-2.0 */
/* The bot: applies accepted comments from the durable inbox exactly once, in order per
 * PR/MR — parse the commands, check the commenter's permission, change the task, queue
 * the reaction and replies — with the task change, the outbox calls and the "done" mark of
 * the inbox entry in ONE transaction. */
#ifndef DIVERGE_BOT_BOT_H
#define DIVERGE_BOT_BOT_H

#include <stdbool.h>
#include <stdint.h>

#include "bot/slashcmd.h"
#include "common/err.h"
#include "scm/scm.h"
#include "store/store.h"

struct bot_config {
    const char *namespace_override;  /* --namespace; NULL: derived from the project */
    int64_t default_budget_usd;      /* micro-dollars, for tasks without agent.yaml values */
    int64_t default_budget_tokens;
    int64_t default_max_iterations;
    enum scm_level min_fix;          /* fix, guide, pause, resume without amounts */
    enum scm_level min_budget;       /* budget, resume with amounts */
    int64_t permission_ttl_ms;       /* how long a looked-up permission is trusted */
    int max_attempts;                /* tries of an entry before giving up on it */
};

#define BOT_CONFIG_DEFAULTS                                                                     \
    {                                                                                           \
        .namespace_override = NULL, .default_budget_usd = 5000000,                              \
        .default_budget_tokens = 1000000, .default_max_iterations = 5,                          \
        .min_fix = SCM_LEVEL_WRITE, .min_budget = SCM_LEVEL_MAINTAIN,                           \
        .permission_ttl_ms = 180000, .max_attempts = 10,                                        \
    }

/* The namespace of a project's tasks (SPEC §2): the path as a DNS label
 * ("myorg/checkout-service" -> "myorg-checkout-service"); longer than 63: cut and
 * suffixed with a short hash. OUT has 64 bytes. */
void bot_project_namespace(char out[64], const char *project);

struct bot;

/* Starts the worker thread over STORE and REGISTRY (borrowed; they must outlive it). */
int bot_new(struct bot **out, struct task_store *store, const struct scm_registry *registry,
            const struct bot_config *cfg, struct err *err);
/* Stops after the entry in flight; NULL is a no-op. */
void bot_free(struct bot *b);

#endif
