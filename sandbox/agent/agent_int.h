/* SPDX-License-Identifier: Apache-2.0 */
/* What agent.c (the operations) and agent_poll.c (the poll thread) of the
 * agent-sandbox provider share. */
#ifndef DIVERGE_SANDBOX_AGENT_INT_H
#define DIVERGE_SANDBOX_AGENT_INT_H

#include <pthread.h>

#include "sandbox/agent/sandbox_agent.h"

struct kube_client;

struct agent_box {
    char *ns, *name, *claim; /* owned */
    char *token_path;        /* owned: the controller's token file of the task */
    char *log_path;          /* owned */
    int64_t timeout_s;       /* spec.sandbox.timeoutSeconds, 0: none (or adopted) */
    /* Adopted: when the task's time is up (the claim's shutdownTime less the grace), as the
     * controller armed no timer for it; told once. 0: the controller's timer runs. */
    int64_t deadline_ms;
    bool deadline_told;
    enum sandbox_state state;
    int exit_code;
    char *ip;     /* owned, or NULL */
    uint64_t gen; /* bumped by every local change: an older poll result is dropped */
    struct agent_box *next;
};

/* Frees B and everything it owns (agent.c). */
void agent_box_free(struct agent_box *b);

struct agent_provider {
    struct sandbox_provider base; /* must be first */
    struct kube_client *kube;     /* borrowed */
    char *pool;                   /* owned */
    int64_t poll_ms;
    pthread_mutex_t lock;    /* the boxes; never held across an API call */
    pthread_mutex_t op_lock; /* one suspend/resume at a time (held across API calls) */
    pthread_cond_t cond;
    struct agent_box *head; /* guarded by lock */
    bool stopping;          /* guarded by lock */
    pthread_t thread;
};

/* The provider's operations (agent.c); sandbox_agent_new (agent_poll.c) makes one. */
extern const struct sandbox_provider_ops agent_ops;

/* The box of NS/NAME (*result NULL: none), with AP->lock held. */
struct agent_box **agent_find(struct agent_provider *ap, const char *ns, const char *name);

/* The poll saw NS/NAME's bound Sandbox running while its box is paused (suspended before
 * the claim was bound): patches it to Suspended unless a resume came first. */
void agent_suspend_late(struct agent_provider *ap, const char *ns, const char *name);

/* Adopts the claims this controller's sandboxes left running (label managed-by diverge,
 * every namespace): a restarted server or a new leader goes on with them instead of
 * starting them again. DATA_DIR: where their token files and logs are. Failures are
 * logged: the tasks then restart as after a local server restart. */
void agent_adopt(struct agent_provider *ap, const char *data_dir);

/* The poll thread (ARG: the provider): every poll_ms it reads each box's claim and bound
 * Sandbox, updates the box, and calls on_exit for a finished runner or a changed pod IP. */
void *agent_poll_thread(void *arg);

#endif
