/* SPDX-License-Identifier: Apache-2.0 */
/* Declarations shared inside controller/ only. */
#ifndef DIVERGE_CONTROLLER_CONTROLLER_INT_H
#define DIVERGE_CONTROLLER_CONTROLLER_INT_H

#include "controller/controller.h"

struct controller {
    struct task_store *store;                   /* borrowed */
    char *data_dir;                             /* owned */
    unsigned char root_key[TOKEN_ROOT_KEY_LEN]; /* wiped on free */
    int64_t default_budget_usd;                 /* micro-dollars */
    int64_t default_budget_tokens;
    char *provider;                             /* owned: the sandbox provider name */
    struct store_worker *worker;                /* owned; NULL in manual mode */
};

/* Writes TOKEN to the task's token file atomically, mode 0600. */
int controller_write_token_file(struct controller *c, const char *ns, const char *name,
                                const char *token, struct err *err);

/* Frees C's memory (the thread must not run). */
void controller_destroy(struct controller *c);

#endif
