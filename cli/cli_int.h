/* SPDX-License-Identifier: Apache-2.0 */
/* Shared inside cli/ only: the resolved global options, the task API client, and the
 * `task` subverb handlers the dispatch table in cmd_task.c points at. */
#ifndef DIVERGE_CLI_CLI_INT_H
#define DIVERGE_CLI_CLI_INT_H

#include <jansson.h>

#include "cli/cli.h"
#include "common/err.h"

#define CLI_API_BASE "/apis/divergedev.com/v1alpha1"
#define CLI_DEFAULT_SERVER "http://127.0.0.1:8080"
#define CLI_DEFAULT_NAMESPACE "default"

/* The global options, appended to every usage text. */
#define CLI_GLOBAL_HELP                                                                            \
    "\nGlobal options:\n"                                                                          \
    "  --server URL        server (env DIVERGE_SERVER, default http://127.0.0.1:8080)\n"           \
    "  --token TOKEN       admin API token (env DIVERGE_API_TOKEN, default the data\n"             \
    "                      dir's api-token: $DIVERGE_DATA_DIR or ./var)\n"                         \
    "  -n, --namespace NS  namespace (default \"default\")\n"                                      \
    "  -o, --output FMT    table (default), json or yaml\n"                                        \
    "  -h, --help          show help\n"

/* The global options after flags, environment and defaults were applied. */
struct cli_ctx {
    char *server;           /* owned; base URL without a trailing '/' */
    char *token;            /* owned; admin API token, NULL when none was found */
    const char *ns;         /* borrowed from argv or static; the namespace */
    enum cli_output output; /* -o */
    bool all_namespaces;    /* -A */
};

/* Resolves ARGS into CTX (caller storage): --server, else $DIVERGE_SERVER, else
 * CLI_DEFAULT_SERVER; --token, else $DIVERGE_API_TOKEN, else the file
 * $DIVERGE_DATA_DIR/api-token, else ./var/api-token. E_INVALID for a bad -o or a token
 * with control characters. cli_ctx_cleanup() releases CTX, also after a failure. */
int cli_ctx_init(struct cli_ctx *ctx, const struct cli_args *args, struct err *err);
void cli_ctx_cleanup(struct cli_ctx *ctx);

/* One call of the task API. PATH starts with "/" and is appended to the server URL.
 * BODY (may be NULL) is sent as CONTENT_TYPE. On a 2xx answer *obj_out is the parsed JSON
 * (caller json_decref()s) and *raw_out, when RAW_OUT is not NULL, the body text (caller
 * free()s). With OBJ_OUT NULL the answer is text (RAW_OUT required) and is not parsed. Errors carry
 * the server's own message in ERR: E_AGAIN unreachable; E_NOTFOUND 404; E_CONFLICT 409; E_DENIED
 * 401/403; E_INVALID 400/422; E_FAIL anything else (also a 2xx that is not JSON). */
int cli_api_call(json_t **obj_out, char **raw_out, const struct cli_ctx *ctx, const char *method,
                 const char *path, const char *content_type, const json_t *body, struct err *err);

/* The exit code for a failed cli_api_call: CLI_EXIT_UNREACHABLE for E_AGAIN, else
 * CLI_EXIT_FAILED. Prints ERR's message first. */
int cli_api_fail(int rc, const struct err *err);

/* The API path of PLURAL (agenttasks, spendquotas) in the context's namespace: the
 * collection (NAME NULL), one object, or every namespace's (ALL). New string. */
char *cli_resource_path(const struct cli_ctx *ctx, const char *plural, const char *name, bool all);
/* "/apis/divergedev.com/v1alpha1/namespaces/NS/agenttasks[/NAME]" with NS and NAME
 * percent-encoded; NAME may be NULL. With ALL (list -A) the cluster-wide list path.
 * Caller frees with free(). */
char *cli_task_path(const struct cli_ctx *ctx, const char *name, bool all);

/* Prints OBJ (with RAW its exact text) in CTX's json or yaml format to stdout. */
void cli_print_object(const struct cli_ctx *ctx, const char *raw, const json_t *obj);

/* Borrowed string at the dotted PATH ("spec.repository.url") of OBJ, or NULL when a
 * member is missing or not a string. */
const char *cli_json_str(const json_t *obj, const char *path);

/* The member at the dotted PATH, borrowed, or NULL. */
const json_t *cli_json_at(const json_t *obj, const char *path);

/* A decimal-string or integer member at PATH of OBJ as text (integers written into TMP),
 * "-" when absent or of another type. */
const char *cli_text_or_dash(char tmp[32], const json_t *obj, const char *path);

/* TASK's spec.budgetUSD in micro-dollars; 0 (the server default applies) when absent. */
int64_t cli_spec_usd(const json_t *task);
/* The budget a bump starts from when the spec has none: status.effectiveBudgetUSD /
 * effectiveBudgetTokens (the server's default at mint), else the documented defaults. */
int64_t cli_default_usd(const json_t *task);
int64_t cli_default_tokens(const json_t *task);

/* `task` subverbs. ARGS holds the positionals after the subverb and every option. */
int cli_task_init(struct cli_ctx *ctx, const struct cli_args *args);
int cli_task_create(struct cli_ctx *ctx, const struct cli_args *args);
int cli_task_list(struct cli_ctx *ctx, const struct cli_args *args);
int cli_task_status(struct cli_ctx *ctx, const struct cli_args *args);
int cli_task_logs(struct cli_ctx *ctx, const struct cli_args *args);
int cli_task_guide(struct cli_ctx *ctx, const struct cli_args *args);
int cli_task_pause(struct cli_ctx *ctx, const struct cli_args *args);
int cli_task_delete(struct cli_ctx *ctx, const struct cli_args *args);
int cli_task_resume(struct cli_ctx *ctx, const struct cli_args *args);
int cli_task_rerun(struct cli_ctx *ctx, const struct cli_args *args);
int cli_task_token(struct cli_ctx *ctx, const struct cli_args *args);

/* How the binary was invoked (argv[0], "diverge" until main sets it): the next steps
 * `local` prints are commands to paste. */
extern const char *cli_program;

/* Splits "owner/repo#7" into a new *PROJECT_OUT and *NUMBER_OUT. Returns false (after a
 * one-line usage message) when malformed. */
bool cli_local_parse_ref(char **project_out, long long *number_out, const char *ref);
/* PUT /api/v1/local/pulls/...: binds PROJECT#NUMBER to URL, HEAD and BASE (checked by the
 * caller). Returns an exit code; on CLI_EXIT_OK *ANS_OUT and *RAW_OUT are the answer. */
int cli_local_pr_open(json_t **ans_out, char **raw_out, struct cli_ctx *ctx, const char *project,
                      long long number, const char *url, const char *head, const char *base);
/* MARKDOWN (a comment's stored text) as a person reads it in a terminal: marker comments
 * and zero-width characters gone, entities and backslash escapes decoded, links as
 * "text (url)", control characters dropped (term_text.c). New string. */
char *cli_term_text(const char *markdown);
/* `diverge local demo` (cmd_local_demo.c). */
int cli_local_demo(struct cli_ctx *ctx, const struct cli_args *args);
/* `diverge kubeconfig` (cmd_kubeconfig.c). */
#define CLI_KUBECONFIG_USAGE                                                                       \
    "Usage: (umask 077 && diverge kubeconfig [-n NS] > kubeconfig)\n\n"                            \
    "Prints a kubeconfig for kubectl against the server's TLS listener (diverge serve\n"           \
    "--tls-listen): the HTTPS URL and certificate the server recorded in the data dir\n"           \
    "($DIVERGE_DATA_DIR/tls-endpoint, default ./var), the admin token, and NS (default\n"          \
    "\"default\") as the context's namespace. The file holds the admin token: keep it private.\n"
int cli_kubeconfig(struct cli_ctx *ctx, const struct cli_args *args);

#endif
