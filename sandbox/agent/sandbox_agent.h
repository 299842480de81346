/* SPDX-License-Identifier: Apache-2.0 */
/* The pure parts of the agent-sandbox provider (agent_doc.c): the names, the
 * SandboxClaim it creates for a task, the token Secret, and what a claim and its bound
 * Sandbox (as kubernetes-sigs/agent-sandbox v1beta1 defines them) say about the runner. */
#ifndef DIVERGE_SANDBOX_AGENT_H
#define DIVERGE_SANDBOX_AGENT_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "sandbox/sandbox.h"

#define SANDBOX_AGENT_LABEL_TASK "divergedev.com/agenttask"
#define SANDBOX_AGENT_LABEL_MANAGED "app.kubernetes.io/managed-by"
/* The claim annotation agent-sandbox writes with the adopted Sandbox's name. */
#define SANDBOX_AGENT_ANN_SANDBOX "agents.x-k8s.io/sandbox-name"
#define SANDBOX_AGENT_TOKEN_KEY "token" /* the Secret key, mounted as .../token/token */
#define SANDBOX_AGENT_TOKEN_ENV "DIVERGE_MACAROON_TOKEN" /* the token in the pod's env */
#define SANDBOX_AGENT_GRACE_S 60    /* shutdownTime: past the controller's own timeout */
#define SANDBOX_AGENT_EXIT_GONE 137 /* the sandbox vanished or expired under the runner */

/* "diverge-<task>" (a DNS label: a long task name is cut and given a hash). New string. */
char *sandbox_agent_claim_name(const char *task);
/* "task-token-<task>" (SPEC §11). New string. */
char *sandbox_agent_secret_name(const char *task);

/* Whether the SPEC §9 variable "KEY=VALUE" goes into the claim's spec.env: not the ones
 * the chart's SandboxTemplate sets itself (DIVERGE_WORKSPACE_DIR, DIVERGE_TOKEN_FILE, HOME:
 * envVarsInjectionPolicy Allowed refuses overrides), nor host paths a pod cannot reach
 * (the meter socket, the staging push URL, the file:// mirror) or the local proxy. */
bool sandbox_agent_env_wanted(const char *kv);

/* The SandboxClaim of S in POOL (new object): labels naming the task, spec.warmPoolRef,
 * spec.env, spec.lifecycle (shutdownTime NOW_MS + timeout + grace, shutdownPolicy Delete)
 * when S->timeout_s > 0. */
json_t *sandbox_agent_claim(const struct sandbox_spec *s, const char *pool, int64_t now_ms);

/* The Secret task-token-<task> holding TOKEN (new object). */
/* The git smart HTTP URL of NS/TASK's repository (server/api_git.c) at the public URL
 * METER_URL (<public-url>/api/v1/agenttask/meter) was made of; NULL when it is not one. */
char *sandbox_agent_git_url(const char *meter_url, const char *ns, const char *task);

/* DOC (a Sandbox) with every env var named SANDBOX_AGENT_TOKEN_ENV of its pod template's
 * containers set to TOKEN: the merge patch (new reference) that gives the next pod the
 * fresh token, guarded by DOC's resourceVersion; NULL when the template has no such var. */
json_t *sandbox_agent_token_patch(const json_t *doc, const char *token);
/* The same for a SandboxClaim not bound yet: its spec.env (copied into the Sandbox it gets). */
json_t *sandbox_agent_claim_token_patch(const json_t *doc, const char *token);

json_t *sandbox_agent_secret(const char *ns, const char *task, const char *token);

/* The bound Sandbox's name from CLAIM (status.sandbox.name, else the annotation), or NULL;
 * borrowed. */
const char *sandbox_agent_bound(const json_t *claim);

/* The name of the pod of SANDBOX (the annotation agents.x-k8s.io/pod-name of a Sandbox
 * adopted from a warm pool, else the Sandbox's own name); borrowed. */
const char *sandbox_agent_pod_name(const json_t *sandbox);
/* The runner's exit status in POD (container "runner", else the first container:
 * state.terminated.exitCode); false when the pod does not say. */
bool sandbox_agent_pod_exit(int *code_out, const json_t *pod);

/* What CLAIM (NULL: absent) and its bound SANDBOX (NULL: not bound yet) say. */
struct sandbox_agent_obs {
    enum sandbox_state state;
    int exit_code;  /* SANDBOX_EXITED: 0 PodSucceeded, 1 PodFailed (the pod's status says the
                       exact one: sandbox_agent_pod_exit), EXIT_GONE expired */
    const char *ip; /* borrowed from the documents: the pod's first IP, or NULL */
};
void sandbox_agent_observe(struct sandbox_agent_obs *out, const json_t *claim,
                           const json_t *sandbox);

#endif
