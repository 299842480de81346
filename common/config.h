/* SPDX-License-Identifier: Apache-2.0 */
/* The repository's `.diverge/agent.yaml` (SPEC §10): strict loading (unknown keys and
 * wrong types are errors naming file, line and key) and the example `task init` writes. */
#ifndef DIVERGE_COMMON_CONFIG_H
#define DIVERGE_COMMON_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

/* Where the file lives, relative to a repository's root (or the working directory). */
#define CONFIG_AGENT_PATH ".diverge/agent.yaml"
/* Larger files are refused with E_TOOBIG before parsing. */
#define CONFIG_AGENT_MAX_BYTES (64u * 1024u)

/* A loaded agent.yaml. Every field is optional in the file; the has_* flags and NULL
 * pointers tell which were present. */
struct config_agent {
    char **capabilities;       /* owned array of owned strings; agent.capabilities */
    size_t n_capabilities;     /* entries in capabilities */
    bool has_capabilities;     /* the key was present (the list may be empty) */
    char **allowed_tools;      /* owned array of owned strings; agent.allowedTools */
    size_t n_allowed_tools;    /* entries in allowed_tools */
    bool has_allowed_tools;    /* the key was present (the list may be empty) */
    int64_t budget_usd_micros; /* agent.budgetUSD in micro-dollars */
    bool has_budget_usd;       /* agent.budgetUSD was present */
    int64_t budget_tokens;     /* agent.budgetTokens, >= 0 */
    bool has_budget_tokens;    /* agent.budgetTokens was present */
    int64_t max_iterations;    /* agent.maxIterations, 0..INT32_MAX */
    bool has_max_iterations;   /* agent.maxIterations was present */
    char *base_branch;         /* owned; agent.baseBranch, NULL when absent */
    char *command;             /* owned; agent.command, NULL when absent */
    char *verify_command;      /* owned; agent.verifyCommand, NULL when absent */
    char *sandbox_provider;    /* owned; sandbox.provider, NULL when absent */
    int64_t sandbox_timeout_s; /* sandbox.timeoutSeconds, 0..INT32_MAX */
    bool has_sandbox_timeout;  /* sandbox.timeoutSeconds was present */
    char *sandbox_network;     /* owned; sandbox.network ("none" or "proxy"), NULL when absent */
    char **allowed_hosts;      /* owned array of owned strings; sandbox.allowedHosts */
    size_t n_allowed_hosts;    /* entries in allowed_hosts */
    bool has_allowed_hosts;    /* the key was present (the list may be empty) */
};

/* Parses the agent.yaml text DATA[0..len). NAME is the file name used in messages
 * (".diverge/agent.yaml"). On success *out is a new config the caller frees with
 * config_agent_free(). Errors, with err->msg "NAME:LINE: KEY: problem" (or "NAME:LINE:
 * problem" for YAML syntax) and err->field the key path ("agent.budgetTokens"):
 *   E_INVALID  malformed YAML, a missing or wrong `version`, unknown key, wrong type;
 *   E_TOOBIG   LEN over CONFIG_AGENT_MAX_BYTES.
 * Pure: no I/O, safe to call from any thread. */
int config_agent_load_mem(struct config_agent **out, const char *name, const char *data, size_t len,
                          struct err *err);

/* Reads and parses the file PATH (also used as NAME in messages). Returns E_NOTFOUND when
 * the file does not exist, E_FAIL when it cannot be read, else as config_agent_load_mem. */
int config_agent_load_file(struct config_agent **out, const char *path, struct err *err);

/* Releases CFG and everything it owns; NULL is a no-op. */
void config_agent_free(struct config_agent *cfg);

/* Copies what CFG says into the AgentTask SPEC (a JSON object; jansson's json_t): lists
 * `capabilities`, `allowedTools`; `sandbox.provider`, `.timeoutSeconds`, `.network`,
 * `.allowedHosts`; `runner.command`, `runner.verifyCommand`. Keys absent from the file are
 * left alone; CFG NULL is a no-op. Budgets, limits and the base branch are the caller's. */
struct json_t;
void config_agent_apply_spec(struct json_t *spec, const struct config_agent *cfg);

/* The example file `diverge task init` writes (static text; it loads without error). */
const char *config_agent_example(void);

/* Writes config_agent_example() to PATH, creating its parent directory (one level, mode
 * 0755) when missing. Returns E_CONFLICT when PATH exists and FORCE is false (nothing is
 * written), E_FAIL on an I/O error. */
int config_agent_write_example(const char *path, bool force, struct err *err);

#endif
