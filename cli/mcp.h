/* SPDX-License-Identifier: Apache-2.0 */
/* `diverge mcp` (SPEC §10): a Model Context Protocol server on stdio. Messages are
 * JSON-RPC 2.0, one per line (the MCP stdio transport); the tools call the task API the
 * same way the `diverge task` verbs do. Inside cli/ only. */
#ifndef DIVERGE_CLI_MCP_H
#define DIVERGE_CLI_MCP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "cli/cli_int.h"

/* The longest message line read, in bytes (without its '\n'); a longer one is answered
 * with a JSON-RPC error and skipped. */
#define CLI_MCP_MAX_LINE (1u << 20)

/* JSON-RPC 2.0 error codes. */
#define CLI_MCP_PARSE_ERROR (-32700)
#define CLI_MCP_INVALID_REQUEST (-32600)
#define CLI_MCP_METHOD_NOT_FOUND (-32601)
#define CLI_MCP_INVALID_PARAMS (-32602)

/* One session. Caller storage, set up with cli_mcp_init(). */
struct cli_mcp {
    const struct cli_ctx *ctx; /* borrowed: server, token, default namespace */
    char version[16];          /* negotiated protocol version, "" before initialize */
    bool initialized;          /* notifications/initialized arrived */
};

void cli_mcp_init(struct cli_mcp *m, const struct cli_ctx *ctx);

/* Handles the message LINE[0..len) (one line without its '\n'; need not be
 * NUL-terminated). Returns the reply to write as one line (JSON text without a
 * newline; caller frees with free()), or NULL when nothing is answered (notifications,
 * responses, blank lines). Never fails: bad input gets a JSON-RPC error reply. */
char *cli_mcp_handle(struct cli_mcp *m, const char *line, size_t len);

/* The `tools/list` result: {"tools": [...]} with each tool's JSON Schema. New. */
json_t *cli_mcp_tools_list(void);

/* Runs tool NAME with ARGS (an object, borrowed) and returns the `tools/call` result
 * (content, structuredContent, isError), new. Returns NULL when NAME is no tool. */
json_t *cli_mcp_tool_call(const struct cli_mcp *m, const char *name, const json_t *args);

/* --- shared by the tools (cmd_mcp_result.c) --- */

/* A tools/call result: one text content block TEXT (taken; made valid UTF-8) and, when
 * not NULL, STRUCTURED as structuredContent (taken). */
json_t *cli_mcp_result(bool is_error, char *text, json_t *structured);
/* The isError result for the cli_api_call() failure RC with ERR's message;
 * structuredContent {"error", "reason"}. */
json_t *cli_mcp_failure(int rc, const struct err *err);
/* The isError result "argument KEY PROBLEM". */
json_t *cli_mcp_bad_arg(const char *key, const char *problem);
/* The flat summary of the AgentTask TASK (name, phase, budgets, guidance...). New. */
json_t *cli_mcp_summary(const json_t *task);
/* MEMBER of the summary S as text: a string as it is, an integer in decimal, else "-". */
const char *cli_mcp_member_text(char tmp[32], const json_t *s, const char *member);
/* The summary member of the limit that applies: EFFECTIVE (status.effective…: what the
 * server enforces, spec or default) when S has it, else SPEC. */
const char *cli_mcp_limit(const json_t *s, const char *effective, const char *spec);
#define MCP_LIMIT_ITER(s) cli_mcp_limit((s), "effectiveMaxIterations", "maxIterations")
#define MCP_LIMIT_TOKENS(s) cli_mcp_limit((s), "effectiveBudgetTokens", "budgetTokens")
#define MCP_LIMIT_USD(s) cli_mcp_limit((s), "effectiveBudgetUSD", "budgetUSD")
/* The success result for TASK: text "VERB\n<one-line summary>" (no VERB when NULL). */
json_t *cli_mcp_task_result(const json_t *task, const char *verb);

/* Argument checks. Each returns NULL when fine, else the isError result to answer. */
/* Every member of ARGS is in the NULL-terminated KNOWN (ALLOWED lists them for the
 * message). */
json_t *cli_mcp_check_known(const json_t *args, const char *const *known, const char *allowed);
/* Optional string KEY into *out (borrowed; NULL when absent or null). */
json_t *cli_mcp_opt_string(const char **out, const json_t *args, const char *key);
/* Required, non-empty string KEY. */
json_t *cli_mcp_req_string(const char **out, const json_t *args, const char *key);
/* *OUT = CTX with the "namespace" argument, when given, as the namespace. */
json_t *cli_mcp_with_namespace(struct cli_ctx *out, const struct cli_ctx *ctx, const json_t *args);
/* Optional count KEY: a non-negative integer or a string "200000"/"2M" ("+2M" with
 * ALLOW_PLUS); *out -1 when absent. */
json_t *cli_mcp_opt_count(int64_t *out, const json_t *args, const char *key, bool allow_plus);
/* Optional USD amount KEY in micro-dollars: a decimal string ("+" only with ALLOW_PLUS)
 * or a non-negative integer; binary floating point is refused. *out -1 when absent. */
json_t *cli_mcp_opt_money(int64_t *out, const json_t *args, const char *key, bool allow_plus);
/* Optional "repository": a URL string or {url, baseBranch, workingBranch}; *out is the
 * spec.repository object (new) or NULL. */
json_t *cli_mcp_opt_repository(json_t **out, const json_t *args);

#define CLI_MCP_USAGE                                                                              \
    "Usage: diverge mcp\n\n"                                                                       \
    "Serves the Model Context Protocol on stdin/stdout (JSON-RPC 2.0, one message per\n"           \
    "line) for IDE assistants and agents. Tools: diverge_create_task, diverge_list_tasks,\n"       \
    "diverge_task_status, diverge_guide_task, diverge_pause_task, diverge_resume_task.\n"          \
    "They call the task API of --server with --token, like `diverge task`; -n sets the\n"          \
    "namespace used when a call names none. Diagnostics go to stderr.\n" CLI_GLOBAL_HELP

/* `diverge mcp`: serves stdin/stdout until end of input. Exit code. */
int cli_mcp_run(struct cli_ctx *ctx, const struct cli_args *args);

#endif
