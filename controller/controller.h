/* SPDX-License-Identifier: Apache-2.0 */
/* The embedded controller: a reconcile loop driven by the store's change feed. It owns
 * the token lifecycle (mint on create/resume, revoke on pause/finish) and the phase
 * machine of SPEC §4. With sandbox provider "none" nothing is started: a task turns
 * Active once its token is minted, and an external agent meters with that token. */
#ifndef DIVERGE_CONTROLLER_CONTROLLER_H
#define DIVERGE_CONTROLLER_CONTROLLER_H

#include <stdbool.h>
#include <stdint.h>

#include "common/clock.h"
#include "common/err.h"
#include "store/store.h"
#include "token/token.h"

struct controller_config {
    const char *data_dir;             /* token files under <data-dir>/tokens/<ns>/<task>/ */
    const unsigned char *root_key;    /* TOKEN_ROOT_KEY_LEN bytes, copied */
    int64_t default_budget_usd;       /* micro-dollars, when spec.budgetUSD is unset */
    int64_t default_budget_tokens;    /* when spec.budgetTokens is unset */
    const char *sandbox_provider;     /* "none" runs tasks; others are not built yet */
    bool manual;                      /* no thread: the caller drives controller_reconcile */
};

/* What one reconcile step does to a task. */
enum controller_action {
    CONTROLLER_NOTHING,
    CONTROLLER_ACTIVATE,  /* mint a fresh token, phase Active */
    CONTROLLER_PAUSE,     /* revoke the token, phase Paused (reason Suspended) */
    CONTROLLER_REVOKE,    /* finished task still holding an active token: revoke it */
    CONTROLLER_WAIT,      /* no sandbox provider can run it: note why, stay Pending */
};

/* The pure decision: V is the task, TOKEN_ACTIVE whether its latest token is active,
 * CAN_RUN whether the configured sandbox provider can start it, WAITING_NOTED whether
 * the task already says why it waits. */
enum controller_action controller_decide(const struct task_view *v, bool token_active,
                                         bool can_run, bool waiting_noted);

struct controller;

/* Starts the reconcile thread over STORE (borrowed). Every existing task is reconciled
 * first, so a restart resumes where the previous process stopped. */
int controller_new(struct controller **out, struct task_store *store,
                   const struct controller_config *cfg, struct err *err);
/* Stops the thread; NULL is a no-op. */
void controller_free(struct controller *c);

/* Reconciles one task now (also used by tests). E_NOTFOUND when it is gone. */
int controller_reconcile(struct controller *c, const char *ns, const char *name,
                         struct err *err);

/* Path of the task's token file: new string, caller frees. */
char *controller_token_path(const struct controller *c, const char *ns, const char *name);

#endif
