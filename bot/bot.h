/* SPDX-License-Identifier: Apache-2.0 */
/* The bot: applies accepted comments from the durable inbox exactly once, in order per
 * PR/MR — parse the commands, check the commenter's permission, change the task, queue
 * the reaction and replies — with the task change, the outbox calls and the "done" mark of
 * the inbox entry in ONE transaction. */
#ifndef DIVERGE_BOT_BOT_H
#define DIVERGE_BOT_BOT_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "bot/slashcmd.h"
#include "common/err.h"
#include "scm/scm.h"
#include "store/store.h"
#include "token/token.h"

struct bot_config {
    const char *namespace_override; /* --namespace; NULL: derived from the project */
    int64_t default_budget_usd;     /* micro-dollars, for tasks without agent.yaml values */
    int64_t default_budget_tokens;
    int64_t default_max_iterations;
    enum scm_level min_fix;    /* fix, guide, pause, resume without amounts */
    enum scm_level min_budget; /* budget, resume with amounts */
    /* GitLab's tiers (--gitlab-min-access-fix/-budget); SCM_LEVEL_NONE: as above. */
    enum scm_level gitlab_min_fix;
    enum scm_level gitlab_min_budget;
    int64_t permission_ttl_ms; /* how long a looked-up permission is trusted */
    int max_attempts;          /* tries of an entry before giving up on it */
    /* TOKEN_ROOT_KEY_LEN bytes (copied; required): the key of the push grants the bot
     * writes on the tasks it makes (token_push_grant, controller_push_refusal). */
    const unsigned char *root_key;
    /* Optional: called (on the bot's thread) when a permitted commenter's `fix` is about
     * to be gathered, before the SCM calls that precede its task: a start may be coming
     * (controller_start_coming). A hint only; it must not block. */
    void (*fix_coming)(void *userdata);
    void *fix_coming_userdata;
};

#define BOT_CONFIG_DEFAULTS                                                                        \
    {                                                                                              \
        .namespace_override = NULL, .default_budget_usd = 5000000,                                 \
        .default_budget_tokens = 1000000, .default_max_iterations = 5, .min_fix = SCM_LEVEL_WRITE, \
        .min_budget = SCM_LEVEL_MAINTAIN, .permission_ttl_ms = 180000, .max_attempts = 10,         \
        .root_key = NULL, .fix_coming = NULL, .fix_coming_userdata = NULL,                         \
    }

/* The namespace of a project's tasks (SPEC §2): the path as a DNS label
 * ("myorg/checkout-service" -> "myorg-checkout-service"); longer than 63: cut and
 * suffixed with a short hash. OUT has 64 bytes. */
void bot_project_namespace(char out[64], const char *project);

/* The name of the task PR/MR NUMBER of PROVIDER's PROJECT acts on (OUT has 64 bytes).
 * Without SHARED_NS it is SPEC's "fix-pr-<number>" (GitLab "fix-mr-<iid>"). With it,
 * "fix-pr-<number>-<8 hex>", the hex being the low 32 bits of FNV-1a over
 * "<provider>:<project>": in one namespace for every project (--namespace) the bot uses
 * that name only when the plain one is another project's or an API-made task's (or the
 * task was made under it), so the PRs #N of two projects do not share one task. A name is
 * never proof of ownership: see bot_task_belongs. */
void bot_task_name(char out[64], const char *provider, const char *project, int64_t number,
                   bool shared_ns);

/* Whether TASK (a stored AgentTask) is the task of PR/MR NUMBER of PROVIDER's PROJECT:
 * its divergedev.com/provider and divergedev.com/project annotations equal PROVIDER and
 * PROJECT exactly and its divergedev.com/pr-number (GitLab: mr-iid) is NUMBER. A task
 * without them (made through the API or the CLI), or made from another project whose
 * namespace maps to the same DNS label, belongs to no comment here: commands refuse it. */
bool bot_task_belongs(const json_t *task, const char *provider, const char *project,
                      int64_t number);

/* The longest objective (`fix`) and hint (`guide`) a comment may set, in bytes: the
 * store's caps on spec.objective and the divergedev.com/guidance annotation. A longer one
 * is refused with a reply and changes nothing. */
#define BOT_OBJECTIVE_MAX TASK_OBJECTIVE_MAX
#define BOT_GUIDANCE_MAX TASK_GUIDANCE_MAX

struct bot;

/* Starts the worker thread over STORE and REGISTRY (borrowed; they must outlive it).
 * E_INVALID without cfg->root_key. */
int bot_new(struct bot **out, struct task_store *store, const struct scm_registry *registry,
            const struct bot_config *cfg, struct err *err);
/* Stops after the entry in flight; NULL is a no-op. */
void bot_free(struct bot *b);

#endif
